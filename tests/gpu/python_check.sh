#!/usr/bin/env bash
# The Python package on the GPU machine (issue 11, part 1): builds the
# mooncake_client extension there, against an installed Mooncake prefix and
# the Python 3.12 + pybind11 3.x + torch of /opt/torch/.venv, then runs on
# CUDA:
#   1. import and a private mooncaked (hello, node_info with the GPUs);
#      then both import orders, each in a fresh interpreter: mooncake_client
#      before torch and torch before mooncake_client, each followed by a
#      torch CUDA op, torch.nn.functional and a hello to the daemon (issue
#      11: mooncake_client first once aborted inside torch's import, when
#      the extension still exported its static copy of libstdc++);
#   2. tests/python/cuda/cuda_two_process.py: two processes, each with its
#      buffer as a torch tensor (torch.from_dlpack, no copy); one writes into
#      the other's tensor with a Device API kernel (mc_put_block + mc_signal,
#      tests/python/cuda/device_api_kernels.cu built here with nvcc,
#      launched with comm.ctx), the other waits with mc_wait_until and
#      checks every byte, then replies the same way; once with torch
#      imported first, once with mooncake_client first;
#   3. python/examples/two_rank.py --platform cuda (torch copies through the
#      peer mapping) and --platform host, as a pair of processes.
# Ranks go on GPU rank % GPU count: one GPU is enough (both on GPU 0).
# Ends with "python_check: N passed, N failed"; exit 0 only when all passed.
#
# Usage:
#   here (the build machine), once per bundle:
#     deploy/make-gpu-bundle.sh                      # .gpu/prefix, CUDA on (add
#       --targets "mooncaked mooncake_client" to build only what this needs)
#     tests/gpu/python_check.sh --stage .gpu/prefix  # + the Abseil headers the
#                                                    #   extension compiles against
#   there, from the repository root (the working tree travels with the prefix):
#     set -o pipefail; tests/gpu/python_check.sh [PREFIX] 2>&1 | tee $OUT/python_check.log
# PREFIX defaults to .gpu/prefix.
#
# Why the staging step: the extension includes the public client headers,
# which use Abseil (absl::Status); the GPU machine has no Abseil, and the
# bundle carries only its shared libraries. --stage copies this machine's
# /usr/include/absl (the headers of exactly those libraries, ~4 MiB) into
# PREFIX/include.
#
# Environment:
#   MC_PY          the Python to build for and run (default /opt/torch/.venv/bin/python)
#   MC_PYCHECK_DIR scratch folder for the builds (default /tmp/mc-python-check)
#   MC_STEP_TIMEOUT seconds one step may run (default 600)
#   MC_CUDA_ARCH   nvcc -arch for the test kernels (default sm_90)
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

if [[ "${1:-}" == "--stage" ]]; then
  prefix=${2:?usage: python_check.sh --stage PREFIX}
  [[ -d "$prefix/include/mooncake" ]] || { echo "python_check: $prefix/include/mooncake missing: run deploy/make-gpu-bundle.sh first" >&2; exit 1; }
  [[ -f /usr/include/absl/status/status.h ]] || { echo "python_check: /usr/include/absl missing (libabsl-dev)" >&2; exit 1; }
  rm -rf "$prefix/include/absl"
  cp -r /usr/include/absl "$prefix/include/absl"
  echo "python_check: staged the Abseil headers into $prefix/include/absl ($(du -sh "$prefix/include/absl" | cut -f1))"
  exit 0
fi

prefix=$(cd "${1:-$root/.gpu/prefix}" 2>/dev/null && pwd) || { echo "python_check: no prefix ${1:-$root/.gpu/prefix}" >&2; exit 1; }
py=${MC_PY:-/opt/torch/.venv/bin/python}
work=${MC_PYCHECK_DIR:-/tmp/mc-python-check}
step_timeout=${MC_STEP_TIMEOUT:-600}
arch=${MC_CUDA_ARCH:-sm_90}
export PATH="$PATH:/usr/local/cuda/bin:$(dirname "$py")"
# The bundle's libraries (gRPC, protobuf, Abseil) for mooncaked and the extension.
export LD_LIBRARY_PATH="$prefix/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# A Python traceback of every thread on SIGSEGV/SIGABRT, in each step.
export PYTHONFAULTHANDLER=1

passed=0
failed=0
failures=()
section() { printf '\n==================== %s ====================\n' "$*"; }
ok() { passed=$((passed + 1)); echo "OK: $1"; }
bad() { failed=$((failed + 1)); failures+=("$1"); echo "FAILED: $1"; }
timed() { timeout -k 30 "$step_timeout" "$@"; }
finish() {
  section "summary"
  for f in "${failures[@]}"; do echo "  failed: $f"; done
  echo "python_check: $passed passed, $failed failed"
  [[ $failed -eq 0 ]]
  exit $?
}

section "environment"
echo "prefix:  $prefix"
echo "python:  $py"
uname -a
nvidia-smi -L 2>&1 || true
"$py" -c 'import sys, torch, numpy, pybind11; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "numpy", numpy.__version__, "pybind11", pybind11.__version__, "gpus", torch.cuda.device_count())' \
  || { bad "the Python at $py with torch, numpy and pybind11"; finish; }
command -v cmake >/dev/null || { bad "cmake on PATH"; finish; }
command -v nvcc >/dev/null || { bad "nvcc on PATH"; finish; }
for f in include/mooncake/client/communicator.h include/mooncake/device/comm_device.h include/absl/status/status.h bin/mooncaked; do
  [[ -e "$prefix/$f" ]] || { bad "$prefix/$f (deploy/make-gpu-bundle.sh, then python_check.sh --stage)"; finish; }
done

section "build the extension (python/ on its own, against the prefix)"
rm -rf "$work"
mkdir -p "$work"
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
if timed cmake -S "$root/python" -B "$work/build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
     -DMOONCAKE_PREFIX="$prefix" -DPython3_EXECUTABLE="$py" \
     -Dpybind11_DIR="$("$py" -m pybind11 --cmakedir)" \
  && timed cmake --build "$work/build" -j "$(nproc)"; then
  ok "extension built for $("$py" -c 'import sys; print(sys.version.split()[0])')"
else
  bad "building the extension"
  finish
fi
export PYTHONPATH="$work/build${PYTHONPATH:+:$PYTHONPATH}"
export MOONCAKED="$prefix/bin/mooncaked"

section "the extension exports its init function only"
# python/src/extension.map: this machine's compiler (CXX=/opt/gcc/bin/g++, a
# wrapper of Ubuntu's g++ 13) links libstdc++ statically; exported, that
# copy stood in for the system libstdc++ when mooncake_client was imported
# before torch.
ext=$(ls "$work"/build/mooncake_client/_mooncake_client*.so)
echo "NEEDED of $(basename "$ext"):" $(readelf -d "$ext" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
readelf -d "$ext" | grep -q 'libstdc++' || echo "(no libstdc++.so NEEDED: ${CXX:-c++} linked libstdc++ statically)"
if (cd "$root/tests/python" && timed "$py" -m unittest -v test_extension_exports); then
  ok "the extension exports PyInit__mooncake_client only"
else
  bad "the extension exports more than PyInit__mooncake_client"
fi

section "build the Device API test kernels (nvcc)"
if timed nvcc -std=c++20 -O2 -arch="$arch" -shared -Xcompiler -fPIC -I"$prefix/include" \
     -o "$work/libmc_pycheck.so" "$root/tests/python/cuda/device_api_kernels.cu"; then
  ok "device_api_kernels.cu"
  export MC_PYCHECK_KERNELS="$work/libmc_pycheck.so"
else
  bad "building device_api_kernels.cu"
fi

section "import, hello, node_info"
if (cd "$root" && timed "$py" -) <<'EOF'
import sys
sys.path.insert(0, "tests/python")
import mc_testing
import mooncake_client as mc
d = mc_testing.Daemon(node_id="gpu-python-check")
try:
    with mc.Client.connect(d.socket) as c:
        print(c.hello())
        n = c.node_info()
        print(n)
        assert n.gpus, f"the daemon sees no GPU: {n.gpu_note}"
        assert all(isinstance(g, mc.Gpu) and g.uuid.startswith("GPU-") for g in n.gpus)
    try:
        mc.Client.connect(d.socket + ".missing", call_timeout=2)
        raise AssertionError("connect to a missing socket succeeded")
    except mc.UnavailableError as e:
        assert e.code == "UNAVAILABLE", e
finally:
    d.stop()
print("import/hello/node_info: ok")
EOF
then ok "import, hello, node_info (GPUs seen)"; else bad "import, hello, node_info"; fi

# One fresh interpreter per order: the first import decides in which search
# scope the system libstdc++.so.6 resolves its own symbols.
import_order() {
  local order=$1
  (cd "$root" && timed "$py" - "$order" <<'EOF'
import sys
sys.path.insert(0, "tests/python")
order = sys.argv[1]
if order == "mooncake-first":
    import mooncake_client as mc
    import torch
else:
    import torch
    import mooncake_client as mc
import torch.nn.functional as F  # where the abort was (torch/_sources.py)
import mc_testing
x = torch.arange(1 << 20, device="cuda", dtype=torch.float64)
got = float(F.relu(x - 10).sum())
want = float(sum(i - 10 for i in range(11, 1 << 20)))
assert got == want, (got, want)
d = mc_testing.Daemon(node_id="gpu-python-check")
try:
    with mc.Client.connect(d.socket) as c:
        h = c.hello()
        assert c.node_info().gpus
finally:
    d.stop()
print(f"{order}: torch {torch.__version__} on {torch.cuda.get_device_name()}, daemon {h.daemon_version}: ok")
EOF
  )
}
for order in mooncake-first torch-first; do
  section "import order: $order"
  import_order "$order" && ok "import order $order (torch CUDA op, torch.nn.functional, hello)" \
    || bad "import order $order"
done

for order in torch-first mooncake-first; do
  section "two processes, CUDA tensors, Device API kernels ($order)"
  if [[ -n "${MC_PYCHECK_KERNELS:-}" ]]; then
    (cd "$root" && timed "$py" tests/python/cuda/cuda_two_process.py --import-order "$order") \
      && ok "cuda_two_process.py --import-order $order (torch.from_dlpack + mc_put_block/mc_signal across processes)" \
      || bad "cuda_two_process.py --import-order $order"
  else
    bad "cuda_two_process.py --import-order $order (no test kernels)"
  fi
done

# A pair of two_rank.py processes against a private daemon.
example_pair() {
  local platform=$1
  (cd "$root" && timed "$py" - "$platform" <<'EOF'
import subprocess, sys
sys.path.insert(0, "tests/python")
import mc_testing
platform = sys.argv[1]
d = mc_testing.Daemon(node_id="gpu-python-check")
procs = []
try:
    procs = [subprocess.Popen([sys.executable, "python/examples/two_rank.py", "--platform", platform,
                               "--socket", d.socket, "--group", "py-example-" + platform,
                               "--rank", str(r), "--bytes", str(8 << 20), "--timeout-ms", "60000"])
             for r in (0, 1)]
    rcs = [p.wait(timeout=300) for p in procs]
finally:
    for p in procs:
        if p.poll() is None:
            p.kill()
    d.stop()
print("exit statuses", rcs)
sys.exit(0 if rcs == [0, 0] else 1)
EOF
  )
}

section "python/examples/two_rank.py --platform cuda"
example_pair cuda && ok "two_rank.py --platform cuda" || bad "two_rank.py --platform cuda"

section "python/examples/two_rank.py --platform host"
example_pair host && ok "two_rank.py --platform host" || bad "two_rank.py --platform host"

finish
