// The RDMA route from CUDA kernels, through a real mooncaked and softnic, on
// one GPU. Both ranks run in this process (two threads, two Communicators,
// two sessions, one CUDA context, so their kernels run side by side).
//
//   rdma_bench --socket S post   WQEs posted per second, one warp and a full
//                                grid (the daemon must run with softnic_sink =
//                                true: WQEs complete without moving data, so
//                                the GPU post path is measured alone; the
//                                rings are deep enough that no post waits)
//   rdma_bench --socket S bw     softnic WRITE bandwidth GPU->GPU, 4 KiB to
//                                256 MiB, beside cudaMemcpyAsync of the same
//                                sizes (device to device)
//   rdma_bench --socket S lat    one-way latency of mc_signal over RDMA
//                                (ping-pong / 2), beside mc_signal over P2P
//   rdma_bench --socket S check  GPU checks of the RDMA route (ok/FAIL lines):
//                                256 posters through a 64-WQE ring (one post
//                                per thread, and warp batches), puts of 1 B to
//                                256 MiB at odd offsets, a posting
//                                kernel replayed 100 times from a CUDA graph,
//                                an error completion seen by the kernel
//
// Prints one table per test; exits non-zero on any error.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.cuh"
#include "mooncake/client/communicator.h"
#include "mooncake/device/comm_device.h"

using mooncake::device::CommCtx;
using mooncake::device::McCmp;
using mooncake::device::McPeer;
using mooncake::device::McStatus;

namespace {

constexpr int kQps = 32;            // channels to the peer: one per lane of the warp
constexpr uint32_t kDepth = 32768;  // WQEs per QP: no post in the timed runs waits for space

// Each thread posts `per_thread` inline 8-byte WRITEs. Lanes: every thread
// calls mc_put_thread on its own QP (tid % kQps): one doorbell per WQE.
// Warps: the 32 lanes of a warp call mc_put_lanes together on the warp's QP
// (warp % kQps): one reservation and one doorbell per 32 WQEs.
template <bool kWarpBatched>
__global__ void PostKernel(CommCtx ctx, uint64_t* dst_sym, int per_thread, int* status) {
  const unsigned tid = blockIdx.x * blockDim.x + threadIdx.x;
  const unsigned channel = kWarpBatched ? tid / 32 : tid;
  McPeer peer = mooncake::device::mc_peer(ctx, 1, static_cast<int>(channel % kQps));
  uint64_t v = tid;
  for (int i = 0; i < per_thread; ++i) {
    McStatus st =
        kWarpBatched ? mooncake::device::mc_put_lanes(peer, dst_sym + (tid & 1023), &v, sizeof(v))
                     : mooncake::device::mc_put_thread(peer, dst_sym + (tid & 1023), &v, sizeof(v));
    if (st != McStatus::kOk) {
      atomicExch(status, static_cast<int>(st));
      return;
    }
  }
}

__global__ void QuietKernel(CommCtx ctx, int* status) {
  McStatus st = mooncake::device::mc_quiet(ctx);
  if (st != McStatus::kOk) atomicExch(status, static_cast<int>(st));
}

__global__ void PutQuietKernel(CommCtx ctx, uint8_t* dst_sym, const uint8_t* src, size_t n,
                               int iters, int* status) {
  McPeer peer = mooncake::device::mc_peer(ctx, 1);
  for (int i = 0; i < iters; ++i) {
    McStatus st = mooncake::device::mc_put_thread(peer, dst_sym, src, n);
    if (st == McStatus::kOk) st = mooncake::device::mc_quiet(ctx);
    if (st != McStatus::kOk) {
      atomicExch(status, static_cast<int>(st));
      return;
    }
  }
}

// Ping-pong: `me` signals the peer's flag with i and waits for its own to
// reach i; the responder does the opposite. Reports the total time.
__global__ void PingPongKernel(CommCtx ctx, int peer_rank, uint64_t* flag_sym, int iters,
                               bool initiator, unsigned long long* ns, int* status) {
  McPeer peer = mooncake::device::mc_peer(ctx, peer_rank);
  const uint64_t t0 = mooncake::device::mc_time_ns();
  for (int i = 1; i <= iters; ++i) {
    if (!initiator) mooncake::device::mc_wait_until(flag_sym, McCmp::kGe, uint64_t(i));
    McStatus st = mooncake::device::mc_signal(peer, flag_sym, uint64_t(i));
    if (st != McStatus::kOk) {
      atomicExch(status, static_cast<int>(st));
      return;
    }
    if (initiator) mooncake::device::mc_wait_until(flag_sym, McCmp::kGe, uint64_t(i));
  }
  *ns = mooncake::device::mc_time_ns() - t0;
  mooncake::device::mc_quiet(ctx);
}

struct Rank {
  std::unique_ptr<mooncake::Communicator> comm;
  std::string error;
};

// Creates ranks 0 and 1 of `group` concurrently (the rendezvous needs both).
bool MakePair(const std::string& socket, const std::string& group, mooncake::Route route,
              size_t bytes, Rank ranks[2]) {
  std::thread t[2];
  for (int r = 0; r < 2; ++r) {
    t[r] = std::thread([&, r] {
      cudaSetDevice(0);
      mooncake::CommunicatorOptions o;
      o.socket_path = socket;
      o.group = group;
      o.rank = r;
      o.world_size = 2;
      o.buffer_bytes = bytes;
      o.platform = mooncake::Platform::kCuda;
      o.cuda_handle = mooncake::device::CudaHandleKind::kVmmPosixFd;
      o.route = route;
      // No word takes adds over two routes here: one QP set each way, as
      // the earlier results measured (no loopback QPs of NIC atomics).
      o.atomics_route = mooncake::AtomicsRoute::kDevice;
      o.qps_per_peer = kQps;
      o.rdma_sq_depth = kDepth;
      auto c = mooncake::Communicator::Create(o);
      if (c.ok()) {
        ranks[r].comm = *std::move(c);
      } else {
        ranks[r].error = std::string(c.status().message());
      }
    });
  }
  for (auto& th : t) th.join();
  for (int r = 0; r < 2; ++r) {
    if (!ranks[r].comm) {
      std::fprintf(stderr, "rank %d setup failed: %s\n", r, ranks[r].error.c_str());
      return false;
    }
  }
  return true;
}

int CheckStatus(int* status, const char* what) {
  int st = 0;
  BENCH_CUDA(cudaMemcpy(&st, status, sizeof(int), cudaMemcpyDeviceToHost));
  if (st != 0) std::fprintf(stderr, "%s: McStatus %d\n", what, st);
  return st;
}

int Post(const std::string& socket) {
  Rank ranks[2];
  if (!MakePair(socket, "rdma-bench-post", mooncake::Route::kRdma, 1 << 20, ranks)) return 2;
  const CommCtx ctx = ranks[0].comm->ctx();
  auto* dst = static_cast<uint64_t*>(ranks[0].comm->buffer());
  int* status = nullptr;
  BENCH_CUDA(cudaMalloc(&status, sizeof(int)));
  BENCH_CUDA(cudaMemset(status, 0, sizeof(int)));
  cudaEvent_t a, b;
  BENCH_CUDA(cudaEventCreate(&a));
  BENCH_CUDA(cudaEventCreate(&b));
  int sms = 0;
  BENCH_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  struct Shape {
    const char* name;
    int blocks, threads;
    bool warp_batched;
    int qps_used;
  };
  const Shape shapes[] = {
      {"warp, a doorbell per WQE (32 QPs)", 1, 32, false, kQps},
      {"block 256, a doorbell per WQE", 1, 256, false, kQps},
      {"grid SMs x 256, a doorbell per WQE", sms, 256, false, kQps},
      {"warp, mc_put_lanes (1 QP)", 1, 32, true, 1},
      {"block 256, mc_put_lanes (8 QPs)", 1, 256, true, 8},
      {"grid SMs x 256, mc_put_lanes", sms, 256, true, kQps},
  };
  std::printf(
      "\nWQEs posted per second from CUDA threads (inline 8-byte WRITEs, %d QPs of %u "
      "WQEs, softnic sink)\n",
      kQps, kDepth);
  std::printf("%-38s %12s %12s %14s\n", "shape", "WQEs", "ms (median)", "M WQEs/s");
  for (const Shape& s : shapes) {
    const int threads = s.blocks * s.threads;
    // Per QP at most kDepth WQEs per run: no post ever waits for ring space.
    const int per_qp_threads = (threads + s.qps_used - 1) / s.qps_used;
    const int per_thread = std::max(1, static_cast<int>(kDepth) / per_qp_threads - 1);
    const double wqes = double(threads) * per_thread;
    std::vector<double> ms;
    for (int rep = 0; rep < 7; ++rep) {
      BENCH_CUDA(cudaEventRecord(a));
      if (s.warp_batched) {
        PostKernel<true><<<s.blocks, s.threads>>>(ctx, dst, per_thread, status);
      } else {
        PostKernel<false><<<s.blocks, s.threads>>>(ctx, dst, per_thread, status);
      }
      BENCH_CUDA(cudaEventRecord(b));
      BENCH_CUDA(cudaEventSynchronize(b));
      float t = 0;
      BENCH_CUDA(cudaEventElapsedTime(&t, a, b));
      // Drain (untimed): every WQE completes before the next run.
      QuietKernel<<<1, 1>>>(ctx, status);
      BENCH_CUDA(cudaDeviceSynchronize());
      if (CheckStatus(status, s.name) != 0) return 1;
      if (rep > 0) ms.push_back(t);
    }
    const double m = mcbench::median(ms);
    std::printf("%-38s %12.0f %12.3f %14.1f\n", s.name, wqes, m, wqes / (m * 1e-3) / 1e6);
  }
  return 0;
}

int Bandwidth(const std::string& socket) {
  const size_t max_bytes = 256ull << 20;
  Rank ranks[2];
  if (!MakePair(socket, "rdma-bench-bw", mooncake::Route::kRdma, max_bytes, ranks)) return 2;
  const CommCtx ctx = ranks[0].comm->ctx();
  auto* buf = static_cast<uint8_t*>(ranks[0].comm->buffer());
  int* status = nullptr;
  BENCH_CUDA(cudaMalloc(&status, sizeof(int)));
  BENCH_CUDA(cudaMemset(status, 0, sizeof(int)));
  uint8_t *x = nullptr, *y = nullptr;
  BENCH_CUDA(cudaMalloc(&x, max_bytes));
  BENCH_CUDA(cudaMalloc(&y, max_bytes));
  cudaEvent_t a, b;
  BENCH_CUDA(cudaEventCreate(&a));
  BENCH_CUDA(cudaEventCreate(&b));
  std::printf(
      "\nGPU -> GPU WRITE through softnic (one WQE + mc_quiet per op) vs cudaMemcpyAsync "
      "D2D, same GPU\n");
  std::printf("%-10s %14s %14s %14s %14s\n", "size", "softnic us/op", "softnic GB/s",
              "memcpy us/op", "memcpy GB/s");
  for (size_t n = 4096; n <= max_bytes; n *= 4) {
    const int iters = n <= (1 << 20) ? 50 : 5;
    std::vector<double> soft, copy;
    for (int rep = 0; rep < 5; ++rep) {
      float t = 0;
      BENCH_CUDA(cudaEventRecord(a));
      // From this rank's buffer to the same offset of the peer's.
      PutQuietKernel<<<1, 1>>>(ctx, buf, buf, n, iters, status);
      BENCH_CUDA(cudaEventRecord(b));
      BENCH_CUDA(cudaEventSynchronize(b));
      BENCH_CUDA(cudaEventElapsedTime(&t, a, b));
      soft.push_back(t * 1e3 / iters);
      BENCH_CUDA(cudaEventRecord(a));
      for (int i = 0; i < iters; ++i)
        BENCH_CUDA(cudaMemcpyAsync(y, x, n, cudaMemcpyDeviceToDevice));
      BENCH_CUDA(cudaEventRecord(b));
      BENCH_CUDA(cudaEventSynchronize(b));
      BENCH_CUDA(cudaEventElapsedTime(&t, a, b));
      copy.push_back(t * 1e3 / iters);
    }
    if (CheckStatus(status, "bw") != 0) return 1;
    const double s = mcbench::median(soft), c = mcbench::median(copy);
    std::printf("%-10s %14.1f %14.2f %14.1f %14.2f\n", mcbench::sizeName(n).c_str(), s,
                n / (s * 1e3), c, n / (c * 1e3));
  }
  return 0;
}

double PingPongUs(Rank ranks[2], int iters, int* status) {
  unsigned long long* ns = nullptr;
  BENCH_CUDA(cudaMalloc(&ns, 2 * sizeof(unsigned long long)));
  cudaStream_t st[2];
  for (auto& s : st) BENCH_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  auto* f0 = static_cast<uint64_t*>(ranks[0].comm->buffer());
  auto* f1 = static_cast<uint64_t*>(ranks[1].comm->buffer());
  BENCH_CUDA(cudaMemset(f0, 0, 8));
  BENCH_CUDA(cudaMemset(f1, 0, 8));
  BENCH_CUDA(cudaDeviceSynchronize());
  PingPongKernel<<<1, 1, 0, st[1]>>>(ranks[1].comm->ctx(), 0, f1, iters, false, ns + 1, status);
  PingPongKernel<<<1, 1, 0, st[0]>>>(ranks[0].comm->ctx(), 1, f0, iters, true, ns, status);
  BENCH_CUDA(cudaDeviceSynchronize());
  unsigned long long total = 0;
  BENCH_CUDA(cudaMemcpy(&total, ns, sizeof(total), cudaMemcpyDeviceToHost));
  for (auto& s : st) cudaStreamDestroy(s);
  cudaFree(ns);
  return total / 1e3 / iters / 2;
}

int Latency(const std::string& socket) {
  int* status = nullptr;
  BENCH_CUDA(cudaMalloc(&status, sizeof(int)));
  BENCH_CUDA(cudaMemset(status, 0, sizeof(int)));
  std::printf("\nmc_signal one-way latency (ping-pong / 2), two ranks on GPU 0\n");
  std::printf("%-34s %12s\n", "route", "us (median)");
  const struct {
    const char* name;
    mooncake::Route route;
    int iters;
  } routes[] = {{"RDMA (softnic, host-pinned rings)", mooncake::Route::kRdma, 200},
                {"P2P (load/store)", mooncake::Route::kP2p, 10000}};
  for (const auto& r : routes) {
    Rank ranks[2];
    if (!MakePair(socket, std::string("rdma-bench-lat-") + r.name[0], r.route, 1 << 20, ranks)) {
      return 2;
    }
    std::vector<double> us;
    for (int rep = 0; rep < 5; ++rep) us.push_back(PingPongUs(ranks, r.iters, status));
    if (CheckStatus(status, r.name) != 0) return 1;
    std::printf("%-34s %12.2f\n", r.name, mcbench::median(us));
  }
  return 0;
}

// ---- checks (run by tests/gpu/run.sh; exit non-zero on any failure) --------

// Every thread writes its own 8-byte word at the peer, `rounds` times,
// through one QP with a small ring: posters wait for ring space (back-
// pressure) while softnic drains it. kLanes: the warp posts its 32 words as
// one batch (mc_put_lanes).
template <bool kLanes>
__global__ void ManyPostersKernel(CommCtx ctx, uint64_t* words_sym, int rounds, int* status) {
  const unsigned tid = blockIdx.x * blockDim.x + threadIdx.x;
  McPeer peer = mooncake::device::mc_peer(ctx, 1);
  for (int r = 1; r <= rounds; ++r) {
    uint64_t v = (uint64_t(tid) << 16) | uint64_t(r);
    McStatus st = kLanes ? mooncake::device::mc_put_lanes(peer, words_sym + tid, &v, sizeof(v))
                         : mooncake::device::mc_put_thread(peer, words_sym + tid, &v, sizeof(v));
    if (st != McStatus::kOk) {
      atomicExch(status, static_cast<int>(st));
      return;
    }
  }
}

__global__ void CountWordsKernel(const uint64_t* words, unsigned n, int rounds,
                                 unsigned long long* bad) {
  for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    if (words[i] != ((uint64_t(i) << 16) | uint64_t(rounds))) atomicAdd(bad, 1ull);
  }
}

// A put past the end of the peer's registered buffer: the responder
// rejects it, the kernel sees kRdmaError from mc_quiet.
__global__ void BadPutKernel(CommCtx ctx, uint8_t* past_end_sym, const uint8_t* src, int* status) {
  McStatus st = mooncake::device::mc_put_thread(ctx, 1, past_end_sym, src, 4096);
  McStatus q = mooncake::device::mc_quiet(ctx);
  *status = static_cast<int>(st == McStatus::kOk ? q : st);
}

__global__ void AddKernel(CommCtx ctx, unsigned long long* counter_sym, int* status) {
  McStatus st = mooncake::device::mc_red_add(ctx, 1, counter_sym, 1ull);
  if (st == McStatus::kOk) st = mooncake::device::mc_quiet(ctx);
  if (st != McStatus::kOk) atomicExch(status, static_cast<int>(st));
}

__global__ void FillPatternKernel(uint8_t* p, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    p[i] = static_cast<uint8_t>((i * 131) ^ (i >> 9) ^ 0x5a);
  }
}

// Mismatches of got[dst_off, +n) against want[src_off, +n), plus non-zero
// bytes in the 64 before and after (the put must not spill).
__global__ void CompareKernel(const uint8_t* got, size_t dst_off, const uint8_t* want,
                              size_t src_off, size_t n, unsigned long long* bad) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n + 128;
       i += size_t(gridDim.x) * blockDim.x) {
    if (i < 64) {
      if (dst_off >= 64 - i && got[dst_off - 64 + i] != 0) atomicAdd(bad, 1ull);
    } else if (i < n + 64) {
      if (got[dst_off + i - 64] != want[src_off + i - 64]) atomicAdd(bad, 1ull);
    } else if (got[dst_off + n + (i - n - 64)] != 0) {
      atomicAdd(bad, 1ull);
    }
  }
}

// Puts of 1 B to 256 MiB at odd source and destination offsets, each one
// WQE (inline up to 28 bytes) then mc_quiet, checked byte for byte with
// the bytes around the destination untouched.
int SizeSweep(const std::string& socket,
              const std::function<void(bool, const std::string&)>& report) {
  const size_t max_n = 256ull << 20;
  Rank ranks[2];
  if (!MakePair(socket, "rdma-check-sizes", mooncake::Route::kRdma, max_n + (1 << 20), ranks)) {
    report(false, "size sweep: setup");
    return 1;
  }
  const CommCtx ctx = ranks[0].comm->ctx();
  auto* b0 = static_cast<uint8_t*>(ranks[0].comm->buffer());
  auto* b1 = static_cast<uint8_t*>(ranks[1].comm->buffer());
  int* status = nullptr;
  unsigned long long* bad = nullptr;
  BENCH_CUDA(cudaMalloc(&status, sizeof(int)));
  BENCH_CUDA(cudaMalloc(&bad, sizeof(unsigned long long)));
  FillPatternKernel<<<264, 256>>>(b0, max_n + 4096);
  // MC_RDMA_SWEEP_MAX caps the sizes (tests/gpu/run.sh's memcheck and racecheck passes: an
  // instrumented compare of 256 MiB takes minutes).
  const char* cap_env = std::getenv("MC_RDMA_SWEEP_MAX");
  const size_t cap = cap_env != nullptr ? std::strtoull(cap_env, nullptr, 10) : max_n;
  const size_t sizes[] = {1, 3, 28, 29, 4097, (1 << 20) + 5, (64ull << 20) + 7, max_n};
  const std::pair<size_t, size_t> offsets[] = {{0, 64}, {1, 71}, {13, 66}, {7, 77}};
  int cases = 0, wrong_cases = 0;
  unsigned long long worst = 0;
  for (size_t n : sizes) {
    if (n > cap) continue;
    for (auto [src_off, dst_off] : offsets) {
      BENCH_CUDA(cudaMemset(b1, 0, dst_off + n + 64));
      BENCH_CUDA(cudaMemset(status, 0, sizeof(int)));
      BENCH_CUDA(cudaMemset(bad, 0, sizeof(unsigned long long)));
      BENCH_CUDA(cudaDeviceSynchronize());
      PutQuietKernel<<<1, 1>>>(ctx, b0 + dst_off, b0 + src_off, n, 1, status);
      CompareKernel<<<264, 256>>>(b1, dst_off, b0, src_off, n, bad);
      int st = 0;
      unsigned long long nbad = 0;
      BENCH_CUDA(cudaMemcpy(&st, status, sizeof(int), cudaMemcpyDeviceToHost));
      BENCH_CUDA(cudaMemcpy(&nbad, bad, sizeof(nbad), cudaMemcpyDeviceToHost));
      ++cases;
      if (st != 0 || nbad != 0) {
        ++wrong_cases;
        worst = std::max(worst, nbad);
        std::fprintf(stderr, "size sweep: %zu bytes, src +%zu, dst +%zu: status %d, %llu wrong\n",
                     n, src_off, dst_off, st, nbad);
      }
    }
  }
  report(wrong_cases == 0, "puts of 1 B to " + std::to_string(std::min(cap, max_n)) +
                               " B at odd offsets (" + std::to_string(cases) +
                               " cases): " + std::to_string(wrong_cases) + " wrong");
  cudaFree(status);
  cudaFree(bad);
  return wrong_cases == 0 ? 0 : 1;
}

int Checks(const std::string& socket) {
  int failures = 0;
  auto report = [&](bool ok, const std::string& what) {
    std::printf("%s - %s\n", ok ? "ok  " : "FAIL", what.c_str());
    failures += ok ? 0 : 1;
  };
  const size_t bytes = 1 << 20;
  int* status = nullptr;
  unsigned long long* bad = nullptr;
  BENCH_CUDA(cudaMalloc(&status, sizeof(int)));
  BENCH_CUDA(cudaMalloc(&bad, sizeof(unsigned long long)));
  {
    // A 64-WQE ring per QP and 256 threads posting 4 rounds each through
    // one QP: 1024 WQEs, 16 times the ring.
    Rank ranks[2];
    std::thread t[2];
    for (int r = 0; r < 2; ++r) {
      t[r] = std::thread([&, r] {
        cudaSetDevice(0);
        mooncake::CommunicatorOptions o;
        o.socket_path = socket;
        o.group = "rdma-check-backpressure";
        o.rank = r;
        o.world_size = 2;
        o.buffer_bytes = bytes;
        o.platform = mooncake::Platform::kCuda;
        o.cuda_handle = mooncake::device::CudaHandleKind::kVmmPosixFd;
        o.route = mooncake::Route::kRdma;
        o.atomics_route = mooncake::AtomicsRoute::kDevice;
        o.rdma_sq_depth = 64;
        auto c = mooncake::Communicator::Create(o);
        if (c.ok())
          ranks[r].comm = *std::move(c);
        else
          ranks[r].error = std::string(c.status().message());
      });
    }
    for (auto& th : t) th.join();
    if (!ranks[0].comm || !ranks[1].comm) {
      report(false, "setup: " + ranks[0].error + ranks[1].error);
      return 1;
    }
    const CommCtx ctx = ranks[0].comm->ctx();
    auto* words = static_cast<uint64_t*>(ranks[0].comm->buffer());
    const unsigned n = 256;
    const int rounds = 4;
    int st = 0;
    for (bool lanes : {false, true}) {
      BENCH_CUDA(cudaMemset(ranks[1].comm->buffer(), 0, n * sizeof(uint64_t)));
      BENCH_CUDA(cudaMemset(status, 0, sizeof(int)));
      if (lanes) {
        ManyPostersKernel<true><<<1, n>>>(ctx, words, rounds, status);
      } else {
        ManyPostersKernel<false><<<1, n>>>(ctx, words, rounds, status);
      }
      QuietKernel<<<1, 1>>>(ctx, status);
      BENCH_CUDA(cudaDeviceSynchronize());
      BENCH_CUDA(cudaMemcpy(&st, status, sizeof(int), cudaMemcpyDeviceToHost));
      BENCH_CUDA(cudaMemset(bad, 0, sizeof(unsigned long long)));
      CountWordsKernel<<<1, 256>>>(static_cast<const uint64_t*>(ranks[1].comm->buffer()), n, rounds,
                                   bad);
      unsigned long long nbad = 0;
      BENCH_CUDA(cudaMemcpy(&nbad, bad, sizeof(nbad), cudaMemcpyDeviceToHost));
      report(st == 0 && nbad == 0,
             std::string("256 threads x 4 puts through one 64-WQE ring (back-pressure), ") +
                 (lanes ? "warp batches (mc_put_lanes)" : "one post per thread") + ": status " +
                 std::to_string(st) + ", wrong words " + std::to_string(nbad));
    }

    // A posting kernel captured in a CUDA graph and replayed 100 times.
    auto* counter = reinterpret_cast<unsigned long long*>(words + 1024);
    cudaStream_t s;
    BENCH_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    BENCH_CUDA(cudaMemset(status, 0, sizeof(int)));
    BENCH_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    AddKernel<<<1, 1, 0, s>>>(ctx, counter, status);
    BENCH_CUDA(cudaStreamEndCapture(s, &graph));
    BENCH_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    for (int i = 0; i < 100; ++i) BENCH_CUDA(cudaGraphLaunch(exec, s));
    BENCH_CUDA(cudaStreamSynchronize(s));
    unsigned long long seen = 0;
    BENCH_CUDA(cudaMemcpy(&seen,
                          reinterpret_cast<unsigned long long*>(
                              static_cast<uint64_t*>(ranks[1].comm->buffer()) + 1024),
                          sizeof(seen), cudaMemcpyDeviceToHost));
    BENCH_CUDA(cudaMemcpy(&st, status, sizeof(int), cudaMemcpyDeviceToHost));
    report(st == 0 && seen == 100,
           "mc_red_add kernel in a CUDA graph replayed 100 times: peer "
           "counter " +
               std::to_string(seen) + ", status " + std::to_string(st));
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(s);

    // An error completion reaches the kernel.
    BENCH_CUDA(cudaMemset(status, 0, sizeof(int)));
    BadPutKernel<<<1, 1>>>(ctx, reinterpret_cast<uint8_t*>(words) + bytes + (4 << 20),
                           reinterpret_cast<const uint8_t*>(words), status);
    BENCH_CUDA(cudaDeviceSynchronize());
    BENCH_CUDA(cudaMemcpy(&st, status, sizeof(int), cudaMemcpyDeviceToHost));
    report(st == static_cast<int>(McStatus::kRdmaError),
           "a put outside the peer's region: the kernel's mc_quiet returns kRdmaError (got " +
               std::to_string(st) + ")");
  }
  SizeSweep(socket, report);
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string socket, test;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--socket" && i + 1 < argc) {
      socket = argv[++i];
    } else {
      test = a;
    }
  }
  if (test != "post" && test != "bw" && test != "lat" && test != "check") {
    std::fprintf(stderr, "usage: rdma_bench [--socket S] post|bw|lat|check\n");
    return 64;
  }
  BENCH_CUDA(cudaSetDevice(0));
  BENCH_CUDA(cudaFree(nullptr));
  mcbench::printDevice(0);
  if (test == "post") return Post(socket);
  if (test == "bw") return Bandwidth(socket);
  if (test == "check") return Checks(socket);
  return Latency(socket);
}
