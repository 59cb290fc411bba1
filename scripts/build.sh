#!/usr/bin/env bash
# Configures and builds hbmsim (Release) into ${BUILD_DIR:-build}. Extra arguments go to cmake's configure
# step; BUILD_TARGET (default: everything) limits what is built.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
GEN=()
command -v ninja >/dev/null 2>&1 && GEN=(-G Ninja)
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  cmake -S . -B "$BUILD_DIR" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release "$@" >"${BUILD_DIR}.configure.log" 2>&1 ||
    { cat "${BUILD_DIR}.configure.log"; exit 1; }
fi
cmake --build "$BUILD_DIR" -j "$(nproc)" ${BUILD_TARGET:+--target "$BUILD_TARGET"}
