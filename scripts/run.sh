#!/usr/bin/env bash
# The main job on built-in defaults: install what is missing, build, and print the GB200 what-if table
# (every measured GB200 run of the seed documents, reported beside predicted, with the fitted profile).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
BUILD_TARGET=hbmsim ./scripts/build.sh >/dev/null
./build/cli/hbmsim reproduce --calibration gb200-fitted "$@"
