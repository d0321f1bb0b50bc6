// Queue rings in GPU memory: the control memory (send queues, CQs, doorbell
// records, fetch scratch; rdma_control_layout.h) as a cuMem allocation of
// the rank's GPU instead of host memory mapped for it. Kernels then write
// WQEs and poll CQEs in their own memory, and only the NIC crosses PCIe
// (it reads WQEs and writes CQEs peer to peer), as in NVSHMEM's IBGDA with
// its rings in device memory.
//
// The daemon reaches the allocation only through its dmabuf (the mlx5
// provider registers it as DevX umem: rdma.proto control_kind "dmabuf");
// it cannot read it, so this form needs the session to ring its own
// doorbells ("gpu-uar"), and the client does what the daemon would have
// done with the host form: clearing the rings, and failing them when the
// daemon goes (FailGpuQueuePairRings).
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "mooncake/client/daemon_rdma_transport.h"
#include "mooncake/common/unique_fd.h"
#include "mooncake/drivers/cuda_driver.h"

namespace mooncake {

struct GpuControlMemory {
  drivers::CuDevicePtr base = 0;  // as kernels (and the NIC, as iova) address it
  size_t bytes = 0;               // mapped: the request rounded up to the granularity
  drivers::CuMemHandle handle = 0;
  UniqueFd dmabuf;  // of [base, base + bytes)
  // A non-blocking stream for the host's own accesses (clearing rings,
  // failing them): they never queue behind the application's kernels, which
  // may be spinning on these very rings in a blocking stream.
  drivers::CuStream stream = nullptr;
  drivers::CuContext context = nullptr;  // the context it was made in (current then)
};

// How long the host's accesses to the rings may take before they count as
// stuck (DeadlineExceeded): they are a few bytes on an otherwise idle stream.
inline constexpr int kGpuRingAccessTimeoutMs = 2000;

// At least `bytes` of memory on `device` (the context current on this
// thread), accessible read-write from it, exported as a dmabuf, with its
// non-blocking stream. The
// allocation asks for GPUDirect RDMA (the NIC must reach it); errors name
// the step and, where the driver cannot export a dmabuf, say so (the caller
// keeps the rings in host memory). Nothing is left on an error.
absl::StatusOr<GpuControlMemory> AllocateGpuControlMemory(drivers::CudaDriver& cuda,
                                                          drivers::CuDevice device, uint64_t bytes);

// Unmaps and frees (no-op for an empty one). Kernels using it must be done.
void FreeGpuControlMemory(drivers::CudaDriver& cuda, GpuControlMemory& memory);

// The rings of QP slot `slot` start clean: no WQEs, every CQE invalid
// (0xff) and owned by the NIC, the doorbell block zero; done when this
// returns (on the memory's stream, bounded by kGpuRingAccessTimeoutMs).
absl::Status ClearGpuQueueRings(drivers::CudaDriver& cuda, const GpuControlMemory& memory,
                                uint32_t depth, uint64_t slot);

// Whether a refused attempt at GPU rings (the allocation, its region, or
// CreateQueuePairs on it, refused with `refusal`) falls back to host rings:
// only when the caller let the transport choose (kAuto), only before its
// first QP (later QPs share the first ones' memory), and not when the
// daemon is unreachable (kUnavailable: the host form would fail alike).
bool FallsBackToHostRings(DaemonRdmaOptions::RingMemory option, bool any_queue_pair,
                          absl::StatusCode refusal);

// FailQueuePairRings (rdma_control_layout.h) for rings in GPU memory: reads
// the QP's doorbell records and writes the flush CQE through the driver,
// its body before its last 4 bytes (the poller reads those first), on the
// memory's own stream, in its context (the caller's thread keeps its own
// current context).
absl::Status FailGpuQueuePairRings(drivers::CudaDriver& cuda, const GpuControlMemory& memory,
                                   uint32_t depth, uint64_t slot, uint32_t qpn);

}  // namespace mooncake
