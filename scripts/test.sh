#!/usr/bin/env bash
# Every test: install what is missing, build, run the whole suite (C++, CLI, Python, notebooks), pip install
# in a fresh venv, then the sanitizer build's suite and the bounded fuzzers. HBMSIM_QUICK=1 skips the sanitizer and fuzzer stages.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
./scripts/build.sh
ctest --test-dir build -j "$(nproc)" --output-on-failure --timeout 600
./scripts/test_pip_install.sh  # pip install . and -e . in a fresh venv, offline
if [ "${HBMSIM_QUICK:-0}" != 1 ]; then
  [ -x scripts/sanitize.sh ] && ./scripts/sanitize.sh
  [ -x scripts/fuzz.sh ] && ./scripts/fuzz.sh
fi
echo "hbmsim: all test stages passed"
