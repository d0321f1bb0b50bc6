#!/usr/bin/env bash
# Mooncake quick start: build, install into a temporary prefix, start a
# private mooncaked, look at it with mcctl, and run the two-rank example over
# it on the host platform (CPU threads over shared memory: no GPU or NIC
# needed). Leaves nothing running and nothing behind but build/.
#
#   deploy/quickstart.sh
#
# Environment:
#   QUICKSTART_SKIP_DEPS=1    do not run deploy/install-deps.sh
#   QUICKSTART_JOBS=N         parallel build jobs (default: nproc)
#   QUICKSTART_BUILD_DIR=DIR  build tree (default: <repo>/build)
#   QUICKSTART_KEEP=1         keep the temporary directory (logs) on exit
#   QUICKSTART_CMAKE_ARGS=... extra configure arguments (word-split); tests
#                             and benchmarks are off unless turned on here
# Exit status: 0 when every step passed, non-zero otherwise.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${QUICKSTART_BUILD_DIR:-$repo/build}
jobs=${QUICKSTART_JOBS:-$(nproc)}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mooncake-quickstart.XXXXXX")
prefix=$tmp/prefix
socket=$tmp/mooncaked.sock
daemon_log=$tmp/mooncaked.log
daemon_pid=""
rank_pids=()

step() { printf '\n==> %s\n' "$*"; }
fail() { printf 'quickstart: FAILED: %s\n' "$*" >&2; exit 1; }

# Sends SIGTERM and waits up to 10 s, then SIGKILL. Returns the daemon's
# exit status (non-zero when it had to be killed).
stop_daemon() {
  local pid=$daemon_pid rc=0
  daemon_pid=""
  kill -TERM "$pid" 2>/dev/null || true
  # The daemon says goodbye to its sessions and releases resources on
  # SIGTERM; SIGKILL only if that hangs.
  for _ in $(seq 100); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then
    echo "quickstart: mooncaked did not stop within 10 s of SIGTERM; killing it" >&2
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    return 1
  fi
  wait "$pid" || rc=$?
  return "$rc"
}

cleanup() {
  local rc=$?
  set +e
  for pid in "${rank_pids[@]}"; do
    kill -TERM "$pid" 2>/dev/null
  done
  if [[ -n "$daemon_pid" ]]; then
    stop_daemon || rc=1
  fi
  if [[ $rc -ne 0 && -s "$daemon_log" ]]; then
    echo "--- last lines of the mooncaked log ($daemon_log) ---" >&2
    tail -n 30 "$daemon_log" >&2
  fi
  if [[ "${QUICKSTART_KEEP:-0}" == 1 ]]; then
    echo "quickstart: kept $tmp"
  else
    rm -rf "$tmp"
  fi
  exit "$rc"
}
trap cleanup EXIT
# A failing command under `set -e` names itself, so the reason is not lost in
# build output.
trap 'echo "quickstart: FAILED: \"$BASH_COMMAND\" exited with status $? (line $LINENO)" >&2' ERR
trap 'exit 130' INT
trap 'exit 143' TERM

if [[ "${QUICKSTART_SKIP_DEPS:-0}" != 1 ]]; then
  step "Checking build dependencies"
  "$repo/deploy/install-deps.sh"
fi

step "Configuring and building into $build"
# shellcheck disable=SC2086  # QUICKSTART_CMAKE_ARGS is a list of words
cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DMOONCAKE_BUILD_TESTS=OFF -DMOONCAKE_BUILD_BENCH=OFF ${QUICKSTART_CMAKE_ARGS:-}
cmake --build "$build" -j "$jobs"

step "Installing into $prefix"
cmake --install "$build" --prefix "$prefix" >/dev/null

mooncaked=$prefix/bin/mooncaked
mcctl=$prefix/bin/mcctl
[[ -x "$mooncaked" ]] || fail "$mooncaked was not installed"
[[ -x "$mcctl" ]] || fail "$mcctl was not installed"
# The example need not be installed; take it from the build tree then.
example=""
for candidate in "$prefix/bin/device_transport_example" "$build/bin/device_transport_example"; do
  if [[ -x "$candidate" ]]; then
    example=$candidate
    break
  fi
done
[[ -n "$example" ]] || fail "device_transport_example was built neither into $prefix/bin nor $build/bin"

step "Starting mooncaked on $socket (embedded defaults)"
"$mooncaked" --socket "$socket" >"$daemon_log" 2>&1 &
daemon_pid=$!
for _ in $(seq 200); do
  [[ -S "$socket" ]] && break
  kill -0 "$daemon_pid" 2>/dev/null || fail "mooncaked exited before creating $socket"
  sleep 0.1
done
[[ -S "$socket" ]] || fail "mooncaked did not create $socket within 20 s"
echo "mooncaked running, pid $daemon_pid"

step "mcctl status"
"$mcctl" --socket "$socket" status || fail "mcctl status"

step "mcctl topo"
"$mcctl" --socket "$socket" topo || fail "mcctl topo"

step "Two-rank example on the host platform (group 'quickstart')"
for rank in 0 1; do
  timeout 120 "$example" --platform host --socket "$socket" --group quickstart \
    --rank "$rank" --world-size 2 >"$tmp/rank$rank.log" 2>&1 &
  rank_pids+=($!)
done
example_ok=1
for rank in 0 1; do
  rc=0
  wait "${rank_pids[$rank]}" || rc=$?
  sed "s/^/[rank $rank] /" "$tmp/rank$rank.log"
  if [[ $rc -ne 0 ]]; then
    echo "quickstart: rank $rank exited with status $rc$([[ $rc -eq 124 ]] && echo ' (timed out after 120 s)')" >&2
    example_ok=0
  elif ! grep -q PASS "$tmp/rank$rank.log"; then
    echo "quickstart: rank $rank exited 0 but did not print PASS" >&2
    example_ok=0
  fi
done
rank_pids=()

step "mcctl groups"
"$mcctl" --socket "$socket" groups || fail "mcctl groups"
step "mcctl sessions"
"$mcctl" --socket "$socket" sessions || fail "mcctl sessions"

[[ $example_ok -eq 1 ]] || fail "the two-rank example"

step "Stopping mooncaked (SIGTERM)"
rc=0
stop_daemon || rc=$?
[[ $rc -eq 0 ]] || fail "mooncaked exited with status $rc after SIGTERM"

printf '\nquickstart: PASS\n'
