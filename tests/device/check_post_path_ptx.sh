#!/usr/bin/env bash
# The post path's ordering in the PTX nvcc emits for mlx5/qp_ops.h
# (post_path_ptx.cu): what the CPU tests cannot see, since the host platform
# maps every scope to the same C++ atomics.
#   - the doorbell record is a system-scope release for host rings and a
#     GPU-scope one for rings in GPU memory (both paths present);
#   - no full system fence (fence.sc.sys / membar.sys) anywhere in posting
#     or quiet: the release store is the only system-wide wait per doorbell;
#   - the reservation is a GPU-scope relaxed atomic, the poll lock a
#     GPU-scope CAS;
#   - lanes posting to one QP are grouped (match.any), waiters back off
#     (nanosleep).
set -euo pipefail
ptx=$1
[[ -s $ptx ]] || { echo "no PTX at $ptx"; exit 1; }
fail=0
need() {
  if ! grep -q -- "$1" "$ptx"; then echo "FAIL: '$1' missing ($2)"; fail=1; else echo "ok: $2"; fi
}
never() {
  if grep -q -- "$1" "$ptx"; then
    echo "FAIL: '$1' present ($2):"; grep -n -- "$1" "$ptx" | head -5; fail=1
  else
    echo "ok: $2"
  fi
}
need 'st.release.sys.global.b32' "doorbell record, host rings: system-scope release"
need 'st.release.gpu.global.b32' "doorbell record, GPU rings: GPU-scope release"
need 'atom.relaxed.gpu.global.add.u64' "reservation: GPU-scope relaxed add"
need 'atom.acquire.gpu.global.cas.b32' "poll lock: GPU-scope CAS"
need 'match.any.sync' "lanes posting to one QP grouped"
need 'nanosleep' "waiters back off"
never 'fence.sc.sys' "no full system fence"
never 'membar.sys' "no membar.sys"
never 'atom.acquire.sys.global.cas' "no system-scope CAS on the poll lock"
exit $fail
