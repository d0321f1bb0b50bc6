// One-way GPU0 <-> GPU1 latency over NVLink in one process: a kernel on each
// GPU ping-pongs a sequence number; one-way latency = round-trip / 2, timed
// on GPU0 with %globaltimer over many round trips after a warm-up. Each side
// writes into the other GPU's memory and polls its own (the push model of
// every P2P protocol here).
//
// Rows: bare flag protocols (volatile, relaxed, release/acquire, fences),
// data + flag (8-byte store + release flag, 16-byte LL slots), a 4 KiB warp
// put + signal, and the same through the Device API (mc_signal,
// mc_signal_relaxed, mc_put_signal_ll, mc_put_warp, mc_red_add with
// mc_wait_until / mc_wait_ll) on a CommCtx filled by hand.
//
// Usage: p2p_latency_bench [--iters N] [--reps N]
// Exit status 1 when any row saw wrong data or timed out.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_util.cuh"
#include "mooncake/device/comm_device.h"

using namespace mooncake::device;
using mcbench::median;

namespace {

enum Mode : int {
  kVolatile,           // volatile st / volatile ld
  kRelaxed,            // st.relaxed.sys / ld.relaxed.sys
  kReleaseAcquire,     // st.release.sys / ld.acquire.sys
  kFenceVolatile,      // __threadfence_system(); volatile st / volatile ld
  kDataRelease,        // 8 B data st, st.release.sys flag / ld.acquire.sys, data ld
  kLL16,               // {data, flag} as one st.relaxed.sys.v2.u64 / 16 B relaxed poll
  kLL16Split,          // {d_lo|flag, d_hi|flag} (McLLSlot layout), same store/poll
  kPut4KWarp,          // warp copies 4 KiB, __syncwarp, st.release.sys flag
  kMcSignal,           // mc_signal / mc_wait_until
  kMcSignalRelaxed,    // mc_signal_relaxed / mc_wait_until
  kMcLL,               // mc_put_signal_ll / mc_wait_ll
  kMcPutWarpSignal,    // mc_put_warp 4 KiB + mc_signal / mc_wait_until + data check
  kMcRedAdd,           // mc_red_add(+1) / mc_wait_until(>= i)
  kPreRelaxedAcq,      // route resolved once (mc_route_put), mc_st_relaxed / mc_wait_until
  kPreRelaxedRlx,      // route resolved once, mc_st_relaxed / mc_ld_relaxed poll
  kPreRelease,         // route resolved once, mc_st_release / mc_wait_until
  kLdgRouteRelaxed,    // route per call with tables read by ld.global.nc, mc_st_relaxed /
                       // mc_wait_until
  kPeerSignal,         // Device API, McPeer resolved once: mc_signal / mc_wait_until
  kPeerSignalRelaxed,  // McPeer: mc_signal_relaxed / mc_wait_until
  kPeerLL,             // McPeer: mc_put_signal_ll / mc_wait_ll
  kPeerPutWarpSignal,  // McPeer: mc_put_warp 4 KiB + mc_signal / mc_wait_until + data check
  kModeCount
};

const char* modeName(int m) {
  switch (m) {
    case kVolatile: return "volatile store / volatile poll";
    case kRelaxed: return "st.relaxed.sys / ld.relaxed.sys";
    case kReleaseAcquire: return "st.release.sys / ld.acquire.sys";
    case kFenceVolatile: return "__threadfence_system + volatile store / volatile poll";
    case kDataRelease: return "8 B data store + st.release.sys flag / ld.acquire.sys";
    case kLL16: return "LL 16 B {data64, flag64}: one st.relaxed.sys.v2.u64 / 16 B poll";
    case kLL16Split:
      return "LL 16 B {flag|lo32, flag|hi32} (McLLSlot): one v2.u64 store / 16 B poll";
    case kPut4KWarp: return "4 KiB put (mc_detail_copy_warp) + __syncwarp + st.release.sys flag";
    case kMcSignal: return "Device API: mc_signal / mc_wait_until";
    case kMcSignalRelaxed: return "Device API: mc_signal_relaxed / mc_wait_until";
    case kMcLL: return "Device API: mc_put_signal_ll / mc_wait_ll (8 B data + flag)";
    case kMcPutWarpSignal: return "Device API: mc_put_warp 4 KiB + mc_signal / mc_wait_until";
    case kMcRedAdd: return "Device API: mc_red_add(+1) / mc_wait_until(>= seq)";
    case kPeerSignal: return "Device API, McPeer: mc_signal / mc_wait_until";
    case kPeerSignalRelaxed: return "Device API, McPeer: mc_signal_relaxed / mc_wait_until";
    case kPeerLL: return "Device API, McPeer: mc_put_signal_ll / mc_wait_ll (8 B data + flag)";
    case kPeerPutWarpSignal:
      return "Device API, McPeer: mc_put_warp 4 KiB + mc_signal / mc_wait_until";
    case kPreRelaxedAcq:
      return "route resolved once + mc_st_relaxed / mc_wait_until (acquire poll)";
    case kPreRelaxedRlx: return "route resolved once + mc_st_relaxed / mc_ld_relaxed poll";
    case kPreRelease: return "route resolved once + mc_st_release / mc_wait_until";
    case kLdgRouteRelaxed:
      return "route per call, tables via ld.global.nc + mc_st_relaxed / mc_wait_until";
  }
  return "?";
}

constexpr int kPutBytes = 4096;
constexpr uint64_t kTimeoutNs = 2000000000ull;  // a stuck row gives up after 2 s

// Per-GPU symmetric buffer layout (same offsets on both GPUs).
struct Layout {
  static constexpr size_t kFlag = 0;     // u64 flag this GPU polls
  static constexpr size_t kData = 128;   // u64 data next to nothing else
  static constexpr size_t kSlot = 256;   // 16 B LL slot
  static constexpr size_t kPut = 4096;   // kPutBytes landing zone
  static constexpr size_t kSrc = 16384;  // two kPutBytes source patterns
  static constexpr size_t kBytes = 32768;
};

struct Side {
  char* local;   // this GPU's buffer
  char* remote;  // the other GPU's buffer, mapped here
  CommCtx ctx;   // rank = this GPU, peer = 1 - rank
  int peer;
  uint64_t* pre_flag;          // the peer's flag, resolved once through the context
  McPeer mc_peer;              // the peer, resolved once with mc_peer()
  unsigned long long* result;  // [0] elapsed ns (initiator), [1] errors, [2] timeouts
};

__device__ __forceinline__ uint64_t nowNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ uint64_t ldVolatile(const uint64_t* p) {
  return *(const volatile uint64_t*)p;
}
__device__ __forceinline__ void stVolatile(uint64_t* p, uint64_t v) { *(volatile uint64_t*)p = v; }
__device__ __forceinline__ void ld16(const void* p, uint64_t* a, uint64_t* b) {
  asm volatile("ld.relaxed.sys.global.v2.u64 {%0, %1}, [%2];"
               : "=l"(*a), "=l"(*b)
               : "l"(p)
               : "memory");
}
__device__ __forceinline__ void st16(void* p, uint64_t a, uint64_t b) {
  asm volatile("st.relaxed.sys.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(a), "l"(b) : "memory");
}
__device__ __forceinline__ uint64_t dataFor(uint64_t seq) { return seq * 0x9E3779B97F4A7C15ull; }

// Spins until `ready()`; false after kTimeoutNs.
template <class F>
__device__ __forceinline__ bool spinUntil(F ready) {
  uint64_t start = 0;
  for (uint32_t i = 0;; ++i) {
    if (ready()) return true;
    if ((i & 1023) == 1023) {
      uint64_t t = nowNs();
      if (start == 0)
        start = t;
      else if (t - start > kTimeoutNs)
        return false;
    }
  }
}

// Send message `seq` to the peer (all lanes of the warp call).
template <int M>
__device__ __forceinline__ void sendMsg(Side& s, uint64_t seq, unsigned lane) {
  uint64_t* rflag = reinterpret_cast<uint64_t*>(s.remote + Layout::kFlag);
  uint64_t* rdata = reinterpret_cast<uint64_t*>(s.remote + Layout::kData);
  if constexpr (M == kPut4KWarp || M == kMcPutWarpSignal || M == kPeerPutWarpSignal) {
    const char* src = s.local + Layout::kSrc + (seq & 1) * kPutBytes;
    if constexpr (M == kPeerPutWarpSignal) {
      mc_put_warp(s.mc_peer, s.local + Layout::kPut, src, kPutBytes, lane);
      if (lane == 0)
        mc_signal(s.mc_peer, reinterpret_cast<uint64_t*>(s.local + Layout::kFlag), seq);
    } else if constexpr (M == kPut4KWarp) {
      mc_detail_copy_warp(s.remote + Layout::kPut, src, kPutBytes, lane);
      __syncwarp();
      if (lane == 0) mc_st_release(rflag, seq);
    } else {
      mc_put_warp(s.ctx, s.peer, s.local + Layout::kPut, src, kPutBytes, lane);
      if (lane == 0)
        mc_signal(s.ctx, s.peer, reinterpret_cast<uint64_t*>(s.local + Layout::kFlag), seq);
    }
    return;
  }
  if (lane != 0) return;
  if constexpr (M == kVolatile) stVolatile(rflag, seq);
  if constexpr (M == kRelaxed) mc_st_relaxed(rflag, seq);
  if constexpr (M == kReleaseAcquire) mc_st_release(rflag, seq);
  if constexpr (M == kFenceVolatile) {
    __threadfence_system();
    stVolatile(rflag, seq);
  }
  if constexpr (M == kDataRelease) {
    *rdata = dataFor(seq);
    mc_st_release(rflag, seq);
  }
  if constexpr (M == kLL16) st16(s.remote + Layout::kSlot, dataFor(seq), seq);
  if constexpr (M == kLL16Split) {
    uint64_t d = dataFor(seq);
    st16(s.remote + Layout::kSlot, (seq << 32) | (uint32_t)d, (seq << 32) | (d >> 32));
  }
  if constexpr (M == kMcSignal)
    mc_signal(s.ctx, s.peer, reinterpret_cast<uint64_t*>(s.local + Layout::kFlag), seq);
  if constexpr (M == kMcSignalRelaxed)
    mc_signal_relaxed(s.ctx, s.peer, reinterpret_cast<uint64_t*>(s.local + Layout::kFlag), seq);
  if constexpr (M == kMcLL)
    mc_put_signal_ll(s.ctx, s.peer, reinterpret_cast<McLLSlot*>(s.local + Layout::kSlot),
                     dataFor(seq), (uint32_t)seq);
  if constexpr (M == kPreRelaxedAcq || M == kPreRelaxedRlx) mc_st_relaxed(s.pre_flag, seq);
  if constexpr (M == kPreRelease) mc_st_release(s.pre_flag, seq);
  if constexpr (M == kPeerSignal)
    mc_signal(s.mc_peer, reinterpret_cast<uint64_t*>(s.local + Layout::kFlag), seq);
  if constexpr (M == kPeerSignalRelaxed)
    mc_signal_relaxed(s.mc_peer, reinterpret_cast<uint64_t*>(s.local + Layout::kFlag), seq);
  if constexpr (M == kPeerLL)
    mc_put_signal_ll(s.mc_peer, reinterpret_cast<McLLSlot*>(s.local + Layout::kSlot), dataFor(seq),
                     (uint32_t)seq);
  if constexpr (M == kLdgRouteRelaxed) {
    // What mc_route_put does, with the (kernel-read-only) tables read through
    // the non-coherent path: does the read-only cache survive the acquire?
    if (__ldg(&s.ctx.p2p.available[s.peer])) {
      const char* peer_base = reinterpret_cast<const char*>(
          __ldg(reinterpret_cast<const unsigned long long*>(s.ctx.p2p.peer_ptrs) + s.peer));
      mc_st_relaxed(reinterpret_cast<uint64_t*>(const_cast<char*>(peer_base) + Layout::kFlag), seq);
    }
  }
  if constexpr (M == kMcRedAdd)
    mc_red_add(s.ctx, s.peer, reinterpret_cast<unsigned long long*>(s.local + Layout::kFlag), 1ull);
}

// Wait for message `seq` in local memory and check its data; returns false
// on timeout. Bad data counts into *errors.
template <int M>
__device__ __forceinline__ bool recvMsg(Side& s, uint64_t seq, unsigned lane,
                                        unsigned long long* errors) {
  const uint64_t* flag = reinterpret_cast<const uint64_t*>(s.local + Layout::kFlag);
  bool ok = true;
  if (lane == 0) {
    if constexpr (M == kVolatile || M == kFenceVolatile)
      ok = spinUntil([&] { return ldVolatile(flag) == seq; });
    if constexpr (M == kPreRelaxedRlx) ok = spinUntil([&] { return mc_ld_relaxed(flag) == seq; });
    if constexpr (M == kPreRelaxedAcq || M == kPreRelease || M == kLdgRouteRelaxed) {
      uint64_t seen = 0;
      ok = mc_wait_until_for(flag, McCmp::kEq, seq, kTimeoutNs, &seen);
    }
    if constexpr (M == kRelaxed) ok = spinUntil([&] { return mc_ld_relaxed(flag) == seq; });
    if constexpr (M == kReleaseAcquire || M == kPut4KWarp || M == kDataRelease)
      ok = spinUntil([&] { return mc_ld_acquire(flag) == seq; });
    if constexpr (M == kDataRelease)
      if (ok &&
          *reinterpret_cast<const volatile uint64_t*>(s.local + Layout::kData) != dataFor(seq))
        ++*errors;
    if constexpr (M == kLL16) {
      uint64_t d = 0, f = 0;
      ok = spinUntil([&] {
        ld16(s.local + Layout::kSlot, &d, &f);
        return f == seq;
      });
      if (ok && d != dataFor(seq)) ++*errors;
    }
    if constexpr (M == kLL16Split) {
      uint64_t lo = 0, hi = 0;
      ok = spinUntil([&] {
        ld16(s.local + Layout::kSlot, &lo, &hi);
        return (lo >> 32) == (seq & 0xffffffffu) && (hi >> 32) == (seq & 0xffffffffu);
      });
      if (ok && (((hi << 32) | (uint32_t)lo) != dataFor(seq))) ++*errors;
    }
    if constexpr (M == kMcSignal || M == kMcSignalRelaxed || M == kMcPutWarpSignal ||
                  M == kPeerSignal || M == kPeerSignalRelaxed || M == kPeerPutWarpSignal) {
      uint64_t seen = 0;
      ok = mc_wait_until_for(flag, McCmp::kEq, seq, kTimeoutNs, &seen);
    }
    if constexpr (M == kMcRedAdd) {
      unsigned long long seen = 0;
      ok = mc_wait_until_for(reinterpret_cast<const unsigned long long*>(flag), McCmp::kGe,
                             (unsigned long long)seq, kTimeoutNs, &seen);
    }
    if constexpr (M == kMcLL || M == kPeerLL) {
      const McLLSlot* slot = reinterpret_cast<const McLLSlot*>(s.local + Layout::kSlot);
      uint64_t d = 0;
      ok = spinUntil([&] { return mc_poll_ll(slot, (uint32_t)seq, &d); });
      if (ok && d != dataFor(seq)) ++*errors;
    }
  }
  if constexpr (M == kPut4KWarp || M == kMcPutWarpSignal || M == kPeerPutWarpSignal) {
    ok = __shfl_sync(0xffffffffu, ok ? 1 : 0, 0) != 0;
    __syncwarp();  // orders lane 0's acquire before the other lanes' reads
    // Every lane checks its share of the 4 KiB against the pattern sent.
    if (ok) {
      const volatile uint32_t* got =
          reinterpret_cast<const volatile uint32_t*>(s.local + Layout::kPut);
      uint32_t want_base = (uint32_t)((seq & 1) ? 0xB0000000u : 0xA0000000u);
      unsigned bad = 0;
      for (unsigned i = lane; i < kPutBytes / 4; i += 32) bad += got[i] != (want_base | i);
      for (int o = 16; o > 0; o /= 2) bad += __shfl_xor_sync(0xffffffffu, bad, o);
      if (lane == 0 && bad) ++*errors;
    }
  }
  return ok;
}

template <int M>
__global__ void pingPong(Side s, bool initiator, int warmup, int iters) {
  const unsigned lane = threadIdx.x % 32;
  s.pre_flag = static_cast<uint64_t*>(
      mc_route_put(s.ctx, s.peer, reinterpret_cast<uint64_t*>(s.local + Layout::kFlag)));
  s.mc_peer = mc_peer(s.ctx, s.peer);
  unsigned long long errors = 0;
  bool ok = true;
  uint64_t t0 = 0;
  const int total = warmup + iters;
  for (int i = 1; i <= total && ok; ++i) {
    if (initiator && i == warmup + 1) t0 = nowNs();
    if (initiator) {
      sendMsg<M>(s, (uint64_t)i, lane);
      ok = recvMsg<M>(s, (uint64_t)i, lane, &errors);
    } else {
      ok = recvMsg<M>(s, (uint64_t)i, lane, &errors);
      if (ok) sendMsg<M>(s, (uint64_t)i, lane);
    }
  }
  if (lane == 0) {
    if (initiator) s.result[0] = nowNs() - t0;
    s.result[1] = errors;
    s.result[2] = ok ? 0 : 1;
  }
}

__global__ void fillSources(char* local) {
  uint32_t* a = reinterpret_cast<uint32_t*>(local + Layout::kSrc);
  uint32_t* b = reinterpret_cast<uint32_t*>(local + Layout::kSrc + kPutBytes);
  for (unsigned i = threadIdx.x; i < kPutBytes / 4; i += blockDim.x) {
    a[i] = 0xA0000000u | i;
    b[i] = 0xB0000000u | i;
  }
}

struct Gpu {
  char* buf = nullptr;
  void** peer_ptrs = nullptr;  // device table [2]
  int32_t* available = nullptr;
  unsigned long long* result = nullptr;
  cudaStream_t stream = nullptr;
};

template <int M>
void launchPair(Gpu* g, int warmup, int iters) {
  unsigned threads = (M == kPut4KWarp || M == kMcPutWarpSignal || M == kPeerPutWarpSignal) ? 32 : 1;
  for (int d = 1; d >= 0; --d) {  // responder first, so it is polling when the first ping lands
    BENCH_CUDA(cudaSetDevice(d));
    Side s;
    s.local = g[d].buf;
    s.remote = g[1 - d].buf;
    s.peer = 1 - d;
    s.result = g[d].result;
    s.ctx.rank = d;
    s.ctx.num_ranks = 2;
    s.ctx.p2p.available = g[d].available;
    s.ctx.p2p.peer_ptrs = g[d].peer_ptrs;
    s.ctx.p2p.local_base = g[d].buf;
    pingPong<M><<<1, threads, 0, g[d].stream>>>(s, d == 0, warmup, iters);
    BENCH_CUDA(cudaGetLastError());
  }
}

void launchMode(int m, Gpu* g, int warmup, int iters) {
  switch (m) {
    case kVolatile: launchPair<kVolatile>(g, warmup, iters); break;
    case kRelaxed: launchPair<kRelaxed>(g, warmup, iters); break;
    case kReleaseAcquire: launchPair<kReleaseAcquire>(g, warmup, iters); break;
    case kFenceVolatile: launchPair<kFenceVolatile>(g, warmup, iters); break;
    case kDataRelease: launchPair<kDataRelease>(g, warmup, iters); break;
    case kLL16: launchPair<kLL16>(g, warmup, iters); break;
    case kLL16Split: launchPair<kLL16Split>(g, warmup, iters); break;
    case kPut4KWarp: launchPair<kPut4KWarp>(g, warmup, iters); break;
    case kMcSignal: launchPair<kMcSignal>(g, warmup, iters); break;
    case kMcSignalRelaxed: launchPair<kMcSignalRelaxed>(g, warmup, iters); break;
    case kMcLL: launchPair<kMcLL>(g, warmup, iters); break;
    case kMcPutWarpSignal: launchPair<kMcPutWarpSignal>(g, warmup, iters); break;
    case kMcRedAdd: launchPair<kMcRedAdd>(g, warmup, iters); break;
    case kPreRelaxedAcq: launchPair<kPreRelaxedAcq>(g, warmup, iters); break;
    case kPreRelaxedRlx: launchPair<kPreRelaxedRlx>(g, warmup, iters); break;
    case kPreRelease: launchPair<kPreRelease>(g, warmup, iters); break;
    case kLdgRouteRelaxed: launchPair<kLdgRouteRelaxed>(g, warmup, iters); break;
    case kPeerSignal: launchPair<kPeerSignal>(g, warmup, iters); break;
    case kPeerSignalRelaxed: launchPair<kPeerSignalRelaxed>(g, warmup, iters); break;
    case kPeerLL: launchPair<kPeerLL>(g, warmup, iters); break;
    case kPeerPutWarpSignal: launchPair<kPeerPutWarpSignal>(g, warmup, iters); break;
  }
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 20000, reps = 5;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--iters") && i + 1 < argc)
      iters = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc)
      reps = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: %s [--iters N] [--reps N]\n", argv[0]);
      return 2;
    }
  }
  int ndev = 0;
  BENCH_CUDA(cudaGetDeviceCount(&ndev));
  if (ndev < 2) {
    std::fprintf(stderr, "p2p_latency_bench needs 2 GPUs, found %d\n", ndev);
    return 2;
  }
  if (!mcbench::enablePeer(0, 1)) {
    std::fprintf(stderr, "GPU0 and GPU1 cannot access each other (no P2P)\n");
    return 2;
  }
  mcbench::printDevice(0);
  mcbench::printDevice(1);
  Gpu g[2];
  for (int d = 0; d < 2; ++d) {
    BENCH_CUDA(cudaSetDevice(d));
    BENCH_CUDA(cudaMalloc(&g[d].buf, Layout::kBytes));
    BENCH_CUDA(cudaMalloc(&g[d].peer_ptrs, 2 * sizeof(void*)));
    BENCH_CUDA(cudaMalloc(&g[d].available, 2 * sizeof(int32_t)));
    BENCH_CUDA(cudaMalloc(&g[d].result, 3 * sizeof(unsigned long long)));
    BENCH_CUDA(cudaStreamCreateWithFlags(&g[d].stream, cudaStreamNonBlocking));
    fillSources<<<1, 256>>>(g[d].buf);
  }
  void* ptrs[2] = {g[0].buf, g[1].buf};
  int32_t avail[2] = {1, 1};
  for (int d = 0; d < 2; ++d) {
    BENCH_CUDA(cudaSetDevice(d));
    BENCH_CUDA(cudaMemcpy(g[d].peer_ptrs, ptrs, sizeof ptrs, cudaMemcpyHostToDevice));
    BENCH_CUDA(cudaMemcpy(g[d].available, avail, sizeof avail, cudaMemcpyHostToDevice));
  }
  std::printf(
      "# one-way latency = (GPU0 globaltimer over %d round trips) / 2 / %d, after %d warm-up round "
      "trips;\n"
      "# median of %d reps; one thread per side (one warp for the 4 KiB rows)\n\n",
      iters, iters, 1000, reps);
  std::printf(
      "| protocol | one-way µs (median) | min | max | data errors |\n|---|---|---|---|---|\n");
  int failures = 0;
  for (int m = 0; m < kModeCount; ++m) {
    std::vector<double> us;
    unsigned long long errors = 0, timeouts = 0;
    for (int r = 0; r < reps; ++r) {
      for (int d = 0; d < 2; ++d) {
        BENCH_CUDA(cudaSetDevice(d));
        BENCH_CUDA(cudaMemset(g[d].buf, 0, Layout::kSrc));  // flags, slots, landing zone
        BENCH_CUDA(cudaMemset(g[d].result, 0, 3 * sizeof(unsigned long long)));
        BENCH_CUDA(cudaDeviceSynchronize());
      }
      launchMode(m, g, 1000, iters);
      unsigned long long res[2][3];
      for (int d = 0; d < 2; ++d) {
        BENCH_CUDA(cudaSetDevice(d));
        BENCH_CUDA(cudaStreamSynchronize(g[d].stream));
        BENCH_CUDA(cudaMemcpy(res[d], g[d].result, sizeof res[d], cudaMemcpyDeviceToHost));
        errors += res[d][1];
        timeouts += res[d][2];
      }
      us.push_back(res[0][0] / 1e3 / iters / 2);
    }
    std::sort(us.begin(), us.end());
    std::printf("| %s | %.3f | %.3f | %.3f | %llu%s |\n", modeName(m), median(us), us.front(),
                us.back(), errors, timeouts ? " (TIMED OUT)" : "");
    std::fflush(stdout);
    if (errors || timeouts) ++failures;
  }
  return failures ? 1 : 0;
}
