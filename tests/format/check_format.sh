#!/usr/bin/env bash
# Fails (and prints the first differences) when a tracked C++/CUDA source
# file is not formatted as .clang-format says. Fix with:
#   git ls-files '*.h' '*.cc' '*.cu' '*.cuh' | xargs clang-format -i
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v clang-format >/dev/null || { echo "check_format: clang-format not installed (deploy/install-deps.sh installs it)"; exit 1; }
if ! git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  echo "check_format: not a git checkout; nothing to check against"; exit 1
fi
mapfile -t files < <(git ls-files --cached --others --exclude-standard '*.h' '*.cc' '*.cu' '*.cuh')
bad=0
for f in "${files[@]}"; do
  [[ -f "$f" ]] || continue
  if ! clang-format --dry-run -Werror "$f" >/dev/null 2>&1; then
    echo "not formatted: $f"
    bad=$((bad + 1))
  fi
done
echo "check_format: ${#files[@]} files, $bad not formatted ($(clang-format --version))"
[[ $bad -eq 0 ]]
