#!/usr/bin/env bash
# Every test: install what is missing, build, run the whole suite (C++, CLI, Python, notebooks), pip install
# in a fresh venv, then the sanitizer build's suite and the bounded fuzzers. HBMSIM_QUICK=1 skips the sanitizer
# and fuzzer stages. Each stage's wall time is printed as it ends (CI keeps under 25 minutes on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
T0=$SECONDS
stage() {
  local name=$1 t=$SECONDS
  shift
  "$@"
  echo "test.sh: $name took $((SECONDS - t)) s ($((SECONDS - T0)) s so far)"
}
stage "installing dependencies" ./scripts/install-deps.sh
stage "the Release build" ./scripts/build.sh
stage "the test suite" ctest --test-dir build -j "$(nproc)" --output-on-failure --timeout 600
stage "the pip install check" ./scripts/test_pip_install.sh  # pip install . and -e . in a fresh venv, offline
if [ "${HBMSIM_QUICK:-0}" != 1 ]; then
  # One clang tree serves both: the sanitizer build also builds the fuzz harnesses, which then run from it
  # (about 160 s less than a fuzzer tree of their own). Where it could not (no libFuzzer), fuzz.sh builds its own.
  stage "the sanitizer build and suite" env HBMSIM_SANITIZE_FUZZ=1 ./scripts/sanitize.sh
  fuzz_tree=build-fuzz
  grep -qx "HBMSIM_FUZZ:BOOL=ON" build-asan/CMakeCache.txt 2>/dev/null && fuzz_tree=build-asan
  stage "the fuzzer runs" env BUILD_DIR=$fuzz_tree ./scripts/fuzz.sh
fi
echo "hbmsim: all test stages passed in $((SECONDS - T0)) s"
