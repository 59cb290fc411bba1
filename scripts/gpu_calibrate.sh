#!/usr/bin/env bash
# Builds hbmsim-calibrate-cuda standalone (only hwmodels/calibration, so the rest of hbmsim's
# dependencies need not exist on the GPU machine) and measures the local GPU into OUTDIR:
#   OUTDIR/profile.json (hbmsim-profile/1), OUTDIR/raw.json (every repeat), OUTDIR/nvidia-smi.txt
# Usage: scripts/gpu_calibrate.sh OUTDIR [extra hbmsim-calibrate-cuda flags, e.g. --quick]
# Env: BUILD_DIR (default REPO/build-gpu), HBMSIM_NLOHMANN_JSON_INCLUDE_DIR (dir holding
#      nlohmann/json.hpp when the nlohmann_json package is not installed), CUDA_HOME (default
#      /usr/local/cuda; used when cmake is missing: then nvcc and g++ are called directly),
#      HBMSIM_CALIB_NO_CMAKE=1 (use that direct build even where cmake exists),
#      HBMSIM_CALIB_BUILD_ONLY=1 (build, skip the GPU check and the measurement: for testing the script).
# Exit: 0 ok, 3 no GPU, other non-zero on build or measurement failure. Stays under 5 minutes.
set -euo pipefail

if [ $# -lt 1 ]; then
  echo "usage: $0 OUTDIR [hbmsim-calibrate-cuda flags]" >&2
  exit 2
fi
out=$1
shift
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-$repo/build-gpu}
say() { echo "gpu_calibrate: $*" >&2; }

build_only=${HBMSIM_CALIB_BUILD_ONLY:-0}
if [ "$build_only" != 1 ]; then
  if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    say "no NVIDIA GPU visible (nvidia-smi missing or lists no GPU); nothing measured"
    exit 3
  fi
  mkdir -p "$out"
  {
    nvidia-smi
    echo
    nvidia-smi -L
    echo
    nvidia-smi topo -m || true
    echo
    nvidia-smi -q
  } >"$out/nvidia-smi.txt" 2>&1 || true
fi

start=$(date +%s)
src=$repo/hwmodels/calibration
bin=$build/hbmsim-calibrate-cuda
if command -v cmake >/dev/null 2>&1 && [ "${HBMSIM_CALIB_NO_CMAKE:-0}" != 1 ]; then
  cmake_args=(-S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release)
  if [ -n "${HBMSIM_NLOHMANN_JSON_INCLUDE_DIR:-}" ]; then
    cmake_args+=("-DHBMSIM_NLOHMANN_JSON_INCLUDE_DIR=$HBMSIM_NLOHMANN_JSON_INCLUDE_DIR")
  fi
  say "configuring: cmake ${cmake_args[*]}"
  timeout 90 cmake "${cmake_args[@]}"
  say "building hbmsim-calibrate-cuda"
  timeout 150 cmake --build "$build" --target hbmsim-calibrate-cuda -j "$(nproc)"
else
  # No cmake on this machine: the tool is four files, so compile them directly.
  cuda=${CUDA_HOME:-/usr/local/cuda}
  nvcc=$cuda/bin/nvcc
  command -v "$nvcc" >/dev/null 2>&1 || nvcc=nvcc
  json_inc=()
  if [ -n "${HBMSIM_NLOHMANN_JSON_INCLUDE_DIR:-}" ]; then json_inc=(-isystem "$HBMSIM_NLOHMANN_JSON_INCLUDE_DIR"); fi
  say "no cmake (or HBMSIM_CALIB_NO_CMAKE=1): building with $nvcc and g++ into $build"
  mkdir -p "$build"
  "$nvcc" -O3 -std=c++17 -gencode 'arch=compute_90,code=[sm_90,compute_90]' -I"$src/src" \
    -c "$src/src/kernels.cu" -o "$build/kernels.o" &
  nvcc_pid=$!
  for f in main measure profile; do
    g++ -O3 -std=c++20 -Wall -Wextra -Wpedantic -I"$src/src" -isystem "$cuda/include" "${json_inc[@]}" \
      -c "$src/src/$f.cpp" -o "$build/$f.o"
  done
  wait "$nvcc_pid"
  g++ -o "$bin" "$build"/main.o "$build"/measure.o "$build"/profile.o "$build"/kernels.o \
    -L"$cuda/lib64" -lcublasLt -lcudart -Wl,-rpath,"$cuda/lib64"
fi
if [ ! -x "$bin" ]; then
  say "$bin was not built (is nvcc found? is nlohmann/json.hpp found? see the build output above)"
  exit 1
fi
say "built in $(($(date +%s) - start)) s"
if [ "$build_only" = 1 ]; then exit 0; fi
mkdir -p "$out"
say "measuring"

# Bounded so the whole script stays under 5 minutes even if the build was slow.
left=$((290 - ($(date +%s) - start)))
if [ "$left" -lt 60 ]; then left=60; fi
set +e
timeout "$left" "$bin" -o "$out/profile.json" --raw "$out/raw.json" "$@"
rc=$?
set -e
if [ "$rc" -ne 0 ]; then
  say "hbmsim-calibrate-cuda failed with status $rc (124 = timed out after ${left} s)"
  exit "$rc"
fi
say "done in $(($(date +%s) - start)) s: $out/profile.json $out/raw.json $out/nvidia-smi.txt"
