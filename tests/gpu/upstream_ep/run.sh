#!/usr/bin/env bash
# Upstream Mooncake EP, unchanged, on this project (issue 25 item 5), on the
# GPU machine: builds upstream's Python module _ep (mooncake-ep/src host
# sources) against our installed prefix, starts a private mooncaked, and runs
# upstream's own tests with 2 ranks on GPU 0 and torch.distributed's gloo
# backend. Steps (MC_EP_STEPS, default "perf grid-p2p grid-rdma"; _ep is
# built first when missing or with MC_EP_REBUILD=1):
#   perf      mooncake-ep/benchmarks/legacy_buffer_perf.py: dispatch + combine
#             latency (avg/min/max us per rank), P2P route
#   grid-p2p  mooncake-ep/tests/test_ep_grid.py, the 6 no-failure, non-fallback
#             P2P configurations (BF16/FP8 x sync/async/hook)
#   grid-rdma the same 6 with disable_p2p: upstream's kernels post RDMA
#             through mooncaked's softnic
#   grid      test_ep_grid.py -k each of $MC_EP_GRID (e.g. "fallback fail1 stale")
#   wheel     mooncake-wheel/tests/test_mooncake_ep.py: at the pinned commit
#             it stops at upstream's own NotImplementedError (zero-copy combine)
# Ends with "upstream_ep: N passed, N failed".
#
# Harness changes (ep_harness.py, run_ep_test.py, CMakeLists.txt here; no
# upstream file is edited):
#   - rank r on GPU r % GPU count; test_ep_grid.py's device count answers 2;
#   - process group "gloo" instead of upstream's "mooncake" PG, and so:
#     list-form all_to_all over all_to_all_single, and a stacked
#     all_gather_into_tensor output passed as its concatenated view;
#   - the build: CUDA_ARCHITECTURES 90 (upstream 80;90;103), shared cudart
#     only, the kernels compiled on the build machine (prepare.sh), and our
#     prefix, carried glog/gflags and the venv's pybind11 for what upstream's
#     top-level CMake would provide.
#
# Before (on the build machine): deploy/make-gpu-bundle.sh, then
# tests/gpu/upstream_ep/prepare.sh; carry .gpu/prefix/lib,
# .gpu/prefix/bin/mooncaked, .gpu/prefix/include and .gpu/upstream-ep.
# Usage, from the repository root there:
#   tests/gpu/upstream_ep/run.sh [PREFIX] [UPSTREAM]   (.gpu/prefix, .gpu/upstream-ep)
# Environment: MC_PY (/opt/torch/.venv/bin/python), MC_EP_WORK (scratch,
#   /tmp/mc-upstream-ep), MC_EP_CXX (/usr/bin/g++: the machine's CXX,
#   /opt/gcc/bin/g++, links libstdc++ statically, and _ep shares C++ objects
#   with libglog and libmooncake_client), MC_EP_TIMEOUT (one step, 240 s).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../../.." && pwd)
prefix=$(cd "${1:-$root/.gpu/prefix}" && pwd)
up=$(cd "${2:-$root/.gpu/upstream-ep}" && pwd)
py=${MC_PY:-/opt/torch/.venv/bin/python}
work=${MC_EP_WORK:-/tmp/mc-upstream-ep}
cxx=${MC_EP_CXX:-/usr/bin/g++}
[[ -x "$cxx" ]] || cxx=$(command -v g++)
steps=${MC_EP_STEPS:-perf grid-p2p grid-rdma}
step_timeout=${MC_EP_TIMEOUT:-240}
pydir=$(dirname "$py")
export PATH="$PATH:/usr/local/cuda/bin:$pydir"
passed=0
failed=0
section() { printf '\n==================== %s ====================\n' "$*"; }
finish() {
  echo "upstream_ep: $passed passed, $failed failed"
  [[ $failed -eq 0 ]]
}
bad() { failed=$((failed + 1)); echo "FAILED: $1"; finish || exit 1; }

section "environment"
nvidia-smi -L || true
"$py" -c 'import sys, torch, pybind11; print("python", sys.version.split()[0], "torch", torch.__version__, "pybind11", pybind11.__version__, "gpus", torch.cuda.device_count())'
for f in "$prefix/bin/mooncaked" "$prefix/lib/libmooncake_client.so" \
         "$prefix/include/transport/device/device_transport.h" \
         "$up/lib/libmooncake_ep_device.so" "$up/deps/lib/libglog.so.1" "$up/src/MANIFEST.sha256"; do
  [[ -e "$f" ]] || bad "$f missing (deploy/make-gpu-bundle.sh, tests/gpu/upstream_ep/prepare.sh, carry)"
done
# The sources are upstream's, byte for byte as prepare.sh extracted them.
(cd "$up/src" && sha256sum --quiet -c MANIFEST.sha256) || bad "upstream sources changed since prepare.sh"
head -1 "$up/src/UPSTREAM"

if [[ "${MC_EP_REBUILD:-0}" == 1 ]] || ! ls "$work"/py/mooncake/_ep*.so >/dev/null 2>&1; then
  section "build _ep (upstream mooncake-ep/src host sources)"
  rm -rf "$work"
  mkdir -p "$work"
  if cmake -S "$here" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DEP_PART=host \
       -DEP_SRC="$up/src" -DMC_PREFIX="$prefix" -DEP_DEPS="$up/deps" \
       -DEP_DEVICE_LIB="$up/lib/libmooncake_ep_device.so" -DEP_PY_OUT="$work/py" \
       -DPython3_EXECUTABLE="$py" -Dpybind11_DIR="$("$py" -m pybind11 --cmakedir)" \
       -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_CUDA_HOST_COMPILER="$cxx" \
       -DCMAKE_CUDA_COMPILER="$(command -v nvcc)" >"$work/configure.log" 2>&1 \
     && cmake --build "$work/build" --target _ep -j "$(nproc)"; then
    passed=$((passed + 1))
    echo "OK: built $(ls "$work"/py/mooncake/_ep*.so)"
    readelf -d "$work"/py/mooncake/_ep*.so | grep -E 'NEEDED|RPATH|RUNPATH' || true
  else
    cat "$work/configure.log"
    bad "building _ep"
  fi
fi

section "mooncaked (softnic serves the RDMA transport EP asks for)"
tmp=$(mktemp -d /tmp/mc-upstream-ep-d.XXXXXX)
sock=$tmp/mooncaked.sock
"$prefix/bin/mooncaked" --socket "$sock" --node-id upstream-ep --log-level warning 2>"$tmp/daemon.log" &
daemon=$!
cleanup() {
  kill -TERM "$daemon" 2>/dev/null && wait "$daemon" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
for _ in $(seq 200); do [[ -S "$sock" ]] && break; sleep 0.05; done
[[ -S "$sock" ]] || { cat "$tmp/daemon.log"; bad "mooncaked did not open $sock"; }
# upstream's createP2pDeviceTransport/createIbgdaDeviceTransport find it here;
# CUDA buffers only (never the host platform's shared memory).
# MOONCAKE_COPY_AGENT=1: softnic's copies into each rank's GPU memory run
# on that rank's own stream (docs/rdma.md, the copy agent; off by default).
export MOONCAKE_SOCKET=$sock MOONCAKE_DEVICE_PLATFORM=cuda MOONCAKE_COPY_AGENT=${MOONCAKE_COPY_AGENT:-1}
# libglog.so.1's own dependencies (libgflags, libunwind) for every rank.
export LD_LIBRARY_PATH="$up/deps/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# step NAME TEST [TEST ARGS]: one run_ep_test.py run, counted.
step() {
  local name=$1 test=$2 rc=0
  shift 2
  section "$name"
  "$py" "$here/run_ep_test.py" "$test" --upstream "$up/src" --ep-py "$work/py" \
    --timeout "$step_timeout" -- "$@" 2>&1 | tee "$work/$name.log" || rc=$?
  if [[ $rc -eq 0 ]]; then
    passed=$((passed + 1))
    echo "OK: $name"
  else
    failed=$((failed + 1))
    echo "FAILED: $name (status $rc); mooncaked log:"
    tail -30 "$tmp/daemon.log"
  fi
}
# test_ep_grid.py names: test_ep_<flags>_<nofail|fail1>_t256_h2048_e288_k8,
# flags from fp8, async, hook, fallback, no_p2p ("base" when none).
for s in $steps; do
  case $s in
    perf) step perf perf ;;
    grid-p2p) step grid-p2p grid -k base_nofail -k fp8_nofail -k async_nofail -k hook_nofail ;;
    grid-rdma) step grid-rdma grid -k ep_no_p2p_nofail -k fp8_no_p2p_nofail -k async_no_p2p_nofail -k hook_no_p2p_nofail ;;
    grid) for k in ${MC_EP_GRID:-}; do step "grid-$k" grid -k "$k"; done ;;
    wheel) step wheel wheel ;;
    *) bad "unknown step '$s'" ;;
  esac
done
finish
