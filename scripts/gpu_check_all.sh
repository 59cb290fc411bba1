#!/usr/bin/env bash
# One prepared script for a GPU machine: the CUDA calibration into $OUT/calib and, if JAX is importable,
# the Llama offload check into $OUT/jax (compared with hbmsim when a binary is found). Logs are tee'd
# into $OUT. Every stage has a timeout so the whole run stays under 8 minutes.
# Usage: OUT=/path scripts/gpu_check_all.sh [--quick]      (OUT defaults to ./gpu-check-out)
# Env: PYTHON (default python3), HBMSIM (path to an hbmsim binary; default build*/hbmsim if present).
set -uo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT/calib" "$OUT/jax"
total_budget_s=470  # 8 minutes minus a margin for start-up and copying results back
start=$(date +%s)
elapsed() { echo $(($(date +%s) - start)); }
log() { echo "gpu_check_all: [$(elapsed) s] $*" | tee -a "$OUT/gpu_check_all.log" >&2; }

log "repo $repo, output $OUT"
timeout 300 bash "$repo/scripts/gpu_calibrate.sh" "$OUT/calib" "$@" 2>&1 | tee "$OUT/calibrate.log"
calib_rc=${PIPESTATUS[0]}
log "calibration exit status $calib_rc"

python=${PYTHON:-python3}
jax_rc=0
if ! "$python" -c "import jax" >/dev/null 2>&1; then
  log "JAX is not importable with $python: JAX check skipped"
  echo "skipped: jax not importable" >"$OUT/jax.log"
else
  jax_args=(--out "$OUT/jax")
  if [ -f "$OUT/calib/profile.json" ]; then jax_args+=(--calibration "$OUT/calib/profile.json"); fi
  hbmsim=${HBMSIM:-}
  if [ -z "$hbmsim" ]; then
    for c in "$repo"/build/hbmsim "$repo"/build*/hbmsim "$repo"/build/*/hbmsim; do
      if [ -x "$c" ]; then hbmsim=$c; break; fi
    done
  fi
  if [ -n "$hbmsim" ]; then jax_args+=(--hbmsim "$hbmsim"); fi
  left=$((total_budget_s - $(elapsed)))
  if [ "$left" -lt 60 ]; then
    log "only $left s left: JAX check skipped"
  else
    # The script itself stops starting configs when its budget runs out; timeout is the backstop.
    log "JAX check with ${left} s: ${jax_args[*]}"
    timeout "$left" "$python" "$repo/scripts/jax_check/llama_offload_check.py" "${jax_args[@]}" \
      --time-budget-s $((left - 15)) 2>&1 | tee "$OUT/jax.log"
    jax_rc=${PIPESTATUS[0]}
    log "JAX check exit status $jax_rc"
  fi
fi

log "done: calibration $calib_rc, jax $jax_rc; files under $OUT"
if [ "$calib_rc" -ne 0 ]; then exit "$calib_rc"; fi
exit "$jax_rc"
