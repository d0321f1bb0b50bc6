#!/usr/bin/env bash
# Creates etcd roles and users so that each mooncaked node may write only
# what it must (docs/cluster.md, "etcd access"). Run it with etcdctl's
# administrator credentials in the environment (ETCDCTL_ENDPOINTS,
# ETCDCTL_CACERT, ETCDCTL_CERT/ETCDCTL_KEY of a certificate whose CN is
# root, or ETCDCTL_USER=root:PASSWORD once auth is on):
#
#   deploy/etcd-rbac.sh [--prefix /mooncake] [--enable] NODE_ID...
#
# Per node N: a role mooncake-node-N with
#   readwrite  <prefix>/nodes/N          (its own record, nobody else's)
#   readwrite  <prefix>/groups/          (group claims: shared, see the docs)
#   read       <prefix>/                 (every node and group record)
# and a user N holding it. With etcd --client-cert-auth, etcd takes the
# user from the client certificate's CN, so a node's certificate made by
# deploy/make-cluster-certs.sh (CN=N) is its login; the user's password is
# random and never printed. Existing roles and users are kept.
# --enable: also creates the root user (with the root role, a random
# password that is not printed: administer with a certificate whose CN is
# root) when missing, and turns auth on. Idempotent.
set -euo pipefail

usage() {
  sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'
  exit "${1:-2}"
}

prefix=/mooncake
enable=0
nodes=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --prefix) prefix="${2:-}"; shift 2 ;;
    --enable) enable=1; shift ;;
    -h|--help) usage 0 ;;
    -*) echo "etcd-rbac: unknown option '$1'" >&2; usage ;;
    *) nodes+=("$1"); shift ;;
  esac
done
[[ ${#nodes[@]} -gt 0 ]] || { echo "etcd-rbac: name at least one node id" >&2; usage; }
# The etcd_prefix rule of mooncaked.conf: absolute, no trailing '/'.
[[ "$prefix" =~ ^/[A-Za-z0-9._/-]*[A-Za-z0-9._-]$ ]] ||
  { echo "etcd-rbac: --prefix '$prefix' is not an etcd_prefix (/name, no trailing /)" >&2; exit 2; }
for id in "${nodes[@]}"; do
  [[ "$id" =~ ^[A-Za-z0-9._-]{1,64}$ ]] ||
    { echo "etcd-rbac: '$id' is not a node id (1..64 of A-Z a-z 0-9 . _ -)" >&2; exit 2; }
  [[ "$id" != root ]] || { echo "etcd-rbac: 'root' is etcd's administrator, not a node id" >&2; exit 2; }
done
command -v etcdctl >/dev/null || { echo "etcd-rbac: etcdctl not found (apt-get install etcd-client)" >&2; exit 1; }
export ETCDCTL_API=3

random_password() { head -c 24 /dev/urandom | base64 | tr -d '/+='; }
# Runs an etcdctl "add"; one that already exists is kept (idempotent, and
# with no list-then-add race). Prints 1 when it was made.
add() {
  local err
  if err=$(etcdctl "$@" 2>&1 >/dev/null); then echo 1; return 0; fi
  grep -q "already exists" <<<"$err" && return 0
  echo "etcd-rbac: etcdctl $1 $2 $3: $err" >&2
  return 1
}

for id in "${nodes[@]}"; do
  role="mooncake-node-$id"
  add role add "$role" >/dev/null
  etcdctl role grant-permission "$role" readwrite "$prefix/nodes/$id" >/dev/null
  etcdctl role grant-permission "$role" --prefix=true readwrite "$prefix/groups/" >/dev/null
  etcdctl role grant-permission "$role" --prefix=true read "$prefix/" >/dev/null
  add user add "$id" --new-user-password="$(random_password)" >/dev/null
  etcdctl user grant-role "$id" "$role" >/dev/null
  echo "node $id: role $role (readwrite $prefix/nodes/$id and $prefix/groups/, read $prefix/)"
done

if [[ $enable -eq 1 ]]; then
  if [[ -n "$(add user add root --new-user-password="$(random_password)")" ]]; then
    echo "made user root (password not kept: administer with a certificate whose CN is root)"
  fi
  etcdctl user grant-role root root >/dev/null
  if etcdctl auth enable >/dev/null 2>&1; then
    echo "auth enabled"
  else
    # Already on (etcdctl then fails to enable again, and the roles above
    # were made with root's credentials anyway).
    echo "auth was already enabled"
  fi
fi
