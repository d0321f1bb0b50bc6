#!/usr/bin/env bash
# A node cut off from the network while its daemon lives (issue 9 item 4):
# the other nodes report its rank LOST within the lease TTL plus 1 s.
#
#   cluster_netcut_test.sh BUILD_DIR
#
# Layout, all inside private user, network and PID namespaces (`unshare -rnp`, so
# nothing of the host's network is touched and no host privilege is needed
# where unprivileged user namespaces are allowed):
#
#   netns etcd  10.77.0.1  etcd
#   netns n0    10.77.0.10 mooncaked node-0     rank 0
#   netns n1    10.77.0.11 mooncaked node-1     rank 1
#   netns n2    10.77.0.12 mooncaked node-2     rank 2   <- cut off
#   each joined by a veth pair to the bridge br0 of the outer namespace.
#
# The members are mc_test_client processes in the outer namespace: a UNIX
# socket is a file, so they reach their node's daemon across namespaces.
# Once the group of 3 has formed, `ip link set veth-n2 down` (n2's bridge
# port) cuts node-2 off; node-2's daemon keeps running, cannot refresh its
# lease, etcd expires it, and ranks 0 and 1 must print
# `EVENT kind=lost group=netcut rank=2` within TTL + 1 s of the cut.
#
# SKIP (exit 0, line starting "SKIP:") with the precise reason where user or
# network namespaces cannot be made, or a tool or binary is missing.
set -euo pipefail

readonly TTL_S=2
readonly SUBNET=10.77.0

if [[ ${MC_NETCUT_INNER:-} != 1 ]]; then
  build=$(cd "${1:?usage: cluster_netcut_test.sh BUILD_DIR}" && pwd)
  etcd_bin=${MOONCAKE_ETCD_BIN:-/usr/bin/etcd}
  for tool in unshare nsenter ip; do
    command -v "$tool" >/dev/null || { echo "SKIP: '$tool' is not installed (util-linux, iproute2)"; exit 0; }
  done
  [[ -x $etcd_bin ]] || { echo "SKIP: no etcd at $etcd_bin (deploy/install-deps.sh installs etcd-server)"; exit 0; }
  for b in mooncaked mc_test_client; do
    [[ -x $build/bin/$b ]] || { echo "SKIP: $build/bin/$b is not built"; exit 0; }
  done
  # Probe each thing the test needs, so a refusal names itself.
  # A PID namespace too: when the test is killed (a CTest timeout), unshare
  # takes its bash (the namespace's init) along, and the kernel every
  # process started in it, so nothing outlives the test.
  readonly ns_flags=(-r -n -p -f -m --mount-proc --kill-child)
  if ! err=$(unshare "${ns_flags[@]}" true 2>&1); then
    echo "SKIP: cannot create user + network + PID namespaces (unshare ${ns_flags[*]}: $err);" \
      "needs unprivileged user namespaces (sysctl user.max_user_namespaces > 0," \
      "kernel.unprivileged_userns_clone = 1, no AppArmor/seccomp block) or CAP_SYS_ADMIN"
    exit 0
  fi
  if ! err=$(unshare "${ns_flags[@]}" sh -c 'unshare -n true && ip link add mcv0 type veth peer name mcv1 && ip link add mcbr type bridge' 2>&1); then
    echo "SKIP: inside a user + network namespace, nested network namespaces, veth" \
      "pairs or a bridge cannot be made: $err (a kernel without CONFIG_VETH/CONFIG_BRIDGE" \
      "or a sandbox that forbids them)"
    exit 0
  fi
  exec env MC_NETCUT_INNER=1 MC_NETCUT_BUILD="$build" MC_NETCUT_ETCD="$etcd_bin" \
    unshare "${ns_flags[@]}" bash "$0" "$@"
fi

# ---- inside the private user + network namespace -------------------------------
build=$MC_NETCUT_BUILD
etcd_bin=$MC_NETCUT_ETCD
work=$(mktemp -d /tmp/mc-netcut-XXXXXX)
pids=()  # everything started here, killed by pid on exit
cleanup() {
  local rc=$?
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do kill -KILL "${pids[i]}" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  if [[ $rc != 0 && -d $work ]]; then
    for f in "$work"/*.log; do
      [[ -f $f ]] || continue
      echo "---- $(basename "$f") (last 15 lines)"
      tail -n 15 "$f"
    done
  fi
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  exit 1
}
now_ms() { echo $(($(date +%s%N) / 1000000)); }

# One network namespace per host, held open by a sleeping process.
declare -A ns_pid
# Runs a command in a host's namespace. Started with `&` it must be called
# as `nsenter --net="$(ns_net NS)" ... &` directly, so that $! is the
# process itself (nsenter execs it) and the cleanup's kill reaches it.
ns_net() { echo "/proc/${ns_pid[$1]}/ns/net"; }
in_ns() {
  local ns=$1
  shift
  nsenter --net="$(ns_net "$ns")" "$@"
}
ip link add br0 type bridge
ip link set br0 up
ip link set lo up
for ns in etcd n0 n1 n2; do
  unshare -n sleep 100000 &
  ns_pid[$ns]=$!
  pids+=($!)
done
sleep 0.2
declare -A addr=([etcd]=$SUBNET.1 [n0]=$SUBNET.10 [n1]=$SUBNET.11 [n2]=$SUBNET.12)
for ns in etcd n0 n1 n2; do
  ip link add "veth-$ns" type veth peer name eth0-"$ns"
  ip link set "eth0-$ns" netns "${ns_pid[$ns]}"
  ip link set "veth-$ns" master br0
  ip link set "veth-$ns" up
  in_ns "$ns" ip link set lo up
  in_ns "$ns" ip addr add "${addr[$ns]}/24" dev "eth0-$ns"
  in_ns "$ns" ip link set "eth0-$ns" up
done

# etcd on 10.77.0.1.
etcd_url=http://$SUBNET.1:2379
nsenter --net="$(ns_net etcd)" "$etcd_bin" --name netcut --data-dir "$work/etcd" \
  --listen-client-urls "$etcd_url" --advertise-client-urls "$etcd_url" \
  --listen-peer-urls "http://$SUBNET.1:2380" --initial-advertise-peer-urls "http://$SUBNET.1:2380" \
  --initial-cluster "netcut=http://$SUBNET.1:2380" --log-level error >"$work/etcd.log" 2>&1 &
pids+=($!)

# The nodes: each retries its start until etcd answers (an unreachable etcd
# stops a daemon's start, by design).
printf 'etcd_lease_ttl_s = %d\netcd_prefix = /mcnetcut\n' "$TTL_S" >"$work/cluster.conf"
declare -A daemon_pid
start_node() {
  local ns=$1 deadline=$(($(now_ms) + 20000))
  while :; do
    nsenter --net="$(ns_net "$ns")" "$build/bin/mooncaked" --config "$work/cluster.conf" --socket "$work/$ns.sock" \
      --node-id "node-${ns#n}" --peer-listen "${addr[$ns]}:7000" --etcd "$etcd_url" \
      --log-level info >>"$work/mooncaked-$ns.log" 2>&1 &
    local p=$!
    while [[ ! -S $work/$ns.sock ]] && kill -0 "$p" 2>/dev/null; do sleep 0.05; done
    if kill -0 "$p" 2>/dev/null; then
      daemon_pid[$ns]=$p
      pids+=("$p")
      return
    fi
    wait "$p" || true
    (($(now_ms) < deadline)) || fail "mooncaked in $ns did not start (see its log)"
    sleep 0.3
  done
}
for ns in n0 n1 n2; do start_node "$ns"; done

# The group: rank R on node-R, each member holding it until its stdin closes.
writers=()
for r in 0 1 2; do
  mkfifo "$work/member$r.in"
  "$build/bin/mc_test_client" member "$work/n$r.sock" netcut "$r" 3 \
    <"$work/member$r.in" >"$work/member$r.log" 2>&1 &
  pids+=($!)
  # Held open until the script exits: the member stays in the group.
  exec {writer}>"$work/member$r.in"
  writers+=("$writer")
done
deadline=$(($(now_ms) + 30000))
for r in 0 1 2; do
  until grep -q '^JOINED' "$work/member$r.log"; do
    grep -q '^ERROR' "$work/member$r.log" && fail "rank $r: $(grep '^ERROR' "$work/member$r.log")"
    (($(now_ms) < deadline)) || fail "rank $r did not join within 30 s"
    sleep 0.05
  done
done
echo "group of 3 formed over node-0, node-1, node-2 (lease TTL $TTL_S s)"

# Cut node-2 off: its bridge port goes down, its daemon lives on.
t0=$(now_ms)
ip link set veth-n2 down
limit=$((t0 + (TTL_S + 1) * 1000))
declare -A seen
while :; do
  for r in 0 1; do
    if [[ -z ${seen[$r]:-} ]] && grep -qi '^EVENT kind=lost group=netcut rank=2$' "$work/member$r.log"; then
      seen[$r]=$(($(now_ms) - t0))
      echo "rank $r: EVENT lost rank 2 after ${seen[$r]} ms"
    fi
  done
  [[ -n ${seen[0]:-} && -n ${seen[1]:-} ]] && break
  if (($(now_ms) > limit)); then
    fail "rank 2 not reported LOST on both other nodes within TTL + 1 s = $((TTL_S + 1)) s" \
      "(rank 0: ${seen[0]:-none}, rank 1: ${seen[1]:-none})"
  fi
  sleep 0.02
done
kill -0 "${daemon_pid[n2]}" 2>/dev/null || fail "node-2's daemon died: the test is of a cut, not a crash"
echo "node-2's daemon still runs (pid ${daemon_pid[n2]}); detection within TTL + 1 s: PASS"
