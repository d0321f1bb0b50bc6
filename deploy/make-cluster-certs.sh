#!/usr/bin/env bash
# Makes the certificates mooncaked's peer port needs for mutual TLS
# (docs/cluster.md, "Peer trust"): a CA of the cluster's own, and for each
# node a key and a certificate whose identity is the node id, carried as a
# DNS subjectAltName (DNS:<node_id>), usable as TLS server and client.
#
#   deploy/make-cluster-certs.sh --out DIR [--days N] NODE_ID...
#   deploy/make-cluster-certs.sh --out DIR [--days N] --revoke NODE_ID...
#   deploy/make-cluster-certs.sh --out DIR [--days N] --crl
#
# DIR/ca.pem and DIR/ca.key are made on the first run and reused after, so
# nodes can be added later with the same CA. For each node: DIR/<id>.pem
# and DIR/<id>.key (mode 0600; an existing pair is kept, not replaced).
# Copy ca.pem, crl.pem, <id>.pem and <id>.key to node <id> and set there:
#   peer_tls_ca_file   = /etc/mooncake/tls/ca.pem
#   peer_tls_crl_file  = /etc/mooncake/tls/crl.pem
#   peer_tls_cert_file = /etc/mooncake/tls/<id>.pem
#   peer_tls_key_file  = /etc/mooncake/tls/<id>.key
# --revoke puts the nodes' certificates on DIR/crl.pem, the CA's signed
# revocation list, and moves them to DIR/revoked/ (their keys are deleted;
# a node made again gets a new certificate). Copy crl.pem to every node:
# each daemon takes it within a second, no restart. --crl issues the list
# afresh (its next update is --days away; a list past it stays in force
# but the daemons warn).
# Keep ca.key off the nodes: whoever holds it can mint any node's identity.
# Keys are ECDSA P-256. Needs the openssl command line tool.
set -euo pipefail

usage() {
  sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'
  exit "${1:-2}"
}

out=""
days=825
nodes=()
action=make
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out) out="${2:-}"; shift 2 ;;
    --days) days="${2:-}"; shift 2 ;;
    --revoke) action=revoke; shift ;;
    --crl) action=crl; shift ;;
    -h|--help) usage 0 ;;
    -*) echo "make-cluster-certs: unknown option '$1'" >&2; usage ;;
    *) nodes+=("$1"); shift ;;
  esac
done
[[ -n "$out" ]] || { echo "make-cluster-certs: --out DIR is required" >&2; usage; }
if [[ $action == crl ]]; then
  [[ ${#nodes[@]} -eq 0 ]] || { echo "make-cluster-certs: --crl takes no node id" >&2; usage; }
else
  [[ ${#nodes[@]} -gt 0 ]] || { echo "make-cluster-certs: name at least one node id" >&2; usage; }
fi
[[ "$days" =~ ^[0-9]+$ && "$days" -gt 0 ]] || { echo "make-cluster-certs: --days takes a positive number" >&2; exit 2; }
command -v openssl >/dev/null || { echo "make-cluster-certs: openssl is not installed (apt-get install openssl)" >&2; exit 1; }
for id in "${nodes[@]}"; do
  # The node_id rule of mooncaked.conf (peering/node_registry.h).
  if ! [[ "$id" =~ ^[A-Za-z0-9._-]{1,64}$ ]]; then
    echo "make-cluster-certs: '$id' is not a node id (1..64 of A-Z a-z 0-9 . _ -)" >&2
    exit 2
  fi
done

umask 077
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The CA's revocation list: openssl ca's database of revoked serials
# (DIR/crl-index.txt) and DIR/crl.pem, written whole and then renamed so a
# daemon never reads half of it.
ca_config() {
  touch "$out/crl-index.txt"
  [[ -f "$out/crl-number" ]] || echo 01 >"$out/crl-number"
  cat >"$tmp/ca.cnf" <<CNF
[ca]
default_ca = cluster
[cluster]
database = $out/crl-index.txt
crlnumber = $out/crl-number
certificate = $out/ca.pem
private_key = $out/ca.key
default_md = sha256
default_crl_days = $days
CNF
}
write_crl() {
  ca_config
  openssl ca -batch -config "$tmp/ca.cnf" -gencrl -out "$out/crl.pem.new" 2>"$tmp/err" ||
    { cat "$tmp/err" >&2; exit 1; }
  chmod 0644 "$out/crl.pem.new"
  mv -f "$out/crl.pem.new" "$out/crl.pem"
  echo "revocation list: $out/crl.pem ($(grep -c '^R' "$out/crl-index.txt" || true) revoked; next update in $days days)"
}

if [[ $action != make ]]; then
  [[ -f "$out/ca.pem" && -f "$out/ca.key" ]] ||
    { echo "make-cluster-certs: no CA in $out (ca.pem and ca.key)" >&2; exit 1; }
  if [[ $action == revoke ]]; then
    ca_config
    mkdir -p "$out/revoked"
    for id in "${nodes[@]}"; do
      [[ -f "$out/$id.pem" ]] || { echo "make-cluster-certs: no certificate $out/$id.pem" >&2; exit 1; }
      serial=$(openssl x509 -in "$out/$id.pem" -noout -serial | sed 's/^serial=//')
      openssl ca -batch -config "$tmp/ca.cnf" -revoke "$out/$id.pem" -crl_reason keyCompromise \
        >/dev/null 2>"$tmp/err" || { cat "$tmp/err" >&2; exit 1; }
      mv -f "$out/$id.pem" "$out/revoked/$id-$serial.pem"
      rm -f "$out/$id.key"
      echo "node $id: certificate $serial revoked (kept as $out/revoked/$id-$serial.pem, key deleted)"
    done
  fi
  write_crl
  echo "copy $out/crl.pem to every node's peer_tls_crl_file"
  exit 0
fi

if [[ ! -f "$out/ca.pem" || ! -f "$out/ca.key" ]]; then
  openssl ecparam -name prime256v1 -genkey -noout -out "$out/ca.key" 2>"$tmp/err" ||
    { cat "$tmp/err" >&2; exit 1; }
  cat >"$tmp/ca.ext" <<'EXT'
basicConstraints = critical, CA:TRUE, pathlen:0
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
EXT
  openssl req -x509 -new -key "$out/ca.key" -sha256 -days "$days" \
    -subj "/CN=mooncake cluster CA" -extensions v3_ca -config <(printf '[req]\ndistinguished_name=dn\n[dn]\n[v3_ca]\n'; cat "$tmp/ca.ext") \
    -out "$out/ca.pem" 2>"$tmp/err" || { cat "$tmp/err" >&2; exit 1; }
  chmod 0644 "$out/ca.pem"
  echo "made the cluster CA: $out/ca.pem (its key $out/ca.key stays here)"
  write_crl
fi

for id in "${nodes[@]}"; do
  if [[ -f "$out/$id.pem" && -f "$out/$id.key" ]]; then
    echo "node $id: $out/$id.pem exists, kept"
    continue
  fi
  openssl ecparam -name prime256v1 -genkey -noout -out "$out/$id.key" 2>"$tmp/err" ||
    { cat "$tmp/err" >&2; exit 1; }
  openssl req -new -key "$out/$id.key" -subj "/CN=$id" -out "$tmp/$id.csr" 2>"$tmp/err" ||
    { cat "$tmp/err" >&2; exit 1; }
  cat >"$tmp/$id.ext" <<EXT
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth, clientAuth
subjectAltName = DNS:$id
EXT
  openssl x509 -req -in "$tmp/$id.csr" -CA "$out/ca.pem" -CAkey "$out/ca.key" \
    -CAcreateserial -CAserial "$out/ca.srl" -sha256 -days "$days" -extfile "$tmp/$id.ext" \
    -out "$out/$id.pem" 2>"$tmp/err" || { cat "$tmp/err" >&2; exit 1; }
  chmod 0644 "$out/$id.pem"
  chmod 0600 "$out/$id.key"
  echo "node $id: $out/$id.pem (DNS:$id) and $out/$id.key"
done
