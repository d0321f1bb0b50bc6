#include "fake_cuda_driver.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <utility>

namespace mooncake::drivers {
namespace {

constexpr std::string_view kMethods[] = {"init",
                                         "driverGetVersion",
                                         "deviceGetCount",
                                         "deviceGet",
                                         "deviceGetName",
                                         "deviceGetUuid",
                                         "deviceGetPCIBusId",
                                         "deviceTotalMem",
                                         "deviceGetAttribute",
                                         "deviceGetP2PAttribute",
                                         "memGetAllocationGranularity",
                                         "memCreate",
                                         "memAddressReserve",
                                         "memMap",
                                         "memSetAccess",
                                         "memUnmap",
                                         "memAddressFree",
                                         "memRelease",
                                         "memExportToShareableHandle",
                                         "memImportFromShareableHandle",
                                         "ctxGetCurrent",
                                         "ctxSetCurrent",
                                         "ctxGetDevice",
                                         "ctxSynchronize",
                                         "devicePrimaryCtxRetain",
                                         "devicePrimaryCtxRelease",
                                         "memAlloc",
                                         "memFree",
                                         "memcpyHtoD",
                                         "memcpyDtoH",
                                         "memsetD8",
                                         "streamCreate",
                                         "streamCreateWithPriority",
                                         "ctxGetStreamPriorityRange",
                                         "streamDestroy",
                                         "streamQuery",
                                         "memcpy",
                                         "memcpyDtoD",
                                         "memHostRegister",
                                         "memHostUnregister",
                                         "memHostGetDevicePointer",
                                         "memGetDmabufFd",
                                         "ipcGetMemHandle",
                                         "ipcOpenMemHandle",
                                         "ipcCloseMemHandle",
                                         "moduleLoadData",
                                         "moduleGetFunction",
                                         "moduleUnload",
                                         "launchKernel"};

// One byte per possible GPU: the address of byte i is GPU i's primary
// context. Never read or written.
constexpr int kMaxFakeGpus = 256;
char g_context_tokens[kMaxFakeGpus];

// The calling thread's current context, as the driver keeps it.
thread_local CuContext t_current_context = nullptr;

void CheckMethod(std::string_view method) {
  if (std::find(std::begin(kMethods), std::end(kMethods), method) != std::end(kMethods)) return;
  std::fprintf(stderr, "FakeCudaDriver: \"%.*s\" is not a CudaDriver method\n",
               static_cast<int>(method.size()), method.data());
  std::abort();
}

void* AsPtr(CuDevicePtr p) { return reinterpret_cast<void*>(static_cast<uintptr_t>(p)); }

bool IsPowerOfTwo(size_t x) { return x != 0 && (x & (x - 1)) == 0; }

// The fake's fabric handle: magic, the exporter's pid and the fd number of
// its memfd, and the allocation's size; the rest zero.
constexpr char kFabricMagic[8] = {'M', 'C', 'F', 'A', 'K', 'E', 'F', 'H'};
struct FakeFabricHandle {
  char magic[8];
  int32_t pid;
  int32_t fd;
  uint64_t size;
};
static_assert(sizeof(FakeFabricHandle) <= sizeof(CuMemFabricHandle));

// Placeholders for loaded modules and functions (setModulesLoadable).
char g_module_token;
char g_function_token;

}  // namespace

struct FakeCudaDriver::Allocation {
  Allocation(int fd, size_t size, int handle_types)
      : fd(fd), size(size), handle_types(handle_types) {}
  ~Allocation() { ::close(fd); }
  Allocation(const Allocation&) = delete;
  Allocation& operator=(const Allocation&) = delete;

  const int fd;
  const size_t size;
  const int handle_types;  // requestedHandleTypes bits
};

FakeGpu FakeGpu::Hopper(int i) {
  FakeGpu gpu;
  gpu.name = "Fake GPU " + std::to_string(i);
  for (int k = 0; k < 16; ++k) gpu.uuid[k] = static_cast<unsigned char>(0xf0 - 16 * i + k);
  char bus_id[32];
  std::snprintf(bus_id, sizeof(bus_id), "0000:%02X:00.0", (0x1B + 0x21 * i) & 0xff);
  gpu.pci_bus_id = bus_id;
  gpu.total_memory_bytes = static_cast<size_t>(i + 1) * 80 * (size_t{1} << 30);
  gpu.attributes = {
      {kCuDeviceAttrMultiprocessorCount, 132 - i},
      {kCuDeviceAttrComputeCapabilityMajor, 9},
      {kCuDeviceAttrComputeCapabilityMinor, 0},
      {kCuDeviceAttrUnifiedAddressing, 1},
      {kCuDeviceAttrVirtualMemoryManagementSupported, 1},
      {kCuDeviceAttrHandleTypePosixFileDescriptorSupported, 1},
      {kCuDeviceAttrGpuDirectRdmaWithCudaVmmSupported, 1},
      {kCuDeviceAttrGpuDirectRdmaSupported, 1},
      {kCuDeviceAttrDmaBufSupported, 1},
      {kCuDeviceAttrHandleTypeFabricSupported, i == 0 ? 1 : 0},
  };
  return gpu;
}

FakeCudaDriver::FakeCudaDriver() = default;

FakeCudaDriver::~FakeCudaDriver() {
  // Until none is left: a kernel body may launch on another stream.
  for (;;) {
    std::map<CuStream, std::unique_ptr<KernelStream>> kernel_streams;
    {
      std::lock_guard<std::mutex> lock(mu_);
      kernel_streams.swap(kernel_streams_);
    }
    if (kernel_streams.empty()) break;
    for (auto& [stream, ks] : kernel_streams) JoinKernelStream(std::move(ks));
  }
  // Unmapping a reservation also removes the mappings inside it; the
  // allocations close their fds as the maps go.
  for (const auto& [base, reservation] : reservations_) ::munmap(AsPtr(base), reservation.size);
  for (CuStream s : streams_) delete reinterpret_cast<char*>(s);
}

// --- Configuration -------------------------------------------------------------

int FakeCudaDriver::addGpu(FakeGpu gpu) {
  std::lock_guard<std::mutex> lock(mu_);
  gpus_.push_back(std::move(gpu));
  return static_cast<int>(gpus_.size()) - 1;
}

FakeGpu& FakeCudaDriver::gpu(int ordinal) {
  std::lock_guard<std::mutex> lock(mu_);
  return gpus_.at(ordinal);
}

void FakeCudaDriver::setP2PAttribute(int src, int dst, int attrib, int value) {
  std::lock_guard<std::mutex> lock(mu_);
  p2p_[{src, dst, attrib}] = value;
}

void FakeCudaDriver::setDriverVersion(int version) {
  std::lock_guard<std::mutex> lock(mu_);
  driver_version_ = version;
}

void FakeCudaDriver::setInitResult(CuResult r) {
  std::lock_guard<std::mutex> lock(mu_);
  init_result_ = r;
}

void FakeCudaDriver::setGranularity(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  granularity_ = bytes;
}

void FakeCudaDriver::setImexChannel(bool present) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    imex_channel_ = present;
  }
  ForgetFabricProbes();
}

void FakeCudaDriver::setImexDeviceFiles(bool present) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    imex_device_files_ = present;
  }
  ForgetFabricProbes();
}

bool FakeCudaDriver::imexChannelPresent() const {
  std::lock_guard<std::mutex> lock(mu_);
  return imex_device_files_;
}

void FakeCudaDriver::setDmabufExport(bool supported) {
  std::lock_guard<std::mutex> lock(mu_);
  dmabuf_export_ = supported;
}

void FakeCudaDriver::setModulesLoadable(bool loadable) {
  std::lock_guard<std::mutex> lock(mu_);
  modules_loadable_ = loadable;
}

void FakeCudaDriver::registerKernel(std::string name, FakeKernel bind) {
  std::lock_guard<std::mutex> lock(mu_);
  kernels_[std::move(name)] = std::move(bind);
}

void FakeCudaDriver::pauseSubmissions(bool pause) {
  {
    std::lock_guard<std::mutex> lock(pause_mu_);
    submissions_paused_ = pause;
  }
  pause_cv_.notify_all();
}

int FakeCudaDriver::pausedSubmissions() const {
  std::lock_guard<std::mutex> lock(pause_mu_);
  return paused_submissions_;
}

int FakeCudaDriver::busyKernelStreams() const {
  std::lock_guard<std::mutex> lock(mu_);
  int n = 0;
  for (const auto& [stream, ks] : kernel_streams_) n += ks->running || !ks->queue.empty();
  return n;
}

void FakeCudaDriver::QueueKernelLocked(CuStream stream, FakeKernelBody body) {
  std::unique_ptr<KernelStream>& ks = kernel_streams_[stream];
  if (ks == nullptr) {
    ks = std::make_unique<KernelStream>();
    ks->thread = std::thread([this, k = ks.get()] { RunKernelStream(k); });
  }
  ks->queue.push_back(std::move(body));
  ks->cv.notify_all();
}

void FakeCudaDriver::RunKernelStream(KernelStream* ks) {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    ks->cv.wait(lock, [ks] { return ks->quit || !ks->queue.empty(); });
    if (ks->queue.empty()) return;  // quit, with nothing left to run
    FakeKernelBody body = std::move(ks->queue.front());
    ks->queue.pop_front();
    ks->running = true;
    lock.unlock();
    body();  // without mu_: the stand-in calls this driver
    lock.lock();
    ks->running = false;
    ks->cv.notify_all();  // copies queued behind it (waitForKernels)
  }
}

void FakeCudaDriver::waitForKernels(CuStream stream) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = kernel_streams_.find(stream);
  if (it == kernel_streams_.end()) return;
  KernelStream* ks = it->second.get();
  ++ks->waiters;  // JoinKernelStream frees ks only once none is left
  ks->cv.wait(lock, [ks] { return !ks->running && ks->queue.empty(); });
  --ks->waiters;
  ks->cv.notify_all();
}

void FakeCudaDriver::JoinKernelStream(std::unique_ptr<KernelStream> ks) {
  if (ks == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ks->quit = true;
    ks->cv.notify_all();
  }
  ks->thread.join();
  // A copy waiting for this stream's kernels (waitForKernels) leaves
  // before ks goes.
  std::unique_lock<std::mutex> lock(mu_);
  ks->cv.notify_all();
  ks->cv.wait(lock, [&ks] { return ks->waiters == 0; });
}

void FakeCudaDriver::waitForSubmissions() {
  std::unique_lock<std::mutex> lock(pause_mu_);
  if (!submissions_paused_) return;
  ++paused_submissions_;
  pause_cv_.wait(lock, [this] { return !submissions_paused_; });
  --paused_submissions_;
}

void FakeCudaDriver::failNext(std::string_view method, CuResult r, int times) {
  CheckMethod(method);
  std::lock_guard<std::mutex> lock(mu_);
  auto& queue = fail_next_[std::string(method)];
  queue.insert(queue.end(), std::max(times, 0), r);
}

void FakeCudaDriver::setResult(std::string_view method, CuResult r) {
  CheckMethod(method);
  std::lock_guard<std::mutex> lock(mu_);
  results_[std::string(method)] = r;
}

void FakeCudaDriver::clearResult(std::string_view method) {
  CheckMethod(method);
  std::lock_guard<std::mutex> lock(mu_);
  results_.erase(std::string(method));
}

int FakeCudaDriver::calls(std::string_view method) const {
  CheckMethod(method);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = calls_.find(method);
  return it == calls_.end() ? 0 : it->second;
}

size_t FakeCudaDriver::liveHandles() const {
  std::lock_guard<std::mutex> lock(mu_);
  return handles_.size();
}

size_t FakeCudaDriver::liveReservations() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reservations_.size();
}

size_t FakeCudaDriver::liveMappings() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const auto& [base, reservation] : reservations_) n += reservation.mappings.size();
  return n;
}

size_t FakeCudaDriver::liveLinearAllocations() const {
  std::lock_guard<std::mutex> lock(mu_);
  return linear_.size();
}

int FakeCudaDriver::primaryContextRefs(int ordinal) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = primary_refs_.find(ordinal);
  return it == primary_refs_.end() ? 0 : it->second;
}

size_t FakeCudaDriver::liveHostRegistrations() const {
  std::lock_guard<std::mutex> lock(mu_);
  return host_registered_.size();
}

// --- Helpers (mu_ held) ----------------------------------------------------------

CuContext FakeCudaDriver::primaryContext(int ordinal) const {
  return reinterpret_cast<CuContext>(&g_context_tokens[ordinal]);
}

int FakeCudaDriver::ordinalOfContext(CuContext ctx) const {
  const char* token = reinterpret_cast<const char*>(ctx);
  if (token < g_context_tokens || token >= g_context_tokens + kMaxFakeGpus) return -1;
  int ordinal = static_cast<int>(token - g_context_tokens);
  return ordinal < static_cast<int>(gpus_.size()) ? ordinal : -1;
}

bool FakeCudaDriver::linearRange(CuDevicePtr ptr, size_t bytes) const {
  auto it = linear_sizes_.upper_bound(ptr);
  if (it == linear_sizes_.begin()) return false;
  --it;
  return ptr + bytes <= it->first + it->second;
}

bool FakeCudaDriver::hostRegisteredRange(CuDevicePtr ptr, size_t bytes) const {
  auto it = host_registered_.upper_bound(ptr);
  if (it == host_registered_.begin()) return false;
  --it;
  return ptr + bytes <= it->first + it->second;
}

bool FakeCudaDriver::deviceVisible(CuDevicePtr ptr, size_t bytes) {
  return linearRange(ptr, bytes) || hostRegisteredRange(ptr, bytes) ||
         reservationFor(ptr, bytes) != nullptr;
}

CuResult FakeCudaDriver::enter(std::string_view method) {
  auto count = calls_.find(method);
  if (count == calls_.end()) count = calls_.emplace(std::string(method), 0).first;
  ++count->second;
  if (auto next = fail_next_.find(method); next != fail_next_.end() && !next->second.empty()) {
    CuResult r = next->second.front();
    next->second.erase(next->second.begin());
    return r;
  }
  if (auto result = results_.find(method); result != results_.end()) return result->second;
  return kCudaSuccess;
}

int FakeCudaDriver::ordinalOf(CuDevice dev) const {
  int ordinal = dev - kHandleBase;
  return ordinal >= 0 && ordinal < static_cast<int>(gpus_.size()) ? ordinal : -1;
}

CuResult FakeCudaDriver::checkDevice(CuDevice dev) const {
  if (!initialized_) return kCudaErrorNotInitialized;
  return ordinalOf(dev) < 0 ? kCudaErrorInvalidDevice : kCudaSuccess;
}

// The GPU a CUmemLocation names. The driver's CUdevice values equal the
// ordinals, so code passes either in `id`; both are accepted here.
static int LocationOrdinal(const CuMemLocation& location, int gpu_count) {
  if (location.type != kCuMemLocationTypeDevice) return -1;
  if (location.id >= 0 && location.id < gpu_count) return location.id;
  int ordinal = location.id - FakeCudaDriver::kHandleBase;
  return ordinal >= 0 && ordinal < gpu_count ? ordinal : -1;
}

CuResult FakeCudaDriver::checkProp(const CuMemAllocationProp* prop) const {
  if (!initialized_) return kCudaErrorNotInitialized;
  if (prop == nullptr || prop->type != kCuMemAllocationTypePinned ||
      prop->win32HandleMetaData != nullptr) {
    return kCudaErrorInvalidValue;
  }
  int ordinal = LocationOrdinal(prop->location, static_cast<int>(gpus_.size()));
  if (ordinal < 0) return kCudaErrorInvalidDevice;
  const std::map<int, int>& attrs = gpus_[ordinal].attributes;
  auto supported = [&](int attr) {
    auto it = attrs.find(attr);
    return it != attrs.end() && it->second != 0;
  };
  if (!supported(kCuDeviceAttrVirtualMemoryManagementSupported)) return kCudaErrorNotSupported;
  const int types = prop->requestedHandleTypes;
  if ((types & ~(kCuMemHandleTypePosixFileDescriptor | kCuMemHandleTypeFabric)) != 0) {
    return kCudaErrorInvalidValue;
  }
  if ((types & kCuMemHandleTypePosixFileDescriptor) != 0 &&
      !supported(kCuDeviceAttrHandleTypePosixFileDescriptorSupported)) {
    return kCudaErrorNotSupported;
  }
  if ((types & kCuMemHandleTypeFabric) != 0 && !supported(kCuDeviceAttrHandleTypeFabricSupported)) {
    return kCudaErrorNotSupported;
  }
  if (prop->allocFlags.gpuDirectRDMACapable != 0 &&
      !supported(kCuDeviceAttrGpuDirectRdmaWithCudaVmmSupported)) {
    return kCudaErrorNotSupported;
  }
  return kCudaSuccess;
}

FakeCudaDriver::Reservation* FakeCudaDriver::reservationFor(CuDevicePtr ptr, size_t size) {
  auto it = reservations_.upper_bound(ptr);
  if (it == reservations_.begin()) return nullptr;
  --it;
  if (ptr + size > it->first + it->second.size) return nullptr;
  return &it->second;
}

#define MC_FAKE_ENTER(method)            \
  std::lock_guard<std::mutex> lock(mu_); \
  if (CuResult injected = enter(method); injected != kCudaSuccess) return injected

// --- Device queries --------------------------------------------------------------

CuResult FakeCudaDriver::init(unsigned flags) {
  MC_FAKE_ENTER("init");
  if (flags != 0) return kCudaErrorInvalidValue;
  initialized_ = init_result_ == kCudaSuccess;
  return init_result_;
}

CuResult FakeCudaDriver::driverGetVersion(int* version) {
  MC_FAKE_ENTER("driverGetVersion");
  if (version == nullptr) return kCudaErrorInvalidValue;
  *version = driver_version_;
  return kCudaSuccess;
}

CuResult FakeCudaDriver::deviceGetCount(int* count) {
  MC_FAKE_ENTER("deviceGetCount");
  if (!initialized_) return kCudaErrorNotInitialized;
  if (count == nullptr) return kCudaErrorInvalidValue;
  *count = static_cast<int>(gpus_.size());
  return kCudaSuccess;
}

CuResult FakeCudaDriver::deviceGet(CuDevice* device, int ordinal) {
  MC_FAKE_ENTER("deviceGet");
  if (!initialized_) return kCudaErrorNotInitialized;
  if (device == nullptr) return kCudaErrorInvalidValue;
  if (ordinal < 0 || ordinal >= static_cast<int>(gpus_.size())) return kCudaErrorInvalidDevice;
  *device = kHandleBase + ordinal;
  return kCudaSuccess;
}

CuResult FakeCudaDriver::deviceGetName(char* name, int len, CuDevice dev) {
  MC_FAKE_ENTER("deviceGetName");
  if (CuResult r = checkDevice(dev); r != kCudaSuccess) return r;
  if (name == nullptr || len <= 0) return kCudaErrorInvalidValue;
  // Like the driver: truncated to len - 1 characters.
  const std::string& text = gpus_[ordinalOf(dev)].name;
  size_t n = std::min(text.size(), static_cast<size_t>(len) - 1);
  std::memcpy(name, text.data(), n);
  name[n] = '\0';
  return kCudaSuccess;
}

CuResult FakeCudaDriver::deviceGetUuid(CuUuid* uuid, CuDevice dev) {
  MC_FAKE_ENTER("deviceGetUuid");
  if (CuResult r = checkDevice(dev); r != kCudaSuccess) return r;
  if (uuid == nullptr) return kCudaErrorInvalidValue;
  std::memcpy(uuid->bytes, gpus_[ordinalOf(dev)].uuid.data(), sizeof(uuid->bytes));
  return kCudaSuccess;
}

CuResult FakeCudaDriver::deviceGetPCIBusId(char* bus_id, int len, CuDevice dev) {
  MC_FAKE_ENTER("deviceGetPCIBusId");
  if (CuResult r = checkDevice(dev); r != kCudaSuccess) return r;
  const std::string& id = gpus_[ordinalOf(dev)].pci_bus_id;
  if (bus_id == nullptr || len <= static_cast<int>(id.size())) return kCudaErrorInvalidValue;
  std::memcpy(bus_id, id.c_str(), id.size() + 1);
  return kCudaSuccess;
}

CuResult FakeCudaDriver::deviceTotalMem(size_t* bytes, CuDevice dev) {
  MC_FAKE_ENTER("deviceTotalMem");
  if (CuResult r = checkDevice(dev); r != kCudaSuccess) return r;
  if (bytes == nullptr) return kCudaErrorInvalidValue;
  *bytes = gpus_[ordinalOf(dev)].total_memory_bytes;
  return kCudaSuccess;
}

CuResult FakeCudaDriver::deviceGetAttribute(int* value, int attrib, CuDevice dev) {
  MC_FAKE_ENTER("deviceGetAttribute");
  if (CuResult r = checkDevice(dev); r != kCudaSuccess) return r;
  const std::map<int, int>& attrs = gpus_[ordinalOf(dev)].attributes;
  auto it = attrs.find(attrib);
  if (value == nullptr || it == attrs.end()) return kCudaErrorInvalidValue;
  *value = it->second;
  return kCudaSuccess;
}

CuResult FakeCudaDriver::deviceGetP2PAttribute(int* value, int attrib, CuDevice src, CuDevice dst) {
  MC_FAKE_ENTER("deviceGetP2PAttribute");
  if (CuResult r = checkDevice(src); r != kCudaSuccess) return r;
  if (CuResult r = checkDevice(dst); r != kCudaSuccess) return r;
  if (src == dst) return kCudaErrorInvalidDevice;
  // CU_DEVICE_P2P_ATTRIBUTE_* run from 1 to 5.
  if (value == nullptr || attrib < kCuP2pAttrPerformanceRank || attrib > 5) {
    return kCudaErrorInvalidValue;
  }
  auto it = p2p_.find({ordinalOf(src), ordinalOf(dst), attrib});
  *value = it == p2p_.end() ? 0 : it->second;
  return kCudaSuccess;
}

// --- Virtual memory management ----------------------------------------------------

CuResult FakeCudaDriver::memGetAllocationGranularity(size_t* granularity,
                                                     const CuMemAllocationProp* prop, int option) {
  MC_FAKE_ENTER("memGetAllocationGranularity");
  if (CuResult r = checkProp(prop); r != kCudaSuccess) return r;
  if (granularity == nullptr ||
      (option != kCuMemAllocGranularityMinimum && option != kCuMemAllocGranularityRecommended)) {
    return kCudaErrorInvalidValue;
  }
  *granularity = granularity_;
  return kCudaSuccess;
}

CuResult FakeCudaDriver::memCreate(CuMemHandle* handle, size_t size,
                                   const CuMemAllocationProp* prop, unsigned long long flags) {
  MC_FAKE_ENTER("memCreate");
  if (CuResult r = checkProp(prop); r != kCudaSuccess) return r;
  if (handle == nullptr || flags != 0 || size == 0 || size % granularity_ != 0) {
    return kCudaErrorInvalidValue;
  }
  int fd = ::memfd_create("mooncake-fake-cuda", MFD_CLOEXEC);
  if (fd < 0) return kCudaErrorOutOfMemory;
  if (::ftruncate(fd, static_cast<off_t>(size)) != 0) {
    ::close(fd);
    return kCudaErrorOutOfMemory;
  }
  *handle = next_handle_++;
  handles_[*handle] = std::make_shared<Allocation>(fd, size, prop->requestedHandleTypes);
  return kCudaSuccess;
}

CuResult FakeCudaDriver::memAddressReserve(CuDevicePtr* ptr, size_t size, size_t alignment,
                                           CuDevicePtr /*addr: a hint, ignored*/,
                                           unsigned long long flags) {
  MC_FAKE_ENTER("memAddressReserve");
  if (!initialized_) return kCudaErrorNotInitialized;
  if (alignment == 0) alignment = granularity_;
  if (ptr == nullptr || flags != 0 || size == 0 || size % granularity_ != 0 ||
      !IsPowerOfTwo(alignment)) {
    return kCudaErrorInvalidValue;
  }
  // Over-reserve, then trim to an aligned range of `size` bytes.
  const size_t span = size + alignment;
  void* raw = ::mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) return kCudaErrorOutOfMemory;
  const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t base = (start + alignment - 1) & ~(uintptr_t{alignment} - 1);
  if (base > start) ::munmap(raw, base - start);
  if (start + span > base + size) {
    ::munmap(reinterpret_cast<void*>(base + size), start + span - (base + size));
  }
  *ptr = base;
  reservations_[base] = Reservation{size, {}};
  return kCudaSuccess;
}

CuResult FakeCudaDriver::memMap(CuDevicePtr ptr, size_t size, size_t offset, CuMemHandle handle,
                                unsigned long long flags) {
  MC_FAKE_ENTER("memMap");
  if (!initialized_) return kCudaErrorNotInitialized;
  auto alloc = handles_.find(handle);
  if (alloc == handles_.end() || flags != 0 || size == 0 || size % granularity_ != 0 ||
      offset % granularity_ != 0 || offset + size > alloc->second->size) {
    return kCudaErrorInvalidValue;
  }
  Reservation* reservation = reservationFor(ptr, size);
  if (reservation == nullptr || (ptr % granularity_) != 0) return kCudaErrorInvalidValue;
  // No overlap with a mapping already there.
  auto next = reservation->mappings.lower_bound(ptr);
  if (next != reservation->mappings.end() && next->first < ptr + size)
    return kCudaErrorInvalidValue;
  if (next != reservation->mappings.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second.size > ptr) return kCudaErrorInvalidValue;
  }
  // Inaccessible until memSetAccess, as on a GPU.
  void* mapped = ::mmap(AsPtr(ptr), size, PROT_NONE, MAP_SHARED | MAP_FIXED, alloc->second->fd,
                        static_cast<off_t>(offset));
  if (mapped == MAP_FAILED) return kCudaErrorOutOfMemory;
  reservation->mappings[ptr] = Mapping{size, alloc->second};
  return kCudaSuccess;
}

CuResult FakeCudaDriver::memSetAccess(CuDevicePtr ptr, size_t size, const CuMemAccessDesc* desc,
                                      size_t count) {
  MC_FAKE_ENTER("memSetAccess");
  if (!initialized_) return kCudaErrorNotInitialized;
  if (desc == nullptr || count == 0 || size == 0) return kCudaErrorInvalidValue;
  int prot = PROT_NONE;
  for (size_t i = 0; i < count; ++i) {
    if (LocationOrdinal(desc[i].location, static_cast<int>(gpus_.size())) < 0) {
      return kCudaErrorInvalidDevice;
    }
    // The host stands in for every GPU: the widest access granted wins.
    switch (desc[i].flags) {
      case kCuMemAccessFlagsProtNone: break;
      case kCuMemAccessFlagsProtRead: prot |= PROT_READ; break;
      case kCuMemAccessFlagsProtReadWrite: prot |= PROT_READ | PROT_WRITE; break;
      default: return kCudaErrorInvalidValue;
    }
  }
  // The whole range must be mapped, without gaps.
  Reservation* reservation = reservationFor(ptr, size);
  if (reservation == nullptr) return kCudaErrorInvalidValue;
  CuDevicePtr cursor = ptr;
  auto it = reservation->mappings.upper_bound(ptr);
  if (it == reservation->mappings.begin()) return kCudaErrorInvalidValue;
  --it;
  for (; cursor < ptr + size; ++it) {
    if (it == reservation->mappings.end() || it->first > cursor ||
        it->first + it->second.size <= cursor) {
      return kCudaErrorInvalidValue;
    }
    cursor = it->first + it->second.size;
  }
  if (::mprotect(AsPtr(ptr), size, prot) != 0) return kCudaErrorInvalidValue;
  return kCudaSuccess;
}

CuResult FakeCudaDriver::memUnmap(CuDevicePtr ptr, size_t size) {
  MC_FAKE_ENTER("memUnmap");
  if (!initialized_) return kCudaErrorNotInitialized;
  Reservation* reservation = reservationFor(ptr, size);
  if (reservation == nullptr || size == 0) return kCudaErrorInvalidValue;
  // Whole mappings only, back to back from ptr to ptr + size.
  auto first = reservation->mappings.find(ptr);
  if (first == reservation->mappings.end()) return kCudaErrorInvalidValue;
  auto last = first;
  CuDevicePtr cursor = ptr;
  while (cursor < ptr + size) {
    if (last == reservation->mappings.end() || last->first != cursor) return kCudaErrorInvalidValue;
    cursor += last->second.size;
    ++last;
  }
  if (cursor != ptr + size) return kCudaErrorInvalidValue;
  // Put an inaccessible anonymous range back, so the reservation stays.
  void* back = ::mmap(AsPtr(ptr), size, PROT_NONE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
  if (back == MAP_FAILED) return kCudaErrorUnknown;
  reservation->mappings.erase(first, last);
  return kCudaSuccess;
}

CuResult FakeCudaDriver::memAddressFree(CuDevicePtr ptr, size_t size) {
  MC_FAKE_ENTER("memAddressFree");
  if (!initialized_) return kCudaErrorNotInitialized;
  auto it = reservations_.find(ptr);
  // The exact range reserved, with everything in it unmapped first.
  if (it == reservations_.end() || it->second.size != size || !it->second.mappings.empty()) {
    return kCudaErrorInvalidValue;
  }
  ::munmap(AsPtr(ptr), size);
  reservations_.erase(it);
  return kCudaSuccess;
}

CuResult FakeCudaDriver::memRelease(CuMemHandle handle) {
  MC_FAKE_ENTER("memRelease");
  if (!initialized_) return kCudaErrorNotInitialized;
  // Mappings keep the memory alive until they are unmapped.
  return handles_.erase(handle) == 1 ? kCudaSuccess : kCudaErrorInvalidValue;
}

CuResult FakeCudaDriver::memExportToShareableHandle(void* shareable, CuMemHandle handle,
                                                    int handle_type, unsigned long long flags) {
  MC_FAKE_ENTER("memExportToShareableHandle");
  if (!initialized_) return kCudaErrorNotInitialized;
  auto alloc = handles_.find(handle);
  if (shareable == nullptr || flags != 0 || alloc == handles_.end() ||
      (alloc->second->handle_types & handle_type) == 0) {
    return kCudaErrorInvalidValue;
  }
  if (handle_type == kCuMemHandleTypeFabric) {
    if (!imex_channel_) return kCudaErrorNotSupported;
    FakeFabricHandle f{};
    std::memcpy(f.magic, kFabricMagic, sizeof(f.magic));
    f.pid = static_cast<int32_t>(::getpid());
    f.fd = alloc->second->fd;
    f.size = alloc->second->size;
    auto* out = static_cast<CuMemFabricHandle*>(shareable);
    std::memset(out->data, 0, sizeof(out->data));
    std::memcpy(out->data, &f, sizeof(f));
    return kCudaSuccess;
  }
  if (handle_type != kCuMemHandleTypePosixFileDescriptor) return kCudaErrorNotSupported;
  int fd = ::fcntl(alloc->second->fd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return kCudaErrorOperatingSystem;
  *static_cast<int*>(shareable) = fd;
  return kCudaSuccess;
}

CuResult FakeCudaDriver::memImportFromShareableHandle(CuMemHandle* handle, void* os_handle,
                                                      int handle_type) {
  MC_FAKE_ENTER("memImportFromShareableHandle");
  if (!initialized_) return kCudaErrorNotInitialized;
  if (handle == nullptr) return kCudaErrorInvalidValue;
  if (handle_type == kCuMemHandleTypeFabric) {
    if (!imex_channel_) return kCudaErrorNotSupported;
    if (os_handle == nullptr) return kCudaErrorInvalidValue;
    FakeFabricHandle f{};
    std::memcpy(&f, static_cast<const CuMemFabricHandle*>(os_handle)->data, sizeof(f));
    if (std::memcmp(f.magic, kFabricMagic, sizeof(f.magic)) != 0) return kCudaErrorInvalidValue;
    const std::string path = "/proc/" + std::to_string(f.pid) + "/fd/" + std::to_string(f.fd);
    int own = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (own < 0) return kCudaErrorInvalidValue;  // the exporter or its memory is gone
    struct stat st {};
    if (::fstat(own, &st) != 0 || static_cast<uint64_t>(st.st_size) != f.size) {
      ::close(own);
      return kCudaErrorInvalidValue;
    }
    *handle = next_handle_++;
    handles_[*handle] =
        std::make_shared<Allocation>(own, static_cast<size_t>(f.size), kCuMemHandleTypeFabric);
    return kCudaSuccess;
  }
  if (handle_type != kCuMemHandleTypePosixFileDescriptor) return kCudaErrorNotSupported;
  const int fd = static_cast<int>(reinterpret_cast<uintptr_t>(os_handle));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0) {
    return kCudaErrorInvalidValue;
  }
  // The caller keeps (and closes) its fd, as with the driver.
  int own = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (own < 0) return kCudaErrorOperatingSystem;
  *handle = next_handle_++;
  handles_[*handle] = std::make_shared<Allocation>(own, static_cast<size_t>(st.st_size),
                                                   kCuMemHandleTypePosixFileDescriptor);
  return kCudaSuccess;
}

// --- Contexts ------------------------------------------------------------------------

CuResult FakeCudaDriver::ctxGetCurrent(CuContext* ctx) {
  MC_FAKE_ENTER("ctxGetCurrent");
  if (!initialized_) return kCudaErrorNotInitialized;
  if (ctx == nullptr) return kCudaErrorInvalidValue;
  *ctx = t_current_context;
  return kCudaSuccess;
}

CuResult FakeCudaDriver::ctxSetCurrent(CuContext ctx) {
  MC_FAKE_ENTER("ctxSetCurrent");
  if (!initialized_) return kCudaErrorNotInitialized;
  if (ctx != nullptr && ordinalOfContext(ctx) < 0) return kCudaErrorInvalidContext;
  t_current_context = ctx;
  return kCudaSuccess;
}

CuResult FakeCudaDriver::ctxGetDevice(CuDevice* device) {
  MC_FAKE_ENTER("ctxGetDevice");
  if (!initialized_) return kCudaErrorNotInitialized;
  if (device == nullptr) return kCudaErrorInvalidValue;
  int ordinal = ordinalOfContext(t_current_context);
  if (ordinal < 0) return kCudaErrorInvalidContext;
  *device = kHandleBase + ordinal;
  return kCudaSuccess;
}

CuResult FakeCudaDriver::ctxSynchronize() {
  MC_FAKE_ENTER("ctxSynchronize");
  if (!initialized_) return kCudaErrorNotInitialized;
  return ordinalOfContext(t_current_context) < 0 ? kCudaErrorInvalidContext : kCudaSuccess;
}

CuResult FakeCudaDriver::devicePrimaryCtxRetain(CuContext* ctx, CuDevice dev) {
  MC_FAKE_ENTER("devicePrimaryCtxRetain");
  if (CuResult r = checkDevice(dev); r != kCudaSuccess) return r;
  if (ctx == nullptr || ordinalOf(dev) >= kMaxFakeGpus) return kCudaErrorInvalidValue;
  ++primary_refs_[ordinalOf(dev)];
  *ctx = primaryContext(ordinalOf(dev));
  return kCudaSuccess;
}

CuResult FakeCudaDriver::devicePrimaryCtxRelease(CuDevice dev) {
  MC_FAKE_ENTER("devicePrimaryCtxRelease");
  if (CuResult r = checkDevice(dev); r != kCudaSuccess) return r;
  auto it = primary_refs_.find(ordinalOf(dev));
  if (it == primary_refs_.end() || it->second == 0) return kCudaErrorInvalidContext;
  if (--it->second == 0) primary_refs_.erase(it);
  return kCudaSuccess;
}

// --- Linear memory ----------------------------------------------------------------------

CuResult FakeCudaDriver::memAlloc(CuDevicePtr* ptr, size_t bytes) {
  MC_FAKE_ENTER("memAlloc");
  if (!initialized_) return kCudaErrorNotInitialized;
  if (ordinalOfContext(t_current_context) < 0) return kCudaErrorInvalidContext;
  if (ptr == nullptr || bytes == 0) return kCudaErrorInvalidValue;
  auto memory = std::make_unique<unsigned char[]>(bytes);
  *ptr = reinterpret_cast<uintptr_t>(memory.get());
  linear_sizes_[*ptr] = bytes;
  linear_[*ptr] = std::move(memory);
  return kCudaSuccess;
}

CuResult FakeCudaDriver::memFree(CuDevicePtr ptr) {
  MC_FAKE_ENTER("memFree");
  if (!initialized_) return kCudaErrorNotInitialized;
  if (linear_.erase(ptr) != 1) return kCudaErrorInvalidValue;
  linear_sizes_.erase(ptr);
  return kCudaSuccess;
}

CuResult FakeCudaDriver::memcpyHtoD(CuDevicePtr dst, const void* src, size_t bytes) {
  MC_FAKE_ENTER("memcpyHtoD");
  if (!initialized_) return kCudaErrorNotInitialized;
  if (src == nullptr || !deviceVisible(dst, bytes)) return kCudaErrorInvalidValue;
  std::memmove(AsPtr(dst), src, bytes);
  return kCudaSuccess;
}

CuResult FakeCudaDriver::memcpyDtoH(void* dst, CuDevicePtr src, size_t bytes) {
  MC_FAKE_ENTER("memcpyDtoH");
  if (!initialized_) return kCudaErrorNotInitialized;
  if (dst == nullptr || !deviceVisible(src, bytes)) return kCudaErrorInvalidValue;
  std::memmove(dst, AsPtr(src), bytes);
  return kCudaSuccess;
}

CuResult FakeCudaDriver::memsetD8(CuDevicePtr dst, unsigned char value, size_t count) {
  MC_FAKE_ENTER("memsetD8");
  if (!initialized_) return kCudaErrorNotInitialized;
  if (!deviceVisible(dst, count)) return kCudaErrorInvalidValue;
  std::memset(AsPtr(dst), value, count);
  return kCudaSuccess;
}

CuResult FakeCudaDriver::memcpy(CuDevicePtr dst, CuDevicePtr src, size_t bytes) {
  MC_FAKE_ENTER("memcpy");
  if (!initialized_) return kCudaErrorNotInitialized;
  if (!deviceVisible(dst, bytes) || !deviceVisible(src, bytes)) return kCudaErrorInvalidValue;
  std::memmove(AsPtr(dst), AsPtr(src), bytes);
  return kCudaSuccess;
}

CuResult FakeCudaDriver::memcpyDtoD(CuDevicePtr dst, CuDevicePtr src, size_t bytes) {
  MC_FAKE_ENTER("memcpyDtoD");
  if (!initialized_) return kCudaErrorNotInitialized;
  if (!deviceVisible(dst, bytes) || !deviceVisible(src, bytes)) return kCudaErrorInvalidValue;
  std::memmove(AsPtr(dst), AsPtr(src), bytes);
  return kCudaSuccess;
}

// --- Registered host memory ------------------------------------------------------------

CuResult FakeCudaDriver::memHostRegister(void* p, size_t bytes, unsigned flags) {
  MC_FAKE_ENTER("memHostRegister");
  if (!initialized_) return kCudaErrorNotInitialized;
  // Registration belongs to a context, as with the driver.
  if (ordinalOfContext(t_current_context) < 0) return kCudaErrorInvalidContext;
  constexpr unsigned kKnownFlags = kCuMemHostRegisterPortable | kCuMemHostRegisterDeviceMap |
                                   kCuMemHostRegisterIoMemory | 0x08 /* READ_ONLY */;
  if (p == nullptr || bytes == 0 || (flags & ~kKnownFlags) != 0) return kCudaErrorInvalidValue;
  const auto start = reinterpret_cast<uintptr_t>(p);
  if (start + bytes < start) return kCudaErrorInvalidValue;
  // No overlap with a range registered already.
  auto next = host_registered_.lower_bound(start);
  if (next != host_registered_.end() && next->first < start + bytes) {
    return kCudaErrorHostMemoryAlreadyRegistered;
  }
  if (next != host_registered_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second > start) return kCudaErrorHostMemoryAlreadyRegistered;
  }
  host_registered_[start] = bytes;
  return kCudaSuccess;
}

CuResult FakeCudaDriver::memHostUnregister(void* p) {
  MC_FAKE_ENTER("memHostUnregister");
  if (!initialized_) return kCudaErrorNotInitialized;
  // The start of a registered range only, as with the driver.
  return host_registered_.erase(reinterpret_cast<uintptr_t>(p)) == 1
             ? kCudaSuccess
             : kCudaErrorHostMemoryNotRegistered;
}

CuResult FakeCudaDriver::memHostGetDevicePointer(CuDevicePtr* dptr, void* p, unsigned flags) {
  MC_FAKE_ENTER("memHostGetDevicePointer");
  if (!initialized_) return kCudaErrorNotInitialized;
  if (dptr == nullptr || flags != 0) return kCudaErrorInvalidValue;
  const auto addr = reinterpret_cast<uintptr_t>(p);
  if (!hostRegisteredRange(addr, 1)) return kCudaErrorInvalidValue;
  *dptr = addr;
  return kCudaSuccess;
}

CuResult FakeCudaDriver::memGetDmabufFd(int* fd, CuDevicePtr ptr, size_t bytes) {
  MC_FAKE_ENTER("memGetDmabufFd");
  if (!initialized_) return kCudaErrorNotInitialized;
  if (fd == nullptr) return kCudaErrorInvalidValue;
  if (!dmabuf_export_) return kCudaErrorNotSupported;
  Reservation* reservation = reservationFor(ptr, bytes);
  if (reservation == nullptr || bytes == 0) return kCudaErrorInvalidValue;
  auto it = reservation->mappings.upper_bound(ptr);
  if (it == reservation->mappings.begin()) return kCudaErrorInvalidValue;
  --it;
  if (ptr + bytes > it->first + it->second.size) return kCudaErrorInvalidValue;
  const int dup = ::fcntl(it->second.allocation->fd, F_DUPFD_CLOEXEC, 0);
  if (dup < 0) return kCudaErrorOperatingSystem;
  *fd = dup;
  return kCudaSuccess;
}

// --- Streams: tokens; work queued on one is done when the call returns ----------------------

CuResult FakeCudaDriver::streamCreate(CuStream* stream, unsigned flags) {
  MC_FAKE_ENTER("streamCreate");
  if (!initialized_) return kCudaErrorNotInitialized;
  if (stream == nullptr || (flags & ~kCuStreamNonBlocking) != 0) return kCudaErrorInvalidValue;
  if (t_current_context == nullptr) return kCudaErrorInvalidContext;
  // A unique address never dereferenced.
  auto* token = reinterpret_cast<CuStream>(new char);
  streams_.insert(token);
  *stream = token;
  return kCudaSuccess;
}

CuResult FakeCudaDriver::streamCreateWithPriority(CuStream* stream, unsigned flags, int priority) {
  CuResult r = streamCreate(stream, flags);
  MC_FAKE_ENTER("streamCreateWithPriority");
  if (r != kCudaSuccess) return r;
  // As the driver: a priority outside the range is clamped to it.
  stream_priorities_[*stream] = std::clamp(priority, kGreatestStreamPriority, kLeastStreamPriority);
  return kCudaSuccess;
}

CuResult FakeCudaDriver::ctxGetStreamPriorityRange(int* least, int* greatest) {
  MC_FAKE_ENTER("ctxGetStreamPriorityRange");
  if (!initialized_) return kCudaErrorNotInitialized;
  if (t_current_context == nullptr) return kCudaErrorInvalidContext;
  if (least != nullptr) *least = kLeastStreamPriority;
  if (greatest != nullptr) *greatest = kGreatestStreamPriority;
  return kCudaSuccess;
}

int FakeCudaDriver::streamPriority(CuStream stream) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = stream_priorities_.find(stream);
  return it == stream_priorities_.end() ? 0 : it->second;
}

int FakeCudaDriver::streamsAtPriority(int priority) const {
  std::lock_guard<std::mutex> lock(mu_);
  int n = 0;
  for (const auto& [stream, p] : stream_priorities_) n += p == priority ? 1 : 0;
  return n;
}

CuResult FakeCudaDriver::streamDestroy(CuStream stream) {
  std::unique_ptr<KernelStream> ks;
  {
    MC_FAKE_ENTER("streamDestroy");
    if (!initialized_) return kCudaErrorNotInitialized;
    if (streams_.erase(stream) != 1) return kCudaErrorInvalidHandle;
    stream_priorities_.erase(stream);
    delete reinterpret_cast<char*>(stream);
    if (auto it = kernel_streams_.find(stream); it != kernel_streams_.end()) {
      ks = std::move(it->second);
      kernel_streams_.erase(it);
    }
  }
  // As cuStreamDestroy: the work queued on it still runs.
  JoinKernelStream(std::move(ks));
  return kCudaSuccess;
}

CuResult FakeCudaDriver::streamQuery(CuStream stream) {
  MC_FAKE_ENTER("streamQuery");
  if (!initialized_) return kCudaErrorNotInitialized;
  if (hold_streams_) return kCudaErrorNotReady;  // mu_ is held (MC_FAKE_ENTER)
  if (auto it = kernel_streams_.find(stream);
      it != kernel_streams_.end() && (it->second->running || !it->second->queue.empty())) {
    return kCudaErrorNotReady;
  }
  return stream == nullptr || streams_.count(stream) ? kCudaSuccess : kCudaErrorInvalidHandle;
}

std::vector<uint8_t> FakeCudaDriver::lastHeldCopy() const {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = held_.rbegin(); it != held_.rend(); ++it) {
    if (!it->run) return it->bytes;  // a host-to-device copy
  }
  return {};
}

void FakeCudaDriver::holdStreams(bool hold) {
  if (hold) {
    std::lock_guard<std::mutex> lock(mu_);
    hold_streams_ = true;
    return;
  }
  // The hold ends only once every held copy has landed and every held
  // kernel is queued on its stream, so a stream that answers ready has its
  // work done.
  for (;;) {
    std::vector<HeldWork> land;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (held_.empty()) {
        hold_streams_ = false;
        return;
      }
      land.swap(held_);
    }
    // In submission order: kernels go to their streams' threads, and a
    // copy lands once its stream's kernels before it have run.
    for (HeldWork& w : land) {
      if (w.kernel) {
        std::lock_guard<std::mutex> lock(mu_);
        QueueKernelLocked(w.stream, std::move(w.run));
        continue;
      }
      waitForKernels(w.stream);
      if (w.run) {
        w.run();  // a device-to-host copy
      } else {
        memcpyHtoD(w.dst, w.bytes.data(), w.bytes.size());
      }
    }
  }
}

int FakeCudaDriver::liveStreams() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(streams_.size());
}

CuResult FakeCudaDriver::memcpyHtoDAsync(CuDevicePtr dst, const void* src, size_t bytes,
                                         CuStream stream) {
  waitForSubmissions();
  waitForKernels(stream);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stream != nullptr && !streams_.count(stream)) return kCudaErrorInvalidHandle;
    if (hold_streams_ && src != nullptr) {
      const auto* p = static_cast<const uint8_t*>(src);
      held_.push_back(HeldWork{dst, std::vector<uint8_t>(p, p + bytes), nullptr, stream, false});
      return kCudaSuccess;
    }
  }
  return memcpyHtoD(dst, src, bytes);
}

CuResult FakeCudaDriver::memcpyDtoHAsync(void* dst, CuDevicePtr src, size_t bytes,
                                         CuStream stream) {
  waitForSubmissions();
  waitForKernels(stream);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stream != nullptr && !streams_.count(stream)) return kCudaErrorInvalidHandle;
    if (hold_streams_ && dst != nullptr) {
      held_.push_back(
          HeldWork{0, {}, [this, dst, src, bytes] { memcpyDtoH(dst, src, bytes); }, stream, false});
      return kCudaSuccess;
    }
  }
  return memcpyDtoH(dst, src, bytes);
}

CuResult FakeCudaDriver::memsetD8Async(CuDevicePtr dst, unsigned char value, size_t count,
                                       CuStream stream) {
  waitForSubmissions();
  waitForKernels(stream);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stream != nullptr && !streams_.count(stream)) return kCudaErrorInvalidHandle;
  }
  return memsetD8(dst, value, count);
}

CuResult FakeCudaDriver::memcpyAsync(CuDevicePtr dst, CuDevicePtr src, size_t bytes,
                                     CuStream stream) {
  waitForSubmissions();
  waitForKernels(stream);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stream != nullptr && !streams_.count(stream)) return kCudaErrorInvalidHandle;
  }
  return memcpy(dst, src, bytes);
}

// --- Legacy IPC, modules, launches: no device code on the host ----------------------------

CuResult FakeCudaDriver::ipcGetMemHandle(CuIpcMemHandle*, CuDevicePtr) {
  MC_FAKE_ENTER("ipcGetMemHandle");
  return initialized_ ? kCudaErrorNotSupported : kCudaErrorNotInitialized;
}

CuResult FakeCudaDriver::ipcOpenMemHandle(CuDevicePtr*, CuIpcMemHandle, unsigned) {
  MC_FAKE_ENTER("ipcOpenMemHandle");
  return initialized_ ? kCudaErrorNotSupported : kCudaErrorNotInitialized;
}

CuResult FakeCudaDriver::ipcCloseMemHandle(CuDevicePtr) {
  MC_FAKE_ENTER("ipcCloseMemHandle");
  return initialized_ ? kCudaErrorNotSupported : kCudaErrorNotInitialized;
}

CuResult FakeCudaDriver::moduleLoadData(CuModule* module, const void* image) {
  MC_FAKE_ENTER("moduleLoadData");
  if (!initialized_) return kCudaErrorNotInitialized;
  if (!modules_loadable_) return kCudaErrorNotSupported;
  if (module == nullptr || image == nullptr) return kCudaErrorInvalidValue;
  *module = reinterpret_cast<CuModule>(&g_module_token);
  return kCudaSuccess;
}

CuResult FakeCudaDriver::moduleGetFunction(CuFunction* function, CuModule module,
                                           const char* name) {
  MC_FAKE_ENTER("moduleGetFunction");
  if (!initialized_) return kCudaErrorNotInitialized;
  if (!modules_loadable_) return kCudaErrorNotSupported;
  if (function == nullptr || name == nullptr ||
      module != reinterpret_cast<CuModule>(&g_module_token)) {
    return kCudaErrorInvalidValue;
  }
  // A registered stand-in is named by its map node (stable); any other
  // name by the placeholder, which launchKernel refuses.
  auto it = kernels_.find(std::string_view(name));
  *function = it != kernels_.end() ? reinterpret_cast<CuFunction>(&*it)
                                   : reinterpret_cast<CuFunction>(&g_function_token);
  return kCudaSuccess;
}

CuResult FakeCudaDriver::moduleUnload(CuModule module) {
  MC_FAKE_ENTER("moduleUnload");
  if (!initialized_) return kCudaErrorNotInitialized;
  if (!modules_loadable_) return kCudaErrorNotSupported;
  return module == reinterpret_cast<CuModule>(&g_module_token) ? kCudaSuccess
                                                               : kCudaErrorInvalidValue;
}

CuResult FakeCudaDriver::launchKernel(CuFunction f, unsigned grid_x, unsigned, unsigned,
                                      unsigned block_x, unsigned, unsigned, unsigned,
                                      CuStream stream, void** params, void**) {
  waitForSubmissions();
  {
    MC_FAKE_ENTER("launchKernel");
    if (!initialized_) return kCudaErrorNotInitialized;
    // A stand-in's handle is its map node (moduleGetFunction).
    const FakeKernel* bind = nullptr;
    for (const auto& entry : kernels_) {
      if (static_cast<const void*>(&entry) == static_cast<const void*>(f)) bind = &entry.second;
    }
    if (bind == nullptr) return kCudaErrorNotSupported;
    if (stream != nullptr && !streams_.count(stream)) return kCudaErrorInvalidHandle;
    if (grid_x == 0 || block_x == 0) return kCudaErrorInvalidValue;
    FakeKernelBody run = (*bind)(grid_x, block_x, params);
    if (hold_streams_) {
      held_.push_back(HeldWork{0, {}, std::move(run), stream, true});
    } else {
      QueueKernelLocked(stream, std::move(run));
    }
  }
  return kCudaSuccess;
}

#undef MC_FAKE_ENTER

std::string FakeCudaDriver::describe(CuResult r) { return DescribeCuResult(r); }

std::string FakeCudaDriver::source() const { return "fake"; }

}  // namespace mooncake::drivers
