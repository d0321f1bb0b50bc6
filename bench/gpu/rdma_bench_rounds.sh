#!/usr/bin/env bash
# Runs one rdma_bench test several times, each round against a fresh
# mooncaked, so that a figure reported for a GPU machine is a spread over
# rounds and not one pass (the first pass on a freshly started machine has
# come out up to 1.8x slower than the rounds after it).
#
#   bench/gpu/rdma_bench_rounds.sh BUNDLE|PREFIX TEST ROUNDS [daemon config line ...]
#
# BUNDLE: the .tar.gz of deploy/make-gpu-bundle.sh --pack (unpacked beside
# it, into rounds-unpacked/); PREFIX: an installed prefix. TEST: an
# rdma_bench test taking --socket (lat, bw, post, check). Config lines
# (e.g. "softnic_sink = true") go into the daemon's config file.
# Exits non-zero when any round fails.
set -uo pipefail

if [[ $# -lt 3 ]]; then
  sed -n '2,13p' "$0" >&2
  exit 2
fi
src=$1 test=$2 rounds=$3
shift 3
if [[ -f "$src" && "$src" == *.tar.gz ]]; then
  dir=$(dirname "$src")/rounds-unpacked
  rm -rf "$dir" && mkdir -p "$dir" && tar -C "$dir" -xzf "$src" || exit 1
  prefix=$(cd "$dir"/* && pwd)
else
  prefix=$(cd "$src" && pwd) || exit 1
fi
bin=$prefix/bin
tmp=$(mktemp -d /tmp/mc-rounds.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
conf=()
if [[ $# -gt 0 ]]; then
  printf '%s\n' "$@" >"$tmp/d.conf"
  conf=(--config "$tmp/d.conf")
fi

failed=0
for round in $(seq "$rounds"); do
  echo "== $test, round $round of $rounds ($(date -u +%H:%M:%S))"
  "$bin/mooncaked" --socket "$tmp/d.sock" --node-id "rounds-$round" --log-level warning \
    "${conf[@]}" 2>"$tmp/daemon.log" &
  dpid=$!
  for _ in $(seq 100); do [[ -S "$tmp/d.sock" ]] && break; sleep 0.05; done
  if ! timeout 300 "$bin/rdma_bench" --socket "$tmp/d.sock" "$test"; then
    echo "round $round failed; the daemon said:"
    cat "$tmp/daemon.log"
    failed=1
  fi
  kill -TERM "$dpid" 2>/dev/null
  wait "$dpid" 2>/dev/null
  rm -f "$tmp/d.sock"
done
exit $failed
