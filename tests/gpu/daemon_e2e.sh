#!/usr/bin/env bash
# GPU end to end through a real mooncaked: the CUDA device_transport_example
# (pair and all-to-all, both handle kinds; the RDMA route through softnic,
# and mixed routes), a SIGKILLed rank reported LOST,
# mcctl views of a live CUDA group, and Communicator setup time.
# Called by tests/gpu/run.sh; prints "N passed, N failed, N skipped" last.
#   tests/gpu/daemon_e2e.sh BIN_DIR
# Environment:
#   MC_GPU_COUNT     GPUs to use (run.sh counts them once; default: nvidia-smi -L)
#   MC_RANK_TIMEOUT  seconds one example rank may run (default 120)
#
# Placement: with two or more GPUs, rank r runs on GPU r % 2 (every pair and
# all-to-all crosses GPUs). With one GPU every rank runs on GPU 0: the ranks
# are still separate processes that import each other's memory (VMM fds,
# legacy IPC), so the same checks hold; only the cross-GPU (NVLink) placement
# is skipped.
set -uo pipefail
bin=${1:?usage: daemon_e2e.sh BIN_DIR}
ngpu=${MC_GPU_COUNT:-$(timeout 30 nvidia-smi -L 2>/dev/null | grep -c '^GPU ')}
tmp=$(mktemp -d /tmp/mc-gpu-e2e.XXXXXX)
sock=$tmp/mooncaked.sock
passed=0
failed=0
skipped=0
pids=()
cleanup() {
  # TERM: a rank under `timeout` passes it on to the example.
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  [[ -n "${daemon:-}" ]] && kill -TERM "$daemon" 2>/dev/null && wait "$daemon" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
check() {  # check NAME COND-RC
  if [[ $2 -eq 0 ]]; then passed=$((passed + 1)); echo "ok   - $1"; else failed=$((failed + 1)); echo "FAIL - $1"; fi
}
skip() {  # skip REASON
  skipped=$((skipped + 1))
  echo "skip - $1"
}
gpu_of() {  # gpu_of RANK: the GPU that rank runs on
  if [[ $ngpu -ge 2 ]]; then echo $(($1 % 2)); else echo 0; fi
}
if [[ $ngpu -ge 2 ]]; then layout="rank r on GPU r%2"; else layout="every rank on GPU 0"; fi
echo "GPUs: $ngpu; placement: $layout"

# An array, not a shell function: "ex ... &" on a function forks a subshell
# that forks the example, so $! would be the subshell. Ranks that are only
# waited for run under `timeout`; the watch ranks below run bare, so that $!
# is the example itself and the SIGKILL hits it. --timeout-ms bounds only
# their formation (a watch holds the group until an event), so they are
# waited for with wait_bounded.
ex_bare=("$bin/device_transport_example" --platform cuda --socket "$sock")
# wait_bounded PID SECONDS: wait for PID; SIGKILL it after SECONDS (status
# 137). Polls (bash reaps its children as they exit, so kill -0 fails once
# PID is gone): a watchdog subshell killed early runs this script's EXIT
# trap, which removes $tmp.
wait_bounded() {
  local pid=$1 i
  for ((i = 0; i < $2 * 100; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.01
  done
  kill -KILL "$pid" 2>/dev/null
  wait "$pid"
}
ex=(timeout -k 5 "${MC_RANK_TIMEOUT:-120}" "${ex_bare[@]}")
mcctl() { timeout -k 5 20 "$bin/mcctl" --socket "$sock" "$@"; }

"$bin/mooncaked" --socket "$sock" --node-id gpu-e2e --log-level info 2>"$tmp/daemon.log" &
daemon=$!
for _ in $(seq 100); do [[ -S "$sock" ]] && break; sleep 0.05; done
mcctl status
mcctl topo
found=$(mcctl gpus --json | grep -c '"uuid"')
check "daemon discovers the $ngpu GPU(s) nvidia-smi lists (found $found)" \
  $([[ $found -ge 1 && $found -ge $ngpu ]]; echo $?)

if [[ $ngpu -lt 2 ]]; then
  skip "cross-GPU placement (pairs, all-to-all, watch with rank r on GPU r%2, over NVLink): needs 2 GPUs, found $ngpu; the same checks ran with every rank on GPU 0"
fi

# pair: rank 0 writes into rank 1, both handle kinds, odd sizes
for handle in vmm ipc; do
  for bytes in 1 4097 67108867; do
    "${ex[@]}" --group "pair-$handle-$bytes" --rank 0 --world-size 2 --device "$(gpu_of 0)" --handle $handle --bytes $bytes >"$tmp/r0" 2>&1 &
    p0=$!
    "${ex[@]}" --group "pair-$handle-$bytes" --rank 1 --world-size 2 --device "$(gpu_of 1)" --handle $handle --bytes $bytes >"$tmp/r1" 2>&1
    r1=$?
    wait $p0; r0=$?
    cat "$tmp/r0" "$tmp/r1"
    check "pair $handle $bytes B, GPU$(gpu_of 0) -> GPU$(gpu_of 1): rank0 rc=$r0 rank1 rc=$r1" \
      $([[ $r0 -eq 0 && $r1 -eq 0 ]] && grep -q PASS "$tmp/r1"; echo $?)
  done
done

# all-to-all: 2 ranks and 4 ranks
for n in 2 4; do
  rcs=0
  for r in $(seq 0 $((n - 1))); do
    "${ex[@]}" --group "a2a-$n" --rank $r --world-size $n --device "$(gpu_of $r)" --mode all2all --bytes 1048583 >"$tmp/a$r" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || rcs=$((rcs + 1)); done
  pids=()
  cat "$tmp"/a*
  check "all-to-all $n ranks, $layout (failed ranks: $rcs)" $rcs
  rm -f "$tmp"/a*
done

# The RDMA route from CUDA kernels: the kernels write mlx5 WQEs into
# host-pinned rings and ring doorbell records; softnic in mooncaked executes
# them on the GPU buffers it imported from the ranks' VMM fds.
for bytes in 1 4097 67108867; do
  "${ex[@]}" --group "rdma-pair-$bytes" --rank 0 --world-size 2 --device "$(gpu_of 0)" --route rdma --bytes $bytes >"$tmp/r0" 2>&1 &
  p0=$!
  "${ex[@]}" --group "rdma-pair-$bytes" --rank 1 --world-size 2 --device "$(gpu_of 1)" --route rdma --bytes $bytes >"$tmp/r1" 2>&1
  r1=$?
  wait $p0; r0=$?
  cat "$tmp/r0" "$tmp/r1"
  check "RDMA (softnic) pair $bytes B from CUDA kernels: rank0 rc=$r0 rank1 rc=$r1" \
    $([[ $r0 -eq 0 && $r1 -eq 0 ]] && grep -q PASS "$tmp/r1"; echo $?)
done
for n in 2 4; do
  rcs=0
  for r in $(seq 0 $((n - 1))); do
    "${ex[@]}" --group "rdma-a2a-$n" --rank $r --world-size $n --device "$(gpu_of $r)" --mode all2all --route rdma --bytes 1048583 >"$tmp/a$r" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || rcs=$((rcs + 1)); done
  pids=()
  cat "$tmp"/a*
  check "RDMA (softnic) all-to-all $n ranks from CUDA kernels (failed ranks: $rcs)" $rcs
  rm -f "$tmp"/a*
done
# Where the rings live (docs/rdma.md): softnic reads rings with the CPU,
# so --rings auto stays on host memory and passes; --rings gpu allocates the
# rings in GPU memory and exports their dmabuf for real, and then must fail
# setup saying why (softnic refuses the dmabuf, or this driver exports none).
"${ex[@]}" --group rings-auto --rank 0 --world-size 2 --device "$(gpu_of 0)" --route rdma --bytes 4097 >"$tmp/r0" 2>&1 &
p0=$!
"${ex[@]}" --group rings-auto --rank 1 --world-size 2 --device "$(gpu_of 1)" --route rdma --bytes 4097 >"$tmp/r1" 2>&1
r1=$?
wait $p0; r0=$?
cat "$tmp/r0" "$tmp/r1"
check "RDMA rings auto on softnic: host memory, PASS (rc $r0/$r1)" \
  $([[ $r0 -eq 0 && $r1 -eq 0 ]] && grep -q "rings in host memory" "$tmp/r0" && grep -q PASS "$tmp/r1"; echo $?)
"${ex[@]}" --group rings-gpu --rank 0 --world-size 2 --device "$(gpu_of 0)" --route rdma --rings gpu --timeout-ms 10000 >"$tmp/r0" 2>&1 &
p0=$!
"${ex[@]}" --group rings-gpu --rank 1 --world-size 2 --device "$(gpu_of 1)" --route rdma --rings gpu --timeout-ms 10000 >"$tmp/r1" 2>&1
r1=$?
wait $p0; r0=$?
cat "$tmp/r0" "$tmp/r1"
if grep -q 'memory kind "dmabuf" is not one the softnic provider registers' "$tmp/r0"; then
  echo "     (the GPU rings were allocated and their dmabuf exported; softnic refused them)"
elif grep -q "exports no dmabuf of GPU memory" "$tmp/r0"; then
  echo "     (this driver exports no dmabuf: the allocation ran, the export was refused)"
fi
check "RDMA rings gpu on softnic: a setup error naming why (rc $r0/$r1)" \
  $([[ $r0 -eq 2 && $r1 -eq 2 ]] && grep -Eq 'softnic provider registers|exports no dmabuf' "$tmp/r0"; echo $?)
# mixed routes: ranks 0 and 1 over RDMA, every other pair over P2P; every
# rank bumps every other's arrival counter, so atomics go through the NIC
# on every rank (--atomics nic; docs/rdma.md "Atomics across routes")
rcs=0
for r in 0 1 2 3; do
  extra=(--atomics nic)
  [[ $r -eq 0 ]] && extra+=(--rdma-peers 1)
  [[ $r -eq 1 ]] && extra+=(--rdma-peers 0)
  "${ex[@]}" --group "mixed" --rank $r --world-size 4 --device "$(gpu_of $r)" --mode all2all --bytes 65539 "${extra[@]}" >"$tmp/a$r" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || rcs=$((rcs + 1)); done
pids=()
cat "$tmp"/a*
check "mixed routes (an RDMA pair inside a P2P group), 4 ranks (failed ranks: $rcs)" $rcs
rm -f "$tmp"/a*
# a live RDMA group: QPs and GPU memory regions in mcctl, gone after SIGKILL
"${ex_bare[@]}" --group rdma-watch --rank 0 --world-size 2 --device "$(gpu_of 0)" --route rdma --mode watch --timeout-ms 30000 >"$tmp/w0" 2>&1 &
w0=$!
"${ex_bare[@]}" --group rdma-watch --rank 1 --world-size 2 --device "$(gpu_of 1)" --route rdma --mode watch --timeout-ms 30000 >"$tmp/w1" 2>&1 &
w1=$!
pids+=($w0 $w1)
for _ in $(seq 200); do grep -q READY "$tmp/w0" && grep -q READY "$tmp/w1" && break; sleep 0.05; done
mcctl qps
mcctl mrs
nq=$(mcctl qps --json | grep -o '"qpn"' | wc -l)
ncuda=$(mcctl mrs --json | grep -o '"cuda-vmm"' | wc -l)
# per rank: its QP toward the other and its loopback (RDMA peers make
# atomics_route auto choose NIC atomics; docs/rdma.md)
check "mcctl qps lists the live RDMA group's 4 QPs (found $nq)" $([[ $nq -eq 4 ]]; echo $?)
check "mcctl mrs lists both GPU buffers as cuda-vmm regions (found $ncuda)" $([[ $ncuda -eq 2 ]]; echo $?)
kill -KILL $w1
sleep 1
nq=$(mcctl qps --json | grep -o '"qpn"' | wc -l)
check "1 s after SIGKILL only the survivor's QPs are left (found $nq)" $([[ $nq -le 2 ]]; echo $?)
wait_bounded $w0 30; rw0=$?
cat "$tmp/w0"
check "RDMA watch: SIGKILLed rank reported lost" $([[ $rw0 -eq 0 ]] && grep -q 'EVENT lost rank 1' "$tmp/w0"; echo $?)
pids=()

# a live CUDA group in mcctl, then SIGKILL one rank: the other is told
"${ex_bare[@]}" --group watch --rank 0 --world-size 2 --device "$(gpu_of 0)" --mode watch --timeout-ms 30000 >"$tmp/w0" 2>&1 &
w0=$!
"${ex_bare[@]}" --group watch --rank 1 --world-size 2 --device "$(gpu_of 1)" --mode watch --timeout-ms 30000 >"$tmp/w1" 2>&1 &
w1=$!
pids+=($w0 $w1)
for _ in $(seq 200); do grep -q READY "$tmp/w0" && grep -q READY "$tmp/w1" && break; sleep 0.05; done
mcctl groups
mcctl groups --json >"$tmp/groups.json"
check "mcctl groups shows the CUDA handle kind (cuda-vmm-fd)" $(grep -q cuda-vmm-fd "$tmp/groups.json"; echo $?)
check "mcctl groups shows the group ready" $(grep -q '"ready"' "$tmp/groups.json"; echo $?)
t0=$(date +%s%N)
kill -KILL $w1
wait_bounded $w0 30; rw0=$?
t1=$(date +%s%N)
cat "$tmp/w0"
echo "survivor exited $(( (t1 - t0) / 1000000 )) ms after the SIGKILL"
check "SIGKILLed rank reported lost to the survivor" $([[ $rw0 -eq 0 ]] && grep -q 'EVENT lost rank 1' "$tmp/w0"; echo $?)
sleep 0.2
mcctl groups --json >"$tmp/groups2.json"
check "daemon freed the group" $(grep -q '"watch"' "$tmp/groups2.json"; [[ $? -ne 0 ]]; echo $?)
pids=()

# setup time: Communicator creation to a ready CommCtx (CUDA context created before)
echo "setup times (ms), 2 ranks, VMM fds, $layout:"
for i in $(seq 5); do
  "${ex[@]}" --group "setup-$i" --rank 0 --world-size 2 --device "$(gpu_of 0)" --bytes 4096 >"$tmp/s0" 2>&1 &
  p0=$!
  "${ex[@]}" --group "setup-$i" --rank 1 --world-size 2 --device "$(gpu_of 1)" --bytes 4096 >"$tmp/s1" 2>&1
  wait $p0
  grep -h 'ready in' "$tmp/s0" "$tmp/s1"
done

echo "--- daemon log ---"
tail -n 20 "$tmp/daemon.log"
echo "$passed passed, $failed failed, $skipped skipped"
[[ $failed -eq 0 ]]
