#!/usr/bin/env bash
# Configures and builds hbmsim (Release) into ${BUILD_DIR:-build}. Extra arguments go to cmake's configure
# step; BUILD_TARGET (default: everything) limits what is built.
# A unity build: each library's sources are compiled as a few combined files (a clean build on 2 cores takes
# about 245 s instead of 350 s; the tests are never combined). A missing include can hide behind another file
# of the same batch there: -DCMAKE_UNITY_BUILD=OFF (with another BUILD_DIR) compiles file by file.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
GEN=()
command -v ninja >/dev/null 2>&1 && GEN=(-G Ninja)
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  cmake -S . -B "$BUILD_DIR" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_UNITY_BUILD=ON "$@" >"${BUILD_DIR}.configure.log" 2>&1 ||
    { cat "${BUILD_DIR}.configure.log"; exit 1; }
fi
cmake --build "$BUILD_DIR" -j "$(nproc)" ${BUILD_TARGET:+--target "$BUILD_TARGET"}
