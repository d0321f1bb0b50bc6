#!/usr/bin/env bash
# The one script the GPU machine runs (shared/gpu.md): environment, every GPU
# test and benchmark in the bundle, compute-sanitizer memcheck + racecheck of
# the GPU test kernels, the NVSHMEM comparison (built there when NVSHMEM is
# present), all into one log on stdout, ending with
# "N passed, N failed, N skipped" (the reasons for skips listed above it).
#
# The GPU count is taken once, at the start. With one GPU every daemon check
# runs with all ranks on GPU 0, and what needs two GPUs (the GPU0 -> GPU1
# benchmarks, NVSHMEM with one PE per GPU, the NCCL LSA team, the peer cases
# of the gtests) is skipped with the reason. On a sandboxed kernel (uname -r
# 4.4.0, as under gVisor) compute-sanitizer cannot attach to the device: that
# step is reported "not runnable" (counted as skipped). Every step runs under
# `timeout`.
#
# Usage (from the repository root on the GPU machine):
#   set -o pipefail; tests/gpu/run.sh [PREFIX] 2>&1 | tee $OUT/log
# PREFIX defaults to .gpu/prefix (made by deploy/make-gpu-bundle.sh), or to
# the prefix this script is installed in (PREFIX/share/mooncake/gpu/run.sh).
# It may also be the .tar.gz that make-gpu-bundle.sh --pack writes (carry
# that alone when the prefix with etcd and the tree exceed 64 MiB).
#
# Environment:
#   MC_GPU_STEPS      comma list of steps to run (default: all):
#                     env,tests,sanitizer,daemon,elastic,cluster,rdma,compat,upstream_ep,
#                     latency,put,nvshmem,nccl_lsa,nvlink
#   MC_PUT_BENCH_ARGS extra arguments for p2p_put_bench (e.g. --quick)
#   MC_GTEST_FILTER   gtest filter for the test executables (default: all)
#   MC_STEP_TIMEOUT   seconds one step may run (default 900)
#   MC_GPU_COUNT      GPUs to use (default: nvidia-smi -L, narrowed by
#                     CUDA_VISIBLE_DEVICES); e.g. 1 to check the one-GPU mode
#   NVSHMEM_HOME      NVSHMEM (include/, lib/); default: the Python venv's copy
#   NCCL_INCLUDE_DIR  NCCL headers with nccl_device/ for the nccl_lsa step
#                     (default: the machine's, /usr/include)
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [[ $# -ge 1 && -f "$1" && "$1" == *.tar.gz ]]; then
  # A bundle packed by make-gpu-bundle.sh --pack (prefix/ inside): unpacked
  # beside itself; the binaries find their libraries through $ORIGIN.
  unpack_to=$(dirname "$1")/unpacked
  if ! { rm -rf "$unpack_to" && mkdir -p "$unpack_to" && tar -C "$unpack_to" -xzf "$1"; }; then
    echo "run.sh: cannot unpack $1 into $unpack_to" >&2
    exit 1
  fi
  prefix=$(cd "$unpack_to"/* && pwd)
  echo "run.sh: unpacked $1 into $prefix"
elif [[ $# -ge 1 ]]; then
  prefix=$(cd "$1" && pwd)
elif [[ -d "$here/../../../bin" && "$(basename "$(dirname "$here")")" == mooncake ]]; then
  prefix=$(cd "$here/../../.." && pwd)
else
  prefix=$(cd "$here/../.." && pwd)/.gpu/prefix
fi
bin="$prefix/bin"
share="$prefix/share/mooncake/gpu"
steps=",${MC_GPU_STEPS:-env,tests,sanitizer,daemon,elastic,cluster,rdma,compat,upstream_ep,latency,put,nvshmem,nccl_lsa,nvlink},"
want() { [[ "$steps" == *",$1,"* ]]; }

# NVLink multicast stays off (shared/gpu.md: KINDS.md says why).
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1
export PATH="$PATH:/usr/local/cuda/bin"
# The bundle's libraries first; then the machine's CUDA runtime for programs
# linked against the shared cudart (never shipped in the bundle).
export LD_LIBRARY_PATH="$prefix/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [[ -d "$d" ]] && LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$d"
done

passed=0
failed=0
skipped=0
failures=()
skips=()
step_timeout=${MC_STEP_TIMEOUT:-900}
section() { printf '\n==================== %s ====================\n' "$*"; }
ok() { passed=$((passed + $1)); }
bad() { failed=$((failed + $1)); failures+=("$2"); }
skip() { skipped=$((skipped + $1)); skips+=("$2"); echo "SKIPPED: $2"; }
# -k: a process stuck in the driver that ignores SIGTERM is KILLed 30 s later
# (timeout signals its whole process group, forked children included).
timed() { timeout -k 30 "$step_timeout" "$@"; }

# The GPU count, once: nvidia-smi -L, narrowed by CUDA_VISIBLE_DEVICES (which
# nvidia-smi ignores and CUDA honours).
count_gpus() {
  local n visible
  n=$(timeout -k 5 30 nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
  if [[ -n "${CUDA_VISIBLE_DEVICES+set}" ]]; then
    IFS=, read -ra visible <<<"$CUDA_VISIBLE_DEVICES"
    [[ ${#visible[@]} -lt $n ]] && n=${#visible[@]}
  fi
  echo "$n"
}
ngpu=${MC_GPU_COUNT:-$(count_gpus)}
export MC_GPU_COUNT=$ngpu  # daemon_e2e.sh places its ranks by it
needs_two="needs 2 GPUs, found $ngpu"

# A sandboxed kernel (gVisor reports 4.4.0) gives no access to the GPU's
# debug and profiling interfaces.
sandbox=""
if [[ "$(uname -r)" == 4.4.0* ]]; then
  sandbox="sandboxed kernel (uname -r $(uname -r)): compute-sanitizer cannot attach to the device and Nsight Compute cannot read counters"
fi

# Runs a GoogleTest executable; counts its test cases (a crash without a
# summary counts as one failure).
run_gtest() {
  local name="$1"; shift
  local out rc
  out=$(mktemp)
  section "$name"
  timed "$@" 2>&1 | tee "$out"
  rc=${PIPESTATUS[0]}
  local np nf ns why
  np=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$out" | tail -1)
  nf=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$out" | tail -1)
  ns=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' "$out" | tail -1)
  np=${np:-0}
  nf=${nf:-0}
  ns=${ns:-0}
  if [[ $rc -ne 0 && $nf -eq 0 ]]; then nf=1; fi
  ok "$np"
  [[ $nf -gt 0 ]] && bad "$nf" "$name (rc=$rc)"
  if [[ $ns -gt 0 ]]; then
    # GTEST_SKIP() prints "file:line: Skipped" and then its message.
    why=$(awk '/: Skipped$/ { getline; print }' "$out" | sort -u | paste -sd ';' -)
    skip "$ns" "$name: $ns test(s): ${why:-see the log}"
  fi
  echo "-- $name: rc=$rc, $np passed, $nf failed, $ns skipped"
  rm -f "$out"
}

# Runs a step that passes or fails as a whole.
run_step() {
  local name="$1"; shift
  section "$name"
  echo "\$ $*"
  local t0=$SECONDS rc
  timed "$@"
  rc=$?
  echo "-- $name: rc=$rc ($((SECONDS - t0)) s)"
  if [[ $rc -eq 0 ]]; then ok 1; else bad 1 "$name (rc=$rc)"; fi
}

echo "GPUs: $ngpu ($([[ $ngpu -ge 2 ]] && echo "two-GPU mode: ranks spread over GPU 0 and 1" || echo "one-GPU mode: every rank on GPU 0"))"
[[ -n "$sandbox" ]] && echo "$sandbox"

if want env; then
  section "environment"
  date -u
  echo "prefix: $prefix"
  uname -a
  timed nvidia-smi -L
  timed nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.sm,clocks.max.sm,power.limit --format=csv
  timed nvidia-smi topo -m
  timed nvidia-smi nvlink --status -i 0 2>/dev/null | head -5
  command -v nvcc >/dev/null && nvcc --version | tail -2
  command -v compute-sanitizer >/dev/null && timed compute-sanitizer --version | tail -1
  ldconfig -p | grep -E 'libnccl.so|libcuda.so.1' || true
  ls "$bin" 2>/dev/null
fi

if [[ $ngpu -lt 1 ]]; then
  bad 1 "no GPU visible (nvidia-smi -L lists none, or CUDA_VISIBLE_DEVICES hides them): no GPU step can run"
  steps=","
fi

# GPU test executables: gpu_*_test (tests/gpu) and *_gpu_test (other areas'
# GPU tests, e.g. device_cuda_p2p_gpu_test). Each skips its own two-GPU cases.
tests=()
for t in "$bin"/gpu_*_test "$bin"/*_gpu_test; do [[ -x "$t" ]] && tests+=("$t"); done

if want tests; then
  if [[ ${#tests[@]} -eq 0 ]]; then
    bad 1 "no GPU test executables in $bin"
  fi
  for t in "${tests[@]}"; do
    run_gtest "$(basename "$t")" "$t" ${MC_GTEST_FILTER:+--gtest_filter=$MC_GTEST_FILTER}
  done
fi

if want sanitizer; then
  if [[ -n "$sandbox" ]]; then
    section "compute-sanitizer"
    skip 1 "compute-sanitizer (memcheck, racecheck): not runnable: $sandbox"
  elif ! command -v compute-sanitizer >/dev/null; then
    bad 1 "compute-sanitizer not found"
  else
    # Small cases under the sanitizer (each launch is instrumented, so the
    # 1 GiB cases would take minutes); buffers capped to match.
    for t in "${tests[@]}"; do
      name=$(basename "$t")
      case "$name" in
        gpu_copy_test)
          filt='*CopySmall*_s3_d8:*CopySmall*_s0_d0:*CopySmall*_s15_d2:*CopyPeer*'
          export MC_COPY_TEST_CAP_BYTES=1048576 ;;
        *) filt='*' ;;
      esac
      run_gtest "memcheck $name" compute-sanitizer --tool memcheck --error-exitcode 99 --print-limit 20 \
        "$t" --gtest_filter="$filt" --gtest_brief=1
      # racecheck looks at shared memory hazards: the kernels that use shared
      # memory, plus a sample of the block copies.
      case "$name" in
        gpu_copy_test) rfilt='*CopySmall*Block*_n4097_*:*CopySmall*Warp*_n65543_*' ;;
        *) rfilt='*' ;;
      esac
      run_gtest "racecheck $name" compute-sanitizer --tool racecheck --racecheck-report hazard --error-exitcode 99 \
        "$t" --gtest_filter="$rfilt" --gtest_brief=1
      unset MC_COPY_TEST_CAP_BYTES
    done
  fi
fi

# Through a real mooncaked: CUDA example pair/all-to-all, SIGKILL -> LOST,
# mcctl on a live group, setup time (tests/gpu/daemon_e2e.sh places the ranks
# by MC_GPU_COUNT and prints "N passed, N failed, N skipped" and "skip - WHY").
if want daemon; then
  e2e="$share/daemon_e2e.sh"
  [[ -f "$e2e" ]] || e2e="$here/daemon_e2e.sh"
  section "daemon end to end"
  out=$(mktemp)
  timed bash "$e2e" "$bin" 2>&1 | tee "$out"
  summary='^\([0-9]*\) passed, \([0-9]*\) failed\(, \([0-9]*\) skipped\)\?$'
  np=$(sed -n "s/$summary/\1/p" "$out" | tail -1)
  nf=$(sed -n "s/$summary/\2/p" "$out" | tail -1)
  ok "${np:-0}"
  if [[ -z "$nf" ]]; then bad 1 "daemon_e2e.sh (no summary)"; elif [[ $nf -gt 0 ]]; then bad "$nf" "daemon_e2e.sh"; fi
  while IFS= read -r why; do skip 1 "daemon_e2e.sh: $why"; done < <(sed -n 's/^skip - //p' "$out")
  rm -f "$out"
fi

# Elastic groups with CUDA ranks: --mode elastic, rank 2 SIGKILLed and
# replaced, over P2P and RDMA (softnic); tests/gpu/elastic_e2e.sh, which
# also prints the recovery timings.
if want elastic; then
  ee2e="$share/elastic_e2e.sh"
  [[ -f "$ee2e" ]] || ee2e="$here/elastic_e2e.sh"
  section "elastic end to end (CUDA ranks, SIGKILL and replacement)"
  out=$(mktemp)
  timed bash "$ee2e" "$bin" 2>&1 | tee "$out"
  summary='^\([0-9]*\) passed, \([0-9]*\) failed\(, \([0-9]*\) skipped\)\?$'
  np=$(sed -n "s/$summary/\1/p" "$out" | tail -1)
  nf=$(sed -n "s/$summary/\2/p" "$out" | tail -1)
  ok "${np:-0}"
  if [[ -z "$nf" ]]; then bad 1 "elastic_e2e.sh (no summary)"; elif [[ $nf -gt 0 ]]; then bad "$nf" "elastic_e2e.sh"; fi
  while IFS= read -r why; do skip 1 "elastic_e2e.sh: $why"; done < <(sed -n 's/^skip - //p' "$out")
  rm -f "$out"
fi

# Two nodes on this machine: etcd, two mooncaked, CUDA ranks split between
# them over --route rdma (softnic across nodes); tests/gpu/cluster_e2e.sh.
if want cluster; then
  ce2e="$share/cluster_e2e.sh"
  [[ -f "$ce2e" ]] || ce2e="$here/cluster_e2e.sh"
  section "cluster end to end (two nodes, softnic across them)"
  out=$(mktemp)
  MOONCAKE_CERTS_SCRIPT="$here/../../deploy/make-cluster-certs.sh" timed bash "$ce2e" "$bin" 2>&1 | tee "$out"
  summary='^\([0-9]*\) passed, \([0-9]*\) failed\(, \([0-9]*\) skipped\)\?$'
  np=$(sed -n "s/$summary/\1/p" "$out" | tail -1)
  nf=$(sed -n "s/$summary/\2/p" "$out" | tail -1)
  ok "${np:-0}"
  if [[ -z "$nf" ]]; then bad 1 "cluster_e2e.sh (no summary)"; elif [[ $nf -gt 0 ]]; then bad "$nf" "cluster_e2e.sh"; fi
  while IFS= read -r why; do skip 1 "cluster_e2e.sh: $why"; done < <(sed -n 's/^skip - //p' "$out")
  rm -f "$out"
fi

# The RDMA route's benchmarks (one GPU): post rate against a softnic in sink
# mode, the stores' own bound, the CPU-assisted doorbell's latency, then
# WRITE bandwidth and mc_signal latency against a normal softnic.
if want rdma; then
  section "rdma_bench"
  if [[ ! -x "$bin/rdma_bench" ]]; then
    bad 1 "rdma_bench missing from $bin"
  else
    rtmp=$(mktemp -d /tmp/mc-rdma-bench.XXXXXX)
    echo "softnic_sink = true" >"$rtmp/sink.conf"
    # memcheck, racecheck: the posting kernels of `check` under
    # compute-sanitizer (where it can attach; see the sanitizer step), the
    # sweep capped alike. racecheck reports shared-memory hazards: the
    # warp posters use none (shuffles, global atomics); the block posters'
    # collectives (mc_put_lanes_block) do, and are checked here.
    # check-agent: the same checks with softnic's copy agents on, the
    # back-pressure cases 20 times (a copy held back by the first launch of
    # a kernel must not land stale: docs/rdma.md, the copy agent);
    # check-resident: the same with the agents' resident kernels (opt-in
    # until this has passed on a GPU: client/src/copy_agent.h).
    modes="check check-agent check-resident post bound doorbell bw lat"
    if [[ -z "$sandbox" ]] && command -v compute-sanitizer >/dev/null; then
      modes="$modes memcheck racecheck"
    elif want sanitizer; then
      skip 1 "compute-sanitizer memcheck of rdma_bench check: ${sandbox:-compute-sanitizer not found}"
      skip 1 "compute-sanitizer racecheck of rdma_bench check: ${sandbox:-compute-sanitizer not found}"
    fi
    for mode in $modes; do
      conf=()
      [[ $mode == post ]] && conf=(--config "$rtmp/sink.conf")
      "$bin/mooncaked" --socket "$rtmp/d.sock" --node-id rdma-bench --log-level warning "${conf[@]}" 2>"$rtmp/daemon.log" &
      dpid=$!
      for _ in $(seq 100); do [[ -S "$rtmp/d.sock" ]] && break; sleep 0.05; done
      cmd=("$bin/rdma_bench" --socket "$rtmp/d.sock" $mode)
      [[ $mode == check-agent ]] && cmd=(env MOONCAKE_COPY_AGENT=1 MC_RDMA_BACKPRESSURE_REPEAT=20 "$bin/rdma_bench" --socket "$rtmp/d.sock" check)
      [[ $mode == check-resident ]] && cmd=(env MOONCAKE_COPY_AGENT=1 MOONCAKE_COPY_AGENT_RESIDENT=1 MC_RDMA_BACKPRESSURE_REPEAT=20 "$bin/rdma_bench" --socket "$rtmp/d.sock" check)
      [[ $mode == memcheck ]] && cmd=(env MC_RDMA_SWEEP_MAX=1048581 compute-sanitizer --tool memcheck --error-exitcode 99 --print-limit 20 "$bin/rdma_bench" --socket "$rtmp/d.sock" check)
      [[ $mode == racecheck ]] && cmd=(env MC_RDMA_SWEEP_MAX=1048581 compute-sanitizer --tool racecheck --racecheck-report hazard --error-exitcode 99 "$bin/rdma_bench" --socket "$rtmp/d.sock" check)
      if timed "${cmd[@]}"; then ok 1; else bad 1 "rdma_bench $mode"; cat "$rtmp/daemon.log"; fi
      kill -TERM $dpid 2>/dev/null; wait $dpid 2>/dev/null
    done
    # What a first user runs on a node (issue 24 item 10): the RDMA route
    # through the daemon from a CPU thread, each step with latency and rate.
    "$bin/mooncaked" --socket "$rtmp/d.sock" --node-id rdma-selftest --log-level warning 2>"$rtmp/daemon.log" &
    dpid=$!
    for _ in $(seq 100); do [[ -S "$rtmp/d.sock" ]] && break; sleep 0.05; done
    if timed "$bin/mcctl" --socket "$rtmp/d.sock" selftest rdma; then ok 1; else bad 1 "mcctl selftest rdma"; cat "$rtmp/daemon.log"; fi
    # The same steps from CUDA kernels, per ring placement (softnic refuses
    # GPU rings: reported as not supported, no failure).
    if timed "$bin/mcctl" --socket "$rtmp/d.sock" selftest rdma --gpu 0; then ok 1; else bad 1 "mcctl selftest rdma --gpu 0"; cat "$rtmp/daemon.log"; fi
    # The same without copy agents: mooncaked's own CUDA context copies
    # (the fallback when an agent stalls or cannot start), every byte
    # checked as above.
    if timed env MOONCAKE_COPY_AGENT=0 "$bin/mcctl" --socket "$rtmp/d.sock" selftest rdma --gpu 0; then ok 1; else bad 1 "MOONCAKE_COPY_AGENT=0 mcctl selftest rdma --gpu 0"; cat "$rtmp/daemon.log"; fi
    kill -TERM $dpid 2>/dev/null; wait $dpid 2>/dev/null
    rm -rf "$rtmp"
  fi
fi

# The upstream-shaped EP program (tests/compat/ep_style) on CUDA: host setup
# through createP2pDeviceTransport, handles exchanged through files, a kernel
# written with upstream's names; two ranks (on GPU 0 and 1, or both on GPU 0)
# through a real mooncaked.
if want compat; then
  section "compat_ep_style_cuda"
  if [[ ! -x "$bin/compat_ep_style_cuda" ]]; then
    bad 1 "compat_ep_style_cuda missing from $bin"
  else
    ctmp=$(mktemp -d /tmp/mc-compat.XXXXXX)
    "$bin/mooncaked" --socket "$ctmp/d.sock" --node-id compat-ep --log-level warning 2>"$ctmp/daemon.log" &
    dpid=$!
    for _ in $(seq 100); do [[ -S "$ctmp/d.sock" ]] && break; sleep 0.05; done
    cpids=()
    for r in 0 1; do
      dev=$((ngpu >= 2 ? r : 0))
      timed env MOONCAKE_SOCKET="$ctmp/d.sock" MOONCAKE_DEVICE_PLATFORM=cuda CUDA_VISIBLE_DEVICES=$dev \
        "$bin/compat_ep_style_cuda" "$ctmp" "$r" 2 >"$ctmp/rank$r.log" 2>&1 &
      cpids+=($!)
    done
    crc=0
    for r in 0 1; do wait "${cpids[$r]}" || crc=1; cat "$ctmp/rank$r.log"; done
    if [[ $crc -eq 0 ]]; then ok 1; else bad 1 "compat_ep_style_cuda"; cat "$ctmp/daemon.log"; fi
    kill -TERM $dpid 2>/dev/null; wait $dpid 2>/dev/null
    rm -rf "$ctmp"
  fi
fi

# The P2P benchmarks measure GPU0 -> GPU1 in one process (peer access between
# two devices): nothing to measure on one GPU.
if want latency; then
  if [[ $ngpu -lt 2 ]]; then
    section "p2p_latency_bench"
    skip 1 "p2p_latency_bench (GPU0 <-> GPU1 ping-pong over NVLink): $needs_two"
  elif [[ -x "$bin/p2p_latency_bench" ]]; then
    run_step "p2p_latency_bench" "$bin/p2p_latency_bench"
  else
    bad 1 "p2p_latency_bench missing from $bin"
  fi
fi

if want put; then
  if [[ $ngpu -lt 2 ]]; then
    section "p2p_put_bench"
    skip 1 "p2p_put_bench (GPU0 -> GPU1 put bandwidth over NVLink): $needs_two"
  elif [[ -x "$bin/p2p_put_bench" ]]; then
    # shellcheck disable=SC2086
    run_step "p2p_put_bench" "$bin/p2p_put_bench" ${MC_PUT_BENCH_ARGS:-}
  else
    bad 1 "p2p_put_bench missing from $bin"
  fi
fi

if want nvshmem; then
  section "nvshmem_bench"
  nv="${NVSHMEM_HOME:-/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nvshmem}"
  src="$share/nvshmem_bench.cu"
  [[ -f "$src" ]] || src="$here/../../bench/gpu/nvshmem_bench.cu"
  if [[ $ngpu -lt 2 ]]; then
    # PE p runs on GPU p: PE 1 would call cudaSetDevice(1), which never
    # returns on a one-GPU machine. It is not built or started.
    skip 1 "nvshmem_bench (two PEs, PE p on GPU p): $needs_two"
  elif [[ ! -f "$nv/include/nvshmem.h" ]]; then
    skip 1 "nvshmem_bench: NVSHMEM not found at $nv"
  elif ! command -v nvcc >/dev/null; then
    skip 1 "nvshmem_bench: nvcc not found"
  elif [[ ! -f "$src" ]]; then
    bad 1 "nvshmem_bench.cu not found"
  else
    work=$(mktemp -d)
    # The venv ships only the versioned host library; link through a symlink.
    ln -sf "$(ls "$nv"/lib/libnvshmem_host.so.* | head -1)" "$work/libnvshmem_host.so"
    if timed nvcc -std=c++17 -O3 -rdc=true -arch=sm_90 -I"$nv/include" "$src" -o "$work/nvshmem_bench" \
         -L"$nv/lib" -L"$work" -lnvshmem_device -lnvshmem_host; then
      LD_LIBRARY_PATH="$nv/lib:$LD_LIBRARY_PATH" run_step "nvshmem_bench" "$work/nvshmem_bench"
    else
      bad 1 "nvshmem_bench build"
    fi
    rm -rf "$work"
  fi
fi

if want nccl_lsa; then
  section "nccl_lsa_bench"
  # NCCL's device API is header-inlined (the kernel reads ncclWindow_vidmem),
  # so it is built here against this machine's NCCL, never shipped prebuilt.
  ninc="${NCCL_INCLUDE_DIR:-/usr/include}"
  src="$share/nccl_lsa_bench.cu"
  [[ -f "$src" ]] || src="$here/../../bench/gpu/nccl_lsa_bench.cu"
  nlib=$(ldconfig -p | sed -n 's/.*libnccl\.so\.2 (libc6,x86-64) => //p' | head -1)
  if [[ $ngpu -lt 2 ]]; then
    # An LSA team is two ranks on two devices; NCCL refuses two ranks on one GPU.
    skip 1 "nccl_lsa_bench (NCCL LSA put GPU0 -> GPU1): $needs_two"
  elif [[ ! -f "$ninc/nccl.h" || ! -f "$ninc/nccl_device.h" || ! -d "$ninc/nccl_device" ]]; then
    skip 1 "nccl_lsa_bench: NCCL device-API headers (nccl.h, nccl_device.h, nccl_device/) not found in $ninc"
  elif [[ -z "$nlib" ]]; then
    skip 1 "nccl_lsa_bench: libnccl.so.2 not in the linker cache"
  elif ! command -v nvcc >/dev/null; then
    skip 1 "nccl_lsa_bench: nvcc not found"
  elif [[ ! -f "$src" ]]; then
    bad 1 "nccl_lsa_bench.cu not found"
  else
    work=$(mktemp -d)
    # The headers go through a scratch include dir, so that an nccl.h inside
    # the CUDA toolkit (searched before /usr/include) cannot shadow the
    # machine's; the library through a libnccl.so link when no dev link exists.
    mkdir -p "$work/include"
    ln -s "$ninc/nccl.h" "$ninc/nccl_device.h" "$ninc/nccl_device" "$work/include/"
    ln -s "$nlib" "$work/libnccl.so"
    echo "NCCL headers: $ninc ($(sed -n 's/^#define NCCL_VERSION_CODE //p' "$ninc/nccl.h")), library: $nlib"
    if timed nvcc -std=c++17 -O3 -arch=sm_90 -I"$work/include" -I"$(dirname "$src")" "$src" -o "$work/nccl_lsa_bench" \
         -L"$work" -lnccl; then
      LD_LIBRARY_PATH="$(dirname "$nlib"):$LD_LIBRARY_PATH" run_step "nccl_lsa_bench" "$work/nccl_lsa_bench"
    else
      bad 1 "nccl_lsa_bench build"
    fi
    rm -rf "$work"
  fi
fi

# Upstream Mooncake's own EP, unchanged, through mooncaked (issue 25 item
# 5): tests/gpu/upstream_ep/run.sh, from what tests/gpu/upstream_ep/
# prepare.sh left in .gpu/upstream-ep on the build machine.
if want upstream_ep; then
  up="$(cd "$here/../.." && pwd)/.gpu/upstream-ep"
  if [[ ! -d "$up/src" || ! -f "$up/lib/libmooncake_ep_device.so" ]]; then
    skip 1 "upstream_ep: no $up (run tests/gpu/upstream_ep/prepare.sh on the build machine and carry .gpu)"
  else
    run_step "upstream_ep" "$here/upstream_ep/run.sh" "$prefix" "$up"
  fi
fi

# NVLink counters against payload for the copy engine and SM stores (issue
# 12 item 3). A study, not a test: only a missing or failing nvlink_study
# (its copies are checked) counts; counter sources that refuse are printed.
if want nvlink; then
  section "nvlink_counters"
  if [[ $ngpu -lt 2 ]]; then
    skip 1 "nvlink_counters (GPU0 -> GPU1 NVLink counter study): $needs_two"
  elif [[ -x "$bin/nvlink_study" && -x "$bin/nvlink_counters.sh" ]]; then
    run_step "nvlink_counters" "$bin/nvlink_counters.sh" "$bin"
  else
    bad 1 "nvlink_study or nvlink_counters.sh missing from $bin"
  fi
fi

section "summary"
echo "GPUs: $ngpu"
for s in "${skips[@]}"; do echo "SKIPPED: $s"; done
for f in "${failures[@]}"; do echo "FAILED: $f"; done
echo "$passed passed, $failed failed, $skipped skipped"
[[ $failed -eq 0 ]]
