"""The ``hbmsim`` console command of the pip-installed package: runs the C++ CLI shipped in ``hbmsim/bin``.

The process is replaced by the binary (``os.execv``), so arguments, standard streams, signals and the exit
status are the C++ CLI's own.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path


def cli_path() -> Path | None:
    """The C++ CLI: ``hbmsim/bin/hbmsim`` of an installed package, else ``<build>/cli/hbmsim`` of the CMake
    build tree that ``<build>/python/hbmsim`` belongs to (``PYTHONPATH=build/python``)."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "bin" / "hbmsim", here.parent.parent / "cli" / "hbmsim"):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def main() -> None:
    exe = cli_path()
    if exe is None:
        sys.stderr.write("hbmsim: the C++ CLI (hbmsim/bin/hbmsim) is missing from this installation of the "
                         "hbmsim package; reinstall it with `pip install .`\n")
        sys.exit(1)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(exe, [sys.argv[0], *sys.argv[1:]])


if __name__ == "__main__":
    main()
