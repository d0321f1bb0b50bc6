#!/usr/bin/env bash
# deploy/mooncaked.service: exposure 2.5 or better by systemd-analyze
# security, and grants that match what mooncaked does today (a UNIX socket
# in /run/mooncake chowned to a group, /sys, libcuda on /dev/nvidia*, the
# verbs devices and pinned memory for RDMA; not rdma_cm or umad, which it
# does not use, and no capability beyond CAP_CHOWN).
#   unit_security_test.sh UNIT
set -euo pipefail
unit=${1:?usage: unit_security_test.sh UNIT}
if ! command -v systemd-analyze >/dev/null 2>&1; then
  echo "SKIP: systemd-analyze not installed"
  exit 77
fi
fail=0
bad() { echo "FAIL: $*"; fail=1; }

# --threshold is in tenths: 25 = 2.5. The exit status is non-zero above it.
out=$(systemd-analyze security --offline=true --threshold=25 --no-pager "$unit" 2>&1) || rc=$?
score=$(sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\).*/\1/p' <<<"$out")
echo "exposure: ${score:-unknown}"
if [[ -z "$score" ]]; then
  echo "$out"
  bad "systemd-analyze printed no exposure level"
elif [[ ${rc:-0} -ne 0 ]]; then
  grep '✗' <<<"$out" || true
  bad "exposure $score is above 2.5"
fi

# Grants: what the daemon uses, nothing for code that does not exist yet.
value() { sed -n "s/^$1=//p" "$unit"; }
[[ "$(value LimitNOFILE)" == 65536 ]] || bad "LimitNOFILE is '$(value LimitNOFILE)', expected 65536"
[[ "$(value CapabilityBoundingSet)" == CAP_CHOWN ]] ||
  bad "CapabilityBoundingSet is '$(value CapabilityBoundingSet)', expected CAP_CHOWN (socket_group)"
[[ -n "$(value WatchdogSec)" ]] || bad "no WatchdogSec="
[[ "$(value SystemCallFilter)" == *@system-service* ]] || bad "no SystemCallFilter=@system-service"
[[ "$(value ProtectProc)" == invisible ]] || bad "ProtectProc is not invisible"
[[ "$(value PrivateMounts)" == yes ]] || bad "PrivateMounts is not yes"
# RDMA: exactly the verbs devices and memlock (mlx5 DevX through
# /dev/infiniband/uverbsN; registrations pin host memory).
grep -qx 'DeviceAllow=char-infiniband_verbs rw' "$unit" || bad "no DeviceAllow=char-infiniband_verbs rw (verbs devices)"
[[ "$(value LimitMEMLOCK)" == infinity ]] || bad "LimitMEMLOCK is '$(value LimitMEMLOCK)', expected infinity"
if grep -Eq '^DeviceAllow=.*(rdma_cm|umad|infiniband_mad|misc)' "$unit"; then
  bad "grants for devices the daemon does not use (rdma_cm, umad):"
  grep -E '^DeviceAllow=.*(rdma_cm|umad|infiniband_mad|misc)' "$unit"
fi
if [[ $(grep -c '^DeviceAllow=' "$unit") -ne 2 ]]; then
  bad "expected exactly two DeviceAllow= lines (nvidia, infiniband_verbs):"
  grep '^DeviceAllow=' "$unit"
fi
(( fail == 0 )) && echo "PASS: $unit"
exit $fail
