// A configurable stand-in for the CUDA driver, for tests: code written
// against mooncake::drivers::CudaDriver runs unchanged on a machine without
// a GPU.
//
//   auto cu = std::make_shared<mooncake::drivers::FakeCudaDriver>();
//   cu->addGpu(mooncake::drivers::FakeGpu::Hopper(0));
//   cu->addGpu(mooncake::drivers::FakeGpu::Hopper(1));
//   cu->setP2PAttribute(0, 1, kCuP2pAttrAccessSupported, 1);
//   cu->failNext("deviceGetUuid", kCudaErrorUnknown);   // one call fails
//   RunCodeUnderTest(cu);
//
// Device queries answer from the configured GPUs: an attribute the FakeGpu
// does not list fails with CUDA_ERROR_INVALID_VALUE (as the driver does for
// an attribute it does not know), a P2P attribute not set reads 0, and every
// query before a successful init() fails with CUDA_ERROR_NOT_INITIALIZED.
// Device handles are `kHandleBase + ordinal`, never the ordinal itself, so
// code that mixes the two fails; the one exception is CuMemLocation::id,
// which takes either (the real driver's handles equal the ordinals, and
// code passes both there).
//
// The VMM calls are backed by host memory with the driver's rules checked
// (granularity multiples, exact unmap/free ranges, handle types requested at
// creation):
//   memCreate                      a memfd of `size` bytes
//   memExportToShareableHandle     a dup() of it (POSIX fd handle type only)
//   memImportFromShareableHandle   a new handle on the memory behind an fd,
//                                  also one from another process's fake
//   memAddressReserve              an inaccessible anonymous mapping
//   memMap / memSetAccess          the memfd mapped MAP_SHARED|MAP_FIXED into
//                                  the reservation, PROT_NONE until
//                                  memSetAccess grants read or read-write
// so a "device pointer" is a host address the test can read and write, and
// two processes (or two mappings) see each other's stores. memAlloc is host
// memory too. memHostRegister records the range (the fake needs no pinning)
// and memHostGetDevicePointer answers the host address itself, as a GPU
// with CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM does. The copies
// (memcpy, memcpyDtoD, memcpyHtoD, memcpyDtoH) and memsetD8 accept any
// "device" range the fake made: a memAlloc allocation, a reserved range, a
// registered host range; overlapping copies behave as memmove. Nothing is
// asynchronous: a copy is done when it returns, also one queued on a stream
// (streams are tokens; streamQuery answers done). Contexts: each GPU has one
// primary context (retain/release counted); the current context is per
// thread, as with the driver, and shared by every fake in the process.
// Legacy IPC, modules and kernel launches answer CUDA_ERROR_NOT_SUPPORTED:
// nothing on the host can run device code (setModulesLoadable lets modules
// load, for code that loads its kernels at setup; launches fail unless a
// test registered a host stand-in for the kernel: registerKernel).
// Fabric handles (kCuMemHandleTypeFabric) export only once
// setImexChannel(true) says the node has an IMEX channel; without one
// export and import answer CUDA_ERROR_NOT_SUPPORTED, as on a node without
// the IMEX service. The fake's fabric handle names the memfd of the
// exporting process (pid and fd number, reopened through /proc on import),
// so it works within one host only, which is all a host test needs.
//
// Ownership: the fake owns every allocation, fd and mapping it creates and
// frees what is left in its destructor. Fds returned by export belong to
// the caller.
//
// Thread-safety: all methods, configuration included, may be called from
// several threads; each call runs under one mutex.
#pragma once

#include <array>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "mooncake/drivers/cuda_driver.h"

namespace mooncake::drivers {

// One fake GPU. `attributes` maps CUdevice_attribute values to answers.
struct FakeGpu {
  std::string name = "Fake GPU";
  std::array<unsigned char, 16> uuid{};
  std::string pci_bus_id = "0000:00:00.0";  // as the driver prints it
  size_t total_memory_bytes = size_t{80} << 30;
  std::map<int, int> attributes;

  // An H100/H200-like GPU: "Fake GPU <i>", compute capability 9.0, 132 - i
  // SMs, 80 GiB * (i + 1), uuid bytes f0 - 16 i + k (high bytes on purpose),
  // bus id "0000:<1B + 0x21 i>:00.0" in the driver's upper case; VMM, POSIX
  // fd handles, GPUDirect RDMA (also with VMM), dmabuf and unified
  // addressing supported, fabric handles on GPU 0 only.
  static FakeGpu Hopper(int i);
};

class FakeCudaDriver : public CudaDriver {
 public:
  static constexpr CuDevice kHandleBase = 100;

  // No GPU, driver version 13000, init() succeeds, allocation granularity
  // 2 MiB.
  FakeCudaDriver();
  ~FakeCudaDriver() override;
  FakeCudaDriver(const FakeCudaDriver&) = delete;
  FakeCudaDriver& operator=(const FakeCudaDriver&) = delete;

  // --- Configuration -------------------------------------------------------

  // Appends a GPU; returns its ordinal.
  int addGpu(FakeGpu gpu);
  // The GPU with `ordinal`, to change it after adding (not while calls run).
  FakeGpu& gpu(int ordinal);
  // deviceGetP2PAttribute(value, attrib, handle(src), handle(dst)) answers
  // `value`; unset pairs and attributes answer 0.
  void setP2PAttribute(int src, int dst, int attrib, int value);
  void setDriverVersion(int version);
  // What init() returns; anything but kCudaSuccess leaves the driver
  // uninitialized.
  void setInitResult(CuResult r);
  // Granularity reported for both options; memCreate/memMap sizes must be
  // multiples of it.
  void setGranularity(size_t bytes);
  // The next `times` calls of `method` (the CudaDriver method name, e.g.
  // "deviceGetUuid") return `r` without doing anything. Aborts on a name
  // that is not a CudaDriver method, so a typo cannot pass silently.
  void failNext(std::string_view method, CuResult r, int times = 1);
  // Every call of `method` returns `r` until clearResult(method); failNext
  // results come first.
  void setResult(std::string_view method, CuResult r);
  void clearResult(std::string_view method);
  // Whether fabric handles export and import (an IMEX channel is present);
  // false at first.
  void setImexChannel(bool present);
  // Whether the node has IMEX channel device files at all (true at first,
  // so setImexChannel alone decides what the calls do); false: fabric
  // probes stop before any driver call. Either setter drops the kept
  // fabric probes (CachedFabricProbe): the node changed.
  void setImexDeviceFiles(bool present);
  bool imexChannelPresent() const override;
  // Whether memGetDmabufFd exports a dmabuf (false at first: the driver or
  // kernel cannot, CUDA_ERROR_NOT_SUPPORTED). When it does, the "dmabuf"
  // is a dup() of the memfd behind one mapped range of a reservation (the
  // range must lie inside one memMap; anything else: INVALID_VALUE), so a
  // test can map it and see the memory the "GPU" writes.
  void setDmabufExport(bool supported);
  // Whether moduleLoadData / moduleGetFunction / moduleUnload succeed (with
  // placeholder objects); false at first. launchKernel fails for any
  // function but a registered stand-in (registerKernel).
  void setModulesLoadable(bool loadable);
  // A host stand-in for the kernel `name`: moduleGetFunction(name) finds it
  // (modules loadable) and launchKernel queues it on its stream, where a
  // thread of the fake runs the stream's kernels one after another, beside
  // the caller, as a GPU runs them (a held launch is queued when the hold
  // ends: holdStreams); streamQuery answers not ready until the stream's
  // kernels have run. Copies still run in their call. `bind` reads the
  // launch's grid size, block size and arguments (cuLaunchKernel's
  // kernelParams) during the call and returns what the kernel does when it
  // runs; the arguments are gone by then. A body that never returns keeps
  // its stream busy: streamDestroy and the fake's destructor wait for it,
  // as does an async copy on that stream (stream order).
  using FakeKernelBody = std::function<void()>;
  using FakeKernel = std::function<FakeKernelBody(unsigned grid_x, unsigned block_x, void** args)>;
  void registerKernel(std::string name, FakeKernel bind);
  // While paused, async submissions (memcpy*Async, launchKernel) wait in
  // their call until resumed, as a real driver holds every other thread's
  // submission while one thread sits in a synchronous copy from pageable
  // memory that waits for a kernel.
  void pauseSubmissions(bool pause);
  // Submissions waiting in their call now (pauseSubmissions).
  int pausedSubmissions() const;
  // Streams whose kernels (registerKernel) are running or queued now.
  int busyKernelStreams() const;
  // The priority `stream` was created with (0: streamCreate's), and the
  // range ctxGetStreamPriorityRange reports (an H100's: 0 down to -5).
  int streamPriority(CuStream stream) const;
  // Live streams created with `priority`.
  int streamsAtPriority(int priority) const;
  static constexpr int kLeastStreamPriority = 0;
  static constexpr int kGreatestStreamPriority = -5;

  // --- Inspection ------------------------------------------------------------

  // How many times `method` was called (failed calls included).
  int calls(std::string_view method) const;
  // Allocations (created or imported handles not yet released), address
  // reservations and mappings alive now: all 0 after correct cleanup.
  size_t liveHandles() const;
  size_t liveReservations() const;
  size_t liveMappings() const;
  // memAlloc allocations not yet freed, and primary context references
  // (retains minus releases) of the GPU with `ordinal`.
  size_t liveLinearAllocations() const;
  int primaryContextRefs(int ordinal) const;
  // memHostRegister ranges not yet unregistered.
  size_t liveHostRegistrations() const;

  // --- CudaDriver ------------------------------------------------------------

  CuResult init(unsigned flags) override;
  CuResult driverGetVersion(int* version) override;
  CuResult deviceGetCount(int* count) override;
  CuResult deviceGet(CuDevice* device, int ordinal) override;
  CuResult deviceGetName(char* name, int len, CuDevice dev) override;
  CuResult deviceGetUuid(CuUuid* uuid, CuDevice dev) override;
  CuResult deviceGetPCIBusId(char* bus_id, int len, CuDevice dev) override;
  CuResult deviceTotalMem(size_t* bytes, CuDevice dev) override;
  CuResult deviceGetAttribute(int* value, int attrib, CuDevice dev) override;
  CuResult deviceGetP2PAttribute(int* value, int attrib, CuDevice src, CuDevice dst) override;
  CuResult memGetAllocationGranularity(size_t* granularity, const CuMemAllocationProp* prop,
                                       int option) override;
  CuResult memCreate(CuMemHandle* handle, size_t size, const CuMemAllocationProp* prop,
                     unsigned long long flags) override;
  CuResult memAddressReserve(CuDevicePtr* ptr, size_t size, size_t alignment, CuDevicePtr addr,
                             unsigned long long flags) override;
  CuResult memMap(CuDevicePtr ptr, size_t size, size_t offset, CuMemHandle handle,
                  unsigned long long flags) override;
  CuResult memSetAccess(CuDevicePtr ptr, size_t size, const CuMemAccessDesc* desc,
                        size_t count) override;
  CuResult memUnmap(CuDevicePtr ptr, size_t size) override;
  CuResult memAddressFree(CuDevicePtr ptr, size_t size) override;
  CuResult memRelease(CuMemHandle handle) override;
  CuResult memExportToShareableHandle(void* shareable, CuMemHandle handle, int handle_type,
                                      unsigned long long flags) override;
  CuResult memImportFromShareableHandle(CuMemHandle* handle, void* os_handle,
                                        int handle_type) override;
  CuResult ctxGetCurrent(CuContext* ctx) override;
  CuResult ctxSetCurrent(CuContext ctx) override;
  CuResult ctxGetDevice(CuDevice* device) override;
  CuResult ctxSynchronize() override;
  CuResult devicePrimaryCtxRetain(CuContext* ctx, CuDevice dev) override;
  CuResult devicePrimaryCtxRelease(CuDevice dev) override;
  CuResult memAlloc(CuDevicePtr* ptr, size_t bytes) override;
  CuResult memFree(CuDevicePtr ptr) override;
  CuResult memcpyHtoD(CuDevicePtr dst, const void* src, size_t bytes) override;
  CuResult memcpyDtoH(void* dst, CuDevicePtr src, size_t bytes) override;
  CuResult memsetD8(CuDevicePtr dst, unsigned char value, size_t count) override;
  CuResult streamCreate(CuStream* stream, unsigned flags) override;
  CuResult streamCreateWithPriority(CuStream* stream, unsigned flags, int priority) override;
  CuResult ctxGetStreamPriorityRange(int* least, int* greatest) override;
  CuResult streamDestroy(CuStream stream) override;
  CuResult streamQuery(CuStream stream) override;
  CuResult memcpyHtoDAsync(CuDevicePtr dst, const void* src, size_t bytes,
                           CuStream stream) override;
  CuResult memcpyDtoHAsync(void* dst, CuDevicePtr src, size_t bytes, CuStream stream) override;
  CuResult memsetD8Async(CuDevicePtr dst, unsigned char value, size_t count,
                         CuStream stream) override;
  CuResult memcpyAsync(CuDevicePtr dst, CuDevicePtr src, size_t bytes, CuStream stream) override;
  // Streams created and not yet destroyed (tests check nothing leaks).
  int liveStreams() const;
  // A context that holds new work back, as the H200 does while another
  // thread loads a kernel for the first time (lazy loading) and a kernel
  // runs: while held, an async host-to-device copy takes its bytes at
  // submission and lands only when the hold ends, in submission order (a
  // device-to-host copy reads then too), and streamQuery answers not
  // ready.
  void holdStreams(bool hold);
  // The bytes of the copy held last (empty: none held).
  std::vector<uint8_t> lastHeldCopy() const;
  CuResult memcpy(CuDevicePtr dst, CuDevicePtr src, size_t bytes) override;
  CuResult memcpyDtoD(CuDevicePtr dst, CuDevicePtr src, size_t bytes) override;
  CuResult memHostRegister(void* p, size_t bytes, unsigned flags) override;
  CuResult memHostUnregister(void* p) override;
  CuResult memHostGetDevicePointer(CuDevicePtr* dptr, void* p, unsigned flags) override;
  // No dma-buf exporter on the host: kCudaErrorNotSupported (what a driver
  // without dma-buf support answers).
  CuResult memGetDmabufFd(int* fd, CuDevicePtr ptr, size_t bytes) override;
  CuResult ipcGetMemHandle(CuIpcMemHandle* handle, CuDevicePtr ptr) override;
  CuResult ipcOpenMemHandle(CuDevicePtr* ptr, CuIpcMemHandle handle, unsigned flags) override;
  CuResult ipcCloseMemHandle(CuDevicePtr ptr) override;
  CuResult moduleLoadData(CuModule* module, const void* image) override;
  CuResult moduleGetFunction(CuFunction* function, CuModule module, const char* name) override;
  CuResult moduleUnload(CuModule module) override;
  CuResult launchKernel(CuFunction f, unsigned grid_x, unsigned grid_y, unsigned grid_z,
                        unsigned block_x, unsigned block_y, unsigned block_z,
                        unsigned shared_mem_bytes, CuStream stream, void** params,
                        void** extra) override;
  std::string describe(CuResult r) override;
  std::string source() const override;

 private:
  struct Allocation;  // a memfd and its size
  struct Mapping {
    size_t size;
    std::shared_ptr<Allocation> allocation;  // keeps the memory after memRelease
  };
  struct Reservation {
    size_t size;
    std::map<CuDevicePtr, Mapping> mappings;  // by start address
  };

  // Counts the call and returns an injected result, or kCudaSuccess.
  CuResult enter(std::string_view method);
  // The ordinal of a device handle, or -1.
  int ordinalOf(CuDevice dev) const;
  CuResult checkDevice(CuDevice dev) const;
  CuResult checkProp(const CuMemAllocationProp* prop) const;
  Reservation* reservationFor(CuDevicePtr ptr, size_t size);
  // The primary context of GPU `ordinal` (a stable address, never
  // dereferenced), and the ordinal of a context, or -1.
  CuContext primaryContext(int ordinal) const;
  int ordinalOfContext(CuContext ctx) const;
  // True when [ptr, ptr + bytes) lies inside one memAlloc allocation.
  bool linearRange(CuDevicePtr ptr, size_t bytes) const;
  // True when [ptr, ptr + bytes) lies inside one registered host range.
  bool hostRegisteredRange(CuDevicePtr ptr, size_t bytes) const;
  // What a copy may touch: a memAlloc allocation, a reservation, or a
  // registered host range.
  bool deviceVisible(CuDevicePtr ptr, size_t bytes);

  mutable std::mutex mu_;
  bool hold_streams_ = false;  // guarded by mu_ (holdStreams)
  // Work held back (holdStreams), in submission order: a copy (dst, bytes)
  // or a kernel (run).
  struct HeldWork {
    CuDevicePtr dst = 0;
    std::vector<uint8_t> bytes;
    FakeKernelBody run;  // a kernel, or a device-to-host copy
    CuStream stream = nullptr;
    bool kernel = false;
  };
  // The kernels of one stream (registerKernel) and the thread running them.
  struct KernelStream {
    std::deque<FakeKernelBody> queue;  // guarded by mu_
    bool running = false;              // guarded by mu_
    bool quit = false;                 // guarded by mu_
    int waiters = 0;                   // guarded by mu_ (waitForKernels)
    std::condition_variable cv;        // with mu_
    std::thread thread;
  };
  std::map<CuStream, std::unique_ptr<KernelStream>> kernel_streams_;  // guarded by mu_
  void QueueKernelLocked(CuStream stream, FakeKernelBody body);
  // Stream order: an async copy waits in its call for the kernels queued
  // on its stream before it (the copies themselves run in the call).
  void waitForKernels(CuStream stream);
  void RunKernelStream(KernelStream* ks);
  // Ends and joins `ks`'s thread once its queue has run (without mu_ held).
  void JoinKernelStream(std::unique_ptr<KernelStream> ks);
  std::vector<HeldWork> held_;                              // guarded by mu_
  std::map<std::string, FakeKernel, std::less<>> kernels_;  // guarded by mu_; stable nodes
  // pauseSubmissions: its own mutex, so paused callers hold nothing of mu_.
  void waitForSubmissions();
  mutable std::mutex pause_mu_;
  std::condition_variable pause_cv_;
  bool submissions_paused_ = false;  // guarded by pause_mu_
  int paused_submissions_ = 0;       // guarded by pause_mu_
  std::vector<FakeGpu> gpus_;
  std::map<std::array<int, 3>, int> p2p_;  // (src, dst, attrib) -> value
  int driver_version_ = 13000;
  CuResult init_result_ = kCudaSuccess;
  bool initialized_ = false;
  size_t granularity_ = size_t{2} << 20;
  bool imex_channel_ = false;
  bool imex_device_files_ = true;
  bool dmabuf_export_ = false;
  std::set<CuStream> streams_;
  std::map<CuStream, int> stream_priorities_;  // guarded by mu_; absent: 0
  bool modules_loadable_ = false;
  std::map<std::string, std::vector<CuResult>, std::less<>> fail_next_;  // front = next
  std::map<std::string, CuResult, std::less<>> results_;
  std::map<std::string, int, std::less<>> calls_;
  CuMemHandle next_handle_ = 1;
  std::map<CuMemHandle, std::shared_ptr<Allocation>> handles_;
  std::map<CuDevicePtr, Reservation> reservations_;                 // by start address
  std::map<int, int> primary_refs_;                                 // ordinal -> retains
  std::map<CuDevicePtr, std::unique_ptr<unsigned char[]>> linear_;  // by address
  std::map<CuDevicePtr, size_t> linear_sizes_;
  std::map<CuDevicePtr, size_t> host_registered_;  // memHostRegister: start -> bytes
};

}  // namespace mooncake::drivers
