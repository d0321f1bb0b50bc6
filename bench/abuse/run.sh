#!/usr/bin/env bash
# Abuse benchmark: the outside review's attacks at their scale, against one
# mooncaked build, measured from /proc the same way for every build.
#
#   bench/abuse/run.sh BIN_DIR [LABEL]
#
# BIN_DIR holds mooncaked, mcctl, mc_abuse (tests/integration) and mc_test_client (for a build
# before the fix, copy its bin/ and lib/ aside first; mc_abuse may come from
# the new build: it only speaks the wire protocol). Needs root: the attacker
# runs as nobody (65534), the victims as root and uid 1, as on a shared node.
# Prints one "name value" line per figure; bench/results/*-abuse.md holds
# the before/after table.
set -euo pipefail
BIN=$(cd "$1" && pwd)
LABEL=${2:-run}
ABUSE=${MC_ABUSE:-$BIN/mc_abuse}
[[ $(id -u) == 0 ]] || { echo "run.sh: needs root (attacks run as nobody)" >&2; exit 64; }
WORK=$(mktemp -d /tmp/mc_abuse_bench.XXXXXX)
chmod 0755 "$WORK"
# Stage what other uids run where they can reach it.
mkdir -p "$WORK/bin"
cp "$ABUSE" "$WORK/bin/mc_abuse"
cp "$BIN/mc_test_client" "$WORK/bin/" 2>/dev/null || true
[[ -d "$BIN/../lib" ]] && cp -a "$BIN/../lib" "$WORK/lib"
chmod -R a+rX "$WORK"
SOCK=$WORK/run/mooncaked.sock
DAEMON_PID=
cleanup() {
  [[ -n "$DAEMON_PID" ]] && kill "$DAEMON_PID" 2>/dev/null && wait "$DAEMON_PID" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT

# An attack that outlives its time (a daemon too slow to answer) is cut
# there; its figures then show the missing result line.
as_nobody() { timeout "${ATTACK_TIMEOUT:-600}" setpriv --reuid=65534 --regid=65534 --clear-groups "$@" || true; }
PHASES=" ${PHASES:-a1 a2 a3 a4 a5 a6} "
phase() { [[ "$PHASES" == *" $1 "* ]]; }
rss_kb() { awk '/^VmRSS/ {print $2}' /proc/$DAEMON_PID/status; }
vm_kb() { awk '/^VmSize/ {print $2}' /proc/$DAEMON_PID/status; }
anon_kb() { awk '/^RssAnon/ {print $2}' /proc/$DAEMON_PID/status; }
maps() { wc -l <"/proc/$DAEMON_PID/maps"; }
fds() { ls /proc/$DAEMON_PID/fd | wc -l; }
cpu_ms() { awk -v hz="$(getconf CLK_TCK)" '{print int(($14 + $15) * 1000 / hz)}' /proc/$DAEMON_PID/stat; }
# Peak RSS and fd count while a command runs (sampled every 50 ms).
sample_start() {
  : >"$WORK/samples"
  ( while kill -0 "$DAEMON_PID" 2>/dev/null; do
      echo "$(rss_kb) $(fds)" >>"$WORK/samples"; sleep 0.05
    done ) &
  SAMPLER=$!
}
sample_stop() {
  kill "$SAMPLER" 2>/dev/null; wait "$SAMPLER" 2>/dev/null || true
  PEAK_RSS=$(awk 'BEGIN{m=0} $1>m{m=$1} END{print m}' "$WORK/samples")
  PEAK_FDS=$(awk 'BEGIN{m=0} $2>m{m=$2} END{print m}' "$WORK/samples")
}
start_daemon() {
  "$BIN/mooncaked" --socket "$SOCK" --socket-mode 0666 --node-id bench "$@" \
    >"$WORK/daemon.log" 2>&1 &
  DAEMON_PID=$!
  for _ in $(seq 100); do [[ -S "$SOCK" ]] && break; sleep 0.05; done
  sleep 0.3
}
stop_daemon() { kill "$DAEMON_PID" 2>/dev/null || true; wait "$DAEMON_PID" 2>/dev/null || true; DAEMON_PID=; }
# A figure named *_ok that is not 1 is a failed check: the run ends non-zero.
FAILED_CHECKS=
fig() {
  printf '%s %s %s\n' "$LABEL" "$1" "$2"
  if [[ "$1" == *_ok && "$2" != 1 ]]; then FAILED_CHECKS="$FAILED_CHECKS $1"; fi
}

# A1: 6400 fds in one fd-channel frame (100 bytes x 64 fds), on 2
# connections at once, each frame held incomplete for 1.5 s.
if phase a1; then
start_daemon
fig idle_rss_kb "$(rss_kb)"
fig idle_fds "$(fds)"
base=$(fds)
sample_start
as_nobody "$WORK/bin/mc_abuse" "$SOCK" fd-frame 101 2 1500 | { grep result || true; } | sed "s/^/$LABEL a1 /"
sample_stop
sleep 0.5
fig a1_fds_peak_over_idle $((PEAK_FDS - base))
fig a1_fds_after_over_idle $(($(fds) - base))
stop_daemon
fi

# A2: 24000 idle connections on the main socket; root's mcctl status during.
if phase a2; then
start_daemon
base=$(fds)
sample_start
# Two attacker processes: more connections than the daemon's fd limit.
as_nobody "$WORK/bin/mc_abuse" "$SOCK" idle main 12000 12000 >"$WORK/a2.out" &
A=$!
as_nobody "$WORK/bin/mc_abuse" "$SOCK" idle main 12000 12000 >"$WORK/a2b.out" &
B=$!
for _ in $(seq 600); do
  grep -q connected "$WORK/a2.out" 2>/dev/null && grep -q connected "$WORK/a2b.out" 2>/dev/null && break
  sleep 0.05
done
t0=$(date +%s%N)
if timeout 5 "$BIN/mcctl" --socket "$SOCK" status >/dev/null 2>&1; then ok=1; else ok=0; fi
fig a2_root_status_ok $ok
fig a2_root_status_ms $((($(date +%s%N) - t0) / 1000000))
wait $A $B || true
cat "$WORK/a2.out" "$WORK/a2b.out" | { grep result || true; } | sed "s/^/$LABEL a2 /"
sample_stop
fig a2_fds_peak_over_idle $((PEAK_FDS - base))
sleep 1
fig a2_fds_after_over_idle $(($(fds) - base))
fig a2_emfile_log_lines "$(grep -c 'Too many open files' "$WORK/daemon.log" || true)"
stop_daemon
fi

# A3: 2000 idle fd-channel connections; another uid's member must still
# pass its fds.
if phase a3; then
start_daemon
as_nobody "$WORK/bin/mc_abuse" "$SOCK" idle fd 2000 6000 >"$WORK/a3.out" &
A=$!
for _ in $(seq 400); do grep -q connected "$WORK/a3.out" 2>/dev/null && break; sleep 0.05; done
t0=$(date +%s%N)
if echo | timeout 20 setpriv --reuid=1 --regid=1 --clear-groups \
    "$WORK/bin/mc_test_client" member "$SOCK" victim 0 1 --fd >"$WORK/a3v.out" 2>&1 &&
   grep -q JOINED "$WORK/a3v.out"; then ok=1; else ok=0; fi
fig a3_victim_ok $ok
fig a3_victim_ms $((($(date +%s%N) - t0) / 1000000))
wait $A
sed "s/^/$LABEL a3 /" "$WORK/a3.out" | { grep result || true; }
stop_daemon
fi

# A4: one session joins all 2048 ranks of a group, each with a memfd.
if phase a4; then
start_daemon
base_rss=$(rss_kb)
base=$(fds)
sample_start
as_nobody "$WORK/bin/mc_abuse" "$SOCK" join-all 2048 --fds | sed "s/^/$LABEL a4 /"
sleep 2
sample_stop
fig a4_rss_peak_kb "$PEAK_RSS"
fig a4_rss_after_2s_kb "$(rss_kb)"
fig a4_fds_after_2s_over_idle $(($(fds) - base))
sleep 31  # past ticket_ttl_ms: what is still held then is held for good
fig a4_rss_after_33s_kb "$(rss_kb)"
fig a4_rss_idle_kb "$base_rss"
# A4b: a join asking for 49 days.
as_nobody "$WORK/bin/mc_abuse" "$SOCK" join-timeout 4233600000 | sed "s/^/$LABEL a4b /"
stop_daemon
fi

# A5: expiring 5k and 10k waiting joins (root: no per-uid cap), daemon CPU
# from the first join to the last expiry.
for n in 5000 10000; do
  phase a5 || break
  start_daemon
  c0=$(cpu_ms)
  "$WORK/bin/mc_abuse" "$SOCK" waiting-joins $n 3000 | sed "s/^/$LABEL a5 /"
  fig a5_cpu_ms_$n $(($(cpu_ms) - c0))
  stop_daemon
done

# A6: RDMA objects. One user opens 16 sessions (twice the eight that the
# per-uid limits allow at the per-session ones) and in each creates QPs,
# 4096 per call and each connected (softnic polls it), then registers
# 64 MiB regions, until refused; meanwhile uid 1 creates 64 QPs and 2
# regions. Then (A6b) one session registers 4 KiB regions 1 TiB into a
# sparse memfd, which a daemon that maps from offset 0 pays in address
# space, while uid 1 creates 8 QPs and a region. VmSize is the address
# space, maps the daemon's memory map entries, RssAnon its own memory (RSS
# also counts the pages of client memfds softnic touched).
if phase a6; then
start_daemon
base_rss=$(rss_kb)
base=$(fds)
fig a6_idle_vm_kb "$(vm_kb)"
fig a6_idle_maps "$(maps)"
fig a6_rss_anon_idle_kb "$(anon_kb)"
sample_start
as_nobody "$WORK/bin/mc_abuse" "$SOCK" rdma-flood 16 3000 --qps-per-call 4096 \
  --region-bytes 67108864 --connect >"$WORK/a6.out" &
A=$!
for _ in $(seq 6000); do grep -q flooded "$WORK/a6.out" 2>/dev/null && break; sleep 0.05; done
fig a6_flooded "$(grep flooded "$WORK/a6.out" | sed 's/ /,/g')"
fig a6_rss_flooded_kb "$(rss_kb)"
fig a6_rss_anon_flooded_kb "$(anon_kb)"
fig a6_vm_flooded_kb "$(vm_kb)"
fig a6_maps_flooded "$(maps)"
fig a6_fds_flooded_over_idle $(($(fds) - base))
t0=$(date +%s%N)
if timeout 20 setpriv --reuid=1 --regid=1 --clear-groups "$WORK/bin/mc_abuse" "$SOCK" rdma-flood 1 0 \
    --max-qps 64 --max-mrs 2 >"$WORK/a6v.out" 2>&1 && grep -q "qps=64 mrs=2 " "$WORK/a6v.out"; then
  ok=1
else
  ok=0
fi
fig a6_victim_ok $ok
fig a6_victim_ms $((($(date +%s%N) - t0) / 1000000))
wait $A || true
{ grep -E "result|refused" "$WORK/a6.out" || true; } | sed "s/^/$LABEL a6 /"
sample_stop
fig a6_rss_peak_kb "$PEAK_RSS"
fig a6_fds_peak_over_idle $((PEAK_FDS - base))
sleep 3  # the heap trimmer's quiet time
fig a6_rss_after_kb "$(rss_kb)"
fig a6_rss_anon_after_kb "$(anon_kb)"
fig a6_rss_idle_kb "$base_rss"
fig a6_fds_after_over_idle $(($(fds) - base))
fig a6_maps_after "$(maps)"
fig a6b_vm_before_kb "$(vm_kb)"
# Sparse: since the daemon registers only memfds whose every page holds
# data (2026-12-04), a terabyte at the offset must be written by the
# attacker first, which exhausts the attacker's machine (this phase then
# OOM-killed the attacker and, on a host without per-user memory limits,
# the daemon beside it). The daemon must refuse the sparse one.
as_nobody "$WORK/bin/mc_abuse" "$SOCK" rdma-flood 1 2000 --max-qps 0 --region-bytes 4096 \
  --region-offset 1099511627776 --sparse-regions >"$WORK/a6b.out" &
A=$!
for _ in $(seq 1200); do grep -q flooded "$WORK/a6b.out" 2>/dev/null && break; sleep 0.05; done
fig a6b_vm_flooded_kb "$(vm_kb)"
if timeout 20 setpriv --reuid=1 --regid=1 --clear-groups "$WORK/bin/mc_abuse" "$SOCK" rdma-flood 1 0 \
    --max-qps 8 --max-mrs 1 >"$WORK/a6bv.out" 2>&1 && grep -q "qps=8 mrs=1 " "$WORK/a6bv.out"; then
  ok=1
else
  ok=0
fi
fig a6b_victim_ok $ok
{ grep refused "$WORK/a6bv.out" || true; } | sed "s/^/$LABEL a6b victim /"
wait $A || true
{ grep -E "result|refused" "$WORK/a6b.out" || true; } | sed "s/^/$LABEL a6b /"
if timeout 5 "$BIN/mcctl" --socket "$SOCK" status >/dev/null 2>&1; then ok=1; else ok=0; fi
fig a6b_root_status_ok $ok
stop_daemon
fi
if [[ -n "$FAILED_CHECKS" ]]; then
  echo "run.sh: failed checks:$FAILED_CHECKS" >&2
  exit 1
fi
