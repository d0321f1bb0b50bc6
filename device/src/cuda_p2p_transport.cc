// CUDA P2pTransport: buffers in GPU memory shared with the other ranks'
// processes either as cuMem VMM allocations whose POSIX fds travel with the
// join (or through the HandleExchange), or as legacy cudaIpcMemHandles (64
// bytes inside the handle). Tables live in device memory; verification runs
// a kernel that touches every peer through its mapping. Everything else is
// the shared core (p2p_transport_core.h).
//
// Driver-API calls go through the one CUDA driver wrapper
// (mooncake/drivers/cuda_driver.h); runtime calls (tables, copies, legacy
// IPC, the verification kernel) through the shared cudart.
//
// Host C++ (g++): only the verification kernel is CUDA code
// (cuda_verify_kernel.cu).

#include <cuda_runtime_api.h>

#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cuda_verify_kernel.h"
#include "mooncake/common/log.h"
#include "mooncake/common/status.h"
#include "mooncake/drivers/cuda_driver.h"
#include "p2p_transport_core.h"

namespace mooncake {
namespace device {
namespace {

using drivers::CudaDriver;
using drivers::CuStatus;
using internal::BufferHandle;
using internal::HandleKind;

absl::StatusCode CodeFor(cudaError_t e) {
  switch (e) {
    case cudaErrorMemoryAllocation: return absl::StatusCode::kResourceExhausted;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidResourceHandle: return absl::StatusCode::kInvalidArgument;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorPeerAccessUnsupported:
    case cudaErrorNotSupported: return absl::StatusCode::kFailedPrecondition;
    default: return absl::StatusCode::kInternal;
  }
}

absl::Status CudaStatus(cudaError_t e, absl::string_view what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::Status(
      CodeFor(e), absl::StrCat(what, ": ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")"));
}

// Makes `device` current and restores the caller's device when destroyed.
std::shared_ptr<void> SwitchDevice(int device) {
  int previous = -1;
  if (cudaGetDevice(&previous) != cudaSuccess || previous == device) return nullptr;
  cudaSetDevice(device);
  return std::shared_ptr<void>(nullptr, [previous](void*) { cudaSetDevice(previous); });
}

class CudaP2pTransport final : public internal::P2pTransportCore {
 public:
  CudaP2pTransport(int num_ranks, std::shared_ptr<HandleExchange> exchange,
                   std::shared_ptr<CudaDriver> driver, int device, HandleKind kind, bool gdr_vmm)
      : P2pTransportCore(num_ranks, std::move(exchange), kind, absl::StrCat("GPU ", device)),
        drv_(std::move(driver)),
        device_(device),
        gdr_vmm_(gdr_vmm) {}

  ~CudaP2pTransport() override {
    auto on = EnterPlatform();
    ReleaseAll();
    if (d_available_ != nullptr) cudaFree(d_available_);
    if (d_peer_ptrs_ != nullptr) cudaFree(d_peer_ptrs_);
  }

  absl::Status Init() {
    auto on = EnterPlatform();
    MC_RETURN_IF_ERROR(CudaStatus(
        cudaMalloc(reinterpret_cast<void**>(&d_available_), sizeof(int32_t) * numRanks()),
        "cudaMalloc(available table)"));
    MC_RETURN_IF_ERROR(
        CudaStatus(cudaMalloc(reinterpret_cast<void**>(&d_peer_ptrs_), sizeof(void*) * numRanks()),
                   "cudaMalloc(peer pointer table)"));
    MC_RETURN_IF_ERROR(PublishTables());
    if (!vmm()) return absl::OkStatus();
    drivers::CuMemAllocationProp prop = AllocationProp();
    MC_RETURN_IF_ERROR(
        CuStatus(*drv_,
                 drv_->memGetAllocationGranularity(&granularity_, &prop,
                                                   drivers::kCuMemAllocGranularityRecommended),
                 "cuMemGetAllocationGranularity"));
    // Every GPU that can reach this one gets access, so a process driving
    // several GPUs can use the buffer from any of them.
    int count = 0;
    MC_RETURN_IF_ERROR(CudaStatus(cudaGetDeviceCount(&count), "cudaGetDeviceCount"));
    for (int d = 0; d < count; ++d) {
      int can = d == device_ ? 1 : 0;
      if (d != device_ && cudaDeviceCanAccessPeer(&can, d, device_) != cudaSuccess) can = 0;
      if (can) access_devices_.push_back(d);
    }
    return absl::OkStatus();
  }

 private:
  bool vmm() const { return kind() == HandleKind::kCudaVmmFd; }

  drivers::CuMemAllocationProp AllocationProp() const {
    drivers::CuMemAllocationProp prop{};
    prop.type = drivers::kCuMemAllocationTypePinned;
    prop.location.type = drivers::kCuMemLocationTypeDevice;
    prop.location.id = device_;
    prop.requestedHandleTypes = drivers::kCuMemHandleTypePosixFileDescriptor;
    // Lets the RDMA path register the same memory (dmabuf) later.
    prop.allocFlags.gpuDirectRDMACapable = gdr_vmm_ ? 1 : 0;
    return prop;
  }

  // Reserves address space and maps `handle` read-write for `devices`.
  absl::StatusOr<void*> MapHandle(drivers::CuMemHandle handle, size_t bytes,
                                  const std::vector<int>& devices, absl::string_view who) {
    drivers::CuDevicePtr va = 0;
    MC_RETURN_IF_ERROR(CuStatus(*drv_, drv_->memAddressReserve(&va, bytes, granularity_, 0, 0),
                                absl::StrCat(who, ": cuMemAddressReserve(", bytes, ")")));
    absl::Status s =
        CuStatus(*drv_, drv_->memMap(va, bytes, 0, handle, 0), absl::StrCat(who, ": cuMemMap"));
    if (s.ok()) {
      std::vector<drivers::CuMemAccessDesc> access(devices.size());
      for (size_t i = 0; i < devices.size(); ++i) {
        access[i].location.type = drivers::kCuMemLocationTypeDevice;
        access[i].location.id = devices[i];
        access[i].flags = drivers::kCuMemAccessFlagsProtReadWrite;
      }
      s = CuStatus(*drv_, drv_->memSetAccess(va, bytes, access.data(), access.size()),
                   absl::StrCat(who, ": cuMemSetAccess for GPU ", device_,
                                " (can this GPU reach the buffer's over NVLink/PCIe P2P?)"));
      if (!s.ok()) drv_->memUnmap(va, bytes);
    }
    if (!s.ok()) {
      drv_->memAddressFree(va, bytes);
      return s;
    }
    return reinterpret_cast<void*>(static_cast<uintptr_t>(va));
  }

  void UnmapHandle(void* base, size_t bytes) {
    const auto va = static_cast<drivers::CuDevicePtr>(reinterpret_cast<uintptr_t>(base));
    drv_->memUnmap(va, bytes);
    drv_->memAddressFree(va, bytes);
  }

  // ---- core hooks ------------------------------------------------------
  std::shared_ptr<void> EnterPlatform() override { return SwitchDevice(device_); }

  size_t Granularity() const override { return granularity_; }

  absl::Status AllocateMemory(size_t map_bytes, Buffer* b) override {
    if (vmm()) {
      drivers::CuMemAllocationProp prop = AllocationProp();
      drivers::CuMemHandle handle = 0;
      MC_RETURN_IF_ERROR(
          CuStatus(*drv_, drv_->memCreate(&handle, map_bytes, &prop, 0),
                   absl::StrCat("allocateBuffer: cuMemCreate(", map_bytes, " bytes)")));
      absl::StatusOr<void*> base = MapHandle(handle, map_bytes, access_devices_, "allocateBuffer");
      if (!base.ok()) {
        drv_->memRelease(handle);
        return base.status();
      }
      b->base = *base;
      b->alloc_handle = handle;
    } else {
      MC_RETURN_IF_ERROR(
          CudaStatus(cudaMalloc(&b->base, map_bytes),
                     absl::StrCat("allocateBuffer: cudaMalloc(", map_bytes, " bytes)")));
    }
    absl::Status s = CudaStatus(cudaMemset(b->base, 0, map_bytes), "allocateBuffer: cudaMemset");
    if (!s.ok()) ReleaseMemory(*b);
    return s;
  }

  void ReleaseMemory(Buffer& b) override {
    if (vmm()) {
      UnmapHandle(b.base, b.map_bytes);
      drv_->memRelease(b.alloc_handle);
    } else {
      cudaFree(b.base);
    }
  }

  absl::Status WriteLocalWord(void* addr, uint64_t value) override {
    return CudaStatus(cudaMemcpy(addr, &value, sizeof(value), cudaMemcpyHostToDevice),
                      "cudaMemcpy");
  }

  absl::Status ExportMemory(Buffer& b, std::vector<UniqueFd>* fds, std::string* payload) override {
    if (vmm()) {
      int fd = -1;
      MC_RETURN_IF_ERROR(
          CuStatus(*drv_,
                   drv_->memExportToShareableHandle(
                       &fd, b.alloc_handle, drivers::kCuMemHandleTypePosixFileDescriptor, 0),
                   "export: cuMemExportToShareableHandle(POSIX fd)"));
      fds->emplace_back(fd);
      return absl::OkStatus();
    }
    cudaIpcMemHandle_t ipc{};
    MC_RETURN_IF_ERROR(
        CudaStatus(cudaIpcGetMemHandle(&ipc, b.base), "export: cudaIpcGetMemHandle"));
    payload->assign(reinterpret_cast<const char*>(&ipc), sizeof(ipc));
    return absl::OkStatus();
  }

  absl::StatusOr<void*> MapMemory(int r, const BufferHandle& h,
                                  std::vector<UniqueFd> fds) override {
    if (vmm()) {
      drivers::CuMemHandle handle = 0;
      MC_RETURN_IF_ERROR(
          CuStatus(*drv_,
                   drv_->memImportFromShareableHandle(
                       &handle, reinterpret_cast<void*>(static_cast<uintptr_t>(fds[0].get())),
                       drivers::kCuMemHandleTypePosixFileDescriptor),
                   "cuMemImportFromShareableHandle"));
      // The mapping holds its own reference; ours goes now.
      absl::StatusOr<void*> base =
          MapHandle(handle, h.map_bytes, {device_}, absl::StrCat("rank ", r));
      drv_->memRelease(handle);
      return base;
    }
    if (h.payload.size() != sizeof(cudaIpcMemHandle_t)) {
      return absl::InvalidArgumentError(absl::StrCat("legacy IPC payload of ", h.payload.size(),
                                                     " bytes, expected ",
                                                     sizeof(cudaIpcMemHandle_t)));
    }
    cudaIpcMemHandle_t ipc{};
    std::memcpy(&ipc, h.payload.data(), sizeof(ipc));
    void* base = nullptr;
    MC_RETURN_IF_ERROR(CudaStatus(
        cudaIpcOpenMemHandle(&base, ipc, cudaIpcMemLazyEnablePeerAccess),
        "cudaIpcOpenMemHandle (a process cannot open its own handle; peers must be other "
        "processes)"));
    return base;
  }

  void UnmapMemory(const PeerMapping& p) override {
    if (vmm()) {
      UnmapHandle(p.base, p.map_bytes);
    } else {
      cudaIpcCloseMemHandle(p.base);
    }
  }

  absl::Status Probe(std::vector<ProbeTarget>& targets,
                     std::vector<ProbeResult>* results) override {
    std::vector<internal::VerifyTarget> v(targets.size());
    for (size_t i = 0; i < targets.size(); ++i) {
      v[i].id_word = targets[i].id_word;
      v[i].probe_slot = targets[i].probe_slot;
      v[i].expected_id = targets[i].expected_id;
      v[i].probe_value = targets[i].probe_value;
    }
    internal::VerifyTarget* d = nullptr;
    const size_t bytes = sizeof(internal::VerifyTarget) * v.size();
    MC_RETURN_IF_ERROR(CudaStatus(cudaMalloc(reinterpret_cast<void**>(&d), bytes), "cudaMalloc"));
    std::unique_ptr<void, void (*)(void*)> free_d(d, [](void* p) { cudaFree(p); });
    MC_RETURN_IF_ERROR(
        CudaStatus(cudaMemcpy(d, v.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy"));
    MC_RETURN_IF_ERROR(CudaStatus(
        static_cast<cudaError_t>(internal::RunVerifyKernel(d, static_cast<int>(v.size()))),
        "probe kernel"));
    MC_RETURN_IF_ERROR(
        CudaStatus(cudaMemcpy(v.data(), d, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy back"));
    for (const internal::VerifyTarget& t : v) {
      ProbeResult r;
      r.id_ok = t.result != internal::kVerifyIdMismatch;
      r.probe_ok = t.result == internal::kVerifyOk;
      r.observed_id = t.observed_id;
      r.observed_probe = t.observed_probe;
      results->push_back(r);
    }
    return absl::OkStatus();
  }

  int32_t* TableAvailable() override { return d_available_; }
  void** TablePeerPtrs() override { return d_peer_ptrs_; }

  absl::Status PublishTables() override {
    MC_RETURN_IF_ERROR(CudaStatus(cudaMemcpy(d_available_, hostAvailable().data(),
                                             sizeof(int32_t) * numRanks(), cudaMemcpyHostToDevice),
                                  "cudaMemcpy(available table)"));
    return CudaStatus(cudaMemcpy(d_peer_ptrs_, hostPeerPtrs(), sizeof(void*) * numRanks(),
                                 cudaMemcpyHostToDevice),
                      "cudaMemcpy(peer pointer table)");
  }

  const std::shared_ptr<CudaDriver> drv_;
  const int device_;
  const bool gdr_vmm_;
  size_t granularity_ = 64;
  std::vector<int> access_devices_;
  int32_t* d_available_ = nullptr;
  void** d_peer_ptrs_ = nullptr;
};

// Picks the handle kind for `requested` on `device` (see CudaHandleKind).
absl::StatusOr<HandleKind> ChooseKind(CudaDriver& drv, int device, CudaHandleKind requested,
                                      bool have_exchange, bool* gdr_vmm) {
  drivers::CuDevice cu = 0;
  MC_RETURN_IF_ERROR(CuStatus(drv, drv.deviceGet(&cu, device), "cuDeviceGet"));
  int vmm = 0, posix_fd = 0, gdr = 0;
  drv.deviceGetAttribute(&vmm, drivers::kCuDeviceAttrVirtualMemoryManagementSupported, cu);
  drv.deviceGetAttribute(&posix_fd, drivers::kCuDeviceAttrHandleTypePosixFileDescriptorSupported,
                         cu);
  drv.deviceGetAttribute(&gdr, drivers::kCuDeviceAttrGpuDirectRdmaWithCudaVmmSupported, cu);
  *gdr_vmm = gdr != 0;
  const bool vmm_ok = vmm != 0 && posix_fd != 0;
  switch (requested) {
    case CudaHandleKind::kVmmPosixFd:
      if (!vmm_ok) {
        return absl::FailedPreconditionError(absl::StrCat(
            "createCudaP2pTransport(kVmmPosixFd): GPU ", device,
            " lacks VMM or POSIX-fd handles (VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED=", vmm,
            ", HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED=", posix_fd,
            "); use kLegacyIpc or kAuto"));
      }
      return HandleKind::kCudaVmmFd;
    case CudaHandleKind::kLegacyIpc: return HandleKind::kCudaIpc;
    case CudaHandleKind::kAuto: break;
  }
  if (vmm_ok && have_exchange) return HandleKind::kCudaVmmFd;
  MC_LOG(kInfo, "CUDA P2P transport on GPU ", device, ": using legacy cudaIpc handles (",
         have_exchange ? "the GPU lacks VMM POSIX-fd handles" : "no HandleExchange given", ")");
  return HandleKind::kCudaIpc;
}

}  // namespace

absl::StatusOr<std::unique_ptr<P2pTransport>> createCudaP2pTransport(
    int num_ranks, std::shared_ptr<HandleExchange> exchange, CudaHandleKind kind) {
  if (num_ranks < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("createCudaP2pTransport: num_ranks ", num_ranks, " (must be >= 1)"));
  }
  int device = -1;
  MC_RETURN_IF_ERROR(CudaStatus(cudaGetDevice(&device),
                                "createCudaP2pTransport: cudaGetDevice (is a GPU visible?)"));
  // Creates the primary context the driver-API calls work in.
  MC_RETURN_IF_ERROR(CudaStatus(cudaFree(nullptr), "createCudaP2pTransport: CUDA init"));
  MC_ASSIGN_OR_RETURN(std::shared_ptr<CudaDriver> drv, drivers::LoadCudaDriver());
  bool gdr_vmm = false;
  MC_ASSIGN_OR_RETURN(HandleKind chosen,
                      ChooseKind(*drv, device, kind, exchange != nullptr, &gdr_vmm));
  auto t = std::make_unique<CudaP2pTransport>(num_ranks, std::move(exchange), std::move(drv),
                                              device, chosen, gdr_vmm);
  MC_RETURN_IF_ERROR(t->Init());
  return std::unique_ptr<P2pTransport>(std::move(t));
}

}  // namespace device
}  // namespace mooncake
