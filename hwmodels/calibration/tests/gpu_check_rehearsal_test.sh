#!/usr/bin/env bash
# Rehearses scripts/gpu_check_all.sh as a bare GPU machine would run it, here, without a GPU:
#   - the C++ compiler cannot see Debian's nlohmann/json, Boost, CLI11 or fmt (stripped_cxx.sh), so the build
#     must use the vendored third_party/nlohmann_json;
#   - MODE cmake: CMake with the build tool this machine has (Ninja here); MODE direct: PATH without cmake,
#     ninja and make, so the script must fall back to nvcc + c++ called directly;
# and checks that preflight, build and packaging run and end in "no GPU: exit 3" with every file listed,
# at most 6 files under $OUT, and a built hbmsim-calibrate-cuda that reports the missing GPU itself.
# MODE deadline: the stages hang (a stand-in command with an inner --foreground timeout); the one
# process-group deadline must end them and leave no process behind.
# The build dir lives under WORKROOT and is reused, so only the first run pays for the nvcc compiles.
# Usage: gpu_check_rehearsal_test.sh REPO WORKROOT cmake|direct|deadline
set -u
repo=${1:?usage: gpu_check_rehearsal_test.sh REPO WORKROOT MODE}
root=${2:?}
mode=${3:?}
fail() {
  echo "gpu_check_rehearsal($mode): FAIL: $*"
  [ -f "$root/$mode.stderr" ] && { echo "--- gpu_check_all.sh stderr (last 60 lines):"; tail -n 60 "$root/$mode.stderr"; }
  exit 1
}

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  echo "gpu_check_rehearsal($mode): skipped: this machine has a GPU, so the no-GPU path cannot be rehearsed"
  exit 0
fi
if [ ! -x /usr/local/cuda/bin/nvcc ] && ! command -v nvcc >/dev/null 2>&1; then
  echo "gpu_check_rehearsal($mode): skipped: no nvcc on this machine"
  exit 0
fi

mkdir -p "$root"
cxx=$(bash "$repo/hwmodels/calibration/tests/stripped_cxx.sh" "$root/stripped") || fail "stripped_cxx.sh failed"
out=$root/out-$mode
rm -rf "$out"
mkdir -p "$out"

path=$PATH
if [ "$mode" = direct ]; then
  # Every command of PATH except cmake, ninja and make.
  nob=$root/path-no-build-tools
  rm -rf "$nob"
  mkdir -p "$nob"
  IFS=: read -r -a pdirs <<<"$PATH"
  for d in "${pdirs[@]}"; do
    [ -d "$d" ] || continue
    for f in "$d"/*; do
      n=${f##*/}
      case "$n" in cmake | ninja | make | gmake) continue ;; esac
      [ -x "$f" ] && [ ! -e "$nob/$n" ] && ln -s "$f" "$nob/$n"
    done
  done
  path=$nob
  PATH=$path command -v cmake >/dev/null && fail "cmake still on the stripped PATH"
fi

envs=(PATH="$path" OUT="$out" CXX="$cxx" BUILD_DIR="$root/build-$mode" PYTHON="${PYTHON:-/usr/bin/python3}"
      CUDA_HOME=/usr/local/cuda TMPDIR="$root")
if [ "$mode" = deadline ]; then
  marker=$((900000 + $$ % 99999))
  # An inner timeout longer than the whole limit, and a grandchild: both must die at the deadline.
  envs+=(GPU_CHECK_TOTAL_S=14 GPU_CHECK_PACKAGING_S=4
         GPU_CHECK_TEST_STAGE_CMD="sleep $marker & timeout --foreground 1000 sleep $marker; wait")
fi

# The wall time is the script's own (the stripped compiler set up above can take seconds on a busy machine).
t0=$(date +%s%N)
env "${envs[@]}" timeout -k 10 280 bash "$repo/scripts/gpu_check_all.sh" >"$root/$mode.stdout" 2>"$root/$mode.stderr"
rc=$?
wall_ms=$((($(date +%s%N) - t0) / 1000000))
wall=$((wall_ms / 1000))

# Files: at most 6, and the summary lists each file the script writes.
n_files=$(find "$out" -type f | wc -l)
[ "$n_files" -le 6 ] || fail "$n_files files under OUT (at most 6): $(ls "$out")"
[ -f "$out/summary.txt" ] || fail "no summary.txt"
[ -f "$out/gpu-check.tar.gz" ] || fail "no gpu-check.tar.gz"
for f in summary.txt profile.json raw.json jax_results.json gpu-check.tar.gz; do
  grep -qE "^(written|not written): $f\$" "$out/summary.txt" || fail "summary.txt does not list $f"
done
tar -tzf "$out/gpu-check.tar.gz" >"$root/$mode.tar-list" || fail "the tarball does not list"
for f in gpu_check_all.log preflight.txt status.json; do
  grep -qx "$f" "$root/$mode.tar-list" || fail "the tarball lacks $f"
done

if [ "$mode" = deadline ]; then
  [ "$rc" -eq 6 ] || fail "exit status $rc after the deadline, expected 6"
  grep -q "deadline reached: SIGTERM to process group" "$root/$mode.stderr" || fail "no deadline message"
  sleep 1
  left=$(ps -eo args= | grep -c "^sleep $marker\$\|^timeout --foreground 1000 sleep $marker\$")
  [ "$left" -eq 0 ] || fail "$left process(es) of the stages outlived the deadline"
  # The limit, plus 1 s for bash to start the script and reap it on a loaded machine.
  [ "$wall_ms" -le 15000 ] || fail "took $wall_ms ms for a 14 s limit"
  echo "gpu_check_rehearsal($mode): PASS in $wall s: the hanging stages (inner timeout 1000 s) ended at the deadline, none left, exit 6"
  exit 0
fi

[ "$rc" -eq 3 ] || fail "exit status $rc, expected 3 (no GPU)"
grep -q "exit 3" "$out/summary.txt" || fail "summary.txt does not say exit 3"
# Preflight: each dependency on its own line.
for k in nvcc cuBLASLt c++ glibc cmake build json python jax gpu; do
  awk -v k="$k" '$1 == k { found = 1 } END { exit !found }' "$out/summary.txt" || fail "preflight does not print $k"
done
grep -qE "^gpu +NONE" "$out/summary.txt" || fail "preflight does not say there is no GPU"
awk -v c="$cxx:" '$1 == "c++" && $2 == c { found = 1 } END { exit !found }' "$out/summary.txt" ||
  fail "preflight does not name the stripped compiler"
grep -qx "build 0" <(tar -xzOf "$out/gpu-check.tar.gz" stages.txt) || fail "the build stage did not succeed"
tar -xzOf "$out/gpu-check.tar.gz" build.log >"$root/$mode.build.log" || fail "no build.log in the tarball"
if [ "$mode" = cmake ]; then
  grep -q "nlohmann/json from vendored" "$root/$mode.build.log" || fail "CMake did not use the vendored nlohmann/json"
  want=make
  command -v ninja >/dev/null && want=ninja
  grep -q "built with $want" "$root/$mode.build.log" || fail "not built with $want"
else
  grep -q "json from $repo/third_party/nlohmann_json/include" "$root/$mode.build.log" || fail "direct build not from the vendored json"
  grep -q "built with direct" "$root/$mode.build.log" || fail "not built with the direct nvcc + c++ fallback"
fi
bin=$root/build-$mode/hbmsim-calibrate-cuda
[ -x "$bin" ] || fail "no $bin"
bash "$repo/hwmodels/calibration/tests/no_gpu_test.sh" "$bin" >"$root/$mode.no_gpu" || fail "the built binary: $(cat "$root/$mode.no_gpu")"
[ -z "$(ls -A "$root" | grep '^gpu-check\.')" ] || fail "the work dir was not removed"
echo "gpu_check_rehearsal($mode): PASS in $wall s: preflight, build ($(grep -o 'built with [a-z]* in [0-9]* s' "$root/$mode.build.log")), packaging, exit 3; files: $(ls "$out" | tr '\n' ' ')"
