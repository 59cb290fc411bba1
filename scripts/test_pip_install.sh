#!/usr/bin/env bash
# Packaging test: plain `pip install .` and `pip install -e .` of a clean copy of the source into a fresh venv
# (/usr/bin/python3 -m venv --system-site-packages: Debian's setuptools, wheel, numpy and pandas), then the
# installed package is imported, simulates a small run, and its `hbmsim` command runs the C++ CLI.
# pip is given no index, no find-links and no config files: the build must need nothing downloaded.
# Builds the libraries, the extension and the CLI once (the editable install reuses that CMake build).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=/usr/bin/python3
T0=$SECONDS

tmp=$(mktemp -d "${TMPDIR:-/tmp}/hbmsim-pip.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "test_pip_install: FAIL: $*" >&2; exit 1; }
step() { echo "test_pip_install: [$((SECONDS - T0)) s] $*"; }

# Clean copy: tracked and untracked-but-not-ignored files, so no build directories or installed artefacts.
mkdir "$tmp/src"
if git -C "$ROOT" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  git -C "$ROOT" ls-files -z --cached --others --exclude-standard |
    tar -C "$ROOT" --null --ignore-failed-read -T - -cf - | tar -C "$tmp/src" -xf -
else
  tar -C "$ROOT" --exclude='./build*' --exclude='*.egg-info' --exclude='./dist' -cf - . | tar -C "$tmp/src" -xf -
fi
version=$(sed -nE 's/^[[:space:]]*project[[:space:]]*\([[:space:]]*hbmsim[[:space:]].*VERSION[[:space:]]+([0-9.]+).*/\1/p' \
  "$ROOT/CMakeLists.txt")
[ -n "$version" ] || fail "no project(hbmsim VERSION ...) in CMakeLists.txt"

venv=$tmp/venv
$PY -m venv --system-site-packages "$venv"
pip() {
  env -u PIP_FIND_LINKS -u PIP_INDEX_URL -u PIP_EXTRA_INDEX_URL -u PIP_NO_BUILD_ISOLATION -u PIP_REQUIRE_VIRTUALENV \
    PIP_CONFIG_FILE=/dev/null PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 "$venv/bin/pip" "$@"
}

# The installed package, run from a directory with no source in it.
check_installed() {  # $1: the directory hbmsim must be imported from
  (cd "$tmp" && "$venv/bin/python" - "$1" "$version" <<'EOF') || fail "python checks ($1)"
import json, os, subprocess, sys
import hbmsim

where, version = sys.argv[1], sys.argv[2]
assert os.path.realpath(hbmsim.__file__).startswith(os.path.realpath(where) + os.sep), hbmsim.__file__
assert hbmsim.__version__ == version, (hbmsim.__version__, version)
run = dict(system="gb200-nvl72", model="llama3.1-8b", gpus=8, batch=1, seq=4096)
r = hbmsim.simulate(**run)
assert 0.01 < r.step_time_s < 10, r.step_time_s
assert 1 << 30 < r.hbm_peak_bytes <= r.hbm_capacity_bytes, (r.hbm_peak_bytes, r.hbm_capacity_bytes)
flags = [a for k, v in run.items() for a in ("--" + k, str(v))]
out = subprocess.run([os.path.join(sys.prefix, "bin", "hbmsim"), "simulate", *flags, "--json"],
                     check=True, capture_output=True, text=True).stdout
cli = json.loads(out)
assert cli["step_time_s"] == r.step_time_s and cli["hbm_peak_bytes"] == r.hbm_peak_bytes, (cli, r)
print(f"hbmsim {hbmsim.__version__} from {os.path.dirname(hbmsim.__file__)}: llama3.1-8b step "
      f"{r.step_time_s * 1e3:.1f} ms, HBM peak {r.hbm_peak_bytes / 2**30:.1f} GiB (CLI agrees)")
EOF
  (cd "$tmp" && "$venv/bin/hbmsim" --help) | grep -q "Subcommands:" || fail "hbmsim --help"
  out=$(cd "$tmp" && "$venv/bin/hbmsim" --version) && [ "$out" = "hbmsim $version" ] || fail "hbmsim --version: $out"
  local rc=0
  (cd "$tmp" && "$venv/bin/hbmsim" simulate --model no-such-model >/dev/null 2>&1) || rc=$?
  [ "$rc" -eq 2 ] || fail "hbmsim with bad input exited $rc, not the C++ CLI's 2"
}

step "pip install . (builds the C++ libraries, extension and CLI)"
(cd "$tmp/src" && pip install .) || fail "pip install ."
step "installed; checking"
check_installed "$venv/lib"

step "pip install -e ."
(cd "$tmp/src" && pip install -e .) || fail "pip install -e ."
step "installed; checking"
check_installed "$tmp/src/python"

step "pip install . and pip install -e . passed"
