#include "mooncake/drivers/cuda_driver.h"

#include <dirent.h>
#include <dlfcn.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cuda_entry_points.h"
#include "mooncake/common/status.h"

namespace mooncake::drivers {

bool CudaDriver::imexChannelPresent() const {
  DIR* d = ::opendir("/dev/nvidia-caps-imex-channels");
  if (d == nullptr) return false;
  bool found = false;
  while (dirent* e = ::readdir(d)) {
    if (absl::StartsWith(e->d_name, "channel")) found = true;
  }
  ::closedir(d);
  return found;
}

absl::Status CudaDriver::CachedFabricProbe(int device, const std::function<absl::Status()>& probe) {
  std::lock_guard<std::mutex> lock(probe_mu_);
  if (auto it = fabric_probes_.find(device); it != fabric_probes_.end()) return it->second;
  absl::Status s = probe();
  // Kept: a yes, or a no the node gives (not permitted, not supported, no
  // IMEX channel: FailedPrecondition). A transient failure (out of memory,
  // a context switch that failed) is asked again next time.
  if (s.ok() || absl::IsFailedPrecondition(s)) fabric_probes_.emplace(device, s);
  return s;
}

void CudaDriver::ForgetFabricProbes() {
  std::lock_guard<std::mutex> lock(probe_mu_);
  fabric_probes_.clear();
}

namespace {

using internal::GetProcAddressFn;

struct EntryPoints {
#define MC_SLOT(slot, proc, ident, symbol, legacy, required, params) \
  CuResult(*slot) params = nullptr;
  MC_CUDA_DRIVER_ENTRY_POINTS(MC_SLOT)
#undef MC_SLOT
};

class RealCudaDriver final : public CudaDriver {
 public:
  RealCudaDriver(EntryPoints fn, std::string source) : fn_(fn), source_(std::move(source)) {}

  CuResult init(unsigned flags) override { return fn_.init(flags); }
  CuResult driverGetVersion(int* version) override { return fn_.driverGetVersion(version); }
  CuResult deviceGetCount(int* count) override { return fn_.deviceGetCount(count); }
  CuResult deviceGet(CuDevice* device, int ordinal) override {
    return fn_.deviceGet(device, ordinal);
  }
  CuResult deviceGetName(char* name, int len, CuDevice dev) override {
    return fn_.deviceGetName(name, len, dev);
  }
  CuResult deviceGetUuid(CuUuid* uuid, CuDevice dev) override {
    return fn_.deviceGetUuid(uuid, dev);
  }
  CuResult deviceGetPCIBusId(char* bus_id, int len, CuDevice dev) override {
    return fn_.deviceGetPCIBusId(bus_id, len, dev);
  }
  CuResult deviceTotalMem(size_t* bytes, CuDevice dev) override {
    return fn_.deviceTotalMem(bytes, dev);
  }
  CuResult deviceGetAttribute(int* value, int attrib, CuDevice dev) override {
    return fn_.deviceGetAttribute(value, attrib, dev);
  }
  CuResult deviceGetP2PAttribute(int* value, int attrib, CuDevice src, CuDevice dst) override {
    return fn_.deviceGetP2PAttribute(value, attrib, src, dst);
  }
  CuResult memGetAllocationGranularity(size_t* granularity, const CuMemAllocationProp* prop,
                                       int option) override {
    return fn_.memGetAllocationGranularity(granularity, prop, option);
  }
  CuResult memCreate(CuMemHandle* handle, size_t size, const CuMemAllocationProp* prop,
                     unsigned long long flags) override {
    return fn_.memCreate(handle, size, prop, flags);
  }
  CuResult memAddressReserve(CuDevicePtr* ptr, size_t size, size_t alignment, CuDevicePtr addr,
                             unsigned long long flags) override {
    return fn_.memAddressReserve(ptr, size, alignment, addr, flags);
  }
  CuResult memMap(CuDevicePtr ptr, size_t size, size_t offset, CuMemHandle handle,
                  unsigned long long flags) override {
    return fn_.memMap(ptr, size, offset, handle, flags);
  }
  CuResult memSetAccess(CuDevicePtr ptr, size_t size, const CuMemAccessDesc* desc,
                        size_t count) override {
    return fn_.memSetAccess(ptr, size, desc, count);
  }
  CuResult memUnmap(CuDevicePtr ptr, size_t size) override { return fn_.memUnmap(ptr, size); }
  CuResult memAddressFree(CuDevicePtr ptr, size_t size) override {
    return fn_.memAddressFree(ptr, size);
  }
  CuResult memRelease(CuMemHandle handle) override { return fn_.memRelease(handle); }
  CuResult memExportToShareableHandle(void* shareable, CuMemHandle handle, int handle_type,
                                      unsigned long long flags) override {
    return fn_.memExportToShareableHandle(shareable, handle, handle_type, flags);
  }
  CuResult memImportFromShareableHandle(CuMemHandle* handle, void* os_handle,
                                        int handle_type) override {
    return fn_.memImportFromShareableHandle(handle, os_handle, handle_type);
  }

  CuResult ctxGetCurrent(CuContext* ctx) override { return fn_.ctxGetCurrent(ctx); }
  CuResult ctxSetCurrent(CuContext ctx) override { return fn_.ctxSetCurrent(ctx); }
  CuResult ctxGetDevice(CuDevice* device) override { return fn_.ctxGetDevice(device); }
  CuResult ctxSynchronize() override { return fn_.ctxSynchronize(); }
  CuResult devicePrimaryCtxRetain(CuContext* ctx, CuDevice dev) override {
    return fn_.devicePrimaryCtxRetain(ctx, dev);
  }
  CuResult devicePrimaryCtxRelease(CuDevice dev) override {
    return fn_.devicePrimaryCtxRelease(dev);
  }
  CuResult memAlloc(CuDevicePtr* ptr, size_t bytes) override { return fn_.memAlloc(ptr, bytes); }
  CuResult memFree(CuDevicePtr ptr) override { return fn_.memFree(ptr); }
  CuResult memcpyHtoD(CuDevicePtr dst, const void* src, size_t bytes) override {
    return fn_.memcpyHtoD(dst, src, bytes);
  }
  CuResult memcpyDtoH(void* dst, CuDevicePtr src, size_t bytes) override {
    return fn_.memcpyDtoH(dst, src, bytes);
  }
  CuResult memsetD8(CuDevicePtr dst, unsigned char value, size_t count) override {
    return fn_.memsetD8(dst, value, count);
  }
  CuResult streamCreate(CuStream* stream, unsigned flags) override {
    return fn_.streamCreate == nullptr ? kCudaErrorNotSupported : fn_.streamCreate(stream, flags);
  }
  CuResult streamDestroy(CuStream stream) override {
    return fn_.streamDestroy == nullptr ? kCudaErrorNotSupported : fn_.streamDestroy(stream);
  }
  CuResult streamCreateWithPriority(CuStream* stream, unsigned flags, int priority) override {
    return fn_.streamCreateWithPriority == nullptr
               ? kCudaErrorNotSupported
               : fn_.streamCreateWithPriority(stream, flags, priority);
  }
  CuResult ctxGetStreamPriorityRange(int* least, int* greatest) override {
    return fn_.ctxGetStreamPriorityRange == nullptr
               ? kCudaErrorNotSupported
               : fn_.ctxGetStreamPriorityRange(least, greatest);
  }
  CuResult streamQuery(CuStream stream) override {
    return fn_.streamQuery == nullptr ? kCudaErrorNotSupported : fn_.streamQuery(stream);
  }
  CuResult memcpyHtoDAsync(CuDevicePtr dst, const void* src, size_t bytes,
                           CuStream stream) override {
    return fn_.memcpyHtoDAsync == nullptr ? kCudaErrorNotSupported
                                          : fn_.memcpyHtoDAsync(dst, src, bytes, stream);
  }
  CuResult memcpyDtoHAsync(void* dst, CuDevicePtr src, size_t bytes, CuStream stream) override {
    return fn_.memcpyDtoHAsync == nullptr ? kCudaErrorNotSupported
                                          : fn_.memcpyDtoHAsync(dst, src, bytes, stream);
  }
  CuResult memsetD8Async(CuDevicePtr dst, unsigned char value, size_t count,
                         CuStream stream) override {
    return fn_.memsetD8Async == nullptr ? kCudaErrorNotSupported
                                        : fn_.memsetD8Async(dst, value, count, stream);
  }
  CuResult memcpyAsync(CuDevicePtr dst, CuDevicePtr src, size_t bytes, CuStream stream) override {
    return fn_.memcpyAsync == nullptr ? kCudaErrorNotSupported
                                      : fn_.memcpyAsync(dst, src, bytes, stream);
  }
  CuResult memcpy(CuDevicePtr dst, CuDevicePtr src, size_t bytes) override {
    return fn_.memcpy(dst, src, bytes);
  }
  CuResult memcpyDtoD(CuDevicePtr dst, CuDevicePtr src, size_t bytes) override {
    return fn_.memcpyDtoD(dst, src, bytes);
  }
  CuResult memHostRegister(void* p, size_t bytes, unsigned flags) override {
    return fn_.memHostRegister(p, bytes, flags);
  }
  CuResult memHostUnregister(void* p) override { return fn_.memHostUnregister(p); }
  CuResult memHostGetDevicePointer(CuDevicePtr* dptr, void* p, unsigned flags) override {
    return fn_.memHostGetDevicePointer(dptr, p, flags);
  }
  CuResult memGetDmabufFd(int* fd, CuDevicePtr ptr, size_t bytes) override {
    if (fn_.memGetHandleForAddressRange == nullptr) return kCudaErrorNotSupported;
    // CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD = 1; no flags.
    return fn_.memGetHandleForAddressRange(fd, ptr, bytes, 1, 0);
  }
  CuResult ipcGetMemHandle(CuIpcMemHandle* handle, CuDevicePtr ptr) override {
    return fn_.ipcGetMemHandle(handle, ptr);
  }
  CuResult ipcOpenMemHandle(CuDevicePtr* ptr, CuIpcMemHandle handle, unsigned flags) override {
    return fn_.ipcOpenMemHandle(ptr, handle, flags);
  }
  CuResult ipcCloseMemHandle(CuDevicePtr ptr) override { return fn_.ipcCloseMemHandle(ptr); }
  CuResult moduleLoadData(CuModule* module, const void* image) override {
    return fn_.moduleLoadData(module, image);
  }
  CuResult moduleGetFunction(CuFunction* function, CuModule module, const char* name) override {
    return fn_.moduleGetFunction(function, module, name);
  }
  CuResult moduleUnload(CuModule module) override { return fn_.moduleUnload(module); }
  CuResult launchKernel(CuFunction f, unsigned grid_x, unsigned grid_y, unsigned grid_z,
                        unsigned block_x, unsigned block_y, unsigned block_z,
                        unsigned shared_mem_bytes, CuStream stream, void** params,
                        void** extra) override {
    return fn_.launchKernel(f, grid_x, grid_y, grid_z, block_x, block_y, block_z, shared_mem_bytes,
                            stream, params, extra);
  }

  std::string describe(CuResult r) override {
    const char* name = nullptr;
    const char* text = nullptr;
    // The driver knows codes newer than our table; for codes it does not
    // know it fails (CUDA_ERROR_INVALID_VALUE) and the table answers.
    if (fn_.getErrorName == nullptr || fn_.getErrorName(r, &name) != kCudaSuccess) name = nullptr;
    if (fn_.getErrorString == nullptr || fn_.getErrorString(r, &text) != kCudaSuccess) {
      text = nullptr;
    }
    if (name == nullptr) return DescribeCuResult(r);
    if (text == nullptr) return absl::StrCat(name, " (CUDA error ", r, ")");
    return absl::StrCat(name, " (", text, ")");
  }

  std::string source() const override { return source_; }

 private:
  const EntryPoints fn_;
  const std::string source_;
};

// Looks `proc` up through cuGetProcAddress_v2, then `symbol`, then `legacy`
// through dlsym. Null when none resolves.
void* ResolveEntryPoint(void* handle, GetProcAddressFn get_proc, const char* proc,
                        const char* symbol, const char* legacy) {
  if (get_proc != nullptr) {
    void* fn = nullptr;
    int status = -1;
    if (get_proc(proc, &fn, internal::kRequestedCudaAbi, internal::kGetProcAddressDefault,
                 &status) == kCudaSuccess &&
        status == internal::kGetProcAddressSuccess && fn != nullptr) {
      return fn;
    }
  }
  if (void* fn = dlsym(handle, symbol); fn != nullptr) return fn;
  if (legacy != nullptr) return dlsym(handle, legacy);
  return nullptr;
}

absl::StatusOr<std::shared_ptr<CudaDriver>> Load(const std::string& library) {
  if (library.empty()) {
    return absl::InvalidArgumentError(
        "no CUDA driver library named: pass a path or soname such as libcuda.so.1");
  }
  // Deliberately never dlclose()d: see cuda_driver.h.
  void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* err = dlerror();
    std::string why = err != nullptr ? err : "unknown dlopen error";
    // glibc's wording for "searched everywhere, no such file" (ENOENT);
    // anything else means a file was found but is unusable.
    if (absl::StrContains(why, "No such file")) {
      return absl::NotFoundError(absl::StrCat(
          library,
          " not found: no NVIDIA driver on this node, or it is not on the library "
          "search path; install the NVIDIA driver (or set the CUDA library path) to use GPUs"));
    }
    return absl::FailedPreconditionError(absl::StrCat(library, " could not be loaded (", why,
                                                      "); reinstall the NVIDIA driver or point the "
                                                      "CUDA library option at a working libcuda"));
  }

  auto get_proc =
      reinterpret_cast<GetProcAddressFn>(dlsym(handle, internal::kGetProcAddressSymbol));
  EntryPoints fn;
  std::vector<std::string> missing;
#define MC_RESOLVE(slot, proc, ident, symbol, legacy, required, params) \
  fn.slot = reinterpret_cast<decltype(fn.slot)>(                        \
      ResolveEntryPoint(handle, get_proc, proc, symbol, legacy));       \
  if (fn.slot == nullptr && (required)) missing.push_back(symbol);
  MC_CUDA_DRIVER_ENTRY_POINTS(MC_RESOLVE)
#undef MC_RESOLVE
  if (!missing.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(library, " lacks ", absl::StrJoin(missing, ", "),
                     ": the NVIDIA driver is missing or older than ", internal::kMinimumDriver,
                     ", which Mooncake needs; update the driver"));
  }

  int version = 0;
  std::string source = fn.driverGetVersion(&version) == kCudaSuccess
                           ? absl::StrCat(library, " (driver ", version, ")")
                           : absl::StrCat(library, " (driver version unknown)");
  return std::shared_ptr<CudaDriver>(std::make_shared<RealCudaDriver>(fn, std::move(source)));
}

struct KnownResult {
  CuResult code;
  const char* name;
  const char* text;  // as the driver's cuGetErrorString words it
};

constexpr KnownResult kKnownResults[] = {
    {kCudaSuccess, "CUDA_SUCCESS", "no error"},
    {kCudaErrorInvalidValue, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {kCudaErrorOutOfMemory, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {kCudaErrorNotInitialized, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {kCudaErrorDeinitialized, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {kCudaErrorStubLibrary, "CUDA_ERROR_STUB_LIBRARY", "CUDA driver is a stub library"},
    {kCudaErrorCallRequiresNewerDriver, "CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER",
     "API call requires a newer CUDA driver"},
    {kCudaErrorNoDevice, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {kCudaErrorInvalidDevice, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {kCudaErrorInvalidContext, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {kCudaErrorAlreadyMapped, "CUDA_ERROR_ALREADY_MAPPED", "resource already mapped"},
    {kCudaErrorNotMapped, "CUDA_ERROR_NOT_MAPPED", "resource not mapped"},
    {kCudaErrorPeerAccessUnsupported, "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED",
     "peer access is not supported between these two devices"},
    {kCudaErrorOperatingSystem, "CUDA_ERROR_OPERATING_SYSTEM",
     "OS call failed or operation not supported on this OS"},
    {kCudaErrorInvalidHandle, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {kCudaErrorNotFound, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {kCudaErrorNotReady, "CUDA_ERROR_NOT_READY",
     "device not ready (asynchronous work still running)"},
    {kCudaErrorIllegalAddress, "CUDA_ERROR_ILLEGAL_ADDRESS",
     "an illegal memory access was encountered"},
    {kCudaErrorHostMemoryAlreadyRegistered, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
     "part or all of the requested memory range is already mapped"},
    {kCudaErrorHostMemoryNotRegistered, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
     "pointer does not correspond to a registered memory region"},
    {kCudaErrorNotPermitted, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
    {kCudaErrorNotSupported, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {kCudaErrorSystemDriverMismatch, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
     "system has unsupported display driver / cuda driver combination"},
    {kCudaErrorCompatNotSupportedOnDevice, "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
     "forward compatibility was attempted on non supported HW"},
    {kCudaErrorUnknown, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

}  // namespace

absl::StatusOr<std::shared_ptr<CudaDriver>> LoadCudaDriver(const std::string& library) {
  static std::mutex mu;
  // Leaked on purpose: drivers are used until exit, also from static
  // destructors and detached threads.
  static auto* cache = new std::map<std::string, absl::StatusOr<std::shared_ptr<CudaDriver>>>();
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache->find(library);
  if (it == cache->end()) it = cache->emplace(library, Load(library)).first;
  return it->second;
}

std::string DescribeCuResult(CuResult r) {
  for (const KnownResult& known : kKnownResults) {
    if (known.code == r) return absl::StrCat(known.name, " (", known.text, ")");
  }
  return absl::StrCat("CUDA error ", r, " (unknown error code)");
}

absl::StatusCode CuResultCode(CuResult r) {
  switch (r) {
    case kCudaSuccess: return absl::StatusCode::kOk;
    case kCudaErrorOutOfMemory: return absl::StatusCode::kResourceExhausted;
    case kCudaErrorInvalidValue:
    case kCudaErrorInvalidDevice:
    case kCudaErrorInvalidHandle: return absl::StatusCode::kInvalidArgument;
    case kCudaErrorNotSupported:
    case kCudaErrorNotPermitted:
    case kCudaErrorNoDevice:
    case kCudaErrorNotInitialized:
    case kCudaErrorStubLibrary:
    case kCudaErrorCallRequiresNewerDriver:
    case kCudaErrorSystemDriverMismatch:
    case kCudaErrorCompatNotSupportedOnDevice: return absl::StatusCode::kFailedPrecondition;
    default: return absl::StatusCode::kInternal;
  }
}

absl::StatusOr<int> CurrentDeviceOrdinal(CudaDriver& driver) {
  MC_RETURN_IF_ERROR(CuStatus(driver, driver.init(0), "cuInit"));
  CuContext ctx = nullptr;
  MC_RETURN_IF_ERROR(CuStatus(driver, driver.ctxGetCurrent(&ctx), "cuCtxGetCurrent"));
  int count = 0;
  MC_RETURN_IF_ERROR(CuStatus(driver, driver.deviceGetCount(&count), "cuDeviceGetCount"));
  if (count == 0) {
    return absl::FailedPreconditionError("no CUDA device is visible (CUDA_VISIBLE_DEVICES?)");
  }
  if (ctx == nullptr) return 0;
  CuDevice current = 0;
  MC_RETURN_IF_ERROR(CuStatus(driver, driver.ctxGetDevice(&current), "cuCtxGetDevice"));
  // Handles equal ordinals on the real driver; look the ordinal up anyway.
  for (int ordinal = 0; ordinal < count; ++ordinal) {
    CuDevice dev = 0;
    if (driver.deviceGet(&dev, ordinal) == kCudaSuccess && dev == current) return ordinal;
  }
  return absl::InternalError(
      absl::StrCat("cuCtxGetDevice returned device ", current, ", which no ordinal names"));
}

absl::Status CuStatus(CudaDriver& driver, CuResult r, std::string_view what) {
  if (r == kCudaSuccess) return absl::OkStatus();
  return absl::Status(CuResultCode(r), absl::StrCat(absl::string_view(what.data(), what.size()),
                                                    ": ", driver.describe(r)));
}

}  // namespace mooncake::drivers
