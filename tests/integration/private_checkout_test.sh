#!/usr/bin/env bash
# The tests that run processes as another uid must pass wherever the tree is
# cloned, including under a directory only its owner can traverse (a clone
# inside a `mktemp -d` folder, mode 0700). Copies the built binaries into
# such a folder and runs permission_test and abuse_test from there.
#   private_checkout_test.sh BUILD_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
[[ $(id -u) == 0 ]] || { echo "SKIP: needs root to run processes as another uid"; exit 0; }
private=$(mktemp -d)  # 0700: other uids cannot traverse it
trap 'rm -rf "$private"' EXIT
cp -a "$build/bin" "$build/lib" "$private/"
for t in permission_test abuse_test; do
  MOONCAKE_BIN_DIR="$private/bin" "$private/bin/$t" --gtest_brief=1
done
