// The client's half of the doorbell hand-off ("gpu-uar"): maps the UAR page
// of the session's verbs context (rdma.proto GetDoorbellAccess) and
// registers it with CUDA as I/O memory, so kernels ring the NIC's doorbell
// register themselves and no daemon thread sits between a post and the NIC.
//
// Why mmap and not ibv_import_device: importing builds a second libmlx5
// context over the same command fd, which allocates UAR pages of its own and
// queries the device, only for us to mmap the one page the daemon already
// allocated; mmap on the command fd at the UAR's offset is the same mapping
// with no libibverbs in the application (it runs without rdma-core).
//
// The GPU may refuse I/O memory (cuMemHostRegister(IOMEMORY) needs the
// driver's peer-mapping support: NVreg_RegistryDwords=PeerMappingOverride=1
// or nvidia-peermem); MapUarForGpu then undoes the mapping and says so, and
// the caller hands ringing back to the daemon (CPU-assisted).
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "mooncake/client/client.h"
#include "mooncake/drivers/cuda_driver.h"

namespace mooncake {

struct GpuUar {
  void* page = nullptr;  // the process's mapping of the UAR page
  size_t page_bytes = 0;
  drivers::CuDevicePtr device_register = 0;  // what kernels store the doorbell to
  bool detached = false;  // DetachUarFromCommandFd ran: `page` is anonymous memory
};

// Maps and registers `access`'s UAR page in the CUDA context current on this
// thread. The command fd is not kept: the mapping holds the context.
// InvalidArgument for a page size or register offset that cannot be right;
// the mmap's errno or CUDA's refusal, named, with what to change.
absl::StatusOr<GpuUar> MapUarForGpu(const DoorbellAccess& access, drivers::CudaDriver& cuda);

// The daemon is gone: drops this process's hold on its verbs context. The
// mapping of the command fd is the only reference the client keeps (the fd
// itself is closed after mmap), and while it exists the kernel keeps the
// context, with every QP, CQ, MR and UAR in it, even after the daemon exited.
// The page is replaced in place by anonymous memory (mmap MAP_FIXED, one
// step), so the kernel frees the context once the daemon's own references
// are gone, and a stray CPU store through the old address lands harmlessly.
// The CUDA registration is left as it is: a kernel still ringing must not
// fault, and the GPU's own mapping of the NIC page (its PTEs, made at
// registration) holds no reference on the file. UnmapUarForGpu drops it once
// kernels have stopped. Idempotent; no-op for an empty GpuUar. Errors: the
// mmap's errno, named (the page then stays mapped).
absl::Status DetachUarFromCommandFd(GpuUar& uar);

// Unregisters and unmaps (no-op for an empty GpuUar), detached or not.
void UnmapUarForGpu(GpuUar& uar, drivers::CudaDriver& cuda);

// What the client does when the daemon is gone, in this order (issue 24
// item 7): detaches `uar` from the command fd (DetachUarFromCommandFd; an
// empty GpuUar: nothing), so the verbs context, and with it the NIC's QPs
// that could still write CQEs, goes; only then `fail_rings` (the flush
// CQEs the kernels will read: FailQueuePairRings). The other order leaves a
// window in which a NIC still completing WQEs writes a CQE over a flush
// entry. Returns the detach's status (the rings are failed either way).
absl::Status DetachThenFailRings(GpuUar& uar, absl::FunctionRef<void()> fail_rings);

}  // namespace mooncake
