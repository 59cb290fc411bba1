#!/usr/bin/env bash
# Builds the libFuzzer harnesses (tests/fuzz: clang, ASan + UBSan, coverage) into ${BUILD_DIR:-build-fuzz}
# and runs each one for HBMSIM_FUZZ_SECONDS (default 10) from its seed corpus, as many at once as there are cores
# (each harness is one single-threaded process: two cores fuzz two harnesses for the same time as one would).
# A BUILD_DIR already configured for fuzzing with the same clang keeps its own flags (test.sh runs the harnesses
# of the sanitizer tree, which scripts/sanitize.sh builds with HBMSIM_SANITIZE_FUZZ=1); any other is configured
# as below.
# New corpus entries and findings go to $BUILD_DIR/fuzz-corpus and $BUILD_DIR/fuzz-findings, never into
# the repository. Exits 1 on any finding (crash, uncaught exception, sanitizer report, leak, timeout, out of
# memory) and prints each finding's input and the command that reproduces it.
# Usage: scripts/fuzz.sh [HARNESS...]   (default: all; e.g. scripts/fuzz.sh run_config cli)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build-fuzz}
SECONDS_EACH=${HBMSIM_FUZZ_SECONDS:-10}
ALL=(system model hf_config profile run_config reference_runs fit_parameters maxtext_log cli)
HARNESSES=("$@")
[ ${#HARNESSES[@]} -gt 0 ] || HARNESSES=("${ALL[@]}")

if ! grep -Eq 'add_subdirectory\(tests/fuzz\)' CMakeLists.txt; then
  echo "fuzz.sh: CMakeLists.txt does not add tests/fuzz; add: if(HBMSIM_FUZZ) add_subdirectory(tests/fuzz) endif()" >&2
  exit 1
fi
CXX_FUZZ=${CXX_FUZZ:-$(command -v clang++ || command -v clang++-14 || true)}
if [ -z "$CXX_FUZZ" ] || ! CXX_FUZZ=$(command -v "$CXX_FUZZ"); then
  echo "fuzz.sh: clang++ not found (scripts/install-deps.sh installs clang)" >&2
  exit 1
fi
# libFuzzer and clang's sanitizer runtimes are in libclang-rt-14-dev (only recommended by clang's packages).
probe=$(mktemp -d)
printf '#include <cstdint>\n#include <cstddef>\nextern "C" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }\n' >"$probe/p.cpp"
if ! "$CXX_FUZZ" -fsanitize=fuzzer,address,undefined "$probe/p.cpp" -o "$probe/p" >"$probe/log" 2>&1; then
  cat "$probe/log" >&2
  rm -rf "$probe"
  echo "fuzz.sh: $CXX_FUZZ cannot link a libFuzzer harness; install libclang-rt-14-dev (apt-get install libclang-rt-14-dev)" >&2
  exit 1
fi
rm -rf "$probe"

start=$(date +%s)
GEN=()
command -v ninja >/dev/null 2>&1 && GEN=(-G Ninja)
# Configured every time (seconds when nothing changed); the log stays in the build directory. A tree
# configured with another compiler is started afresh.
if [ -f "$BUILD_DIR/CMakeCache.txt" ] &&
   ! grep -qx "CMAKE_CXX_COMPILER:[A-Z]*=$CXX_FUZZ" "$BUILD_DIR/CMakeCache.txt"; then
  rm -rf "$BUILD_DIR"
fi
mkdir -p "$BUILD_DIR"
if grep -qx "HBMSIM_FUZZ:BOOL=ON" "$BUILD_DIR/CMakeCache.txt" 2>/dev/null; then
  cmake -S . -B "$BUILD_DIR" >"$BUILD_DIR/configure.log" 2>&1 || { cat "$BUILD_DIR/configure.log"; exit 1; }
else
  # -O1 with line tables (as OSS-Fuzz builds) compiles in half the time of -O2 -g; asserts stay on.
  cmake -S . -B "$BUILD_DIR" "${GEN[@]}" -DCMAKE_CXX_COMPILER="$CXX_FUZZ" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" -DHBMSIM_FUZZ=ON -DHBMSIM_PYTHON=OFF -DHBMSIM_BENCHMARKS=OFF \
    -DCMAKE_UNITY_BUILD=ON >"$BUILD_DIR/configure.log" 2>&1 || { cat "$BUILD_DIR/configure.log"; exit 1; }
fi
targets=()
for h in "${HARNESSES[@]}"; do targets+=("fuzz_$h"); done
cmake --build "$BUILD_DIR" -j "$(nproc)" --target "${targets[@]}"
built=$(date +%s)

findings_dir="$BUILD_DIR/fuzz-findings"
rm -rf "$findings_dir"
mkdir -p "$findings_dir"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:symbolize=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# One harness: its log, the exit status in $findings_dir/$h.rc. Artifacts are named after the harness.
fuzz_one() {
  local h=$1
  local bin="$BUILD_DIR/tests/fuzz/fuzz_$h" seeds="tests/fuzz/corpus/$h" work="$BUILD_DIR/fuzz-corpus/$h"
  local dict="tests/fuzz/dict/json.dict"
  [ "$h" = cli ] && dict="tests/fuzz/dict/cli.dict"
  mkdir -p "$work"
  local rc=0
  # The outer timeout only guards against a hang outside libFuzzer's own -timeout (per input).
  timeout -k 10 $((SECONDS_EACH + 180)) "$bin" "$work" "$seeds" -dict="$dict" -max_total_time="$SECONDS_EACH" \
    -timeout=30 -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$findings_dir/$h-" \
    >"$findings_dir/$h.log" 2>&1 || rc=$?
  echo $rc >"$findings_dir/$h.rc"
}
parallel=$(nproc)
running=0
for h in "${HARNESSES[@]}"; do
  if [ $running -ge "$parallel" ]; then
    wait -n || true
    running=$((running - 1))
  fi
  echo "fuzz.sh: $h for ${SECONDS_EACH}s"
  fuzz_one "$h" &
  running=$((running + 1))
done
wait || true
# Reported in the harnesses' order, whatever order they ended in.
failed=()
for h in "${HARNESSES[@]}"; do
  bin="$BUILD_DIR/tests/fuzz/fuzz_$h"
  log="$findings_dir/$h.log"
  rc=$(cat "$findings_dir/$h.rc" 2>/dev/null || echo "no status")
  artifacts=$(find "$findings_dir" -maxdepth 1 -type f \( -name "$h-crash-*" -o -name "$h-leak-*" -o -name "$h-timeout-*" \
    -o -name "$h-oom-*" \) | sort)
  echo "fuzz.sh: $h:"
  tail -n 12 "$log" | grep -E '^(stat::number_of_executed_units|stat::peak_rss_mb|#[0-9]+ +DONE)' | sed "s/^/  /" || true
  if [ "$rc" != 0 ] || [ -n "$artifacts" ]; then
    failed+=("$h")
    echo "fuzz.sh: FINDING in $h (exit status $rc); log: $log"
    grep -m 12 -E 'ERROR: |runtime error|terminate called|what\(\)|property violated|does not reload|SUMMARY' "$log" | sed 's/^/  /' || true
    for a in $artifacts; do
      echo "  input: $a"
      echo "  reproduce: $bin $a"
    done
    [ -n "$artifacts" ] || echo "  (no input written; see the log)"
  fi
done
end=$(date +%s)
echo "fuzz.sh: build $((built - start)) s, fuzzing $((end - built)) s"
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz.sh: findings in: ${failed[*]}" >&2
  exit 1
fi
echo "fuzz.sh: no findings in ${HARNESSES[*]}"
