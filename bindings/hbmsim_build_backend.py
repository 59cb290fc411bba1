"""PEP 517/660 build backend of the hbmsim Python package: setuptools' own (``setuptools.build_meta``), found
where the interpreter running pip has it, so that a plain ``pip install .`` works offline.

pyproject.toml names this module with ``backend-path`` and ``requires = []``. pip then installs nothing into
its isolated build environment, but it also hides the interpreter's site-packages there, where Debian's
python3-setuptools and python3-wheel live. This module appends those directories to the end of ``sys.path``
(anything pip did install stays in front) and re-exports setuptools' hooks. Only when setuptools >= 61 or
wheel is still missing do the ``get_requires_*`` hooks ask pip for them, which needs an index.
"""
from __future__ import annotations

import importlib.util
import os
import site
import sys


def _add_interpreter_site_packages() -> None:
    dirs = list(site.getsitepackages())
    user = site.getusersitepackages() if site.ENABLE_USER_SITE else None
    if user:
        dirs.append(user)
    for d in dirs:
        if os.path.isdir(d) and d not in sys.path:
            site.addsitedir(d)  # appends, and reads the directory's .pth files


def _setuptools_version() -> tuple[int, ...] | None:
    if importlib.util.find_spec("setuptools") is None:
        return None
    from importlib.metadata import PackageNotFoundError, version

    try:
        text = version("setuptools")
    except PackageNotFoundError:
        return None
    parts = []
    for p in text.split(".")[:2]:
        digits = "".join(c for c in p if c.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def _missing() -> list[str]:
    missing = []
    v = _setuptools_version()
    if v is None or v < (61,):
        missing.append("setuptools>=61")
    if importlib.util.find_spec("wheel") is None:
        missing.append("wheel")
    return missing


_add_interpreter_site_packages()

if _missing():
    # Only get_requires_* can run without setuptools: pip installs what they return, then calls the others.
    def _requires(config_settings=None):
        return _missing()

    get_requires_for_build_wheel = _requires
    get_requires_for_build_sdist = _requires
    get_requires_for_build_editable = _requires
else:
    from setuptools import build_meta as _sb

    def _without_wheel(requires: list[str]) -> list[str]:
        # setuptools < 70.1 always asks for "wheel"; it is importable here, and asking pip for it needs an index.
        return [r for r in requires if r.split(";")[0].strip().lower() != "wheel"]

    def get_requires_for_build_wheel(config_settings=None):
        return _without_wheel(_sb.get_requires_for_build_wheel(config_settings))

    def get_requires_for_build_sdist(config_settings=None):
        return _without_wheel(_sb.get_requires_for_build_sdist(config_settings))

    def get_requires_for_build_editable(config_settings=None):
        return _without_wheel(_sb.get_requires_for_build_editable(config_settings))

    prepare_metadata_for_build_wheel = _sb.prepare_metadata_for_build_wheel
    build_wheel = _sb.build_wheel
    build_sdist = _sb.build_sdist
    prepare_metadata_for_build_editable = _sb.prepare_metadata_for_build_editable
    build_editable = _sb.build_editable
