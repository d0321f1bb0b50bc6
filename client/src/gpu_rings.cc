#include "gpu_rings.h"

#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "mooncake/common/status.h"
#include "rdma_control_layout.h"

namespace mooncake {
namespace {

// Waits for the memory's stream with a bound: a stream that does not drain
// in time means the device is stuck, and the caller must not hang with it.
absl::Status WaitForStream(drivers::CudaDriver& cuda, const GpuControlMemory& m, const char* what) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(kGpuRingAccessTimeoutMs);
  for (;;) {
    const drivers::CuResult r = cuda.streamQuery(m.stream);
    if (r == drivers::kCudaSuccess) return absl::OkStatus();
    if (r != drivers::kCudaErrorNotReady) return drivers::CuStatus(cuda, r, what);
    if (std::chrono::steady_clock::now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(what, ": not done after ", kGpuRingAccessTimeoutMs, " ms"));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

// OutOfRange when QP slot `slot` (whose rings are at `at`) is not inside `m`.
absl::Status CheckSlot(const GpuControlMemory& m, const QpControlLayout& at, uint64_t slot) {
  if (at.misc + kRdmaMiscBytes <= m.bytes) return absl::OkStatus();
  return absl::OutOfRangeError(absl::StrCat("QP slot ", slot, " lies outside the ", m.bytes,
                                            " bytes of GPU control memory"));
}

// Makes the memory's context current on this thread for one scope, and puts
// the thread's own back after.
class InContext {
 public:
  InContext(drivers::CudaDriver& cuda, drivers::CuContext ctx) : cuda_(cuda) {
    if (cuda_.ctxGetCurrent(&previous_) != drivers::kCudaSuccess) previous_ = nullptr;
    switched_ =
        ctx != nullptr && ctx != previous_ && cuda_.ctxSetCurrent(ctx) == drivers::kCudaSuccess;
  }
  ~InContext() {
    if (switched_) (void)cuda_.ctxSetCurrent(previous_);
  }
  InContext(const InContext&) = delete;
  InContext& operator=(const InContext&) = delete;

 private:
  drivers::CudaDriver& cuda_;
  drivers::CuContext previous_ = nullptr;
  bool switched_ = false;
};

}  // namespace

absl::StatusOr<GpuControlMemory> AllocateGpuControlMemory(drivers::CudaDriver& cuda,
                                                          drivers::CuDevice device,
                                                          uint64_t bytes) {
  drivers::CuMemAllocationProp prop{};
  prop.type = drivers::kCuMemAllocationTypePinned;
  prop.location.type = drivers::kCuMemLocationTypeDevice;
  prop.location.id = static_cast<int>(device);
  prop.requestedHandleTypes = drivers::kCuMemHandleTypeNone;
  prop.allocFlags.gpuDirectRDMACapable = 1;  // the NIC reads WQEs and writes CQEs here
  size_t granularity = 0;
  MC_RETURN_IF_ERROR(drivers::CuStatus(
      cuda,
      cuda.memGetAllocationGranularity(&granularity, &prop, drivers::kCuMemAllocGranularityMinimum),
      "cuMemGetAllocationGranularity (RDMA rings in GPU memory)"));
  if (granularity == 0) granularity = size_t{2} << 20;
  GpuControlMemory m;
  m.bytes = (bytes + granularity - 1) / granularity * granularity;
  MC_RETURN_IF_ERROR(drivers::CuStatus(cuda, cuda.memCreate(&m.handle, m.bytes, &prop, 0),
                                       "cuMemCreate (RDMA rings in GPU memory, GPUDirect RDMA)"));
  absl::Status s = drivers::CuStatus(cuda, cuda.memAddressReserve(&m.base, m.bytes, 0, 0, 0),
                                     "cuMemAddressReserve (RDMA rings)");
  if (!s.ok()) {
    (void)cuda.memRelease(m.handle);
    return s;
  }
  bool mapped = false;
  s = drivers::CuStatus(cuda, cuda.memMap(m.base, m.bytes, 0, m.handle, 0),
                        "cuMemMap (RDMA rings)");
  if (s.ok()) {
    mapped = true;
    drivers::CuMemAccessDesc access{};
    access.location = prop.location;
    access.flags = drivers::kCuMemAccessFlagsProtReadWrite;
    s = drivers::CuStatus(cuda, cuda.memSetAccess(m.base, m.bytes, &access, 1),
                          "cuMemSetAccess (RDMA rings)");
  }
  if (s.ok()) {
    int fd = -1;
    const drivers::CuResult r = cuda.memGetDmabufFd(&fd, m.base, m.bytes);
    if (r == drivers::kCudaSuccess && fd >= 0) {
      m.dmabuf = UniqueFd(fd);
    } else {
      s = drivers::CuStatus(cuda, r == drivers::kCudaSuccess ? drivers::kCudaErrorUnknown : r,
                            "cuMemGetHandleForAddressRange (the dmabuf of the RDMA rings)");
      if (r == drivers::kCudaErrorNotSupported) {
        s = absl::FailedPreconditionError(
            absl::StrCat(s.message(),
                         ": this driver or kernel exports no dmabuf of GPU memory "
                         "(it needs the open kernel modules and Linux 5.12+)"));
      }
    }
  }
  if (s.ok()) {
    s = drivers::CuStatus(cuda, cuda.streamCreate(&m.stream, drivers::kCuStreamNonBlocking),
                          "cuStreamCreate (non-blocking, for the RDMA rings)");
  }
  if (s.ok()) {
    s = drivers::CuStatus(cuda, cuda.ctxGetCurrent(&m.context), "cuCtxGetCurrent");
  }
  if (!s.ok()) {
    if (m.stream != nullptr) (void)cuda.streamDestroy(m.stream);
    m.dmabuf = UniqueFd();
    if (mapped) (void)cuda.memUnmap(m.base, m.bytes);
    (void)cuda.memAddressFree(m.base, m.bytes);
    (void)cuda.memRelease(m.handle);
    return s;
  }
  return m;
}

bool FallsBackToHostRings(DaemonRdmaOptions::RingMemory option, bool any_queue_pair,
                          absl::StatusCode refusal) {
  return option == DaemonRdmaOptions::RingMemory::kAuto && !any_queue_pair &&
         refusal != absl::StatusCode::kUnavailable;
}

void FreeGpuControlMemory(drivers::CudaDriver& cuda, GpuControlMemory& memory) {
  if (memory.base == 0) return;
  if (memory.stream != nullptr) (void)cuda.streamDestroy(memory.stream);
  memory.dmabuf = UniqueFd();
  (void)cuda.memUnmap(memory.base, memory.bytes);
  (void)cuda.memAddressFree(memory.base, memory.bytes);
  (void)cuda.memRelease(memory.handle);
  memory = GpuControlMemory{};
}

absl::Status ClearGpuQueueRings(drivers::CudaDriver& cuda, const GpuControlMemory& memory,
                                uint32_t depth, uint64_t slot) {
  const QpControlLayout at = QpControlAt(depth, slot);
  MC_RETURN_IF_ERROR(CheckSlot(memory, at, slot));
  InContext in(cuda, memory.context);
  for (const RingFill& f : CleanRings(depth, slot)) {
    MC_RETURN_IF_ERROR(drivers::CuStatus(
        cuda, cuda.memsetD8Async(memory.base + f.at, f.value, f.bytes, memory.stream),
        "clearing RDMA rings"));
  }
  return WaitForStream(cuda, memory, "clearing RDMA rings");
}

absl::Status FailGpuQueuePairRings(drivers::CudaDriver& cuda, const GpuControlMemory& memory,
                                   uint32_t depth, uint64_t slot, uint32_t qpn) {
  const QpControlLayout at = QpControlAt(depth, slot);
  MC_RETURN_IF_ERROR(CheckSlot(memory, at, slot));
  InContext in(cuda, memory.context);
  uint32_t records[4] = {};  // SQ record, then CQ record (adjacent: kCqDbrecAt == 8)
  static_assert(kCqDbrecAt == kSqDbrecAt + 8);
  MC_RETURN_IF_ERROR(
      drivers::CuStatus(cuda,
                        cuda.memcpyDtoHAsync(records, memory.base + at.misc + kSqDbrecAt,
                                             sizeof(records), memory.stream),
                        "reading the doorbell records of a failed QP"));
  MC_RETURN_IF_ERROR(WaitForStream(cuda, memory, "reading the doorbell records of a failed QP"));
  const FlushCqe c = BuildFlushCqe(records, records + 2, depth, slot, qpn);
  // Two copies in stream order: a poller that sees the new owner bit finds
  // the body already there. `c` is pageable: each copy has staged it
  // when the call returns.
  MC_RETURN_IF_ERROR(drivers::CuStatus(
      cuda, cuda.memcpyHtoDAsync(memory.base + c.offset, c.bytes, 60, memory.stream),
      "writing the flush CQE of a failed QP"));
  MC_RETURN_IF_ERROR(drivers::CuStatus(
      cuda, cuda.memcpyHtoDAsync(memory.base + c.offset + 60, c.bytes + 60, 4, memory.stream),
      "writing the flush CQE of a failed QP"));
  return WaitForStream(cuda, memory, "writing the flush CQE of a failed QP");
}

}  // namespace mooncake
