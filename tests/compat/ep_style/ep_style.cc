// An EP-style program written as code for upstream Mooncake is: host setup
// through createP2pDeviceTransport, handles exchanged by the program itself
// (host_setup.cc), and a dispatch-like kernel using upstream's names only
// (make_comm_ctx, mc_route_put, mc_rdma_put, mc_red_add, mc_signal-style
// acks, mc_ld_nc/mc_st_na copies, mc_fence, mc_bar_sync, mc_grid_sync).
// Built against an installed Mooncake. The same source is the CUDA program
// (ep_style.cu includes it); under a plain C++ compiler the kernel runs on
// the host platform as one block of CPU threads.
//
//   ep_style RUN_DIR RANK NUM_RANKS     (every rank, one process each;
//                                        $MOONCAKE_SOCKET names the daemon)
// Exit status 0 when every check passed; otherwise what failed is printed.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <transport/device/comm_device.cuh>

#include "host_setup.h"

#ifndef __CUDACC__
#include <mooncake/device/host_coop.h>
#endif

using mooncake::device::CommCtx;
using mooncake::device::make_comm_ctx;
using mooncake::device::mc_bar_sync;
using mooncake::device::mc_fence;
using mooncake::device::mc_grid_sync;
using mooncake::device::mc_ld_acquire;
using mooncake::device::mc_ld_nc;
using mooncake::device::mc_rdma_put;
using mooncake::device::mc_red_add;
using mooncake::device::mc_route_put;
using mooncake::device::mc_st_na;
using mooncake::device::mc_st_release;

namespace {

constexpr int kThreads = 64;  // two warps
constexpr int kTokenInt4 = 96;
constexpr size_t kTokenBytes = kTokenInt4 * sizeof(int4);
constexpr int kMaxRanks = 8;
// The symmetric buffer: a receive slot per source rank, the send token,
// count signals (one per source rank), rank 0's shared counter, phase acks.
constexpr size_t kRecvOff = 0;
constexpr size_t kSendOff = kRecvOff + kMaxRanks * kTokenBytes;
constexpr size_t kSigOff = kSendOff + kTokenBytes;
constexpr size_t kCounterOff = kSigOff + 64 * sizeof(int);
constexpr size_t kAckOff = kCounterOff + 64 * sizeof(int);
constexpr size_t kBufferBytes = kAckOff + 64 * sizeof(int);

int4 TokenWord(int src, int i) { return int4{src, i, src * i, 0x5eed}; }

// One thread of the kernel. lane/warp/thread as CUDA numbers them.
MC_DEVICE void EpKernelBody(void* buffer, const int32_t* available, void* const* peer_ptrs,
                            int rank, int num_ranks, int epoch, int thread) {
  const CommCtx ctx = make_comm_ctx(buffer, available, peer_ptrs, nullptr, nullptr, nullptr,
                                    nullptr, nullptr, rank, num_ranks, 0);
  auto* base = static_cast<uint8_t*>(buffer);
  const auto* send = reinterpret_cast<const int4*>(base + kSendOff);
  int* signals = reinterpret_cast<int*>(base + kSigOff);
  int* counter = reinterpret_cast<int*>(base + kCounterOff);
  int* acks = reinterpret_cast<int*>(base + kAckOff);
  const int lane = thread % 32;
  const int warp = thread / 32;

  // Dispatch: each warp sends the token to every other rank's slot for us,
  // then signals the count (EP's -(n + 1) into a zeroed slot) and adds to
  // rank 0's shared counter.
  for (int dst = warp; dst < num_ranks; dst += kThreads / 32) {
    void* dst_ptr = base + kRecvOff + rank * kTokenBytes;
    void* write_dst = mc_route_put(ctx, dst, dst_ptr);
    if (write_dst != nullptr) {
      auto* d = static_cast<int4*>(write_dst);
      mc_fence();
      for (int i = lane; i < kTokenInt4; i += 32) mc_st_na(d + i, mc_ld_nc(send + i));
      mc_fence();
    } else {
      mc_rdma_put(ctx, 0, dst, 1, send, dst_ptr, static_cast<uint32_t>(kTokenBytes), lane);
    }
    mooncake::device::mc_syncwarp();
    if (lane == 0) {
      if (dst != rank) {
        mc_red_add(ctx, dst, 0, 1, signals + rank, -kTokenInt4 - 1);
      } else {
        mc_st_release(signals + rank, -kTokenInt4 - 1);
      }
    }
  }
  if (thread == 0) mc_red_add(ctx, 0, 0, 1, counter, rank + 1);
  mc_bar_sync(1, kThreads);

  // Receive: wait for every source's count.
  for (int src = thread; src < num_ranks; src += kThreads) {
    while (mc_ld_acquire(signals + src) == 0) {
    }
  }
  if (rank == 0 && thread == 0) {
    while (mc_ld_acquire(counter) != num_ranks * (num_ranks + 1) / 2) {
    }
  }
  mc_grid_sync();

  // Phase ack (EP's mark_and_wait_phase_ack): nobody leaves while a peer
  // may still write into its buffer.
  for (int peer = thread; peer < num_ranks; peer += kThreads) {
    void* dst = mc_route_put(ctx, peer, acks + rank);
    if (dst != nullptr) mc_st_release(static_cast<int*>(dst), epoch);
  }
  mc_bar_sync(1, kThreads);
  for (int peer = thread; peer < num_ranks; peer += kThreads) {
    while (mc_ld_acquire(acks + peer) < epoch) {
    }
  }
}

#ifdef __CUDACC__
__global__ void EpKernel(void* buffer, const int32_t* available, void* const* peer_ptrs, int rank,
                         int num_ranks, int epoch) {
  EpKernelBody(buffer, available, peer_ptrs, rank, num_ranks, epoch, static_cast<int>(threadIdx.x));
}

std::string CudaCheck(cudaError_t e, const char* what) {
  return e == cudaSuccess ? "" : std::string(what) + ": " + cudaGetErrorString(e);
}
#endif

std::string Run(const std::string& run_dir, int rank, int num_ranks) {
  EpSetup s;
  std::string err = SetUpRank(run_dir, rank, num_ranks, kBufferBytes, &s);
  if (!err.empty()) return err;
  std::vector<int4> token(kTokenInt4);
  for (int i = 0; i < kTokenInt4; ++i) token[i] = TokenWord(rank, i);
  auto* base = static_cast<uint8_t*>(s.buffer);
  std::vector<uint8_t> host(kBufferBytes);
#ifdef __CUDACC__
  err = CudaCheck(cudaMemcpy(base + kSendOff, token.data(), kTokenBytes, cudaMemcpyHostToDevice),
                  "copying the token");
  if (!err.empty()) return err;
  // The token must be in place at every rank before anyone sends.
  std::string ignored;
  err = RendezvousFiles(run_dir, "ready", rank, num_ranks, "1", &ignored);
  if (!err.empty()) return err;
  void* buffer = s.buffer;
  const int32_t* available = s.available;
  void* const* peer_ptrs = s.peer_ptrs;
  int epoch = 1;
  void* args[] = {&buffer, &available, &peer_ptrs, &rank, &num_ranks, &epoch};
  err = CudaCheck(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(EpKernel), dim3(1),
                                              dim3(kThreads), args, 0, nullptr),
                  "launching the kernel");
  if (!err.empty()) return err;
  err = CudaCheck(cudaDeviceSynchronize(), "running the kernel");
  if (!err.empty()) return err;
  err = CudaCheck(cudaMemcpy(host.data(), base, kBufferBytes, cudaMemcpyDeviceToHost),
                  "reading the buffer back");
  if (!err.empty()) return err;
#else
  std::memcpy(base + kSendOff, token.data(), kTokenBytes);
  std::string ignored;
  err = RendezvousFiles(run_dir, "ready", rank, num_ranks, "1", &ignored);
  if (!err.empty()) return err;
  mooncake::device::host::runBlock(kThreads, [&](unsigned t) {
    EpKernelBody(s.buffer, s.available, s.peer_ptrs, rank, num_ranks, 1, static_cast<int>(t));
  });
  std::memcpy(host.data(), base, kBufferBytes);
#endif
  // Every source's token arrived whole in its slot, with its count.
  for (int src = 0; src < num_ranks; ++src) {
    const auto* got = reinterpret_cast<const int4*>(host.data() + kRecvOff + src * kTokenBytes);
    for (int i = 0; i < kTokenInt4; ++i) {
      const int4 want = TokenWord(src, i);
      if (std::memcmp(&got[i], &want, sizeof(int4)) != 0) {
        return "token from rank " + std::to_string(src) + " differs at int4 " + std::to_string(i);
      }
    }
    int sig;
    std::memcpy(&sig, host.data() + kSigOff + src * sizeof(int), sizeof(int));
    if (sig != -kTokenInt4 - 1) {
      return "count signal from rank " + std::to_string(src) + " is " + std::to_string(sig);
    }
  }
  if (rank == 0) {
    int counter;
    std::memcpy(&counter, host.data() + kCounterOff, sizeof(int));
    if (counter != num_ranks * (num_ranks + 1) / 2) {
      return "shared counter is " + std::to_string(counter) + ", want " +
             std::to_string(num_ranks * (num_ranks + 1) / 2) + " (an mc_red_add was lost)";
    }
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s RUN_DIR RANK NUM_RANKS\n", argv[0]);
    return 2;
  }
  const int rank = std::atoi(argv[2]);
  const int num_ranks = std::atoi(argv[3]);
  if (num_ranks < 1 || num_ranks > kMaxRanks || rank < 0 || rank >= num_ranks) {
    std::fprintf(stderr, "rank %d of %d: out of range (at most %d ranks)\n", rank, num_ranks,
                 kMaxRanks);
    return 2;
  }
  const std::string err = Run(argv[1], rank, num_ranks);
  if (!err.empty()) {
    std::fprintf(stderr, "ep_style rank %d: FAILED: %s\n", rank, err.c_str());
    return 1;
  }
  std::printf("ep_style rank %d of %d: ok\n", rank, num_ranks);
  return 0;
}
