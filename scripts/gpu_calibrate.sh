#!/usr/bin/env bash
# Builds hbmsim-calibrate-cuda standalone (only hwmodels/calibration and the vendored nlohmann/json in
# third_party/, so none of hbmsim's other dependencies need exist on the GPU machine) and measures the local
# GPU into OUTDIR:
#   OUTDIR/profile.json (hbmsim-profile/1), OUTDIR/raw.json (every repeat, stages.NAME), OUTDIR/nvidia-smi.txt
# Usage: scripts/gpu_calibrate.sh OUTDIR [extra hbmsim-calibrate-cuda flags, e.g. --quick --budget-s 120]
# Build: CMake with Ninja when ninja is on PATH, else CMake with make, else (no cmake, or neither build tool)
# nvcc + the C++ compiler called directly; HBMSIM_CALIB_BUILD=ninja|make|direct forces one.
# Env: BUILD_DIR (default REPO/build-gpu), CXX (C++ compiler, default c++ or g++), CUDA_HOME (default
#      /usr/local/cuda), HBMSIM_NLOHMANN_JSON_INCLUDE_DIR (another nlohmann/json.hpp than the vendored one),
#      HBMSIM_CALIB_CMAKE_ARGS (extra configure arguments, space-separated),
#      HBMSIM_CALIB_BUILD_ONLY=1 (build, skip the GPU check and the measurement: for testing the script),
#      HBMSIM_CALIB_MEASURE_TIMEOUT_S (default 170: the measurement's limit).
# Timeouts here run with --foreground, in the caller's process group, so a caller that kills its group
# (scripts/gpu_check_all.sh) also kills whatever they started: nothing outlives the outer limit.
# Exit: 0 ok, 3 no GPU, 4 profile written but a stage failed (see raw.json stages), 5 build failed, other
# non-zero: measurement failure.
set -euo pipefail

if [ $# -lt 1 ]; then
  echo "usage: $0 OUTDIR [hbmsim-calibrate-cuda flags]" >&2
  exit 2
fi
out=$1
shift
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-$repo/build-gpu}
src=$repo/hwmodels/calibration
bin=$build/hbmsim-calibrate-cuda
cuda=${CUDA_HOME:-/usr/local/cuda}
say() { echo "gpu_calibrate: $*" >&2; }
tmo() { timeout --foreground -k 5 "$@"; }  # same process group as this script (see above)

build_only=${HBMSIM_CALIB_BUILD_ONLY:-0}
if [ "$build_only" != 1 ]; then
  if ! command -v nvidia-smi >/dev/null 2>&1 || ! tmo 20 nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    say "no NVIDIA GPU visible (nvidia-smi missing or lists no GPU); nothing measured"
    exit 3
  fi
  mkdir -p "$out"
  {
    tmo 20 nvidia-smi
    echo
    tmo 20 nvidia-smi -L
    echo
    tmo 20 nvidia-smi topo -m || true
    echo
    tmo 30 nvidia-smi -q
  } >"$out/nvidia-smi.txt" 2>&1 || true
fi

# The build method: the first of ninja, make, direct that this machine has (or HBMSIM_CALIB_BUILD).
method=${HBMSIM_CALIB_BUILD:-}
if [ -z "$method" ]; then
  if command -v cmake >/dev/null 2>&1 && command -v ninja >/dev/null 2>&1; then
    method=ninja
  elif command -v cmake >/dev/null 2>&1 && command -v make >/dev/null 2>&1; then
    method=make
  else
    method=direct
  fi
fi
nvcc=${CUDACXX:-}
if [ -z "$nvcc" ]; then
  if command -v nvcc >/dev/null 2>&1; then nvcc=$(command -v nvcc); else nvcc=$cuda/bin/nvcc; fi
fi
# nvcc finds its headers relative to its own path: a symlink elsewhere must be resolved first.
nvcc=$(readlink -f "$nvcc" 2>/dev/null || echo "$nvcc")
cxx=${CXX:-}
if [ -z "$cxx" ]; then
  if command -v c++ >/dev/null 2>&1; then cxx=c++; else cxx=g++; fi
fi
jobs=$(nproc 2>/dev/null || echo 2)

start=$(date +%s)
mkdir -p "$build"
case "$method" in
  ninja | make)
    gen=Ninja
    [ "$method" = make ] && gen="Unix Makefiles"
    # A build dir configured with the other generator cannot be reused: start it afresh.
    if [ -f "$build/CMakeCache.txt" ] && ! grep -q "^CMAKE_GENERATOR:INTERNAL=$gen\$" "$build/CMakeCache.txt"; then
      say "$build was configured with another generator: removing its CMake cache"
      rm -rf "$build/CMakeCache.txt" "$build/CMakeFiles"
    fi
    cmake_args=(-S "$src" -B "$build" -G "$gen" -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CUDA_COMPILER=$nvcc"
                "-DCMAKE_CXX_COMPILER=$cxx")
    if [ -n "${HBMSIM_NLOHMANN_JSON_INCLUDE_DIR:-}" ]; then
      cmake_args+=("-DHBMSIM_NLOHMANN_JSON_INCLUDE_DIR=$HBMSIM_NLOHMANN_JSON_INCLUDE_DIR")
    fi
    # shellcheck disable=SC2206  # space-separated on purpose
    [ -n "${HBMSIM_CALIB_CMAKE_ARGS:-}" ] && cmake_args+=(${HBMSIM_CALIB_CMAKE_ARGS})
    say "configuring ($method): cmake ${cmake_args[*]}"
    if ! tmo 120 cmake "${cmake_args[@]}"; then
      say "configure failed (the message above names what is missing)"
      exit 5
    fi
    say "building hbmsim-calibrate-cuda with $method, $jobs jobs"
    if ! tmo 240 cmake --build "$build" --target hbmsim-calibrate-cuda -j "$jobs"; then
      say "build failed"
      exit 5
    fi
    ;;
  direct)
    # No cmake, or neither ninja nor make: the tool is four files, so compile them directly. An object is
    # rebuilt only when it is older than its source or any header of the tool (a rerun costs nothing).
    json_inc=${HBMSIM_NLOHMANN_JSON_INCLUDE_DIR:-$repo/third_party/nlohmann_json/include}
    if [ ! -f "$json_inc/nlohmann/json.hpp" ]; then
      say "no $json_inc/nlohmann/json.hpp (the vendored copy is third_party/nlohmann_json/include)"
      exit 5
    fi
    say "building directly with $nvcc and $cxx into $build (json from $json_inc)"
    stale() {  # stale OBJ SRC: true when OBJ must be rebuilt
      [ -f "$1" ] || return 0
      [ "$2" -nt "$1" ] && return 0
      for h in "$src"/src/*.h; do [ "$h" -nt "$1" ] && return 0; done
      return 1
    }
    pids=()
    if stale "$build/kernels.o" "$src/src/kernels.cu"; then
      tmo 240 "$nvcc" -O3 -std=c++17 -gencode 'arch=compute_90,code=[sm_90,compute_90]' -I"$src/src" \
        -c "$src/src/kernels.cu" -o "$build/kernels.o" &
      pids+=($!)
    fi
    for f in main measure profile; do
      if stale "$build/$f.o" "$src/src/$f.cpp"; then
        tmo 240 "$cxx" -O3 -std=c++20 -Wall -Wextra -Wpedantic -I"$src/src" -I"$json_inc" -isystem "$cuda/include" \
          -c "$src/src/$f.cpp" -o "$build/$f.o" &
        pids+=($!)
        # At most `jobs` compiles at once (nvcc counts as one).
        if [ "${#pids[@]}" -ge "$jobs" ]; then
          wait "${pids[0]}" || { say "a compile failed"; exit 5; }
          pids=("${pids[@]:1}")
        fi
      fi
    done
    for p in "${pids[@]}"; do wait "$p" || { say "a compile failed"; exit 5; }; done
    libdir=$cuda/lib64
    [ -e "$libdir/libcublasLt.so" ] || libdir=$cuda/targets/x86_64-linux/lib
    if ! tmo 120 "$cxx" -o "$bin.tmp" "$build"/main.o "$build"/measure.o "$build"/profile.o "$build"/kernels.o \
      -L"$libdir" -lcublasLt -lcudart -Wl,-rpath,"$libdir"; then
      say "link failed"
      exit 5
    fi
    mv "$bin.tmp" "$bin"
    ;;
  *)
    say "HBMSIM_CALIB_BUILD=$method (expected ninja, make or direct)"
    exit 2
    ;;
esac
if [ ! -x "$bin" ]; then
  say "$bin was not built (see the build output above)"
  exit 5
fi
say "built with $method in $(($(date +%s) - start)) s: $bin"
if [ "$build_only" = 1 ]; then exit 0; fi
mkdir -p "$out"
limit=${HBMSIM_CALIB_MEASURE_TIMEOUT_S:-170}
say "measuring (limit $limit s)"
set +e
tmo "$limit" "$bin" -o "$out/profile.json" --raw "$out/raw.json" "$@"
rc=$?
set -e
case "$rc" in
  0) say "done in $(($(date +%s) - start)) s: $out/profile.json $out/raw.json $out/nvidia-smi.txt" ;;
  4) say "profile written, but a stage failed or was skipped: see stages in $out/raw.json" ;;
  124 | 137) say "hbmsim-calibrate-cuda timed out after $limit s (pass --budget-s below that)" ;;
  *) say "hbmsim-calibrate-cuda failed with status $rc" ;;
esac
exit "$rc"
