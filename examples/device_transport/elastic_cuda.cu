#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "elastic_cuda.h"
#include "mooncake/device/comm_device.h"

namespace mooncake::example {
namespace {

using device::CommCtx;
using device::McCmp;
using device::McPeer;
using device::McStatus;

// ElasticByte (elastic_data_path.h), which the host cannot lend the device.
__device__ __forceinline__ uint8_t DevElasticByte(size_t i, int src, int dst, uint64_t seq) {
  const size_t j = i + static_cast<size_t>(seq) * 17u;
  return static_cast<uint8_t>(
      (j * 131u + static_cast<size_t>(src) * 31u + static_cast<size_t>(dst) * 7u + 1u) & 0xffu);
}

// What the kernels report back to the host (one per path, device memory).
struct Scratch {
  int status;                   // first McStatus error of the current send
  int arrived;                  // WaitKernel: 1 when the flag reached `want`
  unsigned long long observed;  // WaitKernel: the last value read
  unsigned long long bad;       // CheckKernel: wrong bytes
};

__global__ void StageKernel(uint8_t* out, size_t n, int src, int dst, uint64_t seq) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    out[i] = DevElasticByte(i, src, dst, seq);
  }
}

// The staged message is read from this rank's outbox: over RDMA the NIC
// reads registered memory, and only after the doorbell.
__global__ void PutKernel(CommCtx ctx, int dst, uint8_t* inbox_sym, const uint8_t* outbox, size_t n,
                          Scratch* s) {
  const McStatus st = device::mc_put_grid(ctx, dst, inbox_sym, outbox, n, blockIdx.x, gridDim.x);
  if (threadIdx.x == 0 && st != McStatus::kOk) atomicCAS(&s->status, 0, static_cast<int>(st));
}

// After the put kernel (stream order) one thread publishes the message. To an
// RDMA peer it then waits for that peer's queue pair only (as the host path
// does): mc_quiet(ctx) would also poll the queue pairs toward a peer that
// was just lost and fail the sends to the healthy ones. Completion frees the
// outbox for the next message.
__global__ void SignalKernel(CommCtx ctx, int dst, unsigned long long* flag_sym,
                             unsigned long long seq, Scratch* s) {
  if (s->status != 0) return;  // nothing to publish
  const McPeer peer = device::mc_peer(ctx, dst);
  device::mc_fence();
  McStatus st = device::mc_signal(peer, flag_sym, seq);
  if (st == McStatus::kOk && device::mc_peer_is_rdma(peer)) st = device::mc_qp_quiet(peer.qp);
  if (st != McStatus::kOk) atomicCAS(&s->status, 0, static_cast<int>(st));
}

// Bounded: a lost sender never keeps the kernel (and so the host) waiting
// longer than timeout_ns.
__global__ void WaitKernel(const unsigned long long* flag, unsigned long long want,
                           uint64_t timeout_ns, Scratch* s) {
  unsigned long long seen = 0;
  s->arrived = device::mc_wait_until_for(flag, McCmp::kGe, want, timeout_ns, &seen) ? 1 : 0;
  s->observed = seen;
}

__global__ void CheckKernel(const uint8_t* inbox, size_t n, int src, int dst, uint64_t seq,
                            Scratch* s) {
  unsigned long long local = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    local += inbox[i] != DevElasticByte(i, src, dst, seq);
  }
  if (local) atomicAdd(&s->bad, local);
}

constexpr int kThreads = 512;
constexpr int kMaxBlocks = 32;
constexpr size_t kPutTile = 64 * 1024;  // mc_put_grid's share of one block

int BlocksFor(size_t n, size_t per_block) {
  const size_t b = (n + per_block - 1) / per_block;
  return b < 1 ? 1 : b > kMaxBlocks ? kMaxBlocks : static_cast<int>(b);
}

class CudaPath final : public ElasticDataPath {
 public:
  CudaPath(const CommCtx& ctx, void* buffer, ElasticLayout at)
      : ctx_(ctx), buf_(static_cast<uint8_t*>(buffer)), at_(at) {}
  ~CudaPath() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    cudaFree(dev_);
    cudaFreeHost(host_);
  }

  std::string Init() {
    std::string why;
    // A blocking stream: its work is ordered after the legacy default
    // stream's, where the transports' table updates (cuMemcpyHtoD from
    // pageable memory, which may return before its DMA lands) go.
    if (!Check("cudaStreamCreateWithFlags", cudaStreamCreateWithFlags(&stream_, cudaStreamDefault),
               &why) ||
        !Check("cudaMalloc(scratch)", cudaMalloc(&dev_, sizeof(Scratch)), &why) ||
        !Check("cudaMallocHost(scratch)", cudaMallocHost(&host_, sizeof(Scratch)), &why) ||
        !Check("cudaMemset(scratch)", cudaMemset(dev_, 0, sizeof(Scratch)), &why)) {
      return why;
    }
    return "";
  }

  PathResult Send(int dst, uint64_t seq, std::string* why) override {
    const size_t n = at_.msg;
    uint8_t* outbox = buf_ + at_.Outbox(dst);
    uint8_t* inbox = buf_ + at_.Inbox(ctx_.rank, seq);  // symmetric: my inbox at dst
    auto* flag = reinterpret_cast<unsigned long long*>(buf_ + FlagOffset(ctx_.rank));
    const std::string what = "sending #" + std::to_string(seq) + " to rank " + std::to_string(dst);
    if (!Check("cudaMemsetAsync(status)", cudaMemsetAsync(&dev_->status, 0, sizeof(int), stream_),
               why)) {
      return PathResult::kBroken;
    }
    StageKernel<<<BlocksFor(n, kThreads), kThreads, 0, stream_>>>(outbox, n, ctx_.rank, dst, seq);
    PutKernel<<<BlocksFor(n, kPutTile), kThreads, 0, stream_>>>(ctx_, dst, inbox, outbox, n, dev_);
    SignalKernel<<<1, 1, 0, stream_>>>(ctx_, dst, flag, seq, dev_);
    if (!Finish(what, why)) return PathResult::kBroken;
    if (host_->status != 0) {
      *why = what + " failed (status " + std::to_string(host_->status) + ")";
      return PathResult::kPeerFailed;
    }
    return PathResult::kOk;
  }

  PathResult WaitFlag(int src, uint64_t want, uint64_t timeout_ns, std::string* why) override {
    auto* flag = reinterpret_cast<const unsigned long long*>(buf_ + FlagOffset(src));
    WaitKernel<<<1, 1, 0, stream_>>>(flag, want, timeout_ns, dev_);
    if (!Finish("waiting for #" + std::to_string(want) + " from rank " + std::to_string(src),
                why)) {
      return PathResult::kBroken;
    }
    return host_->arrived != 0 ? PathResult::kOk : PathResult::kNotYet;
  }

  PathResult CheckInbox(int src, uint64_t seq, uint64_t* bad, std::string* why) override {
    const size_t n = at_.msg;
    if (!Check("cudaMemsetAsync(bad)",
               cudaMemsetAsync(&dev_->bad, 0, sizeof(unsigned long long), stream_), why)) {
      return PathResult::kBroken;
    }
    CheckKernel<<<BlocksFor(n, kThreads), kThreads, 0, stream_>>>(buf_ + at_.Inbox(src, seq), n,
                                                                  src, ctx_.rank, seq, dev_);
    if (!Finish("checking #" + std::to_string(seq) + " from rank " + std::to_string(src), why)) {
      return PathResult::kBroken;
    }
    *bad = host_->bad;
    return PathResult::kOk;
  }

  PathResult ZeroFlag(int src, std::string* why) override {
    const std::string what = "zeroing the flag word of rank " + std::to_string(src);
    if (!Check("cudaMemsetAsync(flag)",
               cudaMemsetAsync(buf_ + FlagOffset(src), 0, sizeof(uint64_t), stream_), why) ||
        !Check("cudaStreamSynchronize (" + what + ")", cudaStreamSynchronize(stream_), why)) {
      return PathResult::kBroken;
    }
    return PathResult::kOk;
  }

 private:
  static bool Check(const std::string& call, cudaError_t e, std::string* why) {
    if (e == cudaSuccess) return true;
    *why = call + ": " + cudaGetErrorString(e);
    return false;
  }
  // Waits for the kernels just launched and brings their scratch back.
  bool Finish(const std::string& what, std::string* why) {
    return Check("launching the kernels (" + what + ")", cudaGetLastError(), why) &&
           Check("cudaMemcpyAsync(scratch) (" + what + ")",
                 cudaMemcpyAsync(host_, dev_, sizeof(Scratch), cudaMemcpyDeviceToHost, stream_),
                 why) &&
           Check("cudaStreamSynchronize (" + what + ")", cudaStreamSynchronize(stream_), why);
  }

  const CommCtx& ctx_;  // Communicator::ctx(): copied into each launch
  uint8_t* const buf_;  // device memory
  const ElasticLayout at_;
  cudaStream_t stream_ = nullptr;
  Scratch* dev_ = nullptr;   // device
  Scratch* host_ = nullptr;  // pinned host copy, valid after Finish
};

}  // namespace

std::unique_ptr<ElasticDataPath> MakeCudaElasticPath(const CommCtx& ctx, void* buffer,
                                                     ElasticLayout layout, std::string* error) {
  auto path = std::make_unique<CudaPath>(ctx, buffer, layout);
  if (std::string why = path->Init(); !why.empty()) {
    *error = "setting up the CUDA data path: " + why;
    return nullptr;
  }
  return path;
}

}  // namespace mooncake::example
