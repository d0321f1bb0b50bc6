// A tiny stand-in for libcuda.so.1, dlopen()ed by the real loader
// (LoadCudaDriver) in cuda_driver_test.cc, to test how it resolves entry
// points: through cuGetProcAddress_v2, by versioned symbol, by the legacy
// symbol, and what it says when one is missing. Plain C++ (no cuda.h): the
// signatures are the ones drivers/src/cuda_entry_points.h declares, which
// cuda_abi_test checks against cuda.h.
//
// Each variant answers deviceGetUuid differently, so a test sees which
// entry point was picked: 0x33 bytes through cuGetProcAddress_v2, 0x22 from
// cuDeviceGetUuid_v2, 0x11 from the legacy cuDeviceGetUuid.
//   STUB_GETPROC       also exports cuGetProcAddress_v2 (CUDA 12.0+ drivers),
//                      which leaves out cuMemMap so the dlsym fallback runs
//   STUB_LEGACY_UUID   exports cuDeviceGetUuid only (drivers before 11.4),
//                      and the first cuMemHostRegister only (it answers
//                      CUDA_ERROR_INVALID_VALUE, _v2 CUDA_ERROR_NOT_SUPPORTED)
//   STUB_NO_P2P        lacks cuDeviceGetP2PAttribute
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace {

constexpr int kSuccess = 0;
constexpr int kInvalidValue = 1;
constexpr int kNotSupported = 801;

int FillUuid(unsigned char* uuid, unsigned char byte) {
  std::memset(uuid, byte, 16);
  return kSuccess;
}

}  // namespace

extern "C" {

// What the last cuGetProcAddress_v2 call asked for, read by the test.
__attribute__((visibility("default"))) int stub_requested_version = 0;
__attribute__((visibility("default"))) int stub_get_proc_calls = 0;

int cuInit(unsigned int flags) { return flags == 0 ? kSuccess : kInvalidValue; }
int cuDriverGetVersion(int* version) {
  *version = 12040;
  return kSuccess;
}
int cuDeviceGetCount(int* count) {
  *count = 1;
  return kSuccess;
}
int cuDeviceGet(int* device, int ordinal) {
  if (ordinal != 0) return 101;  // CUDA_ERROR_INVALID_DEVICE
  *device = 0;
  return kSuccess;
}
int cuDeviceGetName(char* name, int len, int) {
  std::strncpy(name, "Stub GPU", static_cast<size_t>(len));
  return kSuccess;
}
#if !STUB_LEGACY_UUID
int cuDeviceGetUuid_v2(unsigned char* uuid, int) { return FillUuid(uuid, 0x22); }
#endif
int cuDeviceGetUuid(unsigned char* uuid, int) { return FillUuid(uuid, 0x11); }
int cuDeviceGetPCIBusId(char* bus_id, int len, int) {
  std::strncpy(bus_id, "0000:01:00.0", static_cast<size_t>(len));
  return kSuccess;
}
// The first version took an unsigned int*: it must never be picked.
int cuDeviceTotalMem(unsigned int* bytes, int) {
  *bytes = 7;
  return kSuccess;
}
int cuDeviceTotalMem_v2(size_t* bytes, int) {
  *bytes = size_t{1} << 34;
  return kSuccess;
}
int cuDeviceGetAttribute(int* value, int attrib, int) {
  *value = attrib;
  return kSuccess;
}
#if !STUB_NO_P2P
int cuDeviceGetP2PAttribute(int* value, int, int, int) {
  *value = 1;
  return kSuccess;
}
#endif
int cuMemGetAllocationGranularity(size_t*, const void*, int) { return kNotSupported; }
int cuMemCreate(unsigned long long*, size_t, const void*, unsigned long long) {
  return kNotSupported;
}
int cuMemAddressReserve(unsigned long long*, size_t, size_t, unsigned long long,
                        unsigned long long) {
  return kNotSupported;
}
int cuMemMap(unsigned long long, size_t, size_t, unsigned long long, unsigned long long) {
  return kNotSupported;
}
int cuMemSetAccess(unsigned long long, size_t, const void*, size_t) { return kNotSupported; }
int cuMemUnmap(unsigned long long, size_t) { return kNotSupported; }
int cuMemAddressFree(unsigned long long, size_t) { return kNotSupported; }
int cuMemRelease(unsigned long long) { return kNotSupported; }
int cuMemExportToShareableHandle(void*, unsigned long long, int, unsigned long long) {
  return kNotSupported;
}
int cuMemImportFromShareableHandle(unsigned long long*, void*, int) { return kNotSupported; }
// Contexts, linear memory, legacy IPC, modules and launches: present (the
// loader requires them) but unsupported, like a driver without a GPU.
int cuCtxGetCurrent(void** ctx) {
  *ctx = nullptr;
  return kSuccess;
}
int cuCtxSetCurrent(void*) { return kNotSupported; }
int cuCtxGetDevice(int*) { return kNotSupported; }
int cuCtxSynchronize() { return kNotSupported; }
int cuDevicePrimaryCtxRetain(void**, int) { return kNotSupported; }
int cuDevicePrimaryCtxRelease_v2(int) { return kNotSupported; }
int cuMemAlloc_v2(unsigned long long*, size_t) { return kNotSupported; }
int cuMemFree_v2(unsigned long long) { return kNotSupported; }
int cuMemcpyHtoD_v2(unsigned long long, const void*, size_t) { return kNotSupported; }
int cuMemcpyDtoH_v2(void*, unsigned long long, size_t) { return kNotSupported; }
int cuMemsetD8_v2(unsigned long long, unsigned char, size_t) { return kNotSupported; }
int cuMemcpy(unsigned long long, unsigned long long, size_t) { return kNotSupported; }
int cuMemcpyDtoD_v2(unsigned long long, unsigned long long, size_t) { return kNotSupported; }
#if !STUB_LEGACY_UUID
int cuMemHostRegister_v2(void*, size_t, unsigned int) { return kNotSupported; }
#endif
// The first version (same signature): what drivers before CUDA 6.5 export.
int cuMemHostRegister(void*, size_t, unsigned int) { return kInvalidValue; }
int cuMemHostUnregister(void*) { return kNotSupported; }
int cuMemHostGetDevicePointer_v2(unsigned long long*, void*, unsigned int) { return kNotSupported; }
struct IpcHandle {
  char reserved[64];
};
int cuIpcGetMemHandle(IpcHandle*, unsigned long long) { return kNotSupported; }
int cuIpcOpenMemHandle_v2(unsigned long long*, IpcHandle, unsigned int) { return kNotSupported; }
int cuIpcCloseMemHandle(unsigned long long) { return kNotSupported; }
int cuModuleLoadData(void**, const void*) { return kNotSupported; }
int cuModuleGetFunction(void**, void*, const char*) { return kNotSupported; }
int cuModuleUnload(void*) { return kNotSupported; }
int cuLaunchKernel(void*, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int,
                   unsigned int, unsigned int, void*, void**, void**) {
  return kNotSupported;
}
int cuGetErrorName(int error, const char** name) {
  if (error != kNotSupported) return kInvalidValue;  // as the driver does for unknown codes
  *name = "CUDA_ERROR_NOT_SUPPORTED";
  return kSuccess;
}
int cuGetErrorString(int error, const char** text) {
  if (error != kNotSupported) return kInvalidValue;
  *text = "operation not supported";
  return kSuccess;
}

#if STUB_GETPROC
static int GetUuidThroughProc(unsigned char* uuid, int) { return FillUuid(uuid, 0x33); }

int cuGetProcAddress_v2(const char* symbol, void** pfn, int cuda_version, uint64_t flags,
                        int* status) {
  ++stub_get_proc_calls;
  stub_requested_version = cuda_version;
  *pfn = nullptr;
  if (flags != 0) return kInvalidValue;
  struct Row {
    const char* name;
    void* fn;
  };
  const Row rows[] = {
      {"cuInit", reinterpret_cast<void*>(&cuInit)},
      {"cuDriverGetVersion", reinterpret_cast<void*>(&cuDriverGetVersion)},
      {"cuDeviceGetCount", reinterpret_cast<void*>(&cuDeviceGetCount)},
      {"cuDeviceGet", reinterpret_cast<void*>(&cuDeviceGet)},
      {"cuDeviceGetName", reinterpret_cast<void*>(&cuDeviceGetName)},
      {"cuDeviceGetUuid", reinterpret_cast<void*>(&GetUuidThroughProc)},
      {"cuDeviceGetPCIBusId", reinterpret_cast<void*>(&cuDeviceGetPCIBusId)},
      {"cuDeviceTotalMem", reinterpret_cast<void*>(&cuDeviceTotalMem_v2)},
      {"cuDeviceGetAttribute", reinterpret_cast<void*>(&cuDeviceGetAttribute)},
      {"cuDeviceGetP2PAttribute", reinterpret_cast<void*>(&cuDeviceGetP2PAttribute)},
      {"cuMemGetAllocationGranularity", reinterpret_cast<void*>(&cuMemGetAllocationGranularity)},
      {"cuMemCreate", reinterpret_cast<void*>(&cuMemCreate)},
      {"cuMemAddressReserve", reinterpret_cast<void*>(&cuMemAddressReserve)},
      // cuMemMap left out on purpose: the loader must fall back to dlsym.
      {"cuMemSetAccess", reinterpret_cast<void*>(&cuMemSetAccess)},
      {"cuMemUnmap", reinterpret_cast<void*>(&cuMemUnmap)},
      {"cuMemAddressFree", reinterpret_cast<void*>(&cuMemAddressFree)},
      {"cuMemRelease", reinterpret_cast<void*>(&cuMemRelease)},
      {"cuMemExportToShareableHandle", reinterpret_cast<void*>(&cuMemExportToShareableHandle)},
      {"cuMemImportFromShareableHandle", reinterpret_cast<void*>(&cuMemImportFromShareableHandle)},
      {"cuGetErrorName", reinterpret_cast<void*>(&cuGetErrorName)},
      {"cuGetErrorString", reinterpret_cast<void*>(&cuGetErrorString)},
  };
  for (const Row& row : rows) {
    if (std::strcmp(row.name, symbol) == 0) {
      *pfn = row.fn;
      *status = 0;  // CU_GET_PROC_ADDRESS_SUCCESS
      return kSuccess;
    }
  }
  *status = 1;  // CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND
  return 500;   // CUDA_ERROR_NOT_FOUND
}
#endif

}  // extern "C"
