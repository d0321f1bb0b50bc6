// Device API kernels for the Python package's CUDA check
// (tests/gpu/python_check.sh builds this with nvcc into a shared library
// that cuda_two_process.py loads with ctypes): the "kernel launcher" a
// Python program passes comm.ctx to. Each entry point copies the CommCtx
// from comm.ctx.address (a host struct owned by the Communicator) and
// launches with it by value, as any kernel receives it.
//
//   int mc_pycheck_abi(void)                               2 (these signatures)
//   int mc_pycheck_ctx_size(void)                          sizeof(CommCtx)
//   int mc_pycheck_put_signal(device, ctx_address, dst, dst_offset, src_offset,
//                             nbytes, flag_offset, value)
//       one block: mc_put_block of [src_offset, +nbytes) of this rank's
//       buffer to dst's buffer at dst_offset, then mc_signal(value) into
//       dst's flag word at flag_offset, then mc_quiet. Returns the McStatus
//       (0 = ok), or -1000 - cudaError_t when CUDA itself failed.
//   int mc_pycheck_wait_signal(device, ctx_address, flag_offset, value,
//                              timeout_ns, uint64_t* seen)
//       mc_wait_until_for(flag >= value) on this rank's buffer. Returns 1 when
//       it held, 0 on timeout, -1000 - cudaError_t on a CUDA failure.
//
// Both run on CUDA device `device` (the communicator's: comm.buffer's
// __dlpack_device__()[1]) and synchronise it before they return.
// cuda_two_process.py declares these signatures to ctypes, which checks
// nothing against the library: keep the two in step (mc_pycheck_abi()).
// (A wait_signal without the `device` parameter, called with it, took the
// device index 0 as ctx_address and memcpy'd from address 0: the SIGSEGV of
// tests/gpu/results/2026-12-01-h200-python-check-run{1,2}*.log.)
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "mooncake/device/comm_device.h"

namespace {

using mooncake::device::CommCtx;
using mooncake::device::McCmp;
using mooncake::device::McPeer;
using mooncake::device::McStatus;

__global__ void PutSignalKernel(CommCtx ctx, int dst, uint64_t dst_offset, uint64_t src_offset,
                                uint64_t nbytes, uint64_t flag_offset, uint64_t value,
                                int* status) {
  auto* base = static_cast<uint8_t*>(ctx.p2p.local_base);
  const McPeer peer = mooncake::device::mc_peer(ctx, dst);
  McStatus st = mooncake::device::mc_put_block(peer, base + dst_offset, base + src_offset, nbytes);
  // mc_put_block ends with a block barrier: thread 0's release covers the
  // whole block's stores.
  if (threadIdx.x == 0) {
    if (st == McStatus::kOk) {
      st = mooncake::device::mc_signal(peer, reinterpret_cast<uint64_t*>(base + flag_offset),
                                       static_cast<uint64_t>(value));
    }
    if (st == McStatus::kOk) st = mooncake::device::mc_quiet(ctx);
    *status = static_cast<int>(st);
  }
}

__global__ void WaitKernel(CommCtx ctx, uint64_t flag_offset, uint64_t value, uint64_t timeout_ns,
                           unsigned long long* seen, int* ok) {
  const auto* flag = reinterpret_cast<const unsigned long long*>(
      static_cast<const uint8_t*>(ctx.p2p.local_base) + flag_offset);
  unsigned long long v = 0;
  *ok = mooncake::device::mc_wait_until_for(flag, McCmp::kGe,
                                            static_cast<unsigned long long>(value), timeout_ns, &v)
            ? 1
            : 0;
  *seen = v;
}

int CudaFailure(cudaError_t e) { return -1000 - static_cast<int>(e); }

}  // namespace

extern "C" int mc_pycheck_ctx_size() { return static_cast<int>(sizeof(CommCtx)); }

// Bumped whenever an entry point's parameters change; cuda_two_process.py
// refuses a library of another version instead of calling it wrongly.
extern "C" int mc_pycheck_abi() { return 2; }

extern "C" int mc_pycheck_put_signal(int device, const void* ctx_address, int dst,
                                     uint64_t dst_offset, uint64_t src_offset, uint64_t nbytes,
                                     uint64_t flag_offset, uint64_t value) {
  CommCtx ctx;
  std::memcpy(&ctx, ctx_address, sizeof(ctx));
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) return CudaFailure(e);
  int* status = nullptr;
  if (cudaError_t e = cudaMalloc(&status, sizeof(int)); e != cudaSuccess) return CudaFailure(e);
  cudaMemset(status, 0xff, sizeof(int));
  PutSignalKernel<<<1, 256>>>(ctx, dst, dst_offset, src_offset, nbytes, flag_offset, value, status);
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  int host = -1;
  if (e == cudaSuccess) e = cudaMemcpy(&host, status, sizeof(int), cudaMemcpyDeviceToHost);
  cudaFree(status);
  return e == cudaSuccess ? host : CudaFailure(e);
}

extern "C" int mc_pycheck_wait_signal(int device, const void* ctx_address, uint64_t flag_offset,
                                      uint64_t value, uint64_t timeout_ns, uint64_t* seen) {
  CommCtx ctx;
  std::memcpy(&ctx, ctx_address, sizeof(ctx));
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) return CudaFailure(e);
  unsigned long long* d_seen = nullptr;
  int* d_ok = nullptr;
  cudaError_t e = cudaMalloc(&d_seen, sizeof(*d_seen));
  if (e == cudaSuccess) e = cudaMalloc(&d_ok, sizeof(*d_ok));
  if (e == cudaSuccess) {
    WaitKernel<<<1, 1>>>(ctx, flag_offset, value, timeout_ns, d_seen, d_ok);
    e = cudaGetLastError();
  }
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  unsigned long long h_seen = 0;
  int h_ok = 0;
  if (e == cudaSuccess) e = cudaMemcpy(&h_seen, d_seen, sizeof(h_seen), cudaMemcpyDeviceToHost);
  if (e == cudaSuccess) e = cudaMemcpy(&h_ok, d_ok, sizeof(h_ok), cudaMemcpyDeviceToHost);
  cudaFree(d_seen);
  cudaFree(d_ok);
  if (e != cudaSuccess) return CudaFailure(e);
  if (seen != nullptr) *seen = h_seen;
  return h_ok;
}
