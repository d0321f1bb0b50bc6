// The CUDA driver API behind one interface, loaded at run time.
//
// Every part of Mooncake that talks to CUDA (GPU discovery in mooncaked,
// everything the CUDA P2pTransport does: contexts, buffers, legacy IPC
// handles, the verification kernel) does it through a `CudaDriver`: the real one resolves
// libcuda.so.1 once per process with dlopen, so nothing links libcuda and every binary still starts
// (and says "no NVIDIA driver") on a machine without one; tests hand code a `FakeCudaDriver`
// (drivers/fake/) instead, so discovery and VMM buffer handling run in CI without a GPU.
//
//   absl::StatusOr<std::shared_ptr<mooncake::drivers::CudaDriver>> driver =
//       mooncake::drivers::LoadCudaDriver();
//   if (!driver.ok()) return driver.status();  // "libcuda.so.1 not found: ..."
//   mooncake::drivers::CudaDriver& cu = **driver;
//   MC_RETURN_IF_ERROR(CuStatus(cu, cu.init(0), "cuInit"));
//   int count = 0;
//   MC_RETURN_IF_ERROR(CuStatus(cu, cu.deviceGetCount(&count), "cuDeviceGetCount"));
//
// Methods mirror the driver entry points one to one (`memCreate` is
// `cuMemCreate`), take the same arguments in the same order and return the
// driver's `CUresult` unchanged; `CuStatus` turns a result into an
// absl::Status at the call site, which knows what to name in the message.
//
// Why the types are declared here: this header is plain C++17 and never
// includes cuda.h, so the daemon, the client library and their tests build
// on machines without the CUDA toolkit. The few types, enum values and
// struct layouts used are copied from cuda.h of CUDA 13.0 (all of them
// unchanged since they were introduced, and the driver keeps them stable by
// ABI versioning). tests/drivers/cuda_abi_test.cc, built whenever cuda.h is
// found at configure time, static_asserts every constant, struct size and
// field offset below against the real cuda.h, so a wrong value cannot slip
// in. Enum-typed parameters are passed as `int`: a C enum with these values
// has int's size and calling convention on every ABI the driver ships for.
//
// Ownership: `LoadCudaDriver` returns a shared_ptr to a process-wide object
// (one per library path); the library is never dlclose()d, because unloading
// libcuda while the process lives is unsupported by the driver. Handles and
// pointers returned by the methods belong to the caller exactly as with the
// driver API (release them with memRelease / memAddressFree / close()).
//
// Thread-safety: `CudaDriver` holds no mutable state of its own; its methods
// are as thread-safe as the driver's entry points (all of those used here
// are). `LoadCudaDriver` may be called concurrently. Note that `init` runs
// cuInit in the calling process: after it, a fork()ed child must not use
// CUDA.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace mooncake::drivers {

// --- Driver ABI types (cuda.h: CUresult, CUdevice, CUdeviceptr, ...) -------

using CuResult = int;                    // CUresult
using CuDevice = int;                    // CUdevice
using CuDevicePtr = unsigned long long;  // CUdeviceptr (64-bit builds)
using CuMemHandle = unsigned long long;  // CUmemGenericAllocationHandle
struct CuUuid {                          // CUuuid
  unsigned char bytes[16];
};
// Opaque driver objects (CUcontext, CUmodule, CUfunction, CUstream): cuda.h
// declares each as a pointer to an incomplete struct; so do we.
struct CuContextOpaque;
struct CuModuleOpaque;
struct CuFunctionOpaque;
struct CuStreamOpaque;
using CuContext = CuContextOpaque*;
using CuModule = CuModuleOpaque*;
using CuFunction = CuFunctionOpaque*;
using CuStream = CuStreamOpaque*;  // nullptr: the context's default stream
// CUipcMemHandle: 64 opaque bytes naming a cuMemAlloc allocation to another
// process (legacy IPC; passed by value as the driver takes it).
struct CuIpcMemHandle {
  char reserved[64];
};
// CUmemFabricHandle: 64 opaque bytes naming a cuMem allocation created with
// kCuMemHandleTypeFabric to any process of the same NVLink fabric (this node
// or another of a multi-node NVLink domain). Export and import need an IMEX
// channel (/dev/nvidia-caps-imex-channels/channel<N>, made by the
// nvidia-imex service) in the process's namespace.
struct CuMemFabricHandle {
  unsigned char data[64];
};

// CUresult values.
inline constexpr CuResult kCudaSuccess = 0;
inline constexpr CuResult kCudaErrorInvalidValue = 1;
inline constexpr CuResult kCudaErrorOutOfMemory = 2;
inline constexpr CuResult kCudaErrorNotInitialized = 3;
inline constexpr CuResult kCudaErrorDeinitialized = 4;
inline constexpr CuResult kCudaErrorStubLibrary = 34;
inline constexpr CuResult kCudaErrorCallRequiresNewerDriver = 36;
inline constexpr CuResult kCudaErrorNoDevice = 100;
inline constexpr CuResult kCudaErrorInvalidDevice = 101;
inline constexpr CuResult kCudaErrorInvalidContext = 201;
inline constexpr CuResult kCudaErrorAlreadyMapped = 208;
inline constexpr CuResult kCudaErrorNotMapped = 211;
inline constexpr CuResult kCudaErrorPeerAccessUnsupported = 217;
inline constexpr CuResult kCudaErrorOperatingSystem = 304;
inline constexpr CuResult kCudaErrorInvalidHandle = 400;
inline constexpr CuResult kCudaErrorNotFound = 500;
inline constexpr CuResult kCudaErrorNotReady = 600;
inline constexpr CuResult kCudaErrorIllegalAddress = 700;
inline constexpr CuResult kCudaErrorHostMemoryAlreadyRegistered = 712;
inline constexpr CuResult kCudaErrorHostMemoryNotRegistered = 713;
inline constexpr CuResult kCudaErrorNotPermitted = 800;
inline constexpr CuResult kCudaErrorNotSupported = 801;
inline constexpr CuResult kCudaErrorSystemDriverMismatch = 803;
inline constexpr CuResult kCudaErrorCompatNotSupportedOnDevice = 804;
inline constexpr CuResult kCudaErrorUnknown = 999;

// CUdevice_attribute values (for deviceGetAttribute).
inline constexpr int kCuDeviceAttrMultiprocessorCount = 16;
inline constexpr int kCuDeviceAttrPciBusId = 33;
inline constexpr int kCuDeviceAttrPciDeviceId = 34;
inline constexpr int kCuDeviceAttrUnifiedAddressing = 41;
inline constexpr int kCuDeviceAttrPciDomainId = 50;
inline constexpr int kCuDeviceAttrComputeCapabilityMajor = 75;
inline constexpr int kCuDeviceAttrComputeCapabilityMinor = 76;
inline constexpr int kCuDeviceAttrVirtualMemoryManagementSupported = 102;
inline constexpr int kCuDeviceAttrHandleTypePosixFileDescriptorSupported = 103;
inline constexpr int kCuDeviceAttrGpuDirectRdmaWithCudaVmmSupported = 110;
inline constexpr int kCuDeviceAttrGpuDirectRdmaSupported = 116;
inline constexpr int kCuDeviceAttrDmaBufSupported = 124;
inline constexpr int kCuDeviceAttrHandleTypeFabricSupported = 128;

// CUdevice_P2PAttribute values (for deviceGetP2PAttribute).
inline constexpr int kCuP2pAttrPerformanceRank = 1;
inline constexpr int kCuP2pAttrAccessSupported = 2;
inline constexpr int kCuP2pAttrNativeAtomicSupported = 3;
inline constexpr int kCuP2pAttrCudaArrayAccessSupported = 4;

// CUmemAllocationType, CUmemAllocationHandleType, CUmemLocationType,
// CUmemAccess_flags and CUmemAllocationGranularity_flags values.
inline constexpr int kCuMemAllocationTypePinned = 1;
inline constexpr int kCuMemHandleTypeNone = 0;
inline constexpr int kCuMemHandleTypePosixFileDescriptor = 1;
inline constexpr int kCuMemHandleTypeFabric = 8;
inline constexpr int kCuMemLocationTypeDevice = 1;
inline constexpr int kCuMemAccessFlagsProtNone = 0;
inline constexpr int kCuMemAccessFlagsProtRead = 1;
inline constexpr int kCuMemAccessFlagsProtReadWrite = 3;
inline constexpr int kCuMemAllocGranularityMinimum = 0;
inline constexpr int kCuMemAllocGranularityRecommended = 1;
// CUipcMem_flags: cuIpcOpenMemHandle enables peer access on demand.
inline constexpr unsigned kCuIpcMemLazyEnablePeerAccess = 1;
// CU_MEMHOSTREGISTER_* flags of memHostRegister: pinned for every context
// (PORTABLE), mapped into the device address space (DEVICEMAP; implied on
// unified addressing), an I/O range such as a NIC's UAR page (IOMEMORY).
inline constexpr unsigned kCuMemHostRegisterPortable = 0x01;
inline constexpr unsigned kCuMemHostRegisterDeviceMap = 0x02;
inline constexpr unsigned kCuMemHostRegisterIoMemory = 0x04;
// CU_STREAM_NON_BLOCKING (streamCreate): no implicit synchronization with
// the legacy default stream, so work on it never waits for kernels there.
inline constexpr unsigned kCuStreamNonBlocking = 0x1;

// CUmemLocation: where memory lives (`type` kCuMemLocationTypeDevice, `id`
// the device ordinal).
struct CuMemLocation {
  int type;  // CUmemLocationType
  int id;
};

// CUmemAllocationProp (CUmemAllocationProp_v1), layout-compatible.
struct CuMemAllocationProp {
  int type;                  // CUmemAllocationType
  int requestedHandleTypes;  // CUmemAllocationHandleType bits
  CuMemLocation location;
  void* win32HandleMetaData;  // must be null on Linux
  struct {
    unsigned char compressionType;
    unsigned char gpuDirectRDMACapable;
    unsigned short usage;
    unsigned char reserved[4];
  } allocFlags;
};

// CUmemAccessDesc (CUmemAccessDesc_v1), layout-compatible.
struct CuMemAccessDesc {
  CuMemLocation location;
  int flags;  // CUmemAccess_flags
};

// --- The interface ----------------------------------------------------------

// The CUDA driver entry points Mooncake uses. Each method calls the driver
// function of the same name (`deviceTotalMem` is cuDeviceTotalMem_v2,
// `deviceGetUuid` cuDeviceGetUuid_v2 where the driver has it) and returns
// its CUresult; see the CUDA Driver API reference for arguments and errors.
// Implementations: the real driver (LoadCudaDriver) and FakeCudaDriver
// (drivers/fake/fake_cuda_driver.h, tests only).
class CudaDriver {
 public:
  virtual ~CudaDriver() = default;

  virtual CuResult init(unsigned flags) = 0;
  // Readable before init(): useful in messages when init then fails.
  virtual CuResult driverGetVersion(int* version) = 0;
  virtual CuResult deviceGetCount(int* count) = 0;
  virtual CuResult deviceGet(CuDevice* device, int ordinal) = 0;
  virtual CuResult deviceGetName(char* name, int len, CuDevice dev) = 0;
  virtual CuResult deviceGetUuid(CuUuid* uuid, CuDevice dev) = 0;
  virtual CuResult deviceGetPCIBusId(char* bus_id, int len, CuDevice dev) = 0;
  virtual CuResult deviceTotalMem(size_t* bytes, CuDevice dev) = 0;
  virtual CuResult deviceGetAttribute(int* value, int attrib, CuDevice dev) = 0;
  virtual CuResult deviceGetP2PAttribute(int* value, int attrib, CuDevice src, CuDevice dst) = 0;

  // Virtual memory management (cuMem*): allocations exportable as POSIX fds.
  virtual CuResult memGetAllocationGranularity(size_t* granularity, const CuMemAllocationProp* prop,
                                               int option) = 0;
  virtual CuResult memCreate(CuMemHandle* handle, size_t size, const CuMemAllocationProp* prop,
                             unsigned long long flags) = 0;
  virtual CuResult memAddressReserve(CuDevicePtr* ptr, size_t size, size_t alignment,
                                     CuDevicePtr addr, unsigned long long flags) = 0;
  virtual CuResult memMap(CuDevicePtr ptr, size_t size, size_t offset, CuMemHandle handle,
                          unsigned long long flags) = 0;
  virtual CuResult memSetAccess(CuDevicePtr ptr, size_t size, const CuMemAccessDesc* desc,
                                size_t count) = 0;
  virtual CuResult memUnmap(CuDevicePtr ptr, size_t size) = 0;
  virtual CuResult memAddressFree(CuDevicePtr ptr, size_t size) = 0;
  virtual CuResult memRelease(CuMemHandle handle) = 0;
  // For kCuMemHandleTypePosixFileDescriptor `shareable` points to an int that
  // receives a new fd (the caller closes it), and `os_handle` is the fd cast
  // to a pointer (`reinterpret_cast<void*>(static_cast<uintptr_t>(fd))`).
  // For kCuMemHandleTypeFabric both point to a CuMemFabricHandle.
  virtual CuResult memExportToShareableHandle(void* shareable, CuMemHandle handle, int handle_type,
                                              unsigned long long flags) = 0;
  virtual CuResult memImportFromShareableHandle(CuMemHandle* handle, void* os_handle,
                                                int handle_type) = 0;

  // Contexts. The CUDA runtime works in each device's primary context and
  // makes it current on cudaSetDevice(); code that shares a process with
  // runtime users (PyTorch, the application's kernels) retains the primary
  // context too, so both see the same memory.
  virtual CuResult ctxGetCurrent(CuContext* ctx) = 0;
  virtual CuResult ctxSetCurrent(CuContext ctx) = 0;
  virtual CuResult ctxGetDevice(CuDevice* device) = 0;
  virtual CuResult ctxSynchronize() = 0;
  virtual CuResult devicePrimaryCtxRetain(CuContext* ctx, CuDevice dev) = 0;
  virtual CuResult devicePrimaryCtxRelease(CuDevice dev) = 0;

  // Linear device memory in the current context and synchronous copies.
  virtual CuResult memAlloc(CuDevicePtr* ptr, size_t bytes) = 0;
  virtual CuResult memFree(CuDevicePtr ptr) = 0;
  virtual CuResult memcpyHtoD(CuDevicePtr dst, const void* src, size_t bytes) = 0;
  virtual CuResult memcpyDtoH(void* dst, CuDevicePtr src, size_t bytes) = 0;
  virtual CuResult memsetD8(CuDevicePtr dst, unsigned char value, size_t count) = 0;
  // Streams and asynchronous copies (optional entry points: a driver that
  // lacks one answers kCudaErrorNotSupported). streamQuery: kCudaSuccess
  // once all work is done, kCudaErrorNotReady before.
  virtual CuResult streamCreate(CuStream* stream, unsigned flags) = 0;
  // A stream whose work the GPU schedules before lower priorities' when an
  // SM slot frees. Priorities run from `least` (0) down to `greatest`
  // (negative: a lower number is a higher priority) in the current context.
  virtual CuResult streamCreateWithPriority(CuStream* stream, unsigned flags, int priority) = 0;
  virtual CuResult ctxGetStreamPriorityRange(int* least, int* greatest) = 0;
  virtual CuResult streamDestroy(CuStream stream) = 0;
  virtual CuResult streamQuery(CuStream stream) = 0;
  virtual CuResult memcpyHtoDAsync(CuDevicePtr dst, const void* src, size_t bytes,
                                   CuStream stream) = 0;
  virtual CuResult memcpyDtoHAsync(void* dst, CuDevicePtr src, size_t bytes, CuStream stream) = 0;
  virtual CuResult memsetD8Async(CuDevicePtr dst, unsigned char value, size_t count,
                                 CuStream stream) = 0;
  // Between any two device-visible addresses (unified addressing, as memcpy
  // below), queued on `stream`.
  virtual CuResult memcpyAsync(CuDevicePtr dst, CuDevicePtr src, size_t bytes, CuStream stream) = 0;
  // Copies between any two device-visible addresses (unified addressing:
  // the driver infers each side's memory type from the pointer), and device
  // to device. Device-to-device copies return before the copy is done; a
  // caller that needs the bytes in place calls ctxSynchronize().
  virtual CuResult memcpy(CuDevicePtr dst, CuDevicePtr src, size_t bytes) = 0;
  virtual CuResult memcpyDtoD(CuDevicePtr dst, CuDevicePtr src, size_t bytes) = 0;

  // Host memory the GPU reaches: page-locks [p, p + bytes) for the current
  // context (flags: kCuMemHostRegister*), and the device address kernels use
  // for a registered host address (flags must be 0).
  virtual CuResult memHostRegister(void* p, size_t bytes, unsigned flags) = 0;
  virtual CuResult memHostUnregister(void* p) = 0;
  virtual CuResult memHostGetDevicePointer(CuDevicePtr* dptr, void* p, unsigned flags) = 0;

  // A dma-buf fd for [ptr, ptr + bytes) of device memory (both page
  // aligned), for a NIC to register (ibv_reg_dmabuf_mr). The caller owns
  // *fd. kCudaErrorNotSupported when the driver or GPU has no dma-buf export.
  virtual CuResult memGetDmabufFd(int* fd, CuDevicePtr ptr, size_t bytes) = 0;

  // Legacy IPC: a memAlloc allocation named to other processes by 64 bytes.
  virtual CuResult ipcGetMemHandle(CuIpcMemHandle* handle, CuDevicePtr ptr) = 0;
  virtual CuResult ipcOpenMemHandle(CuDevicePtr* ptr, CuIpcMemHandle handle, unsigned flags) = 0;
  virtual CuResult ipcCloseMemHandle(CuDevicePtr ptr) = 0;

  // Modules and kernel launch (`image`: a cubin, fatbin or PTX in memory).
  virtual CuResult moduleLoadData(CuModule* module, const void* image) = 0;
  virtual CuResult moduleGetFunction(CuFunction* function, CuModule module, const char* name) = 0;
  virtual CuResult moduleUnload(CuModule module) = 0;
  virtual CuResult launchKernel(CuFunction f, unsigned grid_x, unsigned grid_y, unsigned grid_z,
                                unsigned block_x, unsigned block_y, unsigned block_z,
                                unsigned shared_mem_bytes, CuStream stream, void** params,
                                void** extra) = 0;

  // "CUDA_ERROR_INVALID_VALUE (invalid argument)"; works for unknown codes
  // too ("CUDA error 12345 (unknown error code)").
  virtual std::string describe(CuResult r) = 0;
  // Which library/entry points back it, for messages
  // ("libcuda.so.1 (driver 13000)", "fake").
  virtual std::string source() const = 0;

  // Whether this process has an IMEX channel, which fabric handles need:
  // the real driver looks for /dev/nvidia-caps-imex-channels/channel<N>
  // (made by the nvidia-imex service on multi-node NVLink systems). Asked
  // before a fabric probe, so a node without one never makes the driver
  // call that must fail (sanitizers count such calls as errors).
  virtual bool imexChannelPresent() const;

  // The fabric-handle probe of `device`, run once per driver (the real
  // driver is process-wide: once per process) and its answer kept when it
  // is OK or FailedPrecondition (what the node allows); every transport
  // created later on that device reuses it.
  absl::Status CachedFabricProbe(int device, const std::function<absl::Status()>& probe);

 protected:
  // Drops the kept answers (a fake whose node changed).
  void ForgetFabricProbes();

 private:
  std::mutex probe_mu_;
  std::map<int, absl::Status> fabric_probes_;
};

// Resolves the real driver once per library path: dlopen(library) and every
// entry point above (through cuGetProcAddress_v2 where the driver has it,
// else by the versioned symbol names cuda.h maps to). Does not call cuInit.
// The outcome is cached, and the library never dlclose()d: later calls with
// the same path return the same object or the same error (a driver installed
// while the process runs is seen only after a restart).
//
// Errors:
//   NotFound            the library is not on this node ("libcuda.so.1 not
//                       found: no NVIDIA driver on this node ...; install the
//                       NVIDIA driver ...").
//   FailedPrecondition  the library exists but cannot be loaded, or lacks an
//                       entry point (the message names each missing symbol
//                       and says the driver is missing or too old).
//   InvalidArgument     `library` is empty.
absl::StatusOr<std::shared_ptr<CudaDriver>> LoadCudaDriver(
    const std::string& library = "libcuda.so.1");

// OkStatus for kCudaSuccess; otherwise a Status whose message is
// "<what>: <driver.describe(r)>", e.g. "cuMemCreate(2097152 bytes):
// CUDA_ERROR_OUT_OF_MEMORY (out of memory)", and whose code maps the result:
//   out of memory                                     -> ResourceExhausted
//   invalid value, invalid device, invalid handle     -> InvalidArgument
//   not supported, not permitted, no device,
//   not initialized, stub library, call requires a
//   newer driver, system driver mismatch, compat
//   not supported on device                           -> FailedPrecondition
//   anything else                                     -> Internal
absl::Status CuStatus(CudaDriver& driver, CuResult r, std::string_view what);

// The canonical code CuStatus uses for `r` (kOk for kCudaSuccess).
absl::StatusCode CuResultCode(CuResult r);

// The device the calling thread works on, as the CUDA runtime sees it: the
// device of the current context, or ordinal 0 (the runtime's default) when
// no context is current. Since CUDA 12.0 cudaSetDevice() makes the device's
// primary context current at once, so this follows the application's
// cudaSetDevice / torch.cuda.set_device. Calls init(0) first.
absl::StatusOr<int> CurrentDeviceOrdinal(CudaDriver& driver);

// "CUDA_ERROR_NO_DEVICE (no CUDA-capable device is detected)" from a table
// of the results declared above, without asking a driver; for unknown codes
// "CUDA error <r> (unknown error code)". Used by describe() when the driver
// cannot word a result itself, and by FakeCudaDriver.
std::string DescribeCuResult(CuResult r);

}  // namespace mooncake::drivers
