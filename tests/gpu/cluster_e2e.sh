#!/usr/bin/env bash
# Two nodes on one machine (issue 9, GPU check): a real etcd and two
# mooncaked as nodes of one cluster, ranks of the CUDA device_transport_example
# split between them with --route rdma: the kernels post mlx5 WQEs that the
# local softnic sends over the peer port to the other node's softnic, which
# writes into the peer's GPU memory. Then a watcher on one node hears the
# rank of the other node, SIGKILLed, reported lost.
# Called by tests/gpu/run.sh; prints "N passed, N failed, N skipped" last.
#   tests/gpu/cluster_e2e.sh BIN_DIR
# etcd: BIN_DIR/etcd (deploy/make-gpu-bundle.sh copies Debian's), else PATH.
set -uo pipefail
bin=${1:?usage: cluster_e2e.sh BIN_DIR}
ngpu=${MC_GPU_COUNT:-$(timeout 30 nvidia-smi -L 2>/dev/null | grep -c '^GPU ')}
tmp=$(mktemp -d /tmp/mc-gpu-cluster.XXXXXX)
passed=0
failed=0
skipped=0
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  rm -rf "$tmp"
}
trap cleanup EXIT
check() {  # check NAME RC
  if [[ $2 -eq 0 ]]; then passed=$((passed + 1)); echo "ok   - $1"; else failed=$((failed + 1)); echo "FAIL - $1"; fi
}
summary() { echo "$passed passed, $failed failed, $skipped skipped"; }
gpu_of() { if [[ $ngpu -ge 2 ]]; then echo $(($1 % 2)); else echo 0; fi; }

etcd_bin="$bin/etcd"
[[ -x "$etcd_bin" ]] || etcd_bin=$(command -v etcd || true)
if [[ -z "$etcd_bin" ]]; then
  skipped=1
  echo "skip - no etcd binary (neither $bin/etcd nor etcd on PATH)"
  summary
  exit 0
fi
# Free ports: ask the kernel for ephemeral ones through bash's /dev/tcp is not
# possible; pick from a range unlikely to be in use and check.
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
pick() { local p; for _ in $(seq 50); do p=$((20000 + RANDOM % 20000)); port_free $p && { echo $p; return; }; done; }
cport=$(pick); pport=$(pick); pa=$(pick); pb=$(pick)
"$etcd_bin" --name mc --data-dir "$tmp/etcd" \
  --listen-client-urls "http://127.0.0.1:$cport" --advertise-client-urls "http://127.0.0.1:$cport" \
  --listen-peer-urls "http://127.0.0.1:$pport" --initial-advertise-peer-urls "http://127.0.0.1:$pport" \
  --initial-cluster "mc=http://127.0.0.1:$pport" >"$tmp/etcd.log" 2>&1 &
pids+=($!)
for _ in $(seq 200); do port_free "$cport" || break; sleep 0.05; done
sleep 0.5
# The nodes talk mTLS with certificates of deploy/make-cluster-certs.sh (as
# an operator sets a cluster up); without the openssl tool, peer_insecure
# (said in the summary: cross-node QPs need one or the other).
certs_script=${MOONCAKE_CERTS_SCRIPT:-"$(cd "$(dirname "$0")/../.." && pwd)/deploy/make-cluster-certs.sh"}
for n in a b; do
  echo "etcd_lease_ttl_s = 2" >"$tmp/node-$n.conf"
  if command -v openssl >/dev/null && [[ -x "$certs_script" ]]; then
    "$certs_script" --out "$tmp/tls" --days 2 "node-$n" >/dev/null
    printf 'peer_tls_ca_file = %s\npeer_tls_cert_file = %s\npeer_tls_key_file = %s\n' \
      "$tmp/tls/ca.pem" "$tmp/tls/node-$n.pem" "$tmp/tls/node-$n.key" >>"$tmp/node-$n.conf"
  else
    echo "peer_insecure = true" >>"$tmp/node-$n.conf"
    echo "note - no openssl tool: the nodes run peer_insecure"
  fi
done
for n in a b; do
  port=$pa; [[ $n == b ]] && port=$pb
  "$bin/mooncaked" --socket "$tmp/$n.sock" --node-id "node-$n" --config "$tmp/node-$n.conf" \
    --peer-listen "127.0.0.1:$port" --etcd "http://127.0.0.1:$cport" --log-level warning 2>"$tmp/daemon-$n.log" &
  pids+=($!)
done
for n in a b; do for _ in $(seq 200); do [[ -S "$tmp/$n.sock" ]] && break; sleep 0.05; done; done
timeout 20 "$bin/mcctl" --socket "$tmp/a.sock" peers
node_of() { if (($1 % 2 == 0)); then echo a; else echo b; fi; }
ex() {  # ex RANK WORLD GROUP ARGS...: one rank on node a (even) or b (odd)
  local r=$1 n=$2 g=$3
  shift 3
  timeout -k 5 "${MC_RANK_TIMEOUT:-120}" "$bin/device_transport_example" --platform cuda \
    --socket "$tmp/$(node_of "$r").sock" --group "$g" --rank "$r" --world-size "$n" \
    --device "$(gpu_of "$r")" --route rdma "$@"
}

for spec in "2 16777216" "4 1048583"; do
  read -r n bytes <<<"$spec"
  rpids=()
  start=$(date +%s.%N)
  for r in $(seq 0 $((n - 1))); do
    ex "$r" "$n" "xnode-$n" --bytes "$bytes" >"$tmp/r$n-$r" 2>&1 &
    rpids+=($!)
  done
  rcs=0
  for r in $(seq 0 $((n - 1))); do
    wait "${rpids[$r]}" || rcs=$((rcs + 1))
    grep -q PASS "$tmp/r$n-$r" || rcs=$((rcs + 1))
  done
  end=$(date +%s.%N)
  for r in $(seq 0 $((n - 1))); do sed "s/^/  rank $r: /" "$tmp/r$n-$r" | tail -3; done
  check "CUDA --route rdma, $n ranks over 2 nodes, $bytes bytes ($(awk "BEGIN{printf \"%.2f\", $end - $start}") s)" $rcs
done

# A watcher on node a; its peer on node b dies with its whole node.
"$bin/device_transport_example" --platform cuda --socket "$tmp/a.sock" --group xwatch --rank 0 \
  --world-size 2 --device "$(gpu_of 0)" --route rdma --mode watch --timeout-ms 30000 >"$tmp/w0" 2>&1 &
w0=$!
pids+=($w0)
"$bin/device_transport_example" --platform cuda --socket "$tmp/b.sock" --group xwatch --rank 1 \
  --world-size 2 --device "$(gpu_of 1)" --route rdma --mode watch --timeout-ms 30000 >"$tmp/w1" 2>&1 &
pids+=($!)
for _ in $(seq 600); do grep -q READY "$tmp/w0" && grep -q READY "$tmp/w1" && break; sleep 0.05; done
kill -KILL "${pids[2]}"  # node-b's daemon
t0=$(date +%s.%N)
wrc=0
timeout 15 tail --pid=$w0 -f /dev/null || wrc=1
t1=$(date +%s.%N)
wait $w0 || wrc=1
grep -q "EVENT lost rank 1" "$tmp/w0" || wrc=1
cat "$tmp/w0" | tail -3
check "watcher on node a heard node b's rank lost ($(awk "BEGIN{printf \"%.2f\", $t1 - $t0}") s at lease TTL 2 s)" $wrc
if [[ $failed -gt 0 ]]; then
  echo "--- daemon a"; tail -20 "$tmp/daemon-a.log"
  echo "--- daemon b"; tail -20 "$tmp/daemon-b.log"
fi
summary
