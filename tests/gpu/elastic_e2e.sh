#!/usr/bin/env bash
# Elastic groups on the GPU (issue 10): the scenario of
# tests/integration/elastic_test.cc with CUDA ranks. Four
# device_transport_example --platform cuda --mode elastic ranks exchange
# puts and signals from kernels through a real mooncaked; rank 2 is
# SIGKILLed, the survivors report LOST and keep exchanging among themselves
# (DEGRADED-OK), a replacement rank 2 joins at epoch 2 and all four exchange
# again (ADMITTED, EXCHANGED, PASS). Over P2P (CUDA VMM fds) and over RDMA
# (softnic executing the kernels' WQEs). Prints the recovery timings from
# the ranks' t= fields (CLOCK_REALTIME, as bench/elastic reads them).
# Called by tests/gpu/run.sh; prints "N passed, N failed, N skipped" last.
#   tests/gpu/elastic_e2e.sh BIN_DIR
# Environment:
#   MC_GPU_COUNT     GPUs to use (run.sh counts them once; default: nvidia-smi -L)
#   MC_RANK_TIMEOUT  seconds one rank may run (default 180)
#   MC_ELASTIC_PLATFORM  cuda (default); host runs the same script without a
#                    GPU (checks the script itself against the host loop)
#
# Placement as in daemon_e2e.sh: rank r on GPU r % 2 with two or more GPUs,
# every rank on GPU 0 with one.
set -uo pipefail
bin=${1:?usage: elastic_e2e.sh BIN_DIR}
ngpu=${MC_GPU_COUNT:-$(timeout 30 nvidia-smi -L 2>/dev/null | grep -c '^GPU ')}
rank_timeout=${MC_RANK_TIMEOUT:-180}
platform=${MC_ELASTIC_PLATFORM:-cuda}
tmp=$(mktemp -d /tmp/mc-gpu-elastic.XXXXXX)
sock=$tmp/mooncaked.sock
passed=0
failed=0
skipped=0
pids=()
cleanup() {
  # KILL: a rank stuck in a wait is of no further use; `timeout` passes TERM
  # on, the bare rank 2 gets it directly.
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  [[ -n "${daemon:-}" ]] && kill -TERM "$daemon" 2>/dev/null && wait "$daemon" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
check() {  # check NAME COND-RC
  if [[ $2 -eq 0 ]]; then passed=$((passed + 1)); echo "ok   - $1"; else failed=$((failed + 1)); echo "FAIL - $1"; fi
}
gpu_of() {  # gpu_of RANK: the GPU that rank runs on
  if [[ $ngpu -ge 2 ]]; then echo $(($1 % 2)); else echo 0; fi
}
if [[ $ngpu -ge 2 ]]; then layout="rank r on GPU r%2"; else layout="every rank on GPU 0"; fi
echo "GPUs: $ngpu; placement: $layout"
# wait_line FILE TEXT SECONDS: true once FILE has a line containing TEXT.
wait_line() {
  local i
  for ((i = 0; i < $3 * 20; ++i)); do
    grep -qF -- "$2" "$1" 2>/dev/null && return 0
    sleep 0.05
  done
  return 1
}
# t_of FILE TEXT: the t= (microseconds) of the first line containing TEXT.
t_of() { grep -F -- "$2" "$1" | head -1 | sed -n 's/.* t=\([0-9]*\)$/\1/p'; }
now_us() { echo $(($(date +%s%N) / 1000)); }
ms() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "") print "?"; else printf "%.3f", (b - a) / 1000 }'; }
max_of() { printf '%s\n' "$@" | sort -n | tail -1; }

"$bin/mooncaked" --socket "$sock" --node-id gpu-elastic --log-level info 2>"$tmp/daemon.log" &
daemon=$!
for _ in $(seq 100); do [[ -S "$sock" ]] && break; sleep 0.05; done

# rank_args GROUP RANK ROUTE: the example's arguments for one rank.
rank_args() {
  local a=("$bin/device_transport_example" --platform "$platform" --socket "$sock" --group "$1"
    --rank "$2" --world-size 4 --device "$(gpu_of "$2")" --mode elastic --timeout-ms 60000)
  [[ -n "$3" ]] && a+=(--route "$3")
  printf '%s\0' "${a[@]}"
}

# scenario ROUTE (empty: auto, which is P2P on one node)
scenario() {
  local route=$1 name=${1:-p2p}
  local group="elastic-$name" want_rdma="rdma_peers 0"
  [[ $route == rdma ]] && want_rdma="rdma_peers 3"
  local -a args
  local r p rc ok ranks=() logs=()
  echo "--- elastic, route $name, 4 $platform ranks ($layout) ---"
  for r in 0 1 2 3; do
    mapfile -d '' args < <(rank_args "$group" $r "$route")
    logs[$r]=$tmp/$name-rank$r.log
    if [[ $r -eq 2 ]]; then
      # Bare, so that $! is the example itself and the SIGKILL hits it.
      "${args[@]}" --expect-rejoins 1 --rounds 200 >"${logs[$r]}" 2>&1 &
    else
      timeout -k 5 "$rank_timeout" "${args[@]}" --expect-rejoins 1 --rounds 200 >"${logs[$r]}" 2>&1 &
    fi
    ranks[$r]=$!
    pids+=("$!")
  done
  ok=0
  for r in 0 1 2 3; do wait_line "${logs[$r]}" "START epoch 1" 60 || ok=1; done
  check "$name: all 4 ranks started (START epoch 1)" "$ok"
  if [[ $ok -ne 0 ]]; then
    for r in 0 1 2 3; do echo "- rank $r:"; cat "${logs[$r]}"; done
    for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
    pids=()
    return
  fi
  ok=0
  for r in 0 1 2 3; do grep -qF "START epoch 1 $want_rdma" "${logs[$r]}" || ok=1; done
  check "$name: every rank reports '$want_rdma'" "$ok"
  # Let the group exchange a little before the kill.
  sleep 0.5
  local t_kill
  t_kill=$(now_us)
  kill -KILL "${ranks[2]}"
  wait "${ranks[2]}"
  rc=$?
  check "$name: rank 2 SIGKILLed (rc=$rc)" $([[ $rc -eq 137 ]]; echo $?)
  ok=0
  for r in 0 1 3; do
    wait_line "${logs[$r]}" "LOST rank 2" 20 && wait_line "${logs[$r]}" "DEGRADED-OK active 0,1,3 rounds 20" 30 || ok=1
  done
  check "$name: survivors 0,1,3 saw LOST rank 2 and went on without it (DEGRADED-OK)" "$ok"
  # The daemon keeps the group, at epoch 1, while it is degraded.
  timeout -k 5 20 "$bin/mcctl" --socket "$sock" groups

  local t_start
  t_start=$(now_us)
  mapfile -d '' args < <(rank_args "$group" 2 "$route")
  logs[4]=$tmp/$name-replacement.log
  timeout -k 5 "$rank_timeout" "${args[@]}" --rounds 200 >"${logs[4]}" 2>&1 &
  p=$!
  pids+=("$p")
  wait "$p"
  rc=$?
  ok=$([[ $rc -eq 0 ]] && grep -qF "START epoch 2" "${logs[4]}"; echo $?)
  for r in 0 1 3; do grep -qF "EXCHANGED rank $r epoch 2" "${logs[4]}" || ok=1; done
  check "$name: replacement rank 2 joined at epoch 2, exchanged with 0,1,3 and passed (rc=$rc)" "$ok"
  for r in 0 1 3; do
    wait "${ranks[$r]}"
    rc=$?
    ok=$([[ $rc -eq 0 ]]; echo $?)
    for line in "ADMITTED rank 2 epoch 2" "EXCHANGED rank 2 epoch 2" "PASS"; do
      grep -qF "$line" "${logs[$r]}" || ok=1
    done
    for other in 0 1 3; do
      [[ $other -ne $r ]] && grep -qF "LOST rank $other" "${logs[$r]}" && ok=1
    done
    check "$name: rank $r admitted and exchanged with the replacement, lost no healthy peer, PASS (rc=$rc)" "$ok"
  done
  pids=()
  for r in 0 1 2 3; do echo "- rank $r:"; cat "${logs[$r]}"; done
  echo "- replacement rank 2:"
  cat "${logs[4]}"
  for _ in $(seq 100); do
    timeout -k 5 20 "$bin/mcctl" --socket "$sock" groups --json | grep -qF "\"$group\"" || break
    sleep 0.05
  done
  timeout -k 5 20 "$bin/mcctl" --socket "$sock" groups --json >"$tmp/groups.json"
  check "$name: daemon freed the group after all ranks finished" \
    $(grep -qF "\"$group\"" "$tmp/groups.json"; [[ $? -ne 0 ]]; echo $?)

  # Recovery, as bench/elastic splits it (here the replacement is started
  # after DEGRADED-OK, not at the kill, so re-join counts from its start).
  local lost=() admitted=() exchanged=()
  for r in 0 1 3; do
    lost+=("$(t_of "${logs[$r]}" "LOST rank 2")")
    admitted+=("$(t_of "${logs[$r]}" "ADMITTED rank 2 epoch 2")")
    exchanged+=("$(t_of "${logs[$r]}" "EXCHANGED rank 2 epoch 2")")
    exchanged+=("$(t_of "${logs[4]}" "EXCHANGED rank $r epoch 2")")
  done
  local l a e
  l=$(max_of "${lost[@]}")
  a=$(max_of "${admitted[@]}")
  e=$(max_of "${exchanged[@]}")
  echo "recovery ($name, $platform ranks, ms): detection (SIGKILL -> last survivor saw LOST) $(ms "$t_kill" "$l");" \
    "re-join (replacement started -> last survivor admitted it) $(ms "$t_start" "$a");" \
    "re-connect (-> first exchange done on all 4 ranks) $(ms "$a" "$e")"
}

scenario ""
scenario rdma

echo "--- daemon log ---"
tail -n 20 "$tmp/daemon.log"
echo "$passed passed, $failed failed, $skipped skipped"
[[ $failed -eq 0 ]]
