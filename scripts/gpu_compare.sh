#!/usr/bin/env bash
# Predicted vs measured, HERE (where hbmsim is built), from what a GPU run of scripts/gpu_check_all.sh
# returned: OUTDIR holds jax_results.json (the JAX check) and profile.json / raw.json (the calibration).
# Runs `hbmsim simulate` for every JAX configuration with the commands generated from
# scripts/jax_check/policies.json (the table the JAX run used), with the datasheet and with the measured
# profile, and prints the table (docs/calibration-profile.md says how to read it).
# Usage: scripts/gpu_compare.sh OUTDIR [COMPARE.json]
# Env: HBMSIM (default REPO/build/cli/hbmsim), PYTHON (default python3; JAX is not needed).
# Exit: 0 table printed, 1 an hbmsim run failed, 2 missing input (OUTDIR lacks jax_results.json, no hbmsim).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dir=${1:?usage: gpu_compare.sh OUTDIR [COMPARE.json]}
hbmsim=${HBMSIM:-$repo/build/cli/hbmsim}
python=${PYTHON:-python3}

if [ -f "$dir/summary.txt" ]; then
  head -n 2 "$dir/summary.txt"
  sed -n '/^== stages/,/^$/p' "$dir/summary.txt"
fi
if [ ! -f "$dir/jax_results.json" ]; then
  echo "gpu_compare: $dir/jax_results.json is missing (the JAX check did not run or wrote nothing; see $dir/summary.txt)" >&2
  exit 2
fi
if [ ! -x "$hbmsim" ]; then
  echo "gpu_compare: no hbmsim at $hbmsim (build it: ./scripts/build.sh, or set HBMSIM)" >&2
  exit 2
fi
args=(--results "$dir/jax_results.json" --hbmsim "$hbmsim")
if [ -f "$dir/profile.json" ]; then
  args+=(--calibration "$dir/profile.json")
else
  echo "gpu_compare: no $dir/profile.json: datasheet predictions only" >&2
fi
[ $# -ge 2 ] && args+=(--json "$2")
exec "$python" "$repo/scripts/jax_check/compare.py" "${args[@]}"
