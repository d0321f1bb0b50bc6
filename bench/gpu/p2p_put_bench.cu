// GPU0 -> GPU1 put bandwidth over NVLink in one process: SM copy designs
// (the shipping mc_detail_copy_* primitives and experimental variants),
// Hopper bulk asynchronous copies (TMA 1-D, cp.async.bulk through shared
// memory), side by side with cudaMemcpyPeerAsync (copy engine) and NCCL
// send/recv.
//
// Usage: p2p_put_bench [--quick] [--reps N] [--max-bytes N] [--no-nccl] [--no-sweep]
// Prints markdown tables (GB/s = 1e9 bytes/s; medians of --reps timed reps,
// each rep a batch of back-to-back puts between CUDA events, after warm-up).
// Every design's output is verified once per size against the source.
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "bench_util.cuh"
#include "mooncake/device/comm_device.h"

using namespace mooncake::device;

using mcbench::median;
using mcbench::sizeName;

namespace {

struct Options {
  int reps = 9;
  size_t max_bytes = 1ull << 30;
  bool nccl = true;
  bool sweep = true;
  bool quick = false;
};

// ---------------------------------------------------------------------------
// SM designs built on the shipping primitives.

// Contiguous slice per block (16-byte multiples so every block's slice stays
// aligned), each block copying it with the group primitive.
template <int kUnroll>
__device__ __forceinline__ void blockChunk(char* dst, const char* src, size_t n) {
  size_t per = ((n + gridDim.x - 1) / gridDim.x + 15) & ~size_t(15);
  size_t begin = per * blockIdx.x;
  if (begin >= n) return;
  size_t len = n - begin < per ? n - begin : per;
  mc_detail_copy_group<kUnroll>(dst + begin, src + begin, len, threadIdx.x, blockDim.x);
}

template <int kUnroll>
__global__ void putBlockChunk(char* dst, const char* src, size_t n) {
  blockChunk<kUnroll>(dst, src, n);
}

// The whole grid as one group: consecutive threads take consecutive 16-byte
// units, the grid strides over the buffer.
template <int kUnroll>
__global__ void putGridStride(char* dst, const char* src, size_t n) {
  mc_detail_copy_group<kUnroll>(dst, src, n, blockIdx.x * blockDim.x + threadIdx.x,
                                gridDim.x * blockDim.x);
}

// Contiguous slice per warp.
template <int kUnroll>
__global__ void putWarpChunk(char* dst, const char* src, size_t n) {
  size_t warps = (size_t)gridDim.x * (blockDim.x / 32);
  size_t w = blockIdx.x * (size_t)(blockDim.x / 32) + threadIdx.x / 32;
  size_t per = ((n + warps - 1) / warps + 15) & ~size_t(15);
  size_t begin = per * w;
  if (begin >= n) return;
  size_t len = n - begin < per ? n - begin : per;
  mc_detail_copy_group<kUnroll>(dst + begin, src + begin, len, threadIdx.x % 32, 32);
}

// The Device API itself: each block puts its slice with mc_put_block to rank
// 1 through a CommCtx whose symmetric buffers are src0 (rank 0) and dst1
// (rank 1), so the put writes the same offsets it reads.
__global__ void putDeviceApi(CommCtx ctx, const char* src, size_t n, int* status) {
  size_t per = ((n + gridDim.x - 1) / gridDim.x + 15) & ~size_t(15);
  size_t begin = per * blockIdx.x;
  if (begin >= n) return;
  size_t len = n - begin < per ? n - begin : per;
  McStatus st =
      mc_put_block(ctx, 1, static_cast<char*>(ctx.p2p.local_base) + begin, src + begin, len);
  if (st != McStatus::kOk && threadIdx.x == 0) *status = (int)st;
}

// Tiles interleaved across blocks (block b takes tiles b, b+B, ...), each
// tile copied by the block with the group primitive.
template <int kUnroll>
__global__ void putTiles(char* dst, const char* src, size_t n, size_t tile) {
  for (size_t off = (size_t)blockIdx.x * tile; off < n; off += (size_t)gridDim.x * tile) {
    size_t len = n - off < tile ? n - off : tile;
    mc_detail_copy_group<kUnroll>(dst + off, src + off, len, threadIdx.x, blockDim.x);
  }
}

// The shipping multi-block helper, as a caller would use it.
__global__ void putTilesDefault(char* dst, const char* src, size_t n) {
  mc_detail_copy_tiles(dst, src, n, blockIdx.x, gridDim.x);
}

// Device API, one mc_put_block per interleaved tile.
__global__ void putDeviceApiTiles(CommCtx ctx, const char* src, size_t n, size_t tile,
                                  int* status) {
  char* base = static_cast<char*>(ctx.p2p.local_base);
  for (size_t off = (size_t)blockIdx.x * tile; off < n; off += (size_t)gridDim.x * tile) {
    size_t len = n - off < tile ? n - off : tile;
    McStatus st = mc_put_block(ctx, 1, base + off, src + off, len);
    if (st != McStatus::kOk && threadIdx.x == 0) *status = (int)st;
  }
}

// Device API, the grid-cooperative put (64 KiB tiles interleaved across
// blocks), with the peer resolved once per thread.
__global__ void putDeviceApiGrid(CommCtx ctx, const char* src, size_t n, int* status) {
  McPeer peer = mc_peer(ctx, 1);
  McStatus st = mc_put_grid(peer, ctx.p2p.local_base, src, n, blockIdx.x, gridDim.x);
  if (st != McStatus::kOk && threadIdx.x == 0) *status = (int)st;
}

// Grid-stride copy with a choice of store instruction (16-byte aligned
// buffers only): 0 st.global.L1::no_allocate, 1 st.global, 2 st.global.cs,
// 3 st.global.cg.
template <int kStore>
__device__ __forceinline__ void stVariant(int4* p, int4 v) {
  if constexpr (kStore == 0)
    asm volatile("st.global.L1::no_allocate.v4.s32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x),
                 "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
  else if constexpr (kStore == 1)
    asm volatile("st.global.v4.s32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z),
                 "r"(v.w)
                 : "memory");
  else if constexpr (kStore == 2)
    asm volatile("st.global.cs.v4.s32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y),
                 "r"(v.z), "r"(v.w)
                 : "memory");
  else
    asm volatile("st.global.cg.v4.s32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y),
                 "r"(v.z), "r"(v.w)
                 : "memory");
}
template <int kUnroll, int kStore>
__global__ void putGridStore(char* dst, const char* src, size_t n) {
  const int4* s = reinterpret_cast<const int4*>(src);
  int4* d = reinterpret_cast<int4*>(dst);
  const size_t nvec = n / 16, size = (size_t)gridDim.x * blockDim.x,
               rank = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  const size_t step = size * kUnroll, full = nvec - nvec % step;
  for (size_t base = rank; base < full; base += step) {
    int4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = mc_detail_ld_nc_v4(s + base + u * size);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) stVariant<kStore>(d + base + u * size, v[u]);
  }
  for (size_t i = full + rank; i < nvec; i += size)
    stVariant<kStore>(d + i, mc_detail_ld_nc_v4(s + i));
  for (size_t i = nvec * 16 + rank; i < n; i += size) dst[i] = src[i];
}

// ---------------------------------------------------------------------------
// Experimental SM variant: 16-byte loads with an L2 256-byte prefetch hint
// and plain (L1-allocating) stores, everything else as putBlockChunk.
__device__ __forceinline__ int4 ldNcL2Prefetch(const int4* p) {
  int4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.s32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
template <int kUnroll>
__global__ void putBlockChunkPrefetch(char* dst, const char* src, size_t n) {
  size_t per = ((n + gridDim.x - 1) / gridDim.x + 15) & ~size_t(15);
  size_t begin = per * blockIdx.x;
  if (begin >= n) return;
  size_t len = n - begin < per ? n - begin : per;
  const int4* s = reinterpret_cast<const int4*>(src + begin);
  int4* d = reinterpret_cast<int4*>(dst + begin);
  size_t nvec = len / 16;
  const size_t step = (size_t)blockDim.x * kUnroll;
  size_t full = nvec - nvec % step;
  for (size_t base = threadIdx.x; base < full; base += step) {
    int4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = ldNcL2Prefetch(s + base + (size_t)u * blockDim.x);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) d[base + (size_t)u * blockDim.x] = v[u];
  }
  for (size_t i = full + threadIdx.x; i < nvec; i += blockDim.x) d[i] = s[i];
  for (size_t i = nvec * 16 + threadIdx.x; i < len; i += blockDim.x)
    dst[begin + i] = src[begin + i];
}

// Pull (GPU1 reads GPU0's memory into its own): not a put, shown because
// NVLink reads and writes are different request types.
template <int kUnroll>
__global__ void getBlockChunk(char* dst, const char* src, size_t n) {
  blockChunk<kUnroll>(dst, src, n);
}

// ---------------------------------------------------------------------------
// Hopper bulk copies. Each warp of each block runs its own pipeline through
// `stages` shared-memory buffers of `chunk` bytes; lane 0 issues everything:
// cp.async.bulk global->shared completing on a per-stage mbarrier, then
// cp.async.bulk shared->global (the remote store) in a bulk group. A stage is
// refilled once its store has finished reading it (wait_group.read).

__device__ __forceinline__ uint32_t smemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbarInit(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbarExpectTx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbarWait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, "
        "1, 0, p;\n}"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}
__device__ __forceinline__ void bulkLoad(uint32_t smem, const void* gsrc, uint32_t bytes,
                                         uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(smem),
      "l"(gsrc), "r"(bytes), "r"(bar)
      : "memory");
}
__device__ __forceinline__ void bulkStore(void* gdst, uint32_t smem, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(gdst), "r"(smem),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void bulkCommit() {
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void bulkWaitRead() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(kPending) : "memory");
}
__device__ __forceinline__ void bulkWaitAll() {
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

constexpr int kMaxTmaStages = 16;
constexpr int kMaxTmaWarps = 8;

// interleave=false: each block a contiguous slice, its warps round-robin over
// the slice's chunks; interleave=true: chunk c of the whole buffer belongs to
// pipeline c % (blocks*warps).
__global__ void putTma(char* dst, const char* src, size_t n, uint32_t chunk, int stages,
                       bool interleave) {
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ uint64_t bars[kMaxTmaWarps][kMaxTmaStages];
  const unsigned warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const size_t body = n & ~size_t(15);
  // Block slice: multiple of 16 bytes so every bulk copy is aligned.
  size_t per = ((body + gridDim.x - 1) / gridDim.x + 15) & ~size_t(15);
  size_t b0 = per * blockIdx.x;
  size_t b1 = b0 + per < body ? b0 + per : body;
  // Pipeline id and count: within the block's slice, or over the buffer.
  size_t pipe = warp, pipes = warps;
  if (interleave) {
    b0 = 0;
    b1 = body;
    pipe = (size_t)blockIdx.x * warps + warp;
    pipes = (size_t)gridDim.x * warps;
  }
  if (lane == 0 && warp < kMaxTmaWarps) {
    for (int s = 0; s < stages; ++s) mbarInit(smemAddr(&bars[warp][s]), 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  }
  __syncwarp();
  if (lane == 0 && warp < kMaxTmaWarps && b0 < b1) {
    unsigned char* buf = smem + (size_t)warp * stages * chunk;
    const size_t nchunks = (b1 - b0 + chunk - 1) / chunk;
    // This pipeline's chunks: pipe, pipe + pipes, ...
    const size_t nk = nchunks > pipe ? (nchunks - pipe + pipes - 1) / pipes : 0;
    auto chunkOff = [&](size_t k) { return b0 + (pipe + k * pipes) * (size_t)chunk; };
    auto chunkLen = [&](size_t k) {
      size_t off = chunkOff(k);
      return (uint32_t)(b1 - off < chunk ? b1 - off : chunk);
    };
    auto issueLoad = [&](size_t k) {
      int s = (int)(k % stages);
      uint32_t bar = smemAddr(&bars[warp][s]);
      mbarExpectTx(bar, chunkLen(k));
      bulkLoad(smemAddr(buf + (size_t)s * chunk), src + chunkOff(k), chunkLen(k), bar);
    };
    for (size_t k = 0; k < nk && k < (size_t)stages; ++k) issueLoad(k);
    for (size_t k = 0; k < nk; ++k) {
      int s = (int)(k % stages);
      mbarWait(smemAddr(&bars[warp][s]), (uint32_t)((k / stages) & 1));
      bulkStore(dst + chunkOff(k), smemAddr(buf + (size_t)s * chunk), chunkLen(k));
      bulkCommit();
      // Refill the previous stage once its store has read it; the store
      // just issued may stay in flight.
      if (k >= 1 && k - 1 + stages < nk) {
        bulkWaitRead<1>();
        issueLoad(k - 1 + stages);
      }
    }
    bulkWaitAll();
  }
  // Sub-16-byte tail.
  if (blockIdx.x == gridDim.x - 1)
    for (size_t i = body + threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
}

// ---------------------------------------------------------------------------

__global__ void countMismatches(const char* a, const char* b, size_t n, unsigned long long* bad) {
  unsigned long long local = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    local += a[i] != b[i];
  if (local) atomicAdd(bad, local);
}
__global__ void fillPattern(uint32_t* p, size_t words, uint32_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < words;
       i += (size_t)gridDim.x * blockDim.x)
    p[i] = (uint32_t)(i * 2654435761u) ^ seed;
}

using Launch = std::function<void(cudaStream_t, char* dst, const char* src, size_t n)>;

struct Design {
  std::string name;
  Launch launch;
  bool pull = false;  // runs on GPU1 reading GPU0 (dst local to the launch)
};

struct Ctx {
  Options opt;
  int sms = 132;
  char* src0 = nullptr;  // GPU0
  char* dst1 = nullptr;  // GPU1
  cudaStream_t s0 = nullptr, s1 = nullptr;
  ncclComm_t comms[2] = {nullptr, nullptr};
  unsigned long long* bad0 = nullptr;
  CommCtx ctx;  // rank 0's view: buffers src0 (rank 0), dst1 (rank 1)
  int* api_status = nullptr;
  std::map<std::string, std::string> verify_fail;
};

// Batch of back-to-back operations per timed rep so small sizes are not just
// one launch: about 256 MiB per rep, at least 1, at most 2000 operations.
int itersFor(size_t n) {
  size_t it = (256ull << 20) / n;
  if (it < 1) it = 1;
  if (it > 2000) it = 2000;
  return (int)it;
}

// Times `op` (issued on stream s, device dev) and returns GB/s (median).
double timeOp(Ctx& c, int dev, cudaStream_t s, size_t n, const std::function<void()>& op) {
  BENCH_CUDA(cudaSetDevice(dev));
  const int iters = itersFor(n);
  for (int i = 0; i < 2; ++i) op();  // warm-up
  BENCH_CUDA(cudaStreamSynchronize(s));
  cudaEvent_t a, b;
  BENCH_CUDA(cudaEventCreate(&a));
  BENCH_CUDA(cudaEventCreate(&b));
  std::vector<double> gbps;
  for (int r = 0; r < c.opt.reps; ++r) {
    BENCH_CUDA(cudaEventRecord(a, s));
    for (int i = 0; i < iters; ++i) op();
    BENCH_CUDA(cudaEventRecord(b, s));
    BENCH_CUDA(cudaEventSynchronize(b));
    float ms = 0;
    BENCH_CUDA(cudaEventElapsedTime(&ms, a, b));
    gbps.push_back((double)n * iters / (ms * 1e-3) / 1e9);
  }
  BENCH_CUDA(cudaEventDestroy(a));
  BENCH_CUDA(cudaEventDestroy(b));
  return median(gbps);
}

bool verify(Ctx& c, const std::string& name, size_t n) {
  BENCH_CUDA(cudaSetDevice(0));
  BENCH_CUDA(cudaMemset(c.bad0, 0, sizeof(unsigned long long)));
  countMismatches<<<264, 512>>>(c.dst1, c.src0, n, c.bad0);  // reads dst over NVLink
  BENCH_CUDA(cudaGetLastError());
  unsigned long long bad = 0;
  BENCH_CUDA(cudaMemcpy(&bad, c.bad0, sizeof bad, cudaMemcpyDeviceToHost));
  if (bad) {
    char msg[128];
    std::snprintf(msg, sizeof msg, "%llu bad bytes at %s", bad, sizeName(n).c_str());
    c.verify_fail[name] = msg;
    std::fprintf(stderr, "VERIFY FAILED: %s: %s\n", name.c_str(), msg);
    return false;
  }
  return true;
}

void clearDst(Ctx& c, size_t n) {
  BENCH_CUDA(cudaSetDevice(1));
  BENCH_CUDA(cudaMemsetAsync(c.dst1, 0, n, c.s1));
  BENCH_CUDA(cudaStreamSynchronize(c.s1));
}

double runDesign(Ctx& c, const Design& d, size_t n) {
  clearDst(c, n);
  double g;
  if (d.pull)
    g = timeOp(c, 1, c.s1, n, [&] { d.launch(c.s1, c.dst1, c.src0, n); });
  else
    g = timeOp(c, 0, c.s0, n, [&] { d.launch(c.s0, c.dst1, c.src0, n); });
  BENCH_CUDA(cudaGetLastError());
  BENCH_CUDA(cudaDeviceSynchronize());
  verify(c, d.name, n);
  return g;
}

double runMemcpyPeer(Ctx& c, size_t n) {
  clearDst(c, n);
  double g = timeOp(c, 0, c.s0, n,
                    [&] { BENCH_CUDA(cudaMemcpyPeerAsync(c.dst1, 1, c.src0, 0, n, c.s0)); });
  verify(c, "cudaMemcpyPeerAsync", n);
  return g;
}

#define BENCH_NCCL(expr)                                                        \
  do {                                                                          \
    ncclResult_t r_ = (expr);                                                   \
    if (r_ != ncclSuccess) {                                                    \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #expr, \
                   ncclGetErrorString(r_));                                     \
      std::exit(2);                                                             \
    }                                                                           \
  } while (0)

double runNccl(Ctx& c, size_t n) {
  clearDst(c, n);
  // One op = a grouped send on GPU0 and recv on GPU1; stream s1 is joined
  // into s0 around the batch so the events on s0 span both.
  cudaEvent_t fork, join;
  BENCH_CUDA(cudaSetDevice(0));
  BENCH_CUDA(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  BENCH_CUDA(cudaSetDevice(1));
  BENCH_CUDA(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
  auto op = [&] {
    BENCH_NCCL(ncclGroupStart());
    BENCH_NCCL(ncclSend(c.src0, n, ncclChar, 1, c.comms[0], c.s0));
    BENCH_NCCL(ncclRecv(c.dst1, n, ncclChar, 0, c.comms[1], c.s1));
    BENCH_NCCL(ncclGroupEnd());
  };
  // timeOp records events on s0 only; make s0 wait for s1 after each op so
  // the recv side is inside the timed interval.
  auto joined = [&] {
    BENCH_CUDA(cudaSetDevice(0));
    BENCH_CUDA(cudaEventRecord(fork, c.s0));
    BENCH_CUDA(cudaStreamWaitEvent(c.s1, fork, 0));
    op();
    BENCH_CUDA(cudaSetDevice(1));
    BENCH_CUDA(cudaEventRecord(join, c.s1));
    BENCH_CUDA(cudaSetDevice(0));
    BENCH_CUDA(cudaStreamWaitEvent(c.s0, join, 0));
  };
  double g = timeOp(c, 0, c.s0, n, joined);
  BENCH_CUDA(cudaSetDevice(1));
  BENCH_CUDA(cudaStreamSynchronize(c.s1));
  verify(c, "NCCL send/recv", n);
  BENCH_CUDA(cudaEventDestroy(fork));
  BENCH_CUDA(cudaSetDevice(1));
  BENCH_CUDA(cudaEventDestroy(join));
  return g;
}

// Block count for a size: at most `max_blocks`, and no block with less than
// `min_bytes` (small puts use few blocks, as a real caller would).
unsigned blocksFor(size_t n, unsigned max_blocks, size_t min_bytes) {
  size_t b = (n + min_bytes - 1) / min_bytes;
  if (b < 1) b = 1;
  return (unsigned)(b < max_blocks ? b : max_blocks);
}

template <int U>
Launch smLaunch(const std::string& kind, unsigned threads, unsigned max_blocks) {
  // A block must get at least one full unrolled step of 16-byte units.
  size_t min_bytes = (size_t)threads * 16 * U;
  if (kind == "block")
    return [=](cudaStream_t s, char* d, const char* src, size_t n) {
      putBlockChunk<U><<<blocksFor(n, max_blocks, min_bytes), threads, 0, s>>>(d, src, n);
    };
  if (kind == "grid")
    return [=](cudaStream_t s, char* d, const char* src, size_t n) {
      putGridStride<U><<<blocksFor(n, max_blocks, min_bytes), threads, 0, s>>>(d, src, n);
    };
  if (kind == "warp")
    return [=](cudaStream_t s, char* d, const char* src, size_t n) {
      putWarpChunk<U><<<blocksFor(n, max_blocks, min_bytes), threads, 0, s>>>(d, src, n);
    };
  if (kind == "prefetch")
    return [=](cudaStream_t s, char* d, const char* src, size_t n) {
      putBlockChunkPrefetch<U><<<blocksFor(n, max_blocks, min_bytes), threads, 0, s>>>(d, src, n);
    };
  if (kind == "pull")
    return [=](cudaStream_t s, char* d, const char* src, size_t n) {
      getBlockChunk<U><<<blocksFor(n, max_blocks, min_bytes), threads, 0, s>>>(d, src, n);
    };
  std::fprintf(stderr, "unknown kind %s\n", kind.c_str());
  std::exit(2);
}

Launch smLaunchU(const std::string& kind, int unroll, unsigned threads, unsigned max_blocks) {
  switch (unroll) {
    case 1: return smLaunch<1>(kind, threads, max_blocks);
    case 2: return smLaunch<2>(kind, threads, max_blocks);
    case 4: return smLaunch<4>(kind, threads, max_blocks);
    case 8: return smLaunch<8>(kind, threads, max_blocks);
    case 16: return smLaunch<16>(kind, threads, max_blocks);
  }
  std::fprintf(stderr, "unsupported unroll %d\n", unroll);
  std::exit(2);
}

Design smDesign(const std::string& kind, int unroll, unsigned threads, unsigned max_blocks) {
  char name[96];
  std::snprintf(name, sizeof name, "sm-%s U=%d T=%u B=%u", kind.c_str(), unroll, threads,
                max_blocks);
  Design d{name, smLaunchU(kind, unroll, threads, max_blocks)};
  d.pull = kind == "pull";
  return d;
}

Design deviceApiDesign(Ctx& c, unsigned threads, unsigned max_blocks) {
  char name[96];
  std::snprintf(name, sizeof name, "Device API mc_put_block T=%u B=%u", threads, max_blocks);
  CommCtx ctx = c.ctx;
  int* status = c.api_status;
  size_t min_bytes = (size_t)threads * 16 * MC_DETAIL_COPY_UNROLL;
  Launch l = [=](cudaStream_t s, char* d, const char* src, size_t n) {
    (void)d;  // reached through the context's peer table
    putDeviceApi<<<blocksFor(n, max_blocks, min_bytes), threads, 0, s>>>(ctx, src, n, status);
  };
  return Design{name, l};
}

Design deviceApiGridDesign(Ctx& c, unsigned threads, unsigned max_blocks) {
  char name[96];
  std::snprintf(name, sizeof name, "Device API mc_put_grid T=%u B=%u", threads, max_blocks);
  CommCtx ctx = c.ctx;
  int* status = c.api_status;
  Launch l = [=](cudaStream_t s, char* d, const char* src, size_t n) {
    (void)d;
    putDeviceApiGrid<<<blocksFor(n, max_blocks, MC_DETAIL_COPY_TILE_BYTES), threads, 0, s>>>(
        ctx, src, n, status);
  };
  return Design{name, l};
}

Design deviceApiTilesDesign(Ctx& c, unsigned threads, unsigned max_blocks, size_t tile) {
  char name[96];
  std::snprintf(name, sizeof name, "Device API mc_put_block per %zuK tile T=%u B=%u", tile >> 10,
                threads, max_blocks);
  CommCtx ctx = c.ctx;
  int* status = c.api_status;
  Launch l = [=](cudaStream_t s, char* d, const char* src, size_t n) {
    (void)d;
    putDeviceApiTiles<<<blocksFor(n, max_blocks, tile), threads, 0, s>>>(ctx, src, n, tile, status);
  };
  return Design{name, l};
}

Design tmaDesign(unsigned warps, int stages, uint32_t chunk, unsigned max_blocks, bool interleave) {
  char name[96];
  std::snprintf(name, sizeof name, "tma%s W=%u S=%d C=%uK B=%u", interleave ? "-interleaved" : "",
                warps, stages, chunk >> 10, max_blocks);
  size_t smem = (size_t)warps * stages * chunk;
  Launch l = [=](cudaStream_t s, char* d, const char* src, size_t n) {
    // Small puts: one chunk per warp at least.
    unsigned b = blocksFor(n, max_blocks, (size_t)chunk * warps);
    putTma<<<b, warps * 32, smem, s>>>(d, src, n, chunk, stages, interleave);
  };
  return Design{name, l};
}

Design tilesDesign(int unroll, unsigned threads, unsigned max_blocks, size_t tile) {
  char name[96];
  std::snprintf(name, sizeof name, "sm-tiles U=%d T=%u B=%u tile=%zuK", unroll, threads, max_blocks,
                tile >> 10);
  Launch l = [=](cudaStream_t s, char* d, const char* src, size_t n) {
    unsigned b = blocksFor(n, max_blocks, tile);
    if (unroll == 4)
      putTiles<4><<<b, threads, 0, s>>>(d, src, n, tile);
    else
      putTiles<8><<<b, threads, 0, s>>>(d, src, n, tile);
  };
  return Design{name, l};
}

Design tilesDefaultDesign(unsigned threads, unsigned max_blocks) {
  char name[128];
  std::snprintf(name, sizeof name, "mc_detail_copy_tiles T=%u B=%u (tile %uK, U=%d)", threads,
                max_blocks, (unsigned)(MC_DETAIL_COPY_TILE_BYTES >> 10),
                MC_DETAIL_COPY_UNROLL_BLOCK);
  Launch l = [=](cudaStream_t s, char* d, const char* src, size_t n) {
    unsigned b = blocksFor(n, max_blocks, MC_DETAIL_COPY_TILE_BYTES);
    putTilesDefault<<<b, threads, 0, s>>>(d, src, n);
  };
  return Design{name, l};
}

Design storeDesign(int store, unsigned threads, unsigned max_blocks) {
  static const char* names[] = {"st.global.L1::no_allocate", "st.global", "st.global.cs",
                                "st.global.cg"};
  char name[96];
  std::snprintf(name, sizeof name, "sm-grid %s U=8 T=%u B=%u", names[store], threads, max_blocks);
  Launch l = [=](cudaStream_t s, char* d, const char* src, size_t n) {
    unsigned b = blocksFor(n, max_blocks, (size_t)threads * 16 * 8);
    switch (store) {
      case 0: putGridStore<8, 0><<<b, threads, 0, s>>>(d, src, n); break;
      case 1: putGridStore<8, 1><<<b, threads, 0, s>>>(d, src, n); break;
      case 2: putGridStore<8, 2><<<b, threads, 0, s>>>(d, src, n); break;
      default: putGridStore<8, 3><<<b, threads, 0, s>>>(d, src, n); break;
    }
  };
  return Design{name, l};
}

void printRow(const std::string& name, const std::vector<double>& g,
              const std::vector<double>* base) {
  std::printf("| %s |", name.c_str());
  for (size_t i = 0; i < g.size(); ++i) {
    if (base && (*base)[i] > 0)
      std::printf(" %.1f (%.2fx) |", g[i], g[i] / (*base)[i]);
    else
      std::printf(" %.1f |", g[i]);
  }
  std::printf("\n");
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--reps") && i + 1 < argc)
      opt.reps = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--max-bytes") && i + 1 < argc)
      opt.max_bytes = std::strtoull(argv[++i], nullptr, 10);
    else if (!std::strcmp(argv[i], "--no-nccl"))
      opt.nccl = false;
    else if (!std::strcmp(argv[i], "--no-sweep"))
      opt.sweep = false;
    else if (!std::strcmp(argv[i], "--quick"))
      opt.quick = true;
    else {
      std::fprintf(stderr,
                   "usage: %s [--quick] [--reps N] [--max-bytes N] [--no-nccl] [--no-sweep]\n",
                   argv[0]);
      return 2;
    }
  }
  setenv("NCCL_NVLS_ENABLE", "0", 0);  // NVLink multicast stays off (shared/gpu.md)
  int ndev = 0;
  BENCH_CUDA(cudaGetDeviceCount(&ndev));
  if (ndev < 2) {
    std::fprintf(stderr, "p2p_put_bench needs 2 GPUs, found %d\n", ndev);
    return 2;
  }
  if (!mcbench::enablePeer(0, 1)) {
    std::fprintf(stderr, "GPU0 and GPU1 cannot access each other (no P2P): nothing to measure\n");
    return 2;
  }
  mcbench::printDevice(0);
  mcbench::printDevice(1);
  Ctx c;
  c.opt = opt;
  cudaDeviceProp p{};
  BENCH_CUDA(cudaGetDeviceProperties(&p, 0));
  c.sms = p.multiProcessorCount;
  const size_t cap = opt.max_bytes;
  BENCH_CUDA(cudaSetDevice(0));
  BENCH_CUDA(cudaMalloc(&c.src0, cap));
  BENCH_CUDA(cudaMalloc(&c.bad0, sizeof(unsigned long long)));
  BENCH_CUDA(cudaStreamCreateWithFlags(&c.s0, cudaStreamNonBlocking));
  fillPattern<<<1024, 256>>>(reinterpret_cast<uint32_t*>(c.src0), cap / 4, 0x5eed);
  BENCH_CUDA(cudaSetDevice(1));
  BENCH_CUDA(cudaMalloc(&c.dst1, cap));
  BENCH_CUDA(cudaStreamCreateWithFlags(&c.s1, cudaStreamNonBlocking));
  BENCH_CUDA(cudaDeviceSynchronize());
  {
    // Device API context of rank 0, tables in GPU0 memory.
    BENCH_CUDA(cudaSetDevice(0));
    void* ptrs[2] = {c.src0, c.dst1};
    int32_t avail[2] = {1, 1};
    void** d_ptrs = nullptr;
    int32_t* d_avail = nullptr;
    BENCH_CUDA(cudaMalloc(&d_ptrs, sizeof ptrs));
    BENCH_CUDA(cudaMalloc(&d_avail, sizeof avail));
    BENCH_CUDA(cudaMalloc(&c.api_status, sizeof(int)));
    BENCH_CUDA(cudaMemset(c.api_status, 0, sizeof(int)));
    BENCH_CUDA(cudaMemcpy(d_ptrs, ptrs, sizeof ptrs, cudaMemcpyHostToDevice));
    BENCH_CUDA(cudaMemcpy(d_avail, avail, sizeof avail, cudaMemcpyHostToDevice));
    c.ctx.rank = 0;
    c.ctx.num_ranks = 2;
    c.ctx.p2p.peer_ptrs = d_ptrs;
    c.ctx.p2p.available = d_avail;
    c.ctx.p2p.local_base = c.src0;
  }
  if (opt.nccl) {
    int devs[2] = {0, 1};
    BENCH_NCCL(ncclCommInitAll(c.comms, 2, devs));
    int v = 0;
    ncclGetVersion(&v);
    std::printf("# NCCL %d (NCCL_NVLS_ENABLE=%s)\n", v, getenv("NCCL_NVLS_ENABLE"));
  }
  std::printf(
      "# medians of %d reps; each rep = a batch of back-to-back puts (about 256 MiB, 1..2000 "
      "ops)\n",
      opt.reps);
  const unsigned S = (unsigned)c.sms;
  BENCH_CUDA(cudaSetDevice(0));
  {
    // Dynamic + static shared memory must fit the opt-in limit.
    cudaFuncAttributes fa{};
    BENCH_CUDA(cudaFuncGetAttributes(&fa, putTma));
    BENCH_CUDA(cudaFuncSetAttribute(putTma, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)(p.sharedMemPerBlockOptin - fa.sharedSizeBytes)));
  }

  // --- Parameter sweeps at 16 MiB and 256 MiB -----------------------------
  std::vector<size_t> sweep_sizes;
  for (size_t n : {(size_t)16 << 20, (size_t)256 << 20})
    if (n <= cap) sweep_sizes.push_back(n);
  std::vector<double> base_sweep;
  for (size_t n : sweep_sizes) base_sweep.push_back(runMemcpyPeer(c, n));

  std::map<std::string, std::pair<Design, double>>
      best;  // family -> (design, GB/s at largest sweep size)
  std::map<std::string, std::vector<double>> best_rows;  // family -> that design's sweep row
  auto consider = [&](const std::string& family, const Design& d) {
    std::vector<double> g;
    for (size_t n : sweep_sizes) g.push_back(runDesign(c, d, n));
    printRow(d.name, g, &base_sweep);
    if (c.verify_fail.count(d.name)) return;
    double key = g.empty() ? 0 : g.back();
    if (!best.count(family) || best[family].second < key) {
      best[family] = {d, key};
      best_rows[family] = g;
    }
  };
  if (opt.sweep && !sweep_sizes.empty()) {
    std::printf("\n## Sweep (GB/s, ratio to cudaMemcpyPeerAsync)\n\n| design |");
    for (size_t n : sweep_sizes) std::printf(" %s |", sizeName(n).c_str());
    std::printf("\n|---|");
    for (size_t i = 0; i < sweep_sizes.size(); ++i) std::printf("---|");
    std::printf("\n");
    printRow("cudaMemcpyPeerAsync", base_sweep, nullptr);
    std::vector<int> unrolls =
        opt.quick ? std::vector<int>{4, 8} : std::vector<int>{1, 2, 4, 8, 16};
    std::vector<unsigned> threads =
        opt.quick ? std::vector<unsigned>{512} : std::vector<unsigned>{128, 256, 512, 1024};
    std::vector<unsigned> blocks =
        opt.quick ? std::vector<unsigned>{S} : std::vector<unsigned>{S / 4, S / 2, S, 2 * S, 4 * S};
    for (int u : unrolls)
      for (unsigned t : threads)
        for (unsigned b : blocks) {
          if (u == 16 && t == 1024) continue;  // 1024 threads x 16 int4 exceeds the register file
          consider("sm-block", smDesign("block", u, t, b));
        }
    for (int u : {4, 8, 16})
      for (unsigned t : {256u, 512u})
        for (unsigned b : {S, 2 * S, 4 * S}) consider("sm-grid", smDesign("grid", u, t, b));
    for (int u : {4, 8, 16})
      for (unsigned t : {128u, 256u, 512u})
        for (unsigned b : {S, 2 * S}) consider("sm-warp", smDesign("warp", u, t, b));
    for (int u : {4, 8, 16})
      for (unsigned t : {256u, 512u})
        for (unsigned b : {S, 2 * S}) consider("sm-prefetch", smDesign("prefetch", u, t, b));
    // Bulk copies: shared memory per block = W * S * C (at most 227 KiB).
    struct TmaCfg {
      unsigned w;
      int s;
      uint32_t c;
    };
    std::vector<TmaCfg> tcfg = {{1, 2, 16384}, {1, 4, 16384}, {1, 8, 16384}, {1, 4, 32768},
                                {1, 2, 65536}, {2, 4, 16384}, {4, 2, 16384}, {4, 4, 8192},
                                {4, 3, 16384}, {8, 2, 8192},  {1, 4, 4096},  {2, 4, 8192},
                                {4, 4, 4096}};
    for (bool il : {false, true})
      for (auto& t : tcfg)
        for (unsigned b : {S, 2 * S}) {
          if ((size_t)t.w * t.s * t.c * (b > S ? 2 : 1) > 226 * 1024)
            continue;  // would not be co-resident
          consider(il ? "tma-interleaved" : "tma", tmaDesign(t.w, t.s, t.c, b, il));
        }
    for (int u : {4, 8})
      for (unsigned t : {256u, 512u, 1024u})
        for (unsigned b : {S, 2 * S, 4 * S})
          for (size_t tile :
               {(size_t)16 << 10, (size_t)64 << 10, (size_t)256 << 10, (size_t)1 << 20}) {
            if (u == 8 && t == 1024) continue;
            consider("sm-tiles", tilesDesign(u, t, b, tile));
          }
    for (int st = 0; st < 4; ++st)
      for (unsigned b : {S, 4 * S}) consider("sm-grid-store", storeDesign(st, 512, b));
    for (int u : {4, 8})
      for (unsigned t : {512u})
        for (unsigned b : {S, 2 * S}) consider("sm-pull (GPU1 reads)", smDesign("pull", u, t, b));
  }

  if (!best.empty()) {
    std::printf(
        "\n## Best of each family in the sweep (chosen at the largest sweep size)\n\n| family | "
        "design |");
    for (size_t n : sweep_sizes) std::printf(" %s |", sizeName(n).c_str());
    std::printf("\n|---|---|");
    for (size_t i = 0; i < sweep_sizes.size(); ++i) std::printf("---|");
    std::printf("\n");
    for (auto& [family, bd] : best)
      printRow(family + " | " + bd.first.name, best_rows[family], &base_sweep);
  }

  // --- Full size ladder -----------------------------------------------------
  std::vector<size_t> sizes;
  for (size_t n = 4096; n <= cap; n *= 4) sizes.push_back(n);
  if (sizes.back() != cap && cap >= 4096) sizes.push_back(cap);
  std::vector<double> base;
  for (size_t n : sizes) base.push_back(runMemcpyPeer(c, n));
  std::printf(
      "\n## GPU0 -> GPU1 put bandwidth by size (GB/s, ratio to cudaMemcpyPeerAsync)\n\n| design |");
  for (size_t n : sizes) std::printf(" %s |", sizeName(n).c_str());
  std::printf("\n|---|");
  for (size_t i = 0; i < sizes.size(); ++i) std::printf("---|");
  std::printf("\n");
  printRow("cudaMemcpyPeerAsync", base, nullptr);
  if (opt.nccl) {
    std::vector<double> g;
    for (size_t n : sizes) g.push_back(runNccl(c, n));
    printRow("NCCL send/recv", g, &base);
  }
  // The shipping default (what a put split over all SMs by blocks uses), then
  // the best of each family from the sweep.
  std::vector<Design> ladder = {tilesDefaultDesign(512, 4 * S),
                                tilesDefaultDesign(1024, 2 * S),
                                deviceApiGridDesign(c, 512, 4 * S),
                                deviceApiTilesDesign(c, 512, 4 * S, MC_DETAIL_COPY_TILE_BYTES),
                                smDesign("block", MC_DETAIL_COPY_UNROLL_BLOCK, 512, S),
                                deviceApiDesign(c, 512, S),
                                deviceApiDesign(c, 1024, S)};
  for (auto& [family, bd] : best) ladder.push_back(bd.first);
  for (auto& d : ladder) {
    std::vector<double> g;
    for (size_t n : sizes) g.push_back(runDesign(c, d, n));
    printRow(d.name, g, &base);
  }
  // Not a device-initiated put: the copy engine and an SM kernel each move
  // part of the buffer at the same time, to see whether the link has room
  // beyond what either reaches alone.
  {
    cudaStream_t s0b;
    cudaEvent_t fork, join;
    BENCH_CUDA(cudaSetDevice(0));
    BENCH_CUDA(cudaStreamCreateWithFlags(&s0b, cudaStreamNonBlocking));
    BENCH_CUDA(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    BENCH_CUDA(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
    for (double sm_frac : {0.25, 0.5}) {
      std::vector<double> g;
      for (size_t n : sizes) {
        size_t n_ce = (size_t)(n * (1 - sm_frac)) & ~size_t(4095);
        clearDst(c, n);
        g.push_back(timeOp(c, 0, c.s0, n, [&] {
          BENCH_CUDA(cudaEventRecord(fork, c.s0));
          BENCH_CUDA(cudaStreamWaitEvent(s0b, fork, 0));
          BENCH_CUDA(cudaMemcpyPeerAsync(c.dst1, 1, c.src0, 0, n_ce, c.s0));
          putGridStride<4><<<blocksFor(n - n_ce, 4 * S, 16384), 256, 0, s0b>>>(
              c.dst1 + n_ce, c.src0 + n_ce, n - n_ce);
          BENCH_CUDA(cudaEventRecord(join, s0b));
          BENCH_CUDA(cudaStreamWaitEvent(c.s0, join, 0));
        }));
        BENCH_CUDA(cudaDeviceSynchronize());
        verify(c, "CE+SM split", n);
      }
      char name[96];
      std::snprintf(name, sizeof name,
                    "info, not a device put: CE %d%% + SM grid %d%% concurrently",
                    (int)((1 - sm_frac) * 100), (int)(sm_frac * 100));
      printRow(name, g, &base);
    }
  }

  int api_status = 0;
  BENCH_CUDA(cudaSetDevice(0));
  BENCH_CUDA(cudaMemcpy(&api_status, c.api_status, sizeof api_status, cudaMemcpyDeviceToHost));
  if (api_status)
    c.verify_fail["Device API mc_put_block"] = "returned McStatus " + std::to_string(api_status);
  std::printf("\n## Verification\n\n");
  if (c.verify_fail.empty())
    std::printf("every design's output matched the source at every size\n");
  for (auto& [name, msg] : c.verify_fail) std::printf("FAILED %s: %s\n", name.c_str(), msg.c_str());
  if (opt.nccl) {
    ncclCommDestroy(c.comms[0]);
    ncclCommDestroy(c.comms[1]);
  }
  return c.verify_fail.empty() ? 0 : 1;
}
