// CUDA P2pTransport: buffers in GPU memory shared with the other ranks'
// processes either as cuMem VMM allocations exported as POSIX fds (through
// the HandleExchange, i.e. the daemon) or as legacy cudaIpcMemHandles (64
// bytes inside the handle). Tables live in device memory; verification runs
// a kernel that touches every peer through its mapping.
//
// Host C++ (g++): only the verification kernel is CUDA code
// (cuda_verify_kernel.cu).

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "buffer_handle.h"
#include "cuda_verify_kernel.h"
#include "mooncake/common/log.h"
#include "mooncake/common/status.h"
#include "mooncake/common/unique_fd.h"
#include "mooncake/device/device_transport.h"

namespace mooncake {
namespace device {
namespace {

using internal::BufferHandle;
using internal::HandleKind;

// Driver-API entry points, resolved through the CUDA runtime at run time so
// this library does not link libcuda.so.1: a CUDA build still loads (and
// reports "no GPU") on a machine without the NVIDIA driver.
struct DriverApi {
#define MC_DRIVER_FN(name) decltype(&::name) name = nullptr;
  MC_DRIVER_FN(cuGetErrorName)
  MC_DRIVER_FN(cuGetErrorString)
  MC_DRIVER_FN(cuDeviceGet)
  MC_DRIVER_FN(cuDeviceGetAttribute)
  MC_DRIVER_FN(cuMemGetAllocationGranularity)
  MC_DRIVER_FN(cuMemCreate)
  MC_DRIVER_FN(cuMemAddressReserve)
  MC_DRIVER_FN(cuMemMap)
  MC_DRIVER_FN(cuMemSetAccess)
  MC_DRIVER_FN(cuMemUnmap)
  MC_DRIVER_FN(cuMemAddressFree)
  MC_DRIVER_FN(cuMemRelease)
  MC_DRIVER_FN(cuMemExportToShareableHandle)
  MC_DRIVER_FN(cuMemImportFromShareableHandle)
#undef MC_DRIVER_FN
};

DriverApi& Drv() {
  static DriverApi api;
  return api;
}

// Fills Drv() once; later calls return the first outcome.
absl::Status LoadDriverApi() {
  static const absl::Status loaded = [] {
    DriverApi& d = Drv();
    struct Entry {
      const char* name;
      void** slot;
    };
#define MC_DRIVER_ENTRY(name) Entry{#name, reinterpret_cast<void**>(&d.name)}
    const Entry entries[] = {
        MC_DRIVER_ENTRY(cuGetErrorName), MC_DRIVER_ENTRY(cuGetErrorString),
        MC_DRIVER_ENTRY(cuDeviceGet), MC_DRIVER_ENTRY(cuDeviceGetAttribute),
        MC_DRIVER_ENTRY(cuMemGetAllocationGranularity), MC_DRIVER_ENTRY(cuMemCreate),
        MC_DRIVER_ENTRY(cuMemAddressReserve), MC_DRIVER_ENTRY(cuMemMap),
        MC_DRIVER_ENTRY(cuMemSetAccess), MC_DRIVER_ENTRY(cuMemUnmap),
        MC_DRIVER_ENTRY(cuMemAddressFree), MC_DRIVER_ENTRY(cuMemRelease),
        MC_DRIVER_ENTRY(cuMemExportToShareableHandle),
        MC_DRIVER_ENTRY(cuMemImportFromShareableHandle)};
#undef MC_DRIVER_ENTRY
    for (const Entry& e : entries) {
      cudaDriverEntryPointQueryResult q{};
      // The ABI of the headers this file was compiled with.
      cudaError_t err = cudaGetDriverEntryPointByVersion(e.name, e.slot, CUDA_VERSION, cudaEnableDefault, &q);
      if (err != cudaSuccess || q != cudaDriverEntryPointSuccess || *e.slot == nullptr) {
        return absl::FailedPreconditionError(absl::StrCat(
            "CUDA driver entry point ", e.name, " (CUDA ", CUDA_VERSION, " ABI) not found: ",
            cudaGetErrorString(err), "; the NVIDIA driver is missing or older than the CUDA "
            "toolkit Mooncake was built with"));
      }
    }
    return absl::OkStatus();
  }();
  return loaded;
}

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
  return absl::Status(CodeFor(e), absl::StrCat(what, ": ", cudaGetErrorName(e), " (",
                                               cudaGetErrorString(e), ")"));
}

absl::Status CuStatus(CUresult r, absl::string_view what) {
  if (r == CUDA_SUCCESS) return absl::OkStatus();
  const char* name = "unknown";
  const char* text = "unknown error";
  if (Drv().cuGetErrorName != nullptr) Drv().cuGetErrorName(r, &name);
  if (Drv().cuGetErrorString != nullptr) Drv().cuGetErrorString(r, &text);
  absl::StatusCode code = absl::StatusCode::kInternal;
  if (r == CUDA_ERROR_OUT_OF_MEMORY) code = absl::StatusCode::kResourceExhausted;
  if (r == CUDA_ERROR_INVALID_VALUE) code = absl::StatusCode::kInvalidArgument;
  if (r == CUDA_ERROR_NOT_SUPPORTED || r == CUDA_ERROR_NOT_PERMITTED)
    code = absl::StatusCode::kFailedPrecondition;
  return absl::Status(code, absl::StrCat(what, ": ", name, " (", text, ")"));
}

// Runs the enclosed calls on the transport's device and restores the
// caller's current device afterwards.
class ScopedDevice {
 public:
  explicit ScopedDevice(int device) {
    if (cudaGetDevice(&previous_) == cudaSuccess && previous_ != device) {
      cudaSetDevice(device);
    } else {
      previous_ = -1;
    }
  }
  ~ScopedDevice() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }

 private:
  int previous_ = -1;
};

// Undo steps for a half-built allocation or mapping.
class Cleanup {
 public:
  template <class F>
  void add(F f) {
    steps_.emplace_back(std::move(f));
  }
  void dismiss() { steps_.clear(); }
  ~Cleanup() {
    for (auto it = steps_.rbegin(); it != steps_.rend(); ++it) (*it)();
  }

 private:
  std::vector<std::function<void()>> steps_;
};

class CudaP2pTransport final : public P2pTransport {
 public:
  static absl::StatusOr<std::unique_ptr<P2pTransport>> Create(
      int num_ranks, std::shared_ptr<HandleExchange> exchange, CudaHandleKind requested) {
    int device = -1;
    MC_RETURN_IF_ERROR(CudaStatus(cudaGetDevice(&device),
                                  "createCudaP2pTransport: cudaGetDevice (is a GPU visible?)"));
    // Creates the primary context the driver-API calls below work in.
    MC_RETURN_IF_ERROR(CudaStatus(cudaFree(nullptr), "createCudaP2pTransport: CUDA init"));
    MC_RETURN_IF_ERROR(LoadDriverApi());
    CUdevice cu_device = 0;
    MC_RETURN_IF_ERROR(CuStatus(Drv().cuDeviceGet(&cu_device, device), "cuDeviceGet"));

    int vmm = 0, posix_fd = 0, gdr_vmm = 0;
    Drv().cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, cu_device);
    Drv().cuDeviceGetAttribute(&posix_fd, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                         cu_device);
    Drv().cuDeviceGetAttribute(&gdr_vmm, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED,
                         cu_device);
    const bool vmm_ok = vmm != 0 && posix_fd != 0;

    HandleKind kind = HandleKind::kCudaIpc;
    switch (requested) {
      case CudaHandleKind::kVmmPosixFd:
        if (exchange == nullptr) {
          return absl::InvalidArgumentError(
              "createCudaP2pTransport(kVmmPosixFd): needs a HandleExchange to pass the fds");
        }
        if (!vmm_ok) {
          return absl::FailedPreconditionError(absl::StrCat(
              "createCudaP2pTransport(kVmmPosixFd): GPU ", device,
              " lacks VMM or POSIX-fd handles (VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED=", vmm,
              ", HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED=", posix_fd,
              "); use kLegacyIpc or kAuto"));
        }
        kind = HandleKind::kCudaVmmFd;
        break;
      case CudaHandleKind::kLegacyIpc:
        kind = HandleKind::kCudaIpc;
        break;
      case CudaHandleKind::kAuto:
        kind = vmm_ok && exchange != nullptr ? HandleKind::kCudaVmmFd : HandleKind::kCudaIpc;
        if (kind == HandleKind::kCudaIpc) {
          MC_LOG(kInfo, "CUDA P2P transport on GPU ", device, ": using legacy cudaIpc handles (",
                 exchange == nullptr ? "no HandleExchange given"
                                     : "the GPU lacks VMM POSIX-fd handles",
                 ")");
        }
        break;
    }

    std::unique_ptr<CudaP2pTransport> t(
        new CudaP2pTransport(num_ranks, std::move(exchange), device, cu_device, kind, gdr_vmm != 0));
    MC_RETURN_IF_ERROR(t->Init());
    return std::unique_ptr<P2pTransport>(std::move(t));
  }

  ~CudaP2pTransport() override {
    ScopedDevice on(device_);
    UnmapPeers();
    for (auto& b : buffers_) Release(b);
    if (d_available_ != nullptr) cudaFree(d_available_);
    if (d_peer_ptrs_ != nullptr) cudaFree(d_peer_ptrs_);
  }

  void* allocateBuffer(size_t bytes) override {
    ScopedDevice on(device_);
    auto r = Allocate(bytes);
    if (!r.ok()) {
      Fail(r.status());
      return nullptr;
    }
    return *r;
  }

  void freeBuffer(void* ptr) override {
    ScopedDevice on(device_);
    for (auto it = buffers_.begin(); it != buffers_.end(); ++it) {
      if (it->base == ptr) {
        Release(*it);
        buffers_.erase(it);
        return;
      }
    }
    Fail(absl::InvalidArgumentError(absl::StrCat(
        "freeBuffer(", internal::PtrString(ptr), "): not a buffer of this transport (pass the pointer allocateBuffer returned)")));
  }

  std::vector<int32_t> exportIpcHandle(void* ptr) override {
    ScopedDevice on(device_);
    auto r = Export(ptr);
    if (!r.ok()) {
      Fail(r.status());
      return {};
    }
    return *std::move(r);
  }

  void importPeerHandles(void* local_ptr, int rank, int num_ranks,
                         const std::vector<std::vector<int32_t>>& remote_handles,
                         const std::vector<int>& active_ranks_mask) override {
    ScopedDevice on(device_);
    absl::Status s = Import(local_ptr, rank, num_ranks, remote_handles, active_ranks_mask);
    absl::Status sync = SyncTables();
    if (!s.ok()) {
      Fail(s);
    } else if (!sync.ok()) {
      Fail(sync);
    }
  }

  int32_t* availableTablePtr() override { return d_available_; }
  void** peerPtrsTablePtr() override { return d_peer_ptrs_; }

  bool allPeersAccessible() const override {
    if (rank_ < 0) return false;
    for (int r = 0; r < num_ranks_; ++r) {
      if (active_[r] && available_[r] == 0) return false;
    }
    return true;
  }

  bool verifyPeerAccess() override {
    ScopedDevice on(device_);
    absl::Status s = Verify();
    absl::Status sync = SyncTables();
    if (!s.ok()) Fail(s);
    if (!sync.ok()) Fail(sync);
    return s.ok() && sync.ok() && allPeersAccessible();
  }

  std::string handleKind() const override { return std::string(internal::HandleKindName(kind_)); }
  absl::Status lastError() const override { return last_error_; }
  std::vector<int32_t> availableSnapshot() const override { return available_; }

  P2PContext p2pContext() override {
    if (rank_ < 0) return P2PContext{};
    return P2PContext{d_available_, d_peer_ptrs_, local_base_};
  }

 private:
  struct Buffer {
    void* base = nullptr;
    size_t map_bytes = 0;
    uint64_t id = 0;
    CUmemGenericAllocationHandle handle = 0;  // VMM only
    std::vector<UniqueFd> export_fds;         // VMM only: kept while exported
  };
  struct PeerMapping {
    void* base = nullptr;
    size_t map_bytes = 0;
    uint64_t expected_id = 0;
  };

  CudaP2pTransport(int num_ranks, std::shared_ptr<HandleExchange> exchange, int device,
                   CUdevice cu_device, HandleKind kind, bool gdr_vmm)
      : num_ranks_(num_ranks),
        exchange_(std::move(exchange)),
        device_(device),
        cu_device_(cu_device),
        kind_(kind),
        gdr_vmm_(gdr_vmm),
        available_(num_ranks, 0),
        peer_ptrs_(num_ranks, nullptr),
        peers_(num_ranks) {}

  bool vmm() const { return kind_ == HandleKind::kCudaVmmFd; }

  CUmemAllocationProp AllocationProp() const {
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = cu_device_;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    // Lets the RDMA path register the same memory (dmabuf) later.
    prop.allocFlags.gpuDirectRDMACapable = gdr_vmm_ ? 1 : 0;
    return prop;
  }

  absl::Status Init() {
    MC_RETURN_IF_ERROR(CudaStatus(cudaMalloc(reinterpret_cast<void**>(&d_available_), sizeof(int32_t) * num_ranks_),
                                  "cudaMalloc(available table)"));
    MC_RETURN_IF_ERROR(CudaStatus(cudaMalloc(reinterpret_cast<void**>(&d_peer_ptrs_), sizeof(void*) * num_ranks_),
                                  "cudaMalloc(peer pointer table)"));
    MC_RETURN_IF_ERROR(SyncTables());
    if (vmm()) {
      CUmemAllocationProp prop = AllocationProp();
      MC_RETURN_IF_ERROR(CuStatus(
          Drv().cuMemGetAllocationGranularity(&granularity_, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
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
    } else {
      granularity_ = 64;
    }
    return absl::OkStatus();
  }

  void Fail(absl::Status s) {
    MC_LOG(kWarning, "CUDA P2P transport (GPU ", device_, "): ", s.ToString());
    last_error_ = std::move(s);
  }

  absl::Status SyncTables() {
    MC_RETURN_IF_ERROR(CudaStatus(cudaMemcpy(d_available_, available_.data(),
                                             sizeof(int32_t) * num_ranks_, cudaMemcpyHostToDevice),
                                  "cudaMemcpy(available table)"));
    return CudaStatus(cudaMemcpy(d_peer_ptrs_, peer_ptrs_.data(), sizeof(void*) * num_ranks_,
                                 cudaMemcpyHostToDevice),
                      "cudaMemcpy(peer pointer table)");
  }

  absl::StatusOr<void*> Allocate(size_t bytes) {
    if (bytes == 0) {
      return absl::InvalidArgumentError("allocateBuffer(0): the buffer size must be > 0");
    }
    const size_t map_bytes = internal::RoundUp(
        internal::RoundUp(bytes, 64) + internal::TailBytes(num_ranks_), granularity_);
    Buffer b;
    b.map_bytes = map_bytes;
    b.id = internal::NewBufferId();
    Cleanup undo;
    if (vmm()) {
      CUmemAllocationProp prop = AllocationProp();
      MC_RETURN_IF_ERROR(CuStatus(Drv().cuMemCreate(&b.handle, map_bytes, &prop, 0),
                                  absl::StrCat("allocateBuffer: cuMemCreate(", map_bytes, " bytes)")));
      const CUmemGenericAllocationHandle h = b.handle;
      undo.add([h] { Drv().cuMemRelease(h); });
      CUdeviceptr va = 0;
      MC_RETURN_IF_ERROR(CuStatus(Drv().cuMemAddressReserve(&va, map_bytes, granularity_, 0, 0),
                                  "allocateBuffer: cuMemAddressReserve"));
      undo.add([va, map_bytes] { Drv().cuMemAddressFree(va, map_bytes); });
      MC_RETURN_IF_ERROR(CuStatus(Drv().cuMemMap(va, map_bytes, 0, b.handle, 0), "allocateBuffer: cuMemMap"));
      undo.add([va, map_bytes] { Drv().cuMemUnmap(va, map_bytes); });
      std::vector<CUmemAccessDesc> access;
      for (int d : access_devices_) {
        CUmemAccessDesc a{};
        a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        a.location.id = d;
        a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        access.push_back(a);
      }
      MC_RETURN_IF_ERROR(CuStatus(Drv().cuMemSetAccess(va, map_bytes, access.data(), access.size()),
                                  "allocateBuffer: cuMemSetAccess"));
      b.base = reinterpret_cast<void*>(va);
    } else {
      MC_RETURN_IF_ERROR(CudaStatus(cudaMalloc(&b.base, map_bytes),
                                    absl::StrCat("allocateBuffer: cudaMalloc(", map_bytes, " bytes)")));
      void* p = b.base;
      undo.add([p] { cudaFree(p); });
    }
    MC_RETURN_IF_ERROR(CudaStatus(cudaMemset(b.base, 0, map_bytes), "allocateBuffer: cudaMemset"));
    MC_RETURN_IF_ERROR(CudaStatus(
        cudaMemcpy(static_cast<char*>(b.base) + internal::TailOffset(map_bytes, num_ranks_), &b.id,
                   sizeof(b.id), cudaMemcpyHostToDevice),
        "allocateBuffer: writing the buffer id"));
    undo.dismiss();
    void* base = b.base;
    buffers_.push_back(std::move(b));
    return base;
  }

  void Release(Buffer& b) {
    if (vmm()) {
      const auto va = reinterpret_cast<CUdeviceptr>(b.base);
      Drv().cuMemUnmap(va, b.map_bytes);
      Drv().cuMemAddressFree(va, b.map_bytes);
      Drv().cuMemRelease(b.handle);
    } else {
      cudaFree(b.base);
    }
    b.export_fds.clear();
  }

  Buffer* FindBuffer(const void* ptr) {
    for (auto& b : buffers_) {
      if (b.base == ptr) return &b;
    }
    return nullptr;
  }

  absl::StatusOr<std::vector<int32_t>> Export(void* ptr) {
    Buffer* b = FindBuffer(ptr);
    if (b == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "exportIpcHandle(", internal::PtrString(ptr), "): not a buffer of this transport (pass the pointer allocateBuffer returned)"));
    }
    BufferHandle h;
    h.kind = kind_;
    h.map_bytes = b->map_bytes;
    h.buffer_id = b->id;
    if (vmm()) {
      int fd = -1;
      MC_RETURN_IF_ERROR(CuStatus(
          Drv().cuMemExportToShareableHandle(&fd, b->handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
          "exportIpcHandle: cuMemExportToShareableHandle(POSIX fd)"));
      UniqueFd owned(fd);
      MC_ASSIGN_OR_RETURN(h.payload, exchange_->exportFds({fd}, handleKind(), b->map_bytes));
      if (h.payload.size() > HandleExchange::kMaxExportedBytes) {
        return absl::InternalError(absl::StrCat("exportIpcHandle: the HandleExchange returned ",
                                                h.payload.size(), " bytes, more than the ",
                                                HandleExchange::kMaxExportedBytes, " a handle holds"));
      }
      b->export_fds.push_back(std::move(owned));
    } else {
      cudaIpcMemHandle_t ipc{};
      MC_RETURN_IF_ERROR(CudaStatus(cudaIpcGetMemHandle(&ipc, b->base), "exportIpcHandle: cudaIpcGetMemHandle"));
      h.payload.assign(reinterpret_cast<const char*>(&ipc), sizeof(ipc));
    }
    return internal::EncodeHandle(h);
  }

  void UnmapPeers() {
    for (int r = 0; r < num_ranks_; ++r) {
      PeerMapping& p = peers_[r];
      if (p.base != nullptr) {
        if (vmm()) {
          const auto va = reinterpret_cast<CUdeviceptr>(p.base);
          Drv().cuMemUnmap(va, p.map_bytes);
          Drv().cuMemAddressFree(va, p.map_bytes);
        } else {
          cudaIpcCloseMemHandle(p.base);
        }
      }
      p = PeerMapping{};
    }
    std::fill(available_.begin(), available_.end(), 0);
    std::fill(peer_ptrs_.begin(), peer_ptrs_.end(), nullptr);
    rank_ = -1;
    local_base_ = nullptr;
    local_map_bytes_ = 0;
    active_.clear();
  }

  absl::Status Import(void* local_ptr, int rank, int num_ranks,
                      const std::vector<std::vector<int32_t>>& handles,
                      const std::vector<int>& mask) {
    UnmapPeers();
    if (absl::Status s = internal::ValidateImportArgs(num_ranks_, rank, num_ranks, handles.size(), mask);
        !s.ok()) {
      return s;
    }
    const Buffer* local = FindBuffer(local_ptr);
    if (local == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "importPeerHandles: local_ptr ", internal::PtrString(local_ptr),
          " is not a buffer of this transport (pass the pointer allocateBuffer returned)"));
    }
    rank_ = rank;
    local_base_ = local_ptr;
    local_map_bytes_ = local->map_bytes;
    active_ = internal::ActiveRanks(mask, num_ranks, rank);
    available_[rank] = 1;
    peer_ptrs_[rank] = local_ptr;

    return internal::ImportActivePeers(rank, active_, absl::StrCat("rank ", rank, ", GPU ", device_),
                                       [&](int r) { return ImportOne(r, handles[r]); });
  }

  absl::Status ImportOne(int r, const std::vector<int32_t>& words) {
    auto decoded = internal::DecodeHandle(words);
    if (!decoded.ok()) {
      return absl::Status(decoded.status().code(),
                          absl::StrCat("rank ", r, ": ", decoded.status().message()));
    }
    const BufferHandle& h = *decoded;
    if (h.kind != kind_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", r, ": handle kind ", internal::HandleKindName(h.kind), ", this rank uses ",
          handleKind(), "; create every rank's transport with the same CudaHandleKind"));
    }
    if (h.map_bytes < local_map_bytes_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", r, ": its buffer maps ", h.map_bytes, " bytes, this rank's ", local_map_bytes_,
          "; every rank must allocateBuffer the same size (symmetric layout)"));
    }
    void* base = nullptr;
    if (vmm()) {
      auto fds = exchange_->importFds(h.payload);
      if (!fds.ok()) {
        return absl::Status(fds.status().code(),
                            absl::StrCat("rank ", r, ": importFds: ", fds.status().message()));
      }
      if (fds->size() != 1) {
        return absl::InvalidArgumentError(absl::StrCat("rank ", r, ": importFds returned ",
                                                       fds->size(), " fds, expected 1"));
      }
      CUmemGenericAllocationHandle handle = 0;
      MC_RETURN_IF_ERROR(CuStatus(
          Drv().cuMemImportFromShareableHandle(
              &handle, reinterpret_cast<void*>(static_cast<uintptr_t>((*fds)[0].get())),
              CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
          absl::StrCat("rank ", r, ": cuMemImportFromShareableHandle")));
      // The mapping holds its own reference; ours goes when this scope ends.
      Cleanup release;
      release.add([handle] { Drv().cuMemRelease(handle); });
      Cleanup undo;
      CUdeviceptr va = 0;
      const size_t bytes = h.map_bytes;
      MC_RETURN_IF_ERROR(CuStatus(Drv().cuMemAddressReserve(&va, bytes, granularity_, 0, 0),
                                  absl::StrCat("rank ", r, ": cuMemAddressReserve(", bytes, ")")));
      undo.add([va, bytes] { Drv().cuMemAddressFree(va, bytes); });
      MC_RETURN_IF_ERROR(CuStatus(Drv().cuMemMap(va, bytes, 0, handle, 0),
                                  absl::StrCat("rank ", r, ": cuMemMap")));
      undo.add([va, bytes] { Drv().cuMemUnmap(va, bytes); });
      CUmemAccessDesc a{};
      a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      a.location.id = device_;
      a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      MC_RETURN_IF_ERROR(CuStatus(
          Drv().cuMemSetAccess(va, bytes, &a, 1),
          absl::StrCat("rank ", r, ": cuMemSetAccess for GPU ", device_,
                       " (can this GPU reach the peer's over NVLink/PCIe P2P?)")));
      undo.dismiss();
      base = reinterpret_cast<void*>(va);
    } else {
      if (h.payload.size() != sizeof(cudaIpcMemHandle_t)) {
        return absl::InvalidArgumentError(absl::StrCat("rank ", r, ": legacy IPC payload of ",
                                                       h.payload.size(), " bytes, expected ",
                                                       sizeof(cudaIpcMemHandle_t)));
      }
      cudaIpcMemHandle_t ipc{};
      std::memcpy(&ipc, h.payload.data(), sizeof(ipc));
      MC_RETURN_IF_ERROR(CudaStatus(
          cudaIpcOpenMemHandle(&base, ipc, cudaIpcMemLazyEnablePeerAccess),
          absl::StrCat("rank ", r, ": cudaIpcOpenMemHandle (a process cannot open its own handle; "
                                   "peers must be other processes)")));
    }
    peers_[r] = PeerMapping{base, static_cast<size_t>(h.map_bytes), h.buffer_id};
    peer_ptrs_[r] = base;
    available_[r] = 1;
    return absl::OkStatus();
  }

  absl::Status Verify() {
    if (rank_ < 0) {
      return absl::FailedPreconditionError(
          "verifyPeerAccess: no peers imported yet; call importPeerHandles first");
    }
    std::vector<internal::VerifyTarget> targets;
    std::vector<int> target_rank;
    for (int r = 0; r < num_ranks_; ++r) {
      if (r == rank_ || !active_[r] || available_[r] == 0) continue;
      const PeerMapping& p = peers_[r];
      internal::VerifyTarget t;
      auto* base = static_cast<char*>(p.base);
      t.id_word = reinterpret_cast<const uint64_t*>(base + internal::TailOffset(p.map_bytes, num_ranks_));
      t.probe_slot =
          reinterpret_cast<uint64_t*>(base + internal::ProbeSlotOffset(p.map_bytes, num_ranks_, rank_));
      t.expected_id = p.expected_id;
      t.probe_value = internal::NewProbeValue(rank_);
      targets.push_back(t);
      target_rank.push_back(r);
    }
    if (targets.empty()) return absl::OkStatus();

    internal::VerifyTarget* d_targets = nullptr;
    const size_t bytes = sizeof(internal::VerifyTarget) * targets.size();
    MC_RETURN_IF_ERROR(CudaStatus(cudaMalloc(reinterpret_cast<void**>(&d_targets), bytes), "verifyPeerAccess: cudaMalloc"));
    Cleanup free_targets;
    free_targets.add([d_targets] { cudaFree(d_targets); });
    MC_RETURN_IF_ERROR(CudaStatus(cudaMemcpy(d_targets, targets.data(), bytes, cudaMemcpyHostToDevice),
                                  "verifyPeerAccess: cudaMemcpy"));
    const int launch = internal::RunVerifyKernel(d_targets, static_cast<int>(targets.size()));
    if (launch != cudaSuccess) {
      // A fault inside the kernel poisons the context: every checked peer
      // is suspect.
      for (int r : target_rank) available_[r] = 0;
      return CudaStatus(static_cast<cudaError_t>(launch),
                        absl::StrCat("verifyPeerAccess (rank ", rank_, ", GPU ", device_,
                                     "): probe kernel over ranks [", internal::RankList(target_rank),
                                     "]; all marked unavailable"));
    }
    MC_RETURN_IF_ERROR(CudaStatus(cudaMemcpy(targets.data(), d_targets, bytes, cudaMemcpyDeviceToHost),
                                  "verifyPeerAccess: cudaMemcpy back"));
    std::vector<int> failed;
    std::string first;
    for (size_t i = 0; i < targets.size(); ++i) {
      const auto& t = targets[i];
      if (t.result == internal::kVerifyOk) continue;
      const int r = target_rank[i];
      available_[r] = 0;
      failed.push_back(r);
      if (first.empty()) {
        first = t.result == internal::kVerifyIdMismatch
                    ? absl::StrCat("rank ", r, ": the mapping shows buffer id 0x",
                                   absl::Hex(t.observed_id), ", the handle named 0x",
                                   absl::Hex(t.expected_id))
                    : absl::StrCat("rank ", r, ": probe wrote 0x", absl::Hex(t.probe_value),
                                   " and read back 0x", absl::Hex(t.observed_probe));
      }
    }
    if (!failed.empty()) {
      return absl::DataLossError(absl::StrCat("verifyPeerAccess (rank ", rank_, ", GPU ", device_,
                                              "): ranks [", internal::RankList(failed),
                                              "] marked unavailable; first failure: ", first));
    }
    return absl::OkStatus();
  }

  const int num_ranks_;
  const std::shared_ptr<HandleExchange> exchange_;
  const int device_;
  const CUdevice cu_device_;
  const HandleKind kind_;
  const bool gdr_vmm_;
  size_t granularity_ = 64;
  std::vector<int> access_devices_;
  std::vector<Buffer> buffers_;
  int32_t* d_available_ = nullptr;
  void** d_peer_ptrs_ = nullptr;
  // Host mirrors of the device tables (the source of truth; copied over
  // after every change).
  std::vector<int32_t> available_;
  std::vector<void*> peer_ptrs_;
  std::vector<PeerMapping> peers_;
  std::vector<int> active_;
  int rank_ = -1;
  void* local_base_ = nullptr;
  size_t local_map_bytes_ = 0;
  absl::Status last_error_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<P2pTransport>> createCudaP2pTransport(
    int num_ranks, std::shared_ptr<HandleExchange> exchange, CudaHandleKind kind) {
  if (num_ranks < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("createCudaP2pTransport: num_ranks ", num_ranks, " (must be >= 1)"));
  }
  return CudaP2pTransport::Create(num_ranks, std::move(exchange), kind);
}

}  // namespace device
}  // namespace mooncake
