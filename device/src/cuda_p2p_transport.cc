// CUDA P2pTransport: buffers in GPU memory shared with the other ranks'
// processes as cuMem VMM allocations named by a fabric handle (64 bytes
// inside the handle; any process of the NVLink fabric, on this node or
// another, maps it) or by POSIX fds that travel with the join (or through
// the HandleExchange), or as legacy IPC handles (64 bytes inside the
// handle). Tables live in device memory; verification runs a
// kernel that touches every peer through its mapping. Everything else is
// the shared core (p2p_transport_core.h).
//
// Every CUDA call goes through the one CUDA driver wrapper
// (mooncake/drivers/cuda_driver.h), resolved at run time: the library links
// neither libcuda nor the CUDA runtime, so it loads on nodes without either
// and never brings a second runtime into a process (PyTorch's, the
// application's). The transport works in the primary context of the
// caller's current device, the context the CUDA runtime uses, so buffers
// and tables are the application's device memory. The verification kernel
// is an embedded fatbin launched with cuLaunchKernel (cuda_verify_kernel.h).
//
// Host C++ (g++, no CUDA headers).

#include "cuda_p2p_transport.h"

#include <cstdint>
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

using drivers::CuContext;
using drivers::CudaDriver;
using drivers::CuDevice;
using drivers::CuDevicePtr;
using drivers::CuFunction;
using drivers::CuModule;
using drivers::CuStatus;
using internal::BufferHandle;
using internal::HandleKind;

// Device pointers are 64-bit addresses in the process's unified address
// space; the core and the device tables hold them as void*.
void* HostPtr(CuDevicePtr p) { return reinterpret_cast<void*>(static_cast<uintptr_t>(p)); }
CuDevicePtr DevPtr(const void* p) {
  return static_cast<CuDevicePtr>(reinterpret_cast<uintptr_t>(p));
}

// What a fabric export needs beyond the GPU's support, for messages.
constexpr char kFabricNeeds[] =
    "fabric handles need an IMEX channel in this process's namespace "
    "(/dev/nvidia-caps-imex-channels/channel0, created by the nvidia-imex service; IMEX channels "
    "exist on multi-node NVLink systems) and, on NVSwitch systems, a running fabric manager";

// The properties of every VMM allocation of `device`: POSIX fd handles
// always (same-node peers), fabric handles too for the fabric kind.
drivers::CuMemAllocationProp VmmProp(int device, bool gdr_vmm, bool fabric) {
  drivers::CuMemAllocationProp prop{};
  prop.type = drivers::kCuMemAllocationTypePinned;
  prop.location.type = drivers::kCuMemLocationTypeDevice;
  prop.location.id = device;
  prop.requestedHandleTypes =
      drivers::kCuMemHandleTypePosixFileDescriptor | (fabric ? drivers::kCuMemHandleTypeFabric : 0);
  // Lets the RDMA path register the same memory (dmabuf) later.
  prop.allocFlags.gpuDirectRDMACapable = gdr_vmm ? 1 : 0;
  return prop;
}

class CudaP2pTransport final : public internal::P2pTransportCore {
 public:
  // Takes over one reference to the primary context `ctx` of `cu_device`
  // (released in the destructor).
  CudaP2pTransport(int num_ranks, std::shared_ptr<HandleExchange> exchange,
                   std::shared_ptr<CudaDriver> driver, int device, CuDevice cu_device,
                   CuContext ctx, HandleKind kind, bool gdr_vmm)
      : P2pTransportCore(num_ranks, std::move(exchange), kind, absl::StrCat("GPU ", device)),
        drv_(std::move(driver)),
        device_(device),
        cu_device_(cu_device),
        ctx_(ctx),
        gdr_vmm_(gdr_vmm) {}

  ~CudaP2pTransport() override {
    {
      auto on = EnterPlatform();
      ReleaseAll();
      if (d_available_ != 0) drv_->memFree(d_available_);
      if (d_peer_ptrs_ != 0) drv_->memFree(d_peer_ptrs_);
      if (module_ != nullptr) drv_->moduleUnload(module_);
    }
    drv_->devicePrimaryCtxRelease(cu_device_);
  }

  absl::Status Init() {
    auto on = EnterPlatform();
    MC_RETURN_IF_ERROR(CuStatus(
        *drv_, drv_->moduleLoadData(&module_, internal::kVerifyKernelImage),
        absl::StrCat("cuModuleLoadData(verification kernel) on GPU ", device_,
                     " (the library's kernels were built for another GPU architecture, or for a "
                     "newer CUDA than this driver supports)")));
    MC_RETURN_IF_ERROR(
        CuStatus(*drv_, drv_->moduleGetFunction(&verify_, module_, internal::kVerifyKernelName),
                 absl::StrCat("cuModuleGetFunction(", internal::kVerifyKernelName, ")")));
    MC_RETURN_IF_ERROR(CuStatus(*drv_, drv_->memAlloc(&d_available_, sizeof(int32_t) * numRanks()),
                                "cuMemAlloc(available table)"));
    MC_RETURN_IF_ERROR(CuStatus(*drv_, drv_->memAlloc(&d_peer_ptrs_, sizeof(void*) * numRanks()),
                                "cuMemAlloc(peer pointer table)"));
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
    MC_RETURN_IF_ERROR(CuStatus(*drv_, drv_->deviceGetCount(&count), "cuDeviceGetCount"));
    for (int d = 0; d < count; ++d) {
      int can = d == device_ ? 1 : 0;
      CuDevice other = 0;
      if (d != device_ &&
          (drv_->deviceGet(&other, d) != drivers::kCudaSuccess ||
           drv_->deviceGetP2PAttribute(&can, drivers::kCuP2pAttrAccessSupported, other,
                                       cu_device_) != drivers::kCudaSuccess)) {
        can = 0;
      }
      if (can) access_devices_.push_back(d);
    }
    return absl::OkStatus();
  }

 private:
  // cuMem VMM allocations (POSIX fd or fabric kind), else legacy IPC.
  bool vmm() const { return kind() == HandleKind::kCudaVmmFd || fabric(); }
  bool fabric() const { return kind() == HandleKind::kCudaFabric; }

  drivers::CuMemAllocationProp AllocationProp() const {
    return VmmProp(device_, gdr_vmm_, fabric());
  }

  // A VMM transport maps both VMM kinds: every allocation of either kind has
  // a POSIX fd, and a fabric transport also imports fabric handles. Legacy
  // IPC maps only legacy IPC.
  bool MapsKind(HandleKind peer) const override {
    if (!vmm()) return peer == HandleKind::kCudaIpc;
    return peer == HandleKind::kCudaVmmFd || peer == HandleKind::kCudaFabric;
  }
  // A fabric handle reaches across the NVLink fabric (MNNVL): another
  // node's rank is mapped, not left to the RDMA route.
  bool MapsOffNode(HandleKind peer) const override {
    return fabric() && peer == HandleKind::kCudaFabric;
  }

  // Reserves address space and maps `handle` read-write for `devices`.
  absl::StatusOr<void*> MapHandle(drivers::CuMemHandle handle, size_t bytes,
                                  const std::vector<int>& devices, absl::string_view who) {
    CuDevicePtr va = 0;
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
    return HostPtr(va);
  }

  void UnmapHandle(void* base, size_t bytes) {
    drv_->memUnmap(DevPtr(base), bytes);
    drv_->memAddressFree(DevPtr(base), bytes);
  }

  // ---- core hooks ------------------------------------------------------
  // Makes this transport's context current for the call and restores the
  // caller's afterwards (the application may be on another device).
  std::shared_ptr<void> EnterPlatform() override {
    CuContext previous = nullptr;
    if (drv_->ctxGetCurrent(&previous) != drivers::kCudaSuccess || previous == ctx_) return nullptr;
    drv_->ctxSetCurrent(ctx_);
    return std::shared_ptr<void>(nullptr,
                                 [drv = drv_, previous](void*) { drv->ctxSetCurrent(previous); });
  }

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
      CuDevicePtr ptr = 0;
      MC_RETURN_IF_ERROR(
          CuStatus(*drv_, drv_->memAlloc(&ptr, map_bytes),
                   absl::StrCat("allocateBuffer: cuMemAlloc(", map_bytes, " bytes)")));
      b->base = HostPtr(ptr);
    }
    // cuMemsetD8 may return before the fill is done: wait, so no peer can
    // see the old contents after the buffer is handed out.
    absl::Status s = CuStatus(*drv_, drv_->memsetD8(DevPtr(b->base), 0, map_bytes),
                              "allocateBuffer: cuMemsetD8");
    if (s.ok()) s = CuStatus(*drv_, drv_->ctxSynchronize(), "allocateBuffer: cuCtxSynchronize");
    if (!s.ok()) ReleaseMemory(*b);
    return s;
  }

  void ReleaseMemory(Buffer& b) override {
    if (vmm()) {
      UnmapHandle(b.base, b.map_bytes);
      drv_->memRelease(b.alloc_handle);
    } else {
      drv_->memFree(DevPtr(b.base));
    }
  }

  absl::Status WriteLocalWord(void* addr, uint64_t value) override {
    return CuStatus(*drv_, drv_->memcpyHtoD(DevPtr(addr), &value, sizeof(value)), "cuMemcpyHtoD");
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
      if (fabric()) {
        drivers::CuMemFabricHandle fh{};
        MC_RETURN_IF_ERROR(CuStatus(
            *drv_,
            drv_->memExportToShareableHandle(&fh, b.alloc_handle, drivers::kCuMemHandleTypeFabric,
                                             0),
            absl::StrCat("export: cuMemExportToShareableHandle(fabric) (", kFabricNeeds, ")")));
        payload->assign(reinterpret_cast<const char*>(fh.data), sizeof(fh.data));
      }
      return absl::OkStatus();
    }
    drivers::CuIpcMemHandle ipc{};
    MC_RETURN_IF_ERROR(
        CuStatus(*drv_, drv_->ipcGetMemHandle(&ipc, DevPtr(b.base)), "export: cuIpcGetMemHandle"));
    payload->assign(ipc.reserved, sizeof(ipc.reserved));
    return absl::OkStatus();
  }

  absl::StatusOr<void*> MapMemory(int r, const BufferHandle& h,
                                  std::vector<UniqueFd> fds) override {
    // MapsKind let through only kinds this transport maps: legacy IPC here
    // means both sides use it, a VMM kind means this side is VMM too.
    if (h.kind != HandleKind::kCudaIpc) {
      drivers::CuMemHandle handle = 0;
      if (h.kind == HandleKind::kCudaFabric && fabric()) {
        // The fd of a same-node peer, if one came, is not needed.
        drivers::CuMemFabricHandle fh{};
        if (h.payload.size() != sizeof(fh.data)) {
          return absl::InvalidArgumentError(absl::StrCat("fabric handle of ", h.payload.size(),
                                                         " bytes, expected ", sizeof(fh.data)));
        }
        std::memcpy(fh.data, h.payload.data(), sizeof(fh.data));
        MC_RETURN_IF_ERROR(CuStatus(
            *drv_,
            drv_->memImportFromShareableHandle(&handle, &fh, drivers::kCuMemHandleTypeFabric),
            absl::StrCat("cuMemImportFromShareableHandle(fabric) (", kFabricNeeds,
                         "; across nodes both must be in one NVLink domain)")));
      } else if (fds.empty()) {
        // Only a fabric handle arrives without an fd (the upstream route).
        return absl::FailedPreconditionError(absl::StrCat(
            "its buffer is shared as a fabric handle only (exportIpcHandle sends no fd beside "
            "it), and this rank uses ",
            handleKind(),
            " (its GPU lacks fabric handles, or their export failed here: see the log of "
            "createCudaP2pTransport); every rank must be able to import fabric handles, or "
            "create every rank with CudaHandleKind::kVmmPosixFd"));
      } else {
        MC_RETURN_IF_ERROR(
            CuStatus(*drv_,
                     drv_->memImportFromShareableHandle(
                         &handle, reinterpret_cast<void*>(static_cast<uintptr_t>(fds[0].get())),
                         drivers::kCuMemHandleTypePosixFileDescriptor),
                     "cuMemImportFromShareableHandle(POSIX fd)"));
      }
      // The mapping holds its own reference; ours goes now.
      absl::StatusOr<void*> base =
          MapHandle(handle, h.map_bytes, {device_}, absl::StrCat("rank ", r));
      drv_->memRelease(handle);
      return base;
    }
    // The same 64 bytes cudaIpcGetMemHandle gives: peers built against the
    // CUDA runtime interoperate.
    drivers::CuIpcMemHandle ipc{};
    if (h.payload.size() != sizeof(ipc.reserved)) {
      return absl::InvalidArgumentError(absl::StrCat("legacy IPC payload of ", h.payload.size(),
                                                     " bytes, expected ", sizeof(ipc.reserved)));
    }
    std::memcpy(ipc.reserved, h.payload.data(), sizeof(ipc.reserved));
    CuDevicePtr base = 0;
    MC_RETURN_IF_ERROR(CuStatus(
        *drv_, drv_->ipcOpenMemHandle(&base, ipc, drivers::kCuIpcMemLazyEnablePeerAccess),
        absl::StrCat("rank ", r,
                     ": cuIpcOpenMemHandle (a process cannot open its own handle; peers must be "
                     "other processes)")));
    return HostPtr(base);
  }

  void UnmapMemory(const PeerMapping& p) override {
    if (vmm()) {
      UnmapHandle(p.base, p.map_bytes);
    } else {
      drv_->ipcCloseMemHandle(DevPtr(p.base));
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
    if (v.empty()) return absl::OkStatus();
    CuDevicePtr d = 0;
    const size_t bytes = sizeof(internal::VerifyTarget) * v.size();
    MC_RETURN_IF_ERROR(CuStatus(*drv_, drv_->memAlloc(&d, bytes), "probe: cuMemAlloc"));
    std::shared_ptr<void> free_d(nullptr, [drv = drv_, d](void*) { drv->memFree(d); });
    MC_RETURN_IF_ERROR(
        CuStatus(*drv_, drv_->memcpyHtoD(d, v.data(), bytes), "probe: cuMemcpyHtoD"));
    int count = static_cast<int>(v.size());
    void* args[] = {&d, &count};
    const unsigned blocks = (static_cast<unsigned>(count) + internal::kVerifyKernelThreads - 1) /
                            internal::kVerifyKernelThreads;
    MC_RETURN_IF_ERROR(
        CuStatus(*drv_,
                 drv_->launchKernel(verify_, blocks, 1, 1, internal::kVerifyKernelThreads, 1, 1, 0,
                                    nullptr, args, nullptr),
                 "probe: cuLaunchKernel(verification kernel)"));
    // A fault while touching a peer's memory surfaces here.
    MC_RETURN_IF_ERROR(
        CuStatus(*drv_, drv_->ctxSynchronize(), "probe: cuCtxSynchronize (verification kernel)"));
    MC_RETURN_IF_ERROR(
        CuStatus(*drv_, drv_->memcpyDtoH(v.data(), d, bytes), "probe: cuMemcpyDtoH"));
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

  int32_t* TableAvailable() override { return static_cast<int32_t*>(HostPtr(d_available_)); }
  void** TablePeerPtrs() override { return static_cast<void**>(HostPtr(d_peer_ptrs_)); }

  absl::Status PublishTables() override {
    MC_RETURN_IF_ERROR(CuStatus(
        *drv_, drv_->memcpyHtoD(d_available_, hostAvailable().data(), sizeof(int32_t) * numRanks()),
        "cuMemcpyHtoD(available table)"));
    return CuStatus(*drv_,
                    drv_->memcpyHtoD(d_peer_ptrs_, hostPeerPtrs(), sizeof(void*) * numRanks()),
                    "cuMemcpyHtoD(peer pointer table)");
  }

  const std::shared_ptr<CudaDriver> drv_;
  const int device_;
  const CuDevice cu_device_;
  const CuContext ctx_;
  const bool gdr_vmm_;
  size_t granularity_ = 64;
  std::vector<int> access_devices_;
  CuModule module_ = nullptr;
  CuFunction verify_ = nullptr;
  CuDevicePtr d_available_ = 0;
  CuDevicePtr d_peer_ptrs_ = 0;
};

// Whether fabric handles work on `device`: one allocation of the minimum
// granularity with the fabric handle type, exported and released, in `ctx`.
// The device attribute only says the GPU could; without an IMEX channel
// the create or the export fails (CUDA_ERROR_NOT_PERMITTED or
// CUDA_ERROR_NOT_SUPPORTED). OK, or the failure naming the call.
absl::Status ProbeFabricNow(CudaDriver& drv, int device, CuContext ctx, bool gdr_vmm) {
  if (!drv.imexChannelPresent()) {
    // The driver call could only fail (and a sanitizer would count it).
    return absl::FailedPreconditionError(
        "no IMEX channel in this process (/dev/nvidia-caps-imex-channels has no channel<N>)");
  }
  CuContext previous = nullptr;
  const bool switched = drv.ctxGetCurrent(&previous) == drivers::kCudaSuccess && previous != ctx &&
                        drv.ctxSetCurrent(ctx) == drivers::kCudaSuccess;
  absl::Status s = [&]() -> absl::Status {
    const drivers::CuMemAllocationProp prop = VmmProp(device, gdr_vmm, /*fabric=*/true);
    size_t granularity = 0;
    MC_RETURN_IF_ERROR(CuStatus(drv,
                                drv.memGetAllocationGranularity(
                                    &granularity, &prop, drivers::kCuMemAllocGranularityMinimum),
                                "cuMemGetAllocationGranularity(fabric handle type)"));
    drivers::CuMemHandle handle = 0;
    MC_RETURN_IF_ERROR(CuStatus(drv, drv.memCreate(&handle, granularity, &prop, 0),
                                "cuMemCreate(fabric handle type)"));
    drivers::CuMemFabricHandle fh{};
    absl::Status exported = CuStatus(
        drv, drv.memExportToShareableHandle(&fh, handle, drivers::kCuMemHandleTypeFabric, 0),
        "cuMemExportToShareableHandle(fabric)");
    drv.memRelease(handle);
    return exported;
  }();
  if (switched) drv.ctxSetCurrent(previous);
  return s;
}

// The probe once per driver and device (CachedFabricProbe): the answer
// does not change while the process runs, and each probe is a driver
// allocation.
absl::Status ProbeFabric(CudaDriver& drv, int device, CuContext ctx, bool gdr_vmm) {
  return drv.CachedFabricProbe(device, [&] { return ProbeFabricNow(drv, device, ctx, gdr_vmm); });
}

// Picks the handle kind for `requested` on `device` (see CudaHandleKind).
absl::StatusOr<HandleKind> ChooseKind(CudaDriver& drv, int device, CuContext ctx,
                                      CudaHandleKind requested, bool have_exchange, bool* gdr_vmm) {
  drivers::CuDevice cu = 0;
  MC_RETURN_IF_ERROR(CuStatus(drv, drv.deviceGet(&cu, device), "cuDeviceGet"));
  int vmm = 0, posix_fd = 0, gdr = 0, fabric = 0;
  drv.deviceGetAttribute(&vmm, drivers::kCuDeviceAttrVirtualMemoryManagementSupported, cu);
  drv.deviceGetAttribute(&posix_fd, drivers::kCuDeviceAttrHandleTypePosixFileDescriptorSupported,
                         cu);
  drv.deviceGetAttribute(&gdr, drivers::kCuDeviceAttrGpuDirectRdmaWithCudaVmmSupported, cu);
  drv.deviceGetAttribute(&fabric, drivers::kCuDeviceAttrHandleTypeFabricSupported, cu);
  *gdr_vmm = gdr != 0;
  const bool vmm_ok = vmm != 0 && posix_fd != 0;
  // Fabric allocations carry a POSIX fd too (same-node peers without fabric
  // support map them by it), so they need everything VMM fds need.
  const bool fabric_ok = vmm_ok && fabric != 0;
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
    case CudaHandleKind::kFabric: {
      if (!fabric_ok) {
        return absl::FailedPreconditionError(absl::StrCat(
            "createCudaP2pTransport(kFabric): GPU ", device,
            " lacks fabric handles (HANDLE_TYPE_FABRIC_SUPPORTED=", fabric,
            ", VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED=", vmm,
            ", HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED=", posix_fd,
            "; fabric handles need a Hopper or newer GPU and driver); use kAuto or kVmmPosixFd"));
      }
      absl::Status probe = ProbeFabric(drv, device, ctx, *gdr_vmm);
      if (!probe.ok()) {
        return absl::FailedPreconditionError(
            absl::StrCat("createCudaP2pTransport(kFabric): GPU ", device,
                         " reports fabric handle support, but ", probe.message(), ": ",
                         kFabricNeeds, "; use kAuto (falls back to VMM POSIX fds) or kVmmPosixFd"));
      }
      return HandleKind::kCudaFabric;
    }
    case CudaHandleKind::kAuto:
    case CudaHandleKind::kSameNode: break;
  }
  // kAuto: fabric where it works (it needs no exchange: the handle carries
  // it), then VMM fds, then legacy IPC. One log line says why fabric was
  // not taken when the GPU claims it, and what is used instead.
  std::string fabric_note;
  if (fabric_ok && requested == CudaHandleKind::kAuto) {
    absl::Status probe = ProbeFabric(drv, device, ctx, *gdr_vmm);
    if (probe.ok()) return HandleKind::kCudaFabric;
    fabric_note =
        absl::StrCat("fabric handles unavailable (", probe.message(), "; ", kFabricNeeds, ")");
  }
  if (vmm_ok && have_exchange) {
    if (!fabric_note.empty()) {
      MC_LOG(kInfo, "CUDA P2P transport on GPU ", device, ": ", fabric_note,
             "; using VMM POSIX fds (same-node peers only)");
    }
    return HandleKind::kCudaVmmFd;
  }
  MC_LOG(kInfo, "CUDA P2P transport on GPU ", device, ": ",
         fabric_note.empty() ? "" : absl::StrCat(fabric_note, "; "), "using legacy IPC handles (",
         have_exchange ? "the GPU lacks VMM POSIX-fd handles" : "no HandleExchange given", ")");
  return HandleKind::kCudaIpc;
}

}  // namespace

namespace internal {

absl::StatusOr<std::unique_ptr<BrokeredP2pTransport>> CreateCudaP2pTransport(
    int num_ranks, std::shared_ptr<HandleExchange> exchange, CudaHandleKind kind,
    std::shared_ptr<drivers::CudaDriver> drv) {
  if (num_ranks < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("createCudaP2pTransport: num_ranks ", num_ranks, " (must be >= 1)"));
  }
  absl::StatusOr<int> device = drivers::CurrentDeviceOrdinal(*drv);
  if (!device.ok()) {
    return absl::Status(device.status().code(),
                        absl::StrCat("createCudaP2pTransport: finding the current GPU: ",
                                     device.status().message()));
  }
  CuDevice cu = 0;
  MC_RETURN_IF_ERROR(CuStatus(*drv, drv->deviceGet(&cu, *device), "cuDeviceGet"));
  // The runtime's context on this device (created here if no one has yet,
  // as the runtime's first call on it would).
  CuContext ctx = nullptr;
  MC_RETURN_IF_ERROR(CuStatus(*drv, drv->devicePrimaryCtxRetain(&ctx, cu),
                              absl::StrCat("cuDevicePrimaryCtxRetain(GPU ", *device, ")")));
  bool gdr_vmm = false;
  absl::StatusOr<HandleKind> chosen =
      ChooseKind(*drv, *device, ctx, kind, exchange != nullptr, &gdr_vmm);
  if (!chosen.ok()) {
    drv->devicePrimaryCtxRelease(cu);
    return chosen.status();
  }
  auto t = std::make_unique<CudaP2pTransport>(num_ranks, std::move(exchange), std::move(drv),
                                              *device, cu, ctx, *chosen, gdr_vmm);
  MC_RETURN_IF_ERROR(t->Init());
  return std::unique_ptr<BrokeredP2pTransport>(std::move(t));
}

}  // namespace internal

absl::StatusOr<std::unique_ptr<BrokeredP2pTransport>> createCudaP2pTransport(
    int num_ranks, std::shared_ptr<HandleExchange> exchange, CudaHandleKind kind) {
  if (num_ranks < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("createCudaP2pTransport: num_ranks ", num_ranks, " (must be >= 1)"));
  }
  MC_ASSIGN_OR_RETURN(std::shared_ptr<CudaDriver> drv, drivers::LoadCudaDriver());
  return internal::CreateCudaP2pTransport(num_ranks, std::move(exchange), kind, std::move(drv));
}

}  // namespace device
}  // namespace mooncake
