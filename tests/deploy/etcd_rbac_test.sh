#!/usr/bin/env bash
# deploy/etcd-rbac.sh against a real etcd (issue 23 item 2): etcd over TLS
# with client certificates (etcd takes the user from the certificate's CN)
# and auth on, the roles made by the script for node-a and node-b, then:
#   - node-a may write its own record and group claims, read the prefix;
#   - node-a may not write node-b's record, nor keys outside the prefix;
#   - two real mooncaked with those certificates register and see each
#     other (leases, the Txn claim of the node key, the watch all pass).
#   etcd_rbac_test.sh REPO_ROOT BIN_DIR
set -euo pipefail
repo=${1:?usage: etcd_rbac_test.sh REPO_ROOT BIN_DIR}
bin=${2:?usage: etcd_rbac_test.sh REPO_ROOT BIN_DIR}
command -v etcd >/dev/null || { echo "FAIL: etcd not installed (deploy/install-deps.sh)"; exit 1; }
command -v etcdctl >/dev/null || { echo "FAIL: etcdctl not installed (deploy/install-deps.sh: etcd-client)"; exit 1; }
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# Certificates: etcd's server (DNS:localhost), the administrator (CN=root),
# two nodes, and one node the roles do not know.
"$repo/deploy/make-cluster-certs.sh" --out "$tmp/tls" --days 2 localhost root node-a node-b node-x >/dev/null
cport=$(free_port); pport=$(free_port)
etcd --name rbac --data-dir "$tmp/etcd" \
  --listen-client-urls "https://127.0.0.1:$cport" --advertise-client-urls "https://localhost:$cport" \
  --listen-peer-urls "http://127.0.0.1:$pport" --initial-advertise-peer-urls "http://127.0.0.1:$pport" \
  --initial-cluster "rbac=http://127.0.0.1:$pport" \
  --cert-file "$tmp/tls/localhost.pem" --key-file "$tmp/tls/localhost.key" \
  --trusted-ca-file "$tmp/tls/ca.pem" --client-cert-auth --log-level error >"$tmp/etcd.log" 2>&1 &
pids+=($!)
as() {  # as WHO etcdctl-args...
  local who=$1; shift
  ETCDCTL_API=3 etcdctl --endpoints "https://localhost:$cport" --cacert "$tmp/tls/ca.pem" \
    --cert "$tmp/tls/$who.pem" --key "$tmp/tls/$who.key" --command-timeout 5s "$@"
}
for _ in $(seq 100); do as root endpoint health >/dev/null 2>&1 && break; sleep 0.1; done
as root endpoint health >/dev/null 2>&1 || { cat "$tmp/etcd.log"; echo "FAIL: etcd did not start"; exit 1; }

ETCDCTL_ENDPOINTS="https://localhost:$cport" ETCDCTL_CACERT="$tmp/tls/ca.pem" \
  ETCDCTL_CERT="$tmp/tls/root.pem" ETCDCTL_KEY="$tmp/tls/root.key" \
  "$repo/deploy/etcd-rbac.sh" --prefix /mcrbac --enable node-a node-b || bad "etcd-rbac.sh failed"
# Idempotent: a second run changes nothing and succeeds.
ETCDCTL_ENDPOINTS="https://localhost:$cport" ETCDCTL_CACERT="$tmp/tls/ca.pem" \
  ETCDCTL_CERT="$tmp/tls/root.pem" ETCDCTL_KEY="$tmp/tls/root.key" \
  "$repo/deploy/etcd-rbac.sh" --prefix /mcrbac --enable node-a node-b >/dev/null || bad "a second run failed"

expect_ok() { as "$@" >/dev/null 2>"$tmp/err" || bad "$* was refused: $(cat "$tmp/err")"; }
expect_denied() {
  if as "$@" >/dev/null 2>"$tmp/err"; then bad "$* was allowed"; 
  elif ! grep -qi "permission denied\|user name is empty\|not found" "$tmp/err"; then bad "$*: $(cat "$tmp/err")"; fi
}
expect_ok node-a put /mcrbac/nodes/node-a '{"node_id":"node-a"}'
expect_ok node-a put /mcrbac/groups/1000/g/ranks/0 '{}'
expect_ok node-a get --prefix /mcrbac/
expect_denied node-a put /mcrbac/nodes/node-b forged
expect_denied node-a del /mcrbac/nodes/node-b
expect_denied node-a put /elsewhere x
expect_denied node-x get --prefix /mcrbac/
expect_ok node-b put /mcrbac/nodes/node-b '{"node_id":"node-b"}'
expect_ok root del --prefix /mcrbac/

# Two daemons with their node certificates: they register and see each other.
for n in a b; do
  cat >"$tmp/$n.conf" <<CONF
etcd_prefix = /mcrbac
etcd_lease_ttl_s = 2
etcd_ca_file = $tmp/tls/ca.pem
etcd_cert_file = $tmp/tls/node-$n.pem
etcd_key_file = $tmp/tls/node-$n.key
CONF
  "$bin/mooncaked" --socket "$tmp/$n.sock" --node-id "node-$n" --config "$tmp/$n.conf" \
    --etcd "https://localhost:$cport" --log-level warning 2>"$tmp/daemon-$n.log" &
  pids+=($!)
done
seen=""
for _ in $(seq 100); do
  seen=$("$bin/mcctl" --socket "$tmp/a.sock" --json peers 2>/dev/null | grep -o '"node_id": *"node-[ab]"' | sort | tr -d ' \n' || true)
  [[ "$seen" == '"node_id":"node-a""node_id":"node-b"' ]] && break
  sleep 0.1
done
[[ "$seen" == '"node_id":"node-a""node_id":"node-b"' ]] ||
  bad "node-a sees '$seen' under RBAC; logs: $(cat "$tmp"/daemon-*.log)"

if [[ $fail -ne 0 ]]; then exit 1; fi
echo "PASS: etcd-rbac.sh: each node writes only its own record; two daemons register under it"
