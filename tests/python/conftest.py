"""Shared fixtures: where the build is (HBMSIM_BUILD_DIR) and the CLI inside it."""
import json
import os
import subprocess
from pathlib import Path

import pytest

SOURCE_DIR = Path(__file__).resolve().parents[2]


def build_dir() -> Path:
    d = os.environ.get("HBMSIM_BUILD_DIR")
    if not d:
        pytest.fail("set HBMSIM_BUILD_DIR to the CMake build directory (ctest does)")
    return Path(d)


@pytest.fixture(scope="session")
def cli() -> Path:
    exe = build_dir() / "cli" / "hbmsim"
    if not exe.exists():
        pytest.fail(f"{exe} is missing: build the CLI first")
    return exe


def run_cli(exe: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=300)
    if check and p.returncode != 0:
        raise AssertionError(f"hbmsim {' '.join(args)} exited {p.returncode}: {p.stderr}")
    return p


def cli_json(exe: Path, *args: str):
    return json.loads(run_cli(exe, *args).stdout)
