// The CUDA driver entry points the real CudaDriver resolves, as one X-macro
// list, so cuda_driver.cc (which builds its function table from it) and
// tests/drivers/cuda_abi_test.cc (which checks every row against the real
// cuda.h) read the same rows. Private to drivers/ and its tests.
//
// X(slot, proc_name, cuda_h_name, symbol, legacy_symbol, required, params)
//   slot           member of the function table in cuda_driver.cc
//   proc_name      name passed to cuGetProcAddress_v2 (unversioned)
//   cuda_h_name    the name as a program calls it: cuda.h #defines some of
//                  these to a versioned symbol (cuDeviceTotalMem ->
//                  cuDeviceTotalMem_v2); the ABI test checks `symbol` is
//                  what it expands to, and the parameter types
//   symbol         exported symbol with the signature below, for dlsym when
//                  the driver lacks cuGetProcAddress_v2 (before CUDA 12.0)
//   legacy_symbol  an older symbol with the same signature, tried last
//                  (nullptr: none)
//   required       false: only used to word messages
//   params         parameter list; every entry point returns CUresult
//
// Enum parameters are `int` (same size and calling convention).
#pragma once

#include <cstddef>
#include <cstdint>

#include "mooncake/drivers/cuda_driver.h"

#define MC_CUDA_DRIVER_ENTRY_POINTS(X)                                                             \
  X(init, "cuInit", cuInit, "cuInit", nullptr, true, (unsigned int))                               \
  X(driverGetVersion, "cuDriverGetVersion", cuDriverGetVersion, "cuDriverGetVersion", nullptr,     \
    true, (int*))                                                                                  \
  X(deviceGetCount, "cuDeviceGetCount", cuDeviceGetCount, "cuDeviceGetCount", nullptr, true,       \
    (int*))                                                                                        \
  X(deviceGet, "cuDeviceGet", cuDeviceGet, "cuDeviceGet", nullptr, true,                           \
    (::mooncake::drivers::CuDevice*, int))                                                         \
  X(deviceGetName, "cuDeviceGetName", cuDeviceGetName, "cuDeviceGetName", nullptr, true,           \
    (char*, int, ::mooncake::drivers::CuDevice))                                                   \
  /* The _v2 entry point (CUDA 11.4+) returns the UUID nvidia-smi shows also */                    \
  /* for MIG instances; older drivers only have the first version. */                              \
  X(deviceGetUuid, "cuDeviceGetUuid", cuDeviceGetUuid, "cuDeviceGetUuid_v2", "cuDeviceGetUuid",    \
    true, (::mooncake::drivers::CuUuid*, ::mooncake::drivers::CuDevice))                           \
  X(deviceGetPCIBusId, "cuDeviceGetPCIBusId", cuDeviceGetPCIBusId, "cuDeviceGetPCIBusId", nullptr, \
    true, (char*, int, ::mooncake::drivers::CuDevice))                                             \
  X(deviceTotalMem, "cuDeviceTotalMem", cuDeviceTotalMem, "cuDeviceTotalMem_v2", nullptr, true,    \
    (size_t*, ::mooncake::drivers::CuDevice))                                                      \
  X(deviceGetAttribute, "cuDeviceGetAttribute", cuDeviceGetAttribute, "cuDeviceGetAttribute",      \
    nullptr, true, (int*, int, ::mooncake::drivers::CuDevice))                                     \
  X(deviceGetP2PAttribute, "cuDeviceGetP2PAttribute", cuDeviceGetP2PAttribute,                     \
    "cuDeviceGetP2PAttribute", nullptr, true,                                                      \
    (int*, int, ::mooncake::drivers::CuDevice, ::mooncake::drivers::CuDevice))                     \
  X(memGetAllocationGranularity, "cuMemGetAllocationGranularity", cuMemGetAllocationGranularity,   \
    "cuMemGetAllocationGranularity", nullptr, true,                                                \
    (size_t*, const ::mooncake::drivers::CuMemAllocationProp*, int))                               \
  X(memCreate, "cuMemCreate", cuMemCreate, "cuMemCreate", nullptr, true,                           \
    (::mooncake::drivers::CuMemHandle*, size_t, const ::mooncake::drivers::CuMemAllocationProp*,   \
     unsigned long long))                                                                          \
  X(memAddressReserve, "cuMemAddressReserve", cuMemAddressReserve, "cuMemAddressReserve", nullptr, \
    true,                                                                                          \
    (::mooncake::drivers::CuDevicePtr*, size_t, size_t, ::mooncake::drivers::CuDevicePtr,          \
     unsigned long long))                                                                          \
  X(memMap, "cuMemMap", cuMemMap, "cuMemMap", nullptr, true,                                       \
    (::mooncake::drivers::CuDevicePtr, size_t, size_t, ::mooncake::drivers::CuMemHandle,           \
     unsigned long long))                                                                          \
  X(memSetAccess, "cuMemSetAccess", cuMemSetAccess, "cuMemSetAccess", nullptr, true,               \
    (::mooncake::drivers::CuDevicePtr, size_t, const ::mooncake::drivers::CuMemAccessDesc*,        \
     size_t))                                                                                      \
  X(memUnmap, "cuMemUnmap", cuMemUnmap, "cuMemUnmap", nullptr, true,                               \
    (::mooncake::drivers::CuDevicePtr, size_t))                                                    \
  X(memAddressFree, "cuMemAddressFree", cuMemAddressFree, "cuMemAddressFree", nullptr, true,       \
    (::mooncake::drivers::CuDevicePtr, size_t))                                                    \
  X(memRelease, "cuMemRelease", cuMemRelease, "cuMemRelease", nullptr, true,                       \
    (::mooncake::drivers::CuMemHandle))                                                            \
  X(memExportToShareableHandle, "cuMemExportToShareableHandle", cuMemExportToShareableHandle,      \
    "cuMemExportToShareableHandle", nullptr, true,                                                 \
    (void*, ::mooncake::drivers::CuMemHandle, int, unsigned long long))                            \
  X(memImportFromShareableHandle, "cuMemImportFromShareableHandle",                                \
    cuMemImportFromShareableHandle, "cuMemImportFromShareableHandle", nullptr, true,               \
    (::mooncake::drivers::CuMemHandle*, void*, int))                                               \
  X(ctxGetCurrent, "cuCtxGetCurrent", cuCtxGetCurrent, "cuCtxGetCurrent", nullptr, true,           \
    (::mooncake::drivers::CuContext*))                                                             \
  X(ctxSetCurrent, "cuCtxSetCurrent", cuCtxSetCurrent, "cuCtxSetCurrent", nullptr, true,           \
    (::mooncake::drivers::CuContext))                                                              \
  X(ctxGetDevice, "cuCtxGetDevice", cuCtxGetDevice, "cuCtxGetDevice", nullptr, true,               \
    (::mooncake::drivers::CuDevice*))                                                              \
  X(ctxSynchronize, "cuCtxSynchronize", cuCtxSynchronize, "cuCtxSynchronize", nullptr, true, ())   \
  X(devicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", cuDevicePrimaryCtxRetain,                  \
    "cuDevicePrimaryCtxRetain", nullptr, true,                                                     \
    (::mooncake::drivers::CuContext*, ::mooncake::drivers::CuDevice))                              \
  /* _v2 since CUDA 11.0, same signature as the first version. */                                  \
  X(devicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease", cuDevicePrimaryCtxRelease,               \
    "cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease", true,                             \
    (::mooncake::drivers::CuDevice))                                                               \
  X(memAlloc, "cuMemAlloc", cuMemAlloc, "cuMemAlloc_v2", nullptr, true,                            \
    (::mooncake::drivers::CuDevicePtr*, size_t))                                                   \
  X(memFree, "cuMemFree", cuMemFree, "cuMemFree_v2", nullptr, true,                                \
    (::mooncake::drivers::CuDevicePtr))                                                            \
  X(memcpyHtoD, "cuMemcpyHtoD", cuMemcpyHtoD, "cuMemcpyHtoD_v2", nullptr, true,                    \
    (::mooncake::drivers::CuDevicePtr, const void*, size_t))                                       \
  X(memcpyDtoH, "cuMemcpyDtoH", cuMemcpyDtoH, "cuMemcpyDtoH_v2", nullptr, true,                    \
    (void*, ::mooncake::drivers::CuDevicePtr, size_t))                                             \
  X(memsetD8, "cuMemsetD8", cuMemsetD8, "cuMemsetD8_v2", nullptr, true,                            \
    (::mooncake::drivers::CuDevicePtr, unsigned char, size_t))                                     \
  /* cuMemcpy has no _v2 (it came with unified addressing in CUDA 4.0); the */                     \
  /* first cuMemcpyDtoD took 32-bit pointers and sizes, so no legacy symbol. */                    \
  X(memcpy, "cuMemcpy", cuMemcpy, "cuMemcpy", nullptr, true,                                       \
    (::mooncake::drivers::CuDevicePtr, ::mooncake::drivers::CuDevicePtr, size_t))                  \
  X(memcpyDtoD, "cuMemcpyDtoD", cuMemcpyDtoD, "cuMemcpyDtoD_v2", nullptr, true,                    \
    (::mooncake::drivers::CuDevicePtr, ::mooncake::drivers::CuDevicePtr, size_t))                  \
  /* Optional: only rings in GPU memory use them (client/src/gpu_rings.h). */                      \
  X(streamCreate, "cuStreamCreate", cuStreamCreate, "cuStreamCreate", nullptr, false,              \
    (::mooncake::drivers::CuStream*, unsigned int))                                                \
  /* Optional: the copy agent's streams ask for the highest priority. */                           \
  X(streamCreateWithPriority, "cuStreamCreateWithPriority", cuStreamCreateWithPriority,            \
    "cuStreamCreateWithPriority", nullptr, false,                                                  \
    (::mooncake::drivers::CuStream*, unsigned int, int))                                           \
  X(ctxGetStreamPriorityRange, "cuCtxGetStreamPriorityRange", cuCtxGetStreamPriorityRange,         \
    "cuCtxGetStreamPriorityRange", nullptr, false, (int*, int*))                                   \
  X(streamDestroy, "cuStreamDestroy", cuStreamDestroy, "cuStreamDestroy_v2", nullptr, false,       \
    (::mooncake::drivers::CuStream))                                                               \
  X(streamQuery, "cuStreamQuery", cuStreamQuery, "cuStreamQuery", nullptr, false,                  \
    (::mooncake::drivers::CuStream))                                                               \
  X(memcpyHtoDAsync, "cuMemcpyHtoDAsync", cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2", nullptr,      \
    false, (::mooncake::drivers::CuDevicePtr, const void*, size_t, ::mooncake::drivers::CuStream)) \
  X(memcpyDtoHAsync, "cuMemcpyDtoHAsync", cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2", nullptr,      \
    false, (void*, ::mooncake::drivers::CuDevicePtr, size_t, ::mooncake::drivers::CuStream))       \
  X(memsetD8Async, "cuMemsetD8Async", cuMemsetD8Async, "cuMemsetD8Async", nullptr, false,          \
    (::mooncake::drivers::CuDevicePtr, unsigned char, size_t, ::mooncake::drivers::CuStream))      \
  /* Optional too: softnic's device-to-device copies in mooncaked's */                             \
  /* context, on a stream per call. cuMemcpyAsync has no _v2 (it came */                           \
  /* with unified addressing). */                                                                  \
  X(memcpyAsync, "cuMemcpyAsync", cuMemcpyAsync, "cuMemcpyAsync", nullptr, false,                  \
    (::mooncake::drivers::CuDevicePtr, ::mooncake::drivers::CuDevicePtr, size_t,                   \
     ::mooncake::drivers::CuStream))                                                               \
  /* The first cuMemHostRegister has the same signature as _v2 (CUDA 6.5). */                      \
  X(memHostRegister, "cuMemHostRegister", cuMemHostRegister, "cuMemHostRegister_v2",               \
    "cuMemHostRegister", true, (void*, size_t, unsigned int))                                      \
  X(memHostUnregister, "cuMemHostUnregister", cuMemHostUnregister, "cuMemHostUnregister", nullptr, \
    true, (void*))                                                                                 \
  X(memHostGetDevicePointer, "cuMemHostGetDevicePointer", cuMemHostGetDevicePointer,               \
    "cuMemHostGetDevicePointer_v2", nullptr, true,                                                 \
    (::mooncake::drivers::CuDevicePtr*, void*, unsigned int))                                      \
  /* CUDA 11.7+; optional: only the RDMA route on a NIC provider asks. */                          \
  X(memGetHandleForAddressRange, "cuMemGetHandleForAddressRange", cuMemGetHandleForAddressRange,   \
    "cuMemGetHandleForAddressRange", nullptr, false,                                               \
    (void*, ::mooncake::drivers::CuDevicePtr, size_t, int, unsigned long long))                    \
  X(ipcGetMemHandle, "cuIpcGetMemHandle", cuIpcGetMemHandle, "cuIpcGetMemHandle", nullptr, true,   \
    (::mooncake::drivers::CuIpcMemHandle*, ::mooncake::drivers::CuDevicePtr))                      \
  /* _v2 since CUDA 11.0, same signature as the first version. */                                  \
  X(ipcOpenMemHandle, "cuIpcOpenMemHandle", cuIpcOpenMemHandle, "cuIpcOpenMemHandle_v2",           \
    "cuIpcOpenMemHandle", true,                                                                    \
    (::mooncake::drivers::CuDevicePtr*, ::mooncake::drivers::CuIpcMemHandle, unsigned int))        \
  X(ipcCloseMemHandle, "cuIpcCloseMemHandle", cuIpcCloseMemHandle, "cuIpcCloseMemHandle", nullptr, \
    true, (::mooncake::drivers::CuDevicePtr))                                                      \
  X(moduleLoadData, "cuModuleLoadData", cuModuleLoadData, "cuModuleLoadData", nullptr, true,       \
    (::mooncake::drivers::CuModule*, const void*))                                                 \
  X(moduleGetFunction, "cuModuleGetFunction", cuModuleGetFunction, "cuModuleGetFunction", nullptr, \
    true, (::mooncake::drivers::CuFunction*, ::mooncake::drivers::CuModule, const char*))          \
  X(moduleUnload, "cuModuleUnload", cuModuleUnload, "cuModuleUnload", nullptr, true,               \
    (::mooncake::drivers::CuModule))                                                               \
  X(launchKernel, "cuLaunchKernel", cuLaunchKernel, "cuLaunchKernel", nullptr, true,               \
    (::mooncake::drivers::CuFunction, unsigned int, unsigned int, unsigned int, unsigned int,      \
     unsigned int, unsigned int, unsigned int, ::mooncake::drivers::CuStream, void**, void**))     \
  X(getErrorName, "cuGetErrorName", cuGetErrorName, "cuGetErrorName", nullptr, false,              \
    (::mooncake::drivers::CuResult, const char**))                                                 \
  X(getErrorString, "cuGetErrorString", cuGetErrorString, "cuGetErrorString", nullptr, false,      \
    (::mooncake::drivers::CuResult, const char**))

namespace mooncake::drivers::internal {

// cuGetProcAddress_v2 (CUDA 12.0+): (const char* symbol, void** pfn,
// int cudaVersion, cuuint64_t flags, CUdriverProcAddressQueryResult*
// symbolStatus).
using GetProcAddressFn = CuResult (*)(const char*, void**, int, uint64_t, int*);
inline constexpr const char* kGetProcAddressSymbol = "cuGetProcAddress_v2";
inline constexpr uint64_t kGetProcAddressDefault = 0;  // CU_GET_PROC_ADDRESS_DEFAULT
inline constexpr int kGetProcAddressSuccess = 0;       // CU_GET_PROC_ADDRESS_SUCCESS

// The CUDA version whose entry-point ABI is requested from
// cuGetProcAddress_v2: every signature above is the one CUDA 12.0 (and 13.0)
// gives these names.
inline constexpr int kRequestedCudaAbi = 12000;

// The oldest driver with every required entry point above (the VMM calls
// came in CUDA 10.2), for messages.
inline constexpr const char* kMinimumDriver = "CUDA 10.2";

}  // namespace mooncake::drivers::internal
