#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, sanitizers; a build directory of their
# own) and runs each for SECONDS on a copy of its seed corpus in a temporary
# directory. Prints one line per target and exits non-zero when any target
# crashed, leaked, hung or failed to run. See fuzz/README.md.
#
#   fuzz/run.sh [SECONDS]     default 20; 0 runs each seed corpus once
#   BUILD_DIR=build-fuzz (default)   JOBS=$(nproc) (default)
#   CC/CXX: clang-14/clang++-14 unless set (used when BUILD_DIR is configured)
#   BUILD_LOCK=FILE: configure and build under `flock FILE` (shared machines)
#   FUZZ_TARGETS="a b": run only these (default: every fuzz/corpus/<target>)
#   FUZZ_ARGS="...": more libFuzzer flags for every target (e.g. -detect_leaks=0
#     where LeakSanitizer cannot ptrace)
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-20}
if [[ "$seconds" == "-h" || "$seconds" == "--help" ]]; then
  sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'
  exit 0
fi
if ! [[ "$seconds" =~ ^[0-9]+$ ]]; then
  echo "fuzz/run.sh: SECONDS must be a whole number, not '$seconds' (try --help)" >&2
  exit 64
fi
BUILD_DIR=${BUILD_DIR:-build-fuzz}
JOBS=${JOBS:-$(nproc)}
export CC=${CC:-clang-14} CXX=${CXX:-clang++-14}
if ! command -v "$CXX" >/dev/null; then
  echo "fuzz/run.sh: $CXX not found: run deploy/install-deps.sh (clang-14, libclang-rt-14-dev)" >&2
  exit 1
fi
locked=()
[[ -n "${BUILD_LOCK:-}" ]] && locked=(flock "$BUILD_LOCK")

command -v ccache >/dev/null && echo "fuzz/run.sh: building $BUILD_DIR with ccache" \
  || echo "fuzz/run.sh: building $BUILD_DIR (no ccache)"
"${locked[@]}" cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DMOONCAKE_BUILD_FUZZERS=ON -DMOONCAKE_BUILD_TESTS=OFF -DMOONCAKE_BUILD_BENCH=OFF \
  -DMOONCAKE_WITH_CUDA=OFF >/dev/null
"${locked[@]}" cmake --build "$BUILD_DIR" --target mooncake_fuzzers -j"$JOBS"

if [[ -n "${FUZZ_TARGETS:-}" ]]; then
  read -r -a targets <<<"$FUZZ_TARGETS"
else
  targets=()
  for d in fuzz/corpus/*/; do targets+=("$(basename "$d")"); done
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/mooncake-fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT
logs="$BUILD_DIR/fuzz-logs"
artifacts="$BUILD_DIR/fuzz-artifacts"
mkdir -p "$logs" "$artifacts"

if [[ "$seconds" -eq 0 ]]; then
  mode=(-runs=0)
else
  mode=(-max_total_time="$seconds")
fi

# "key: value" from libFuzzer's final stats / status lines.
stat() { sed -n "s/^stat::$1: *//p" "$2" | tail -1; }
status_field() { grep -E "^#[0-9]+.*$1: " "$2" | tail -1 | sed -E "s/.*$1: ([^ ]+).*/\1/"; }

failed=0
printf '%-18s %10s %8s %7s %14s  %s\n' target execs exec/s cov corpus result
for t in "${targets[@]}"; do
  bin="$BUILD_DIR/bin/$t"
  log="$logs/$t.log"
  corpus="$work/$t"
  mkdir -p "$corpus"
  cp fuzz/corpus/"$t"/* "$corpus"/
  rc=0
  # -timeout: one input running this long is a hang; -rss_limit_mb: a leak.
  # shellcheck disable=SC2086 # FUZZ_ARGS is a list of flags
  "$bin" "${mode[@]}" -print_final_stats=1 -timeout=30 -rss_limit_mb=2048 \
    -artifact_prefix="$artifacts/$t-" ${FUZZ_ARGS:-} "$corpus" >"$log" 2>&1 || rc=$?
  execs=$(stat number_of_executed_units "$log")
  rate=$(stat average_exec_per_sec "$log")
  cov=$(status_field cov "$log")
  corp=$(status_field corp "$log")
  if [[ $rc -eq 0 ]]; then
    result=ok
  else
    result="FAILED (exit $rc; log $log)"
    failed=$((failed + 1))
  fi
  printf '%-18s %10s %8s %7s %14s  %s\n' "$t" "${execs:-?}" "${rate:-?}" "${cov:-?}" \
    "${corp:-?}" "$result"
  if [[ $rc -ne 0 ]]; then
    grep -E "ERROR|FUZZ_CHECK|SUMMARY|Test unit written|^    #[0-9] " "$log" | head -20 | sed 's/^/    /'
  fi
done

if [[ $failed -ne 0 ]]; then
  echo "fuzz/run.sh: $failed of ${#targets[@]} targets failed; reproduce with" \
    "$BUILD_DIR/bin/TARGET $artifacts/TARGET-crash-..." >&2
  exit 1
fi
echo "fuzz/run.sh: ${#targets[@]} targets, ${seconds}s each, no crash, leak or hang"
