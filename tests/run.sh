#!/usr/bin/env bash
# Installs what is missing (Debian packages), builds, and runs every CPU
# test with ctest. GPU tests live in tests/gpu/ and run on the GPU machine
# (tests/gpu/run.sh). Usage: ./tests/run.sh [extra ctest args]
#   BUILD_DIR=build (default)   JOBS=$(nproc) (default)
set -euo pipefail
cd "$(dirname "$0")/.."
./deploy/install-deps.sh
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
# Tests ON explicitly: a build dir configured without them (the quick start)
# must not turn this into a run of nothing.
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOONCAKE_BUILD_TESTS=ON
cmake --build "$BUILD_DIR" -j"$JOBS"
ctest --test-dir "$BUILD_DIR" --no-tests=error --output-on-failure -j"$JOBS" --timeout 600 "$@"
