#!/usr/bin/env bash
# Every test: install what is missing, build, run the whole suite (C++, CLI, Python, notebooks), then the
# sanitizer build's suite and the bounded fuzzers. HBMSIM_QUICK=1 skips the sanitizer and fuzzer stages.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
./scripts/build.sh
ctest --test-dir build -j "$(nproc)" --output-on-failure --timeout 600
if [ "${HBMSIM_QUICK:-0}" != 1 ]; then
  [ -x scripts/sanitize.sh ] && ./scripts/sanitize.sh
  [ -x scripts/fuzz.sh ] && ./scripts/fuzz.sh
fi
echo "hbmsim: all test stages passed"
