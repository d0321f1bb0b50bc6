#include "softnic/cuda_memory.h"

#include <chrono>
#include <limits>
#include <string_view>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "mooncake/common/log.h"
#include "mooncake/common/status.h"
#include "softnic/cuda_atomics_kernel.h"

#ifndef MC_SOFTNIC_HAVE_ATOMICS_KERNEL
#define MC_SOFTNIC_HAVE_ATOMICS_KERNEL 0
#endif

namespace mooncake::softnic {

namespace {

using drivers::CudaDriver;
using drivers::CuDevicePtr;
using drivers::CuStatus;

void* HostPtr(uint64_t p) { return reinterpret_cast<void*>(static_cast<uintptr_t>(p)); }

// Waits until the work queued on `stream` is done; its first error, named
// `what`. Polls rather than cuStreamSynchronize: under the context's
// default scheduling that spins, and up to one thread per GPU worker may
// wait out a time slice (2.4 ms) at once. A copy on an idle GPU is done
// within the first microseconds of yielding; a longer wait sleeps.
absl::Status WaitForStream(CudaDriver& cu, drivers::CuStream stream, std::string_view what) {
  constexpr auto kYieldFor = std::chrono::microseconds(50);
  constexpr auto kNap = std::chrono::microseconds(20);
  const auto yield_until = std::chrono::steady_clock::now() + kYieldFor;
  for (;;) {
    const drivers::CuResult r = cu.streamQuery(stream);
    if (r == drivers::kCudaSuccess) return absl::OkStatus();
    if (r != drivers::kCudaErrorNotReady) return CuStatus(cu, r, what);
    if (std::chrono::steady_clock::now() < yield_until) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(kNap);
    }
  }
}

#if MC_SOFTNIC_HAVE_ATOMICS_KERNEL
// The embedded kernels (cuda_atomics_kernel.cu), one thread per atomic. The
// old value goes through the lane's scratch word: the launch on the lane's
// stream, a synchronize (where a fault would surface) and a copy back.
class KernelAtomics final : public CudaAtomics {
 public:
  // With the home context current; `cu` outlives the object.
  static absl::StatusOr<std::unique_ptr<CudaAtomics>> Load(CudaDriver& cu) {
    std::unique_ptr<KernelAtomics> k(new KernelAtomics(cu));
    MC_RETURN_IF_ERROR(CuStatus(
        cu, cu.moduleLoadData(&k->module_, internal::kAtomicsKernelImage),
        "cuModuleLoadData(softnic atomics kernel) (mooncaked's kernels were built for another GPU "
        "architecture, or for a newer CUDA than this driver supports)"));
    MC_RETURN_IF_ERROR(CuStatus(
        cu, cu.moduleGetFunction(&k->fetch_add64_, k->module_, internal::kFetchAdd64Kernel),
        absl::StrCat("cuModuleGetFunction(", internal::kFetchAdd64Kernel, ")")));
    MC_RETURN_IF_ERROR(
        CuStatus(cu,
                 cu.moduleGetFunction(&k->masked_fetch_add32_, k->module_,
                                      internal::kMaskedFetchAdd32Kernel),
                 absl::StrCat("cuModuleGetFunction(", internal::kMaskedFetchAdd32Kernel, ")")));
    return std::unique_ptr<CudaAtomics>(std::move(k));
  }

  ~KernelAtomics() override {
    if (module_ != nullptr) cu_.moduleUnload(module_);
  }

  absl::StatusOr<uint64_t> FetchAdd64(const CudaLane& lane, CuDevicePtr word,
                                      uint64_t add) override {
    unsigned long long a = add;
    CuDevicePtr old = lane.scratch;
    void* args[] = {&word, &a, &old};
    return Run(lane, fetch_add64_, args, internal::kFetchAdd64Kernel);
  }

  absl::StatusOr<uint32_t> MaskedFetchAdd32(const CudaLane& lane, CuDevicePtr word, uint32_t add,
                                            uint32_t field_boundary) override {
    unsigned int a = add, boundary = field_boundary;
    CuDevicePtr old_word = lane.scratch;
    void* args[] = {&word, &a, &boundary, &old_word};
    absl::StatusOr<uint64_t> old =
        Run(lane, masked_fetch_add32_, args, internal::kMaskedFetchAdd32Kernel);
    if (!old.ok()) return old.status();
    return static_cast<uint32_t>(*old);
  }

 private:
  explicit KernelAtomics(CudaDriver& cu) : cu_(cu) {}

  absl::StatusOr<uint64_t> Run(const CudaLane& lane, drivers::CuFunction f, void** args,
                               const char* name) {
    MC_RETURN_IF_ERROR(
        CuStatus(cu_, cu_.launchKernel(f, 1, 1, 1, 1, 1, 1, 0, lane.stream, args, nullptr),
                 absl::StrCat("cuLaunchKernel(", name, ")")));
    uint64_t old = 0;
    MC_RETURN_IF_ERROR(CuStatus(cu_,
                                cu_.memcpyDtoHAsync(&old, lane.scratch, sizeof(old), lane.stream),
                                absl::StrCat("cuMemcpyDtoHAsync(", name, " result)")));
    MC_RETURN_IF_ERROR(WaitForStream(cu_, lane.stream, absl::StrCat("cuStreamQuery(", name, ")")));
    return old;
  }

  CudaDriver& cu_;
  drivers::CuModule module_ = nullptr;
  drivers::CuFunction fetch_add64_ = nullptr;
  drivers::CuFunction masked_fetch_add32_ = nullptr;
};
#endif  // MC_SOFTNIC_HAVE_ATOMICS_KERNEL

}  // namespace

// A lane for the span of one call, with the home context current on the
// calling thread. Holds no lock: the GPU work between construction and
// destruction runs beside other leases.
class CudaMemory::LaneLease {
 public:
  explicit LaneLease(CudaMemory& memory) : memory_(memory) {
    absl::MutexLock lock(&memory_.mu_);
    status_ = memory_.EnterLocked();
    if (!status_.ok()) return;
    auto can_take = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(memory_.mu_) {
      return !memory_.free_lanes_.empty() || memory_.lanes_.size() < static_cast<size_t>(kMaxLanes);
    };
    memory_.mu_.Await(absl::Condition(&can_take));
    if (memory_.free_lanes_.empty()) {
      absl::StatusOr<CudaLane*> made = memory_.MakeLaneLocked();
      if (!made.ok()) {
        status_ = made.status();
        return;
      }
      memory_.free_lanes_.push_back(*made);
    }
    lane_ = memory_.free_lanes_.back();
    memory_.free_lanes_.pop_back();
    cu_ = memory_.driver_.get();
    atomics_ = memory_.atomics_.get();
  }
  ~LaneLease() {
    if (lane_ == nullptr) return;
    absl::MutexLock lock(&memory_.mu_);
    memory_.free_lanes_.push_back(lane_);
  }
  LaneLease(const LaneLease&) = delete;
  LaneLease& operator=(const LaneLease&) = delete;

  // Why there is no lane (then nothing else may be used).
  const absl::Status& status() const { return status_; }
  const CudaLane& lane() const { return *lane_; }
  CudaDriver& cu() const { return *cu_; }
  CudaAtomics& atomics() const { return *atomics_; }

 private:
  CudaMemory& memory_;
  absl::Status status_;
  CudaLane* lane_ = nullptr;
  // Set once with the context, and kept until the object goes.
  CudaDriver* cu_ = nullptr;
  CudaAtomics* atomics_ = nullptr;
};

std::shared_ptr<CudaMemory> CudaMemory::Create(CudaMemoryOptions options) {
  return std::shared_ptr<CudaMemory>(new CudaMemory(std::move(options)));
}

CudaMemory::CudaMemory(CudaMemoryOptions options) : options_(std::move(options)) {}

CudaMemory::~CudaMemory() {
  // The last owner: no buffer is left, nothing runs concurrently.
  absl::MutexLock lock(&mu_);
  if (ctx_ == nullptr) return;
  CudaDriver& cu = *driver_;
  cu.ctxSetCurrent(ctx_);
  for (const std::unique_ptr<CudaLane>& lane : lanes_) {
    cu.streamDestroy(lane->stream);
    cu.memFree(lane->scratch);
  }
  atomics_.reset();  // frees its module in the home context
  cu.ctxSetCurrent(nullptr);
  cu.devicePrimaryCtxRelease(cu_device_);
}

bool CudaMemory::KernelAtomicsBuilt() { return MC_SOFTNIC_HAVE_ATOMICS_KERNEL != 0; }

int CudaMemory::device() const {
  absl::MutexLock lock(&mu_);
  return ctx_ != nullptr ? device_ : -1;
}

absl::Status CudaMemory::EnsureContextLocked(int device) {
  if (ctx_ != nullptr) return absl::OkStatus();
  if (!options_.atomics && !KernelAtomicsBuilt()) {
    return absl::FailedPreconditionError(
        "this mooncaked was built without CUDA (MOONCAKE_WITH_CUDA=OFF or no nvcc), so softnic "
        "has no kernel for atomics on GPU memory; rebuild mooncaked with CUDA to register GPU "
        "memory, or register host memory (memfd)");
  }
  if (driver_ == nullptr) {
    if (options_.driver != nullptr) {
      driver_ = options_.driver;
    } else {
      absl::StatusOr<std::shared_ptr<CudaDriver>> loaded =
          drivers::LoadCudaDriver(options_.cuda_library);
      if (!loaded.ok()) {
        return absl::Status(loaded.status().code(),
                            absl::StrCat("GPU memory needs the CUDA driver on the daemon's node: ",
                                         loaded.status().message()));
      }
      driver_ = *std::move(loaded);
    }
  }
  CudaDriver& cu = *driver_;
  MC_RETURN_IF_ERROR(CuStatus(cu, cu.init(0), "cuInit"));
  int count = 0;
  MC_RETURN_IF_ERROR(CuStatus(cu, cu.deviceGetCount(&count), "cuDeviceGetCount"));
  if (count == 0) {
    return absl::FailedPreconditionError(
        "no CUDA GPU is visible to mooncaked (check CUDA_VISIBLE_DEVICES in its environment)");
  }
  const int ordinal = device >= 0 ? device : (options_.device >= 0 ? options_.device : 0);
  if (ordinal >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("GPU ", ordinal, " is not visible to mooncaked (", count, " GPU(s) visible)"));
  }
  drivers::CuDevice dev = 0;
  MC_RETURN_IF_ERROR(
      CuStatus(cu, cu.deviceGet(&dev, ordinal), absl::StrCat("cuDeviceGet(", ordinal, ")")));
  drivers::CuContext ctx = nullptr;
  MC_RETURN_IF_ERROR(CuStatus(cu, cu.devicePrimaryCtxRetain(&ctx, dev),
                              absl::StrCat("cuDevicePrimaryCtxRetain(GPU ", ordinal, ")")));
  auto undo = [&cu, dev](absl::Status s) {
    cu.ctxSetCurrent(nullptr);
    cu.devicePrimaryCtxRelease(dev);
    return s;
  };
  if (absl::Status s = CuStatus(cu, cu.ctxSetCurrent(ctx), "cuCtxSetCurrent"); !s.ok()) {
    return undo(s);
  }
  drivers::CuMemAllocationProp prop{};
  prop.type = drivers::kCuMemAllocationTypePinned;
  prop.location.type = drivers::kCuMemLocationTypeDevice;
  prop.location.id = ordinal;
  size_t granularity = 0;
  if (absl::Status s = CuStatus(cu,
                                cu.memGetAllocationGranularity(
                                    &granularity, &prop, drivers::kCuMemAllocGranularityMinimum),
                                "cuMemGetAllocationGranularity");
      !s.ok()) {
    return undo(s);
  }
  if (granularity == 0 || (granularity & (granularity - 1)) != 0) {
    return undo(absl::InternalError(
        absl::StrCat("cuMemGetAllocationGranularity answered ", granularity, " bytes")));
  }
  absl::StatusOr<std::unique_ptr<CudaAtomics>> atomics = absl::InternalError("unset");
  if (options_.atomics) {
    atomics = options_.atomics(cu);
  } else {
#if MC_SOFTNIC_HAVE_ATOMICS_KERNEL
    atomics = KernelAtomics::Load(cu);
#endif
  }
  if (!atomics.ok()) return undo(atomics.status());
  ctx_ = ctx;
  device_ = ordinal;
  cu_device_ = dev;
  granularity_ = granularity;
  atomics_ = *std::move(atomics);
  MC_LOG(kInfo, "softnic: GPU memory is reached through the primary context of GPU ", ordinal, " (",
         cu.source(), ")",
         device < 0 && options_.device < 0 && count > 1
             ? absl::StrCat("; ", count,
                            " GPUs are visible and no GPU was named: buffers on the others are "
                            "reached by peer access")
             : "");
  return absl::OkStatus();
}

int CudaMemory::lanes() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(lanes_.size());
}

absl::StatusOr<CudaLane*> CudaMemory::MakeLaneLocked() {
  CudaDriver& cu = *driver_;
  auto lane = std::make_unique<CudaLane>();
  // Failures are the caller's to count (Failed).
  MC_RETURN_IF_ERROR(CuStatus(cu, cu.streamCreate(&lane->stream, drivers::kCuStreamNonBlocking),
                              "cuStreamCreate"));
  if (absl::Status s = CuStatus(cu, cu.memAlloc(&lane->scratch, sizeof(uint64_t)),
                                "cuMemAlloc(8 bytes for atomics' old values)");
      !s.ok()) {
    cu.streamDestroy(lane->stream);
    return s;
  }
  lanes_.push_back(std::move(lane));
  return lanes_.back().get();
}

absl::Status CudaMemory::EnterLocked() {
  if (ctx_ == nullptr) {
    return absl::FailedPreconditionError("no GPU memory was imported: there is no CUDA context");
  }
  return CuStatus(*driver_, driver_->ctxSetCurrent(ctx_), "cuCtxSetCurrent");
}

absl::StatusOr<std::shared_ptr<CudaBuffer>> CudaMemory::Import(int fd, uint64_t bytes, int device) {
  if (fd < 0) {
    return absl::InvalidArgumentError(
        "no fd: GPU memory is registered with the POSIX fd of its cuMem allocation");
  }
  if (bytes == 0) return absl::InvalidArgumentError("GPU memory region of 0 bytes");
  absl::MutexLock lock(&mu_);
  MC_RETURN_IF_ERROR(EnsureContextLocked(device));
  MC_RETURN_IF_ERROR(EnterLocked());
  CudaDriver& cu = *driver_;
  if (bytes > std::numeric_limits<uint64_t>::max() - (granularity_ - 1)) {
    return absl::InvalidArgumentError(absl::StrCat("GPU memory region of ", bytes, " bytes"));
  }
  const uint64_t mapped = (bytes + granularity_ - 1) / granularity_ * granularity_;
  drivers::CuMemHandle handle = 0;
  MC_RETURN_IF_ERROR(
      CuStatus(cu,
               cu.memImportFromShareableHandle(&handle, HostPtr(static_cast<uint64_t>(fd)),
                                               drivers::kCuMemHandleTypePosixFileDescriptor),
               "cuMemImportFromShareableHandle (is the fd a cuMem allocation exported as "
               "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR?)"));
  CuDevicePtr va = 0;
  absl::Status s = CuStatus(cu, cu.memAddressReserve(&va, mapped, granularity_, 0, 0),
                            absl::StrCat("cuMemAddressReserve(", mapped, " bytes)"));
  if (s.ok()) {
    s = CuStatus(cu, cu.memMap(va, mapped, 0, handle, 0),
                 absl::StrCat("cuMemMap(", mapped,
                              " bytes) (is the region longer than the allocation the fd names?)"));
    if (s.ok()) {
      drivers::CuMemAccessDesc access{};
      access.location.type = drivers::kCuMemLocationTypeDevice;
      access.location.id = device_;
      access.flags = drivers::kCuMemAccessFlagsProtReadWrite;
      s = CuStatus(
          cu, cu.memSetAccess(va, mapped, &access, 1),
          absl::StrCat("cuMemSetAccess(read-write for GPU ", device_,
                       ") (a buffer on another GPU needs peer access from GPU ", device_, ")"));
      if (!s.ok()) cu.memUnmap(va, mapped);
    }
    if (!s.ok()) cu.memAddressFree(va, mapped);
  }
  // The mapping holds its own reference to the allocation.
  cu.memRelease(handle);
  if (!s.ok()) return s;
  if (device >= 0 && device != device_) {
    MC_LOG(kInfo, "softnic: a buffer of GPU ", device, " is reached from GPU ", device_,
           " by peer access");
  }
  return std::shared_ptr<CudaBuffer>(new CudaBuffer(shared_from_this(), va, bytes, mapped));
}

void CudaMemory::Release(CuDevicePtr base, uint64_t mapped) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = EnterLocked(); !s.ok()) {
    MC_LOG(kWarning, "softnic: cannot unmap GPU memory at 0x", absl::Hex(base), ": ", s.message());
    return;
  }
  CudaDriver& cu = *driver_;
  absl::Status s = CuStatus(cu, cu.memUnmap(base, mapped), "cuMemUnmap");
  if (s.ok()) s = CuStatus(cu, cu.memAddressFree(base, mapped), "cuMemAddressFree");
  if (!s.ok()) {
    MC_LOG(kWarning, "softnic: releasing ", mapped, " bytes of GPU memory at 0x", absl::Hex(base),
           ": ", s.message());
  }
}

absl::Status CudaMemory::Failed(absl::Status s) {
  if (s.ok()) return s;
  absl::MutexLock lock(&mu_);
  return NoteFailure(std::move(s));
}

absl::Status CudaMemory::NoteFailure(absl::Status s) {
  if (s.ok()) return s;
  ++failures_;
  // The first, then at powers of two: a sticky context error fails every
  // later call and must not flood the log.
  if ((failures_ & (failures_ - 1)) == 0) {
    MC_LOG(kWarning, "softnic: ", s.message(), " (", failures_,
           " failed GPU copies or atomics so far; their WQEs completed with errors)");
  }
  return s;
}

absl::Status CudaMemory::Copy(const ByteSpan& dst, const ByteSpan& src) {
  if (dst.length != src.length) {
    return absl::InvalidArgumentError(
        absl::StrCat("copy of ", src.length, " bytes into ", dst.length, " bytes"));
  }
  if (dst.kind != MemoryKind::kCuda && src.kind != MemoryKind::kCuda) {
    return absl::InvalidArgumentError("copy without GPU memory on either side");
  }
  LaneLease lease(*this);
  if (!lease.status().ok()) return Failed(lease.status());
  CudaDriver& cu = lease.cu();
  const drivers::CuStream stream = lease.lane().stream;
  const size_t n = dst.length;
  absl::Status s;
  if (src.kind == MemoryKind::kHost) {
    s = CuStatus(cu, cu.memcpyHtoDAsync(dst.addr, HostPtr(src.addr), n, stream),
                 absl::StrCat("cuMemcpyHtoDAsync(", n, " bytes)"));
  } else if (dst.kind == MemoryKind::kHost) {
    s = CuStatus(cu, cu.memcpyDtoHAsync(HostPtr(dst.addr), src.addr, n, stream),
                 absl::StrCat("cuMemcpyDtoHAsync(", n, " bytes)"));
  } else {
    // Both sides on a GPU, mapped here or by another CudaMemory (another
    // context): unified addressing lets the driver find both.
    s = CuStatus(cu, cu.memcpyAsync(dst.addr, src.addr, n, stream),
                 absl::StrCat("cuMemcpyAsync(", n, " bytes)"));
  }
  // Every copy may return before its bytes land (pageable host memory is
  // staged); a CQE or a later signal must not overtake them, nor may the
  // caller reuse a host buffer the copy still reads.
  if (s.ok()) {
    s = WaitForStream(cu, stream, absl::StrCat("cuStreamQuery (after a ", n, "-byte copy)"));
  }
  return Failed(s);
}

absl::StatusOr<uint64_t> CudaMemory::FetchAdd64(CuDevicePtr word, uint64_t add) {
  if (word % 8 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("64-bit atomic at 0x", absl::Hex(word), ": not 8-byte aligned"));
  }
  LaneLease lease(*this);
  if (!lease.status().ok()) return Failed(lease.status());
  absl::StatusOr<uint64_t> old = lease.atomics().FetchAdd64(lease.lane(), word, add);
  if (!old.ok()) return Failed(old.status());
  return old;
}

absl::StatusOr<uint32_t> CudaMemory::MaskedFetchAdd32(CuDevicePtr word, uint32_t add,
                                                      uint32_t field_boundary) {
  if (word % 4 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("32-bit atomic at 0x", absl::Hex(word), ": not 4-byte aligned"));
  }
  LaneLease lease(*this);
  if (!lease.status().ok()) return Failed(lease.status());
  absl::StatusOr<uint32_t> old =
      lease.atomics().MaskedFetchAdd32(lease.lane(), word, add, field_boundary);
  if (!old.ok()) return Failed(old.status());
  return old;
}

CudaBuffer::~CudaBuffer() { memory_->Release(base_, mapped_); }

}  // namespace mooncake::softnic
