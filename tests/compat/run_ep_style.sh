#!/usr/bin/env bash
# The upstream-shaped program against an installed Mooncake (ctest
# compat_ep_style_installed):
#   1. installs the build into a temporary prefix;
#   2. checks <transport/device/device_transport.h> compiles as C++17 with
#      only -I PREFIX/include and pulls in no Abseil header;
#   3. builds tests/compat/ep_style with find_package(Mooncake);
#   4. starts the installed mooncaked on a temporary socket and runs 4 ranks,
#      each its own process; every rank must print "ok".
# Usage: run_ep_style.sh BUILD_DIR SOURCE_DIR WORK_DIR CXX
set -euo pipefail
build=$1 src=$2 work=$3 cxx=$4
rm -rf "$work"
mkdir -p "$work/run"
prefix=$work/prefix
daemon_pid=
cleanup() {
  if [[ -n "$daemon_pid" ]]; then
    kill "$daemon_pid" 2>/dev/null || true
    wait "$daemon_pid" 2>/dev/null || true
  fi
}
trap cleanup EXIT

cmake --install "$build" --prefix "$prefix" >/dev/null
for h in device_transport.h comm_device.cuh device_ops.cuh p2p_device.cuh ibgda_device.cuh cuda/cuda_ops.cuh ibgda/mlx5gda.h; do
  [[ -f "$prefix/include/transport/device/$h" ]] || { echo "not installed: include/transport/device/$h"; exit 1; }
done
for h in transfer_engine.h cuda_alike.h; do
  [[ -f "$prefix/include/$h" ]] || { echo "not installed: include/$h"; exit 1; }
done

# 2. Standard library only, C++17: list every header the TU opens (the host
# API and the engine path).
echo '#include <transport/device/device_transport.h>
#include <transfer_engine.h>
int main() {
  mooncake::TransferEngine engine;
  return mooncake::device::createP2pDeviceTransport != nullptr ? 0 : 1;
}' >"$work/std_only.cc"
"$cxx" -std=c++17 -fsyntax-only -H -I "$prefix/include" "$work/std_only.cc" 2>"$work/std_only.headers"
if grep -E 'absl/|cuda|grpc' "$work/std_only.headers"; then
  echo "transport/device/device_transport.h or transfer_engine.h includes more than the standard library (above)"
  exit 1
fi

# 3. Build the program as an application would.
cmake -S "$src/ep_style" -B "$work/build" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON >"$work/configure.log"
cmake --build "$work/build" >"$work/build.log" || { cat "$work/build.log"; exit 1; }

# 4. A real daemon, four rank processes.
sock=$work/mooncaked.sock
"$prefix/bin/mooncaked" --socket "$sock" --node-id compat-ep 2>"$work/daemon.log" &
daemon_pid=$!
for _ in $(seq 200); do [[ -S "$sock" ]] && break; sleep 0.05; done
[[ -S "$sock" ]] || { echo "mooncaked did not start"; cat "$work/daemon.log"; exit 1; }
export MOONCAKE_SOCKET=$sock MOONCAKE_DEVICE_PLATFORM=host
n=4
pids=()
for r in $(seq 0 $((n - 1))); do
  timeout 120 "$work/build/ep_style" "$work/run" "$r" "$n" >"$work/rank$r.log" 2>&1 &
  pids+=($!)
done
status=0
for r in $(seq 0 $((n - 1))); do
  if ! wait "${pids[$r]}"; then status=1; fi
  cat "$work/rank$r.log"
done
if [[ $status -ne 0 ]]; then
  echo "--- daemon log"; cat "$work/daemon.log"
  exit 1
fi
[[ $(cat "$work"/rank*.log | grep -c ": ok$") -eq $n ]] || { echo "not every rank said ok"; exit 1; }

# Without a daemon the factory says why, and what it returns fails every call.
if MOONCAKE_SOCKET=$work/none.sock "$work/build/ep_style" "$work/run-none" 0 1 >"$work/none.log" 2>&1; then
  echo "ep_style succeeded without a daemon"; exit 1
fi
grep -q "no mooncaked" "$work/none.log" || { cat "$work/none.log"; echo "no reason logged"; exit 1; }
echo "compat ep_style: $n ranks ok against $prefix"
