#include "gpu_rings.h"

#include "absl/strings/str_cat.h"
#include "mooncake/common/status.h"
#include "rdma_control_layout.h"

namespace mooncake {

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
  if (!s.ok()) {
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
  memory.dmabuf = UniqueFd();
  (void)cuda.memUnmap(memory.base, memory.bytes);
  (void)cuda.memAddressFree(memory.base, memory.bytes);
  (void)cuda.memRelease(memory.handle);
  memory = GpuControlMemory{};
}

absl::Status ClearGpuQueueRings(drivers::CudaDriver& cuda, const GpuControlMemory& memory,
                                uint32_t depth, uint64_t slot) {
  const QpControlLayout at = QpControlAt(depth, slot);
  if (at.misc + kRdmaMiscBytes > memory.bytes) {
    return absl::OutOfRangeError(absl::StrCat("QP slot ", slot, " lies outside the ", memory.bytes,
                                              " bytes of GPU control memory"));
  }
  const struct {
    uint64_t at, bytes;
    unsigned char value;
  } parts[] = {{at.sq, uint64_t{depth} * device::mlx5::kSendWqeBb, 0},
               {at.cq, uint64_t{depth} * device::mlx5::kCqeBytes, 0xff},
               {at.misc, kRdmaMiscBytes, 0}};
  for (const auto& p : parts) {
    MC_RETURN_IF_ERROR(drivers::CuStatus(cuda, cuda.memsetD8(memory.base + p.at, p.value, p.bytes),
                                         "clearing RDMA rings"));
  }
  return absl::OkStatus();
}

absl::Status FailGpuQueuePairRings(drivers::CudaDriver& cuda, const GpuControlMemory& memory,
                                   uint32_t depth, uint64_t slot, uint32_t qpn) {
  const QpControlLayout at = QpControlAt(depth, slot);
  if (at.misc + kRdmaMiscBytes > memory.bytes) {
    return absl::OutOfRangeError(absl::StrCat("QP slot ", slot, " lies outside the ", memory.bytes,
                                              " bytes of GPU control memory"));
  }
  uint32_t records[4] = {};  // SQ record, then CQ record (adjacent: kCqDbrecAt == 8)
  static_assert(kCqDbrecAt == kSqDbrecAt + 8);
  MC_RETURN_IF_ERROR(drivers::CuStatus(
      cuda, cuda.memcpyDtoH(records, memory.base + at.misc + kSqDbrecAt, sizeof(records)),
      "reading the doorbell records of a failed QP"));
  const FlushCqe c = BuildFlushCqe(records, records + 2, depth, slot, qpn);
  // Two copies, in order (each is complete when it returns): a poller that
  // sees the new owner bit finds the body already there.
  MC_RETURN_IF_ERROR(drivers::CuStatus(cuda, cuda.memcpyHtoD(memory.base + c.offset, c.bytes, 60),
                                       "writing the flush CQE of a failed QP"));
  return drivers::CuStatus(cuda, cuda.memcpyHtoD(memory.base + c.offset + 60, c.bytes + 60, 4),
                           "writing the flush CQE of a failed QP");
}

}  // namespace mooncake
