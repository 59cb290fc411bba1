#!/usr/bin/env bash
# Installs every build and test dependency from Debian 12 packages (no PyPI, no downloads).
set -euo pipefail
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
PKGS=(
  build-essential cmake ninja-build pkg-config clang libclang-rt-14-dev
  catch2 libcli11-dev libfmt-dev libboost-graph-dev nlohmann-json3-dev libbenchmark-dev
  pybind11-dev python3-dev python3-pybind11 python3-numpy python3-pandas python3-matplotlib
  python3-pytest python3-distributed python3-nbclient python3-ipykernel python3-nbformat
  python3-venv python3-pip python3-setuptools python3-wheel
)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
