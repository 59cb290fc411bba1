#!/usr/bin/env bash
# Builds hbmsim with AddressSanitizer and UndefinedBehaviorSanitizer (HBMSIM_SANITIZE=ON, RelWithDebInfo)
# into ${BUILD_DIR:-build-asan} and runs the ctest suite there (less its slowest whole-corpus, layout-search and
# GPU-check rehearsal tests), leaks checked, stopping at the first sanitizer report of each test. Exits non-zero on any failure. Extra arguments go to ctest (e.g. -R cli).
# Compiler: $HBMSIM_SANITIZE_CXX, else clang++ where it links sanitized programs (it builds this tree in
# half g++'s time), else g++.
# HBMSIM_SANITIZE_FUZZ=1 (test.sh sets it): with clang that links libFuzzer, the tree also builds the fuzz
# harnesses (HBMSIM_FUZZ=ON, the libraries instrumented for libFuzzer's coverage), so that scripts/fuzz.sh can
# run them from here (BUILD_DIR=build-asan) instead of building a tree of its own: about 30 s more here, about
# 190 s less there.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build-asan}
# clang's sanitizer runtimes are in libclang-rt-14-dev, which apt installs with clang only as a
# recommendation: without it, fall back to the default compiler (g++ brings libasan and libubsan).
links_sanitized() {
  local probe
  probe=$(mktemp -d)
  printf 'int main() { return 0; }\n' >"$probe/p.cpp"
  "$1" -fsanitize=address,undefined "$probe/p.cpp" -o "$probe/p" >/dev/null 2>&1
  local ok=$?
  rm -rf "$probe"
  return $ok
}
if [ -n "${HBMSIM_SANITIZE_CXX:-}" ]; then
  CXX_SANITIZE=$HBMSIM_SANITIZE_CXX
else
  CXX_SANITIZE=$(command -v clang++ || command -v clang++-14 || true)
  if [ -n "$CXX_SANITIZE" ] && ! links_sanitized "$CXX_SANITIZE"; then
    echo "sanitize.sh: $CXX_SANITIZE cannot link -fsanitize=address,undefined (libclang-rt-14-dev missing?); using g++" >&2
    CXX_SANITIZE=""
  fi
  [ -n "$CXX_SANITIZE" ] || CXX_SANITIZE=$(command -v g++ || command -v c++ || true)
fi
COMPILER=()
if [ -n "$CXX_SANITIZE" ]; then
  CXX_SANITIZE=$(command -v "$CXX_SANITIZE") || { echo "sanitize.sh: compiler $HBMSIM_SANITIZE_CXX not found" >&2; exit 1; }
  COMPILER=(-DCMAKE_CXX_COMPILER="$CXX_SANITIZE")
fi
FUZZ=OFF
if [ "${HBMSIM_SANITIZE_FUZZ:-0}" = 1 ] && [ -n "$CXX_SANITIZE" ]; then
  probe=$(mktemp -d)
  printf '#include <cstdint>\n#include <cstddef>\nextern "C" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }\n' >"$probe/p.cpp"
  if "$CXX_SANITIZE" -fsanitize=fuzzer,address,undefined "$probe/p.cpp" -o "$probe/p" >/dev/null 2>&1; then
    FUZZ=ON
  else
    echo "sanitize.sh: $CXX_SANITIZE cannot link a libFuzzer harness; the fuzz harnesses are left to scripts/fuzz.sh's own tree" >&2
  fi
  rm -rf "$probe"
fi
start=$(date +%s)
GEN=()
command -v ninja >/dev/null 2>&1 && GEN=(-G Ninja)
# Configured every time (seconds when nothing changed); the log stays in the build directory. A tree
# configured with another compiler is started afresh.
if [ -n "$CXX_SANITIZE" ] && [ -f "$BUILD_DIR/CMakeCache.txt" ] &&
   ! grep -qx "CMAKE_CXX_COMPILER:[A-Z]*=$CXX_SANITIZE" "$BUILD_DIR/CMakeCache.txt"; then
  rm -rf "$BUILD_DIR"
fi
mkdir -p "$BUILD_DIR"
# A unity build (each library's sources compiled as a few combined files) halves a clean build; the tests
# are never combined (tests/CMakeLists.txt).
cmake -S . -B "$BUILD_DIR" "${GEN[@]}" "${COMPILER[@]}" -DHBMSIM_SANITIZE=ON -DHBMSIM_FUZZ=$FUZZ -DHBMSIM_PYTHON=OFF -DHBMSIM_BENCHMARKS=OFF \
  -DCMAKE_UNITY_BUILD=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$BUILD_DIR/configure.log" 2>&1 ||
  { cat "$BUILD_DIR/configure.log"; exit 1; }
cmake --build "$BUILD_DIR" -j "$(nproc)"
built=$(date +%s)
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
status=0
# Left to the Release suite: the three whole-corpus documents (every published run simulated three times;
# their code paths run here in the smaller validation tests), the GPU-check rehearsals (shell and nvcc,
# no sanitized code of ours) and the two DeepSeek-V3 layout searches under Megatron's state (a minute each
# here, 6 s in Release: the search, its pruning, retries and worker threads run here in the smaller layout
# tests).
ctest --test-dir "$BUILD_DIR" -j "$(nproc)" --output-on-failure --timeout 900 \
  -E "^(Validation: docs/|gpu check rehearsal|an MoE search under Megatron's state prunes|under Megatron's state a layout that cannot fit)" \
  "$@" || status=$?
end=$(date +%s)
echo "sanitize.sh: build $((built - start)) s, tests $((end - built)) s"
if [ $status -ne 0 ]; then
  echo "sanitize.sh: the ASan/UBSan test suite failed (status $status); sanitizer reports are in the output above" >&2
  exit $status
fi
echo "sanitize.sh: ASan/UBSan suite passed"
