"""Builds the hbmsim Python package with CMake (in the manner of pybind11's cmake_example).

`pip install .` / `pip install -e .` run this through pyproject.toml. The extension ``hbmsim._hbmsim`` and the
C++ CLI (shipped as ``hbmsim/bin/hbmsim``, run by the ``hbmsim`` console command) are built by one CMake
configure and build of the ``_hbmsim`` and ``hbmsim`` targets in ``build-pip/``, which later installs reuse.
The version is the one in the top CMakeLists.txt's ``project(hbmsim VERSION ...)``.

The build is a unity build (each library's sources compiled as a few combined files); CMAKE_ARGS=
-DCMAKE_UNITY_BUILD=OFF compiles file by file.

Environment: CMAKE_ARGS (extra configure arguments), CMAKE_GENERATOR (default: Ninja when ninja is on PATH),
CMAKE_BUILD_PARALLEL_LEVEL (default: one job per CPU), HBMSIM_PIP_BUILD_DIR (default: build-pip).
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


def cmake_project_version() -> str:
    text = (ROOT / "CMakeLists.txt").read_text(encoding="utf-8")
    m = re.search(r"^\s*project\s*\(\s*hbmsim\s[^)]*?\bVERSION\s+([0-9]+(?:\.[0-9]+)*)", text, re.M | re.I)
    if not m:
        raise RuntimeError("setup.py: no `project(hbmsim VERSION x.y.z ...)` in CMakeLists.txt")
    return m.group(1)


class CMakeExtension(Extension):
    """An extension built by the CMake target ``target`` rather than by setuptools."""

    def __init__(self, name: str, target: str) -> None:
        super().__init__(name, sources=[])
        self.target = target


class CMakeBuild(build_ext):
    CLI_TARGET = "hbmsim"

    def cmake_build_dir(self) -> Path:
        base = Path(os.environ.get("HBMSIM_PIP_BUILD_DIR", ROOT / "build-pip"))
        if not base.is_absolute():
            base = ROOT / base
        tag = f"{sysconfig.get_platform()}-{sys.implementation.cache_tag}"
        return base / f"cmake-{tag}"

    def build_extension(self, ext: Extension) -> None:
        if not isinstance(ext, CMakeExtension):
            return super().build_extension(ext)
        ext_path = Path(self.get_ext_fullpath(ext.name)).resolve()
        pkg_dir = ext_path.parent
        build_dir = self.cmake_build_dir()
        build_dir.mkdir(parents=True, exist_ok=True)
        cfg = "Debug" if (os.environ.get("DEBUG", "0") not in ("", "0") or self.debug) else "Release"

        configure = [
            "cmake", "-S", str(ROOT), "-B", str(build_dir),
            f"-DCMAKE_BUILD_TYPE={cfg}",
            f"-DPython_EXECUTABLE={sys.executable}",
            "-DHBMSIM_PYTHON=ON",
            "-DHBMSIM_BENCHMARKS=OFF",
            # A clean build compiles each library as a few combined sources: 77 s instead of 197 s on 2 cores.
            "-DCMAKE_UNITY_BUILD=ON",
        ]
        if "CMAKE_ARGS" in os.environ:
            configure += shlex.split(os.environ["CMAKE_ARGS"])
        if not os.environ.get("CMAKE_GENERATOR") and not (build_dir / "CMakeCache.txt").exists():
            if shutil.which("ninja"):
                configure += ["-G", "Ninja"]
        build = ["cmake", "--build", str(build_dir), "--target", ext.target, self.CLI_TARGET]
        if "CMAKE_BUILD_PARALLEL_LEVEL" not in os.environ:
            build += ["--parallel", str(self.parallel or os.cpu_count() or 1)]

        for cmd in (configure, build):
            print("hbmsim setup.py:", shlex.join(cmd), flush=True)
            subprocess.run(cmd, check=True)

        built_ext = build_dir / "python" / "hbmsim" / ext_path.name
        built_cli = build_dir / "cli" / self.CLI_TARGET
        for f in (built_ext, built_cli):
            if not f.is_file():
                raise RuntimeError(f"setup.py: CMake built no {f}")
        pkg_dir.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built_ext, ext_path)
        (pkg_dir / "bin").mkdir(exist_ok=True)
        shutil.copy2(built_cli, pkg_dir / "bin" / self.CLI_TARGET)

    def copy_extensions_to_source(self) -> None:
        # Editable installs import the package from python/hbmsim: the CLI goes there too, beside the extension.
        super().copy_extensions_to_source()
        build_py = self.get_finalized_command("build_py")
        src_pkg = Path(build_py.get_package_dir("hbmsim"))
        built_cli = Path(self.build_lib) / "hbmsim" / "bin" / self.CLI_TARGET
        (src_pkg / "bin").mkdir(exist_ok=True)
        shutil.copy2(built_cli, src_pkg / "bin" / self.CLI_TARGET)


setup(
    version=cmake_project_version(),
    package_dir={"": "python"},
    packages=["hbmsim"],
    zip_safe=False,
    ext_modules=[CMakeExtension("hbmsim._hbmsim", target="_hbmsim")],
    cmdclass={"build_ext": CMakeBuild},
    options={"build": {"build_base": "build-pip"}},
)
