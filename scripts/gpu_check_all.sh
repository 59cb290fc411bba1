#!/usr/bin/env bash
# The one prepared script for a lent GPU machine (README "Calibration on a GPU"). In order:
#   1. preflight (about 20 s): prints what the run depends on (nvcc, cuBLASLt, C++ compiler, glibc, cmake,
#      ninja/make, python + `import jax`, the GPU) and stops early, with the reason, when the build cannot work;
#   2. builds hbmsim-calibrate-cuda (scripts/gpu_calibrate.sh: vendored nlohmann/json; Ninja, else make, else
#      nvcc + c++ directly); also without a GPU, so a rehearsal proves the toolchain;
#   3. with a GPU: measures the calibration profile, then the JAX Llama check (scripts/jax_check/);
#   4. packages at most 6 files into $OUT and lists them.
# The predicted-vs-measured comparison does not run here: it needs hbmsim, which this machine does not build.
# Run scripts/gpu_compare.sh OUT afterwards where hbmsim is built.
#
# Usage: OUT=/path scripts/gpu_check_all.sh [--quick]      (OUT defaults to ./gpu-check-out)
# Env: PYTHON (default python3), BUILD_DIR (calibration build dir, default REPO/build-gpu),
#      GPU_CHECK_TOTAL_S (default 420: the whole check's wall-time limit), GPU_CHECK_PACKAGING_S (default 30:
#      kept for packaging after the stages' deadline), CXX, CUDA_HOME, HBMSIM_CALIB_BUILD.
# Time: stages 2-3 run in their own process group under one deadline (GPU_CHECK_TOTAL_S minus 30 s for
# packaging); at the deadline the whole group gets SIGTERM, then SIGKILL, so no inner process outlives it.
# Files under $OUT (nothing else): summary.txt, profile.json, raw.json, jax_results.json, gpu-check.tar.gz
# (all logs, nvidia-smi.txt, the JAX model config.json, status.json).
# Exit: 0 everything ran, 3 no GPU (after the build and packaging), 4 preflight found the build impossible,
#       5 build failed, 6 a measurement stage failed or timed out (what worked is still in $OUT).
set -uo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
self=$repo/scripts/gpu_check_all.sh

# ------------------------------------------------------------------------------------------------------
# Stages 2-3, run by the supervisor below as `gpu_check_all.sh --stages WORK [args]` in their own group.
# ------------------------------------------------------------------------------------------------------
if [ "${1:-}" = "--stages" ]; then
  work=$2
  shift 2
  deadline=$GPU_CHECK_STAGE_DEADLINE  # epoch seconds
  left() { echo $((deadline - $(date +%s))); }
  note() { echo "$1 $2" >>"$work/stages.txt"; echo "gpu_check_all: stage $1: $2" >&2; }
  export BUILD_DIR=${BUILD_DIR:-$repo/build-gpu}
  if [ -n "${GPU_CHECK_TEST_STAGE_CMD:-}" ]; then  # tests only: a stand-in for the stages (e.g. a hang)
    bash -c "$GPU_CHECK_TEST_STAGE_CMD"
    exit $?
  fi

  HBMSIM_CALIB_BUILD_ONLY=1 bash "$repo/scripts/gpu_calibrate.sh" "$work/calib" >"$work/build.log" 2>&1
  rc=$?
  tail -n 5 "$work/build.log" >&2
  note build "$rc"
  [ "$rc" -eq 0 ] || exit 5
  if [ "$GPU_CHECK_HAVE_GPU" != 1 ]; then
    note measure "skipped: no GPU"
    exit 3
  fi

  # Calibration: stages not started within budget_s are skipped (recorded in raw.json); the timeout is the
  # backstop. Then the JAX check gets what is left.
  quick=()
  for a in "$@"; do [ "$a" = --quick ] && quick=(--quick); done
  limit=$(($(left) - 100))
  [ "$limit" -gt 170 ] && limit=170
  if [ "$limit" -lt 40 ]; then
    note calibrate "skipped: only $(left) s left"
  else
    HBMSIM_CALIB_MEASURE_TIMEOUT_S=$limit bash "$repo/scripts/gpu_calibrate.sh" "$work/calib" \
      --budget-s $((limit - 40)) "${quick[@]}" >"$work/calibrate.log" 2>&1
    rc=$?
    tail -n 12 "$work/calibrate.log" >&2
    note calibrate "$rc"
  fi

  python=${PYTHON:-python3}
  if [ "$GPU_CHECK_HAVE_JAX" != 1 ]; then
    note jax "skipped: jax not importable with $python"
  elif [ "$(left)" -lt 60 ]; then
    note jax "skipped: only $(left) s left"
  else
    l=$(left)
    # The script stops starting configs when its budget runs out; the group deadline is the backstop.
    timeout --foreground -k 5 "$l" "$python" "$repo/scripts/jax_check/llama_offload_check.py" --out "$work/jax" \
      --time-budget-s $((l - 15)) --config-timeout-s 150 >"$work/jax.log" 2>&1
    rc=$?
    tail -n 12 "$work/jax.log" >&2
    note jax "$rc"
  fi
  exit 0
fi

# ------------------------------------------------------------------------------------------------------
# Supervisor: preflight, the stages under one process-group deadline, packaging.
# ------------------------------------------------------------------------------------------------------
OUT=${OUT:-$PWD/gpu-check-out}
total_s=${GPU_CHECK_TOTAL_S:-420}
start=$(date +%s)
mkdir -p "$OUT"
work=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")
mkdir -p "$work/calib" "$work/jax"
log() { echo "gpu_check_all: [$(($(date +%s) - start)) s] $*" | tee -a "$work/gpu_check_all.log" >&2; }
files=(summary.txt profile.json raw.json jax_results.json gpu-check.tar.gz)
tarball_has="gpu_check_all.log preflight.txt stages.txt status.json build.log calibrate.log jax.log nvidia-smi.txt config.json"

log "repo $repo, output $OUT, work dir $work, limit ${total_s} s"
log "will write under $OUT: ${files[*]} (the tarball: $tarball_has)"

# --- 1. preflight ----------------------------------------------------------------------------------------
cuda=${CUDA_HOME:-/usr/local/cuda}
python=${PYTHON:-python3}
fatal=()
have_gpu=0
have_jax=0
probe() { timeout -k 1 8 "$@" 2>&1; }  # bounded probes: they finish before any stage starts
pf() { printf '%-12s %s\n' "$1" "$2" | tee -a "$work/preflight.txt" >&2; }
{
  nvcc=${CUDACXX:-$(command -v nvcc || echo "$cuda/bin/nvcc")}
  nvcc=$(readlink -f "$nvcc" 2>/dev/null || echo "$nvcc")
  if [ -x "$nvcc" ]; then
    pf nvcc "$nvcc: $(probe "$nvcc" --version | grep -i release | head -n 1)"
  else
    pf nvcc "MISSING (not on PATH, not $cuda/bin/nvcc)"
    fatal+=("no nvcc")
  fi
  lt_h=$cuda/include/cublasLt.h
  lt_so=$(ls "$cuda"/lib64/libcublasLt.so* "$cuda"/targets/*/lib/libcublasLt.so* 2>/dev/null | head -n 1)
  if [ -f "$lt_h" ] && [ -n "$lt_so" ]; then
    pf cuBLASLt "$lt_h, $lt_so"
  else
    pf cuBLASLt "MISSING (header $lt_h: $([ -f "$lt_h" ] && echo found || echo missing), library: ${lt_so:-missing})"
    fatal+=("no cuBLASLt")
  fi
  cxx=${CXX:-$(command -v c++ || command -v g++ || true)}
  if [ -n "$cxx" ] && command -v "$cxx" >/dev/null 2>&1; then
    pf c++ "$cxx: $(probe "$cxx" --version | head -n 1)"
  else
    pf c++ "MISSING (no c++ or g++; set CXX)"
    fatal+=("no C++ compiler")
  fi
  pf glibc "$( (getconf GNU_LIBC_VERSION || ldd --version | head -n 1) 2>/dev/null)"
  if command -v cmake >/dev/null 2>&1; then pf cmake "$(probe cmake --version | head -n 1)"; else pf cmake "none"; fi
  if [ -n "${HBMSIM_CALIB_BUILD:-}" ]; then
    pf build "HBMSIM_CALIB_BUILD=$HBMSIM_CALIB_BUILD"
  elif command -v cmake >/dev/null 2>&1 && command -v ninja >/dev/null 2>&1; then
    pf build "cmake + ninja $(probe ninja --version)"
  elif command -v cmake >/dev/null 2>&1 && command -v make >/dev/null 2>&1; then
    pf build "cmake + make (no ninja)"
  else
    pf build "direct nvcc + c++ (no cmake, or neither ninja nor make)"
  fi
  if [ -f "$repo/third_party/nlohmann_json/include/nlohmann/json.hpp" ]; then
    pf json "vendored third_party/nlohmann_json (3.11.2)"
  else
    pf json "MISSING third_party/nlohmann_json/include/nlohmann/json.hpp"
    fatal+=("vendored nlohmann/json missing")
  fi
  if command -v "$python" >/dev/null 2>&1; then
    pf python "$(command -v "$python"): $(probe "$python" --version)"
    jax_v=$(probe "$python" -c "import jax; print(jax.__version__)")
    jax_rc=$?
    jax_v=$(echo "$jax_v" | tail -n 1)
    if [ "$jax_rc" -eq 0 ]; then
      pf jax "$jax_v"
      have_jax=1
    else
      pf jax "not importable ($jax_v): the JAX check will be skipped"
    fi
  else
    pf python "MISSING ($python): the JAX check will be skipped"
  fi
  if command -v nvidia-smi >/dev/null 2>&1 && probe nvidia-smi -L | grep -q '^GPU '; then
    pf gpu "$(probe nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -n 1)"
    have_gpu=1
  else
    pf gpu "NONE (nvidia-smi $(command -v nvidia-smi >/dev/null 2>&1 && echo "lists no GPU" || echo missing))"
  fi
  pf disk "$(df -h "$work" 2>/dev/null | tail -n 1 | awk '{print $4 " free in " $6}')"
}
log "preflight done"

stage_rc=0
if [ "${#fatal[@]}" -gt 0 ]; then
  log "preflight: cannot build: ${fatal[*]}; nothing else runs"
  stage_rc=4
else
  # --- 2-3. the stages, in their own process group, under one deadline -------------------------------
  deadline=$((start + total_s - ${GPU_CHECK_PACKAGING_S:-30}))
  export GPU_CHECK_STAGE_DEADLINE=$deadline GPU_CHECK_HAVE_GPU=$have_gpu GPU_CHECK_HAVE_JAX=$have_jax PYTHON=$python
  if command -v setsid >/dev/null 2>&1; then
    setsid bash "$self" --stages "$work" "$@" &
  else
    set -m  # job control: the background job gets its own process group
    bash "$self" --stages "$work" "$@" &
    set +m
  fi
  pid=$!
  log "stages running as process group $pid, deadline in $((deadline - $(date +%s))) s"
  timed_out=0
  while kill -0 "$pid" 2>/dev/null; do
    if [ "$(date +%s)" -ge "$deadline" ]; then
      log "deadline reached: SIGTERM to process group $pid"
      kill -TERM -- "-$pid" 2>/dev/null
      for _ in 1 2 3 4 5; do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
      kill -KILL -- "-$pid" 2>/dev/null
      timed_out=1
      break
    fi
    sleep 1
  done
  wait "$pid"
  stage_rc=$?
  [ "$timed_out" = 1 ] && { stage_rc=6; echo "deadline killed" >>"$work/stages.txt"; }
  # Anything of the group still alive (it should not be) goes now.
  kill -KILL -- "-$pid" 2>/dev/null
  log "stages finished with status $stage_rc"
  if [ "$stage_rc" -eq 0 ]; then
    grep -E '^(calibrate|jax) ' "$work/stages.txt" | grep -vqE ' (0|skipped: jax not importable.*)$' && stage_rc=6
  fi
fi

# --- 4. packaging: at most 6 files under $OUT -------------------------------------------------------------
[ -f "$work/calib/nvidia-smi.txt" ] && mv "$work/calib/nvidia-smi.txt" "$work/nvidia-smi.txt"
[ -f "$work/jax/config.json" ] && cp "$work/jax/config.json" "$work/config.json"
"$python" - "$work" "$stage_rc" "$have_gpu" "$have_jax" <<'EOF' 2>/dev/null || echo "{\"exit\": $stage_rc}" >"$work/status.json"
import json, sys
work, rc, gpu, jax = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4] == "1"
stages = {}
try:
    for line in open(work + "/stages.txt"):
        name, _, value = line.strip().partition(" ")
        stages[name] = value
except OSError:
    pass
json.dump({"format": "hbmsim-gpu-check/1", "exit": rc, "gpu": gpu, "jax": jax, "stages": stages},
          open(work + "/status.json", "w"), indent=2)
EOF
[ -f "$work/calib/profile.json" ] && cp "$work/calib/profile.json" "$OUT/profile.json"
[ -f "$work/calib/raw.json" ] && cp "$work/calib/raw.json" "$OUT/raw.json"
[ -f "$work/jax/results.json" ] && cp "$work/jax/results.json" "$OUT/jax_results.json"
log "packaging: exit status $stage_rc"
in_tar=()
for f in $tarball_has; do [ -f "$work/$f" ] && in_tar+=("$f"); done
tar -czf "$OUT/gpu-check.tar.gz" -C "$work" "${in_tar[@]}" 2>/dev/null
{
  echo "hbmsim gpu_check_all: exit $stage_rc (0 ok, 3 no GPU, 4 cannot build, 5 build failed, 6 a stage failed)"
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ), wall $(($(date +%s) - start)) s of $total_s s"
  echo
  echo "== preflight"
  cat "$work/preflight.txt"
  echo
  echo "== stages"
  cat "$work/stages.txt" 2>/dev/null || echo "(none ran)"
  echo
  echo "== files under $OUT"
  for f in "${files[@]}"; do
    if [ -f "$OUT/$f" ] || [ "$f" = summary.txt ]; then echo "written: $f"; else echo "not written: $f"; fi
  done
  echo "gpu-check.tar.gz holds: ${in_tar[*]}"
  echo
  echo "Next, where hbmsim is built: scripts/gpu_compare.sh OUTDIR (predicted vs measured)"
} >"$OUT/summary.txt"
cat "$OUT/summary.txt" >&2
rm -rf "$work"
exit "$stage_rc"
