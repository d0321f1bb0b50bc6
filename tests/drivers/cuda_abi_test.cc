// The locally declared CUDA driver ABI (mooncake/drivers/cuda_driver.h and
// drivers/src/cuda_entry_points.h) against the real cuda.h: every constant,
// struct size, alignment and field offset, the versioned symbol each entry
// point resolves to, and each entry point's parameter types. Almost all of
// it is static_assert: a wrong value fails the build of this test. This is
// what makes declaring the types locally (so nothing else needs cuda.h)
// safe. Built only when cuda.h is found at configure time; needs no GPU and
// does not link libcuda.
#include <cuda.h>

#include <cstddef>
#include <iostream>
#include <string>
#include <string_view>
#include <type_traits>

#include "cuda_entry_points.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "mooncake/drivers/cuda_driver.h"

namespace mooncake::drivers {
namespace {

// --- Scalar types ----------------------------------------------------------------

static_assert(sizeof(CuResult) == sizeof(CUresult));
static_assert(std::is_same_v<CuDevice, CUdevice>);
static_assert(std::is_same_v<CuDevicePtr, CUdeviceptr>);
static_assert(std::is_same_v<CuMemHandle, CUmemGenericAllocationHandle>);
static_assert(sizeof(CuUuid) == sizeof(CUuuid) && alignof(CuUuid) == alignof(CUuuid));
static_assert(offsetof(CuUuid, bytes) == offsetof(CUuuid, bytes));

// Opaque driver objects: pointers to incomplete structs, as in cuda.h.
static_assert(sizeof(CuContext) == sizeof(CUcontext));
static_assert(sizeof(CuModule) == sizeof(CUmodule));
static_assert(sizeof(CuFunction) == sizeof(CUfunction));
static_assert(sizeof(CuStream) == sizeof(CUstream));
// Passed by value to cuIpcOpenMemHandle: size and alignment decide the ABI.
static_assert(sizeof(CuIpcMemHandle) == sizeof(CUipcMemHandle));
static_assert(alignof(CuIpcMemHandle) == alignof(CUipcMemHandle));
static_assert(sizeof(CuIpcMemHandle) == CU_IPC_HANDLE_SIZE);

// --- Constants -------------------------------------------------------------------

#define MC_SAME_RESULT(ours, theirs) static_assert((ours) == (theirs), #ours " != " #theirs);
#define MC_RESULTS(X)                                                                 \
  X(kCudaSuccess, CUDA_SUCCESS)                                                       \
  X(kCudaErrorInvalidValue, CUDA_ERROR_INVALID_VALUE)                                 \
  X(kCudaErrorOutOfMemory, CUDA_ERROR_OUT_OF_MEMORY)                                  \
  X(kCudaErrorNotInitialized, CUDA_ERROR_NOT_INITIALIZED)                             \
  X(kCudaErrorDeinitialized, CUDA_ERROR_DEINITIALIZED)                                \
  X(kCudaErrorStubLibrary, CUDA_ERROR_STUB_LIBRARY)                                   \
  X(kCudaErrorCallRequiresNewerDriver, CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER)         \
  X(kCudaErrorNoDevice, CUDA_ERROR_NO_DEVICE)                                         \
  X(kCudaErrorInvalidDevice, CUDA_ERROR_INVALID_DEVICE)                               \
  X(kCudaErrorInvalidContext, CUDA_ERROR_INVALID_CONTEXT)                             \
  X(kCudaErrorAlreadyMapped, CUDA_ERROR_ALREADY_MAPPED)                               \
  X(kCudaErrorNotMapped, CUDA_ERROR_NOT_MAPPED)                                       \
  X(kCudaErrorPeerAccessUnsupported, CUDA_ERROR_PEER_ACCESS_UNSUPPORTED)              \
  X(kCudaErrorOperatingSystem, CUDA_ERROR_OPERATING_SYSTEM)                           \
  X(kCudaErrorInvalidHandle, CUDA_ERROR_INVALID_HANDLE)                               \
  X(kCudaErrorNotFound, CUDA_ERROR_NOT_FOUND)                                         \
  X(kCudaErrorNotReady, CUDA_ERROR_NOT_READY)                                         \
  X(kCudaErrorIllegalAddress, CUDA_ERROR_ILLEGAL_ADDRESS)                             \
  X(kCudaErrorHostMemoryAlreadyRegistered, CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED) \
  X(kCudaErrorHostMemoryNotRegistered, CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED)         \
  X(kCudaErrorNotPermitted, CUDA_ERROR_NOT_PERMITTED)                                 \
  X(kCudaErrorNotSupported, CUDA_ERROR_NOT_SUPPORTED)                                 \
  X(kCudaErrorSystemDriverMismatch, CUDA_ERROR_SYSTEM_DRIVER_MISMATCH)                \
  X(kCudaErrorCompatNotSupportedOnDevice, CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE)  \
  X(kCudaErrorUnknown, CUDA_ERROR_UNKNOWN)
MC_RESULTS(MC_SAME_RESULT)

#define MC_SAME(ours, theirs) \
  static_assert((ours) == static_cast<int>(theirs), #ours " != " #theirs)
MC_SAME(kCuDeviceAttrMultiprocessorCount, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
MC_SAME(kCuDeviceAttrPciBusId, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID);
MC_SAME(kCuDeviceAttrPciDeviceId, CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID);
MC_SAME(kCuDeviceAttrUnifiedAddressing, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING);
MC_SAME(kCuDeviceAttrPciDomainId, CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID);
MC_SAME(kCuDeviceAttrComputeCapabilityMajor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
MC_SAME(kCuDeviceAttrComputeCapabilityMinor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
MC_SAME(kCuDeviceAttrVirtualMemoryManagementSupported,
        CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED);
MC_SAME(kCuDeviceAttrHandleTypePosixFileDescriptorSupported,
        CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED);
MC_SAME(kCuDeviceAttrGpuDirectRdmaWithCudaVmmSupported,
        CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED);
MC_SAME(kCuDeviceAttrGpuDirectRdmaSupported, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED);
MC_SAME(kCuDeviceAttrDmaBufSupported, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED);
MC_SAME(kCuDeviceAttrHandleTypeFabricSupported, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED);

MC_SAME(kCuP2pAttrPerformanceRank, CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK);
MC_SAME(kCuP2pAttrAccessSupported, CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED);
MC_SAME(kCuP2pAttrNativeAtomicSupported, CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED);
MC_SAME(kCuP2pAttrCudaArrayAccessSupported, CU_DEVICE_P2P_ATTRIBUTE_CUDA_ARRAY_ACCESS_SUPPORTED);

MC_SAME(kCuMemAllocationTypePinned, CU_MEM_ALLOCATION_TYPE_PINNED);
MC_SAME(kCuMemHandleTypeNone, CU_MEM_HANDLE_TYPE_NONE);
MC_SAME(kCuMemHandleTypePosixFileDescriptor, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
MC_SAME(kCuMemHandleTypeFabric, CU_MEM_HANDLE_TYPE_FABRIC);
MC_SAME(kCuMemLocationTypeDevice, CU_MEM_LOCATION_TYPE_DEVICE);
MC_SAME(kCuMemAccessFlagsProtNone, CU_MEM_ACCESS_FLAGS_PROT_NONE);
MC_SAME(kCuMemAccessFlagsProtRead, CU_MEM_ACCESS_FLAGS_PROT_READ);
MC_SAME(kCuMemAccessFlagsProtReadWrite, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
MC_SAME(kCuMemAllocGranularityMinimum, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
MC_SAME(kCuMemAllocGranularityRecommended, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);

MC_SAME(kCuIpcMemLazyEnablePeerAccess, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
MC_SAME(kCuMemHostRegisterPortable, CU_MEMHOSTREGISTER_PORTABLE);
MC_SAME(kCuMemHostRegisterDeviceMap, CU_MEMHOSTREGISTER_DEVICEMAP);
MC_SAME(kCuMemHostRegisterIoMemory, CU_MEMHOSTREGISTER_IOMEMORY);
MC_SAME(kCuStreamNonBlocking, CU_STREAM_NON_BLOCKING);
MC_SAME(internal::kGetProcAddressDefault, CU_GET_PROC_ADDRESS_DEFAULT);
MC_SAME(internal::kGetProcAddressSuccess, CU_GET_PROC_ADDRESS_SUCCESS);
static_assert(internal::kRequestedCudaAbi <= CUDA_VERSION);

// --- Struct layouts ----------------------------------------------------------------

#define MC_SAME_FIELD(ours, theirs, field)                          \
  static_assert(offsetof(ours, field) == offsetof(theirs, field) && \
                    sizeof(ours::field) == sizeof(theirs::field),   \
                #ours "::" #field " differs from cuda.h")

static_assert(sizeof(CuMemLocation) == sizeof(CUmemLocation));
static_assert(alignof(CuMemLocation) == alignof(CUmemLocation));
MC_SAME_FIELD(CuMemLocation, CUmemLocation, type);
MC_SAME_FIELD(CuMemLocation, CUmemLocation, id);

static_assert(sizeof(CuMemAllocationProp) == sizeof(CUmemAllocationProp));
static_assert(alignof(CuMemAllocationProp) == alignof(CUmemAllocationProp));
MC_SAME_FIELD(CuMemAllocationProp, CUmemAllocationProp, type);
MC_SAME_FIELD(CuMemAllocationProp, CUmemAllocationProp, requestedHandleTypes);
MC_SAME_FIELD(CuMemAllocationProp, CUmemAllocationProp, location);
MC_SAME_FIELD(CuMemAllocationProp, CUmemAllocationProp, win32HandleMetaData);
MC_SAME_FIELD(CuMemAllocationProp, CUmemAllocationProp, allocFlags);
using OurAllocFlags = decltype(CuMemAllocationProp::allocFlags);
using TheirAllocFlags = decltype(CUmemAllocationProp::allocFlags);
static_assert(sizeof(OurAllocFlags) == sizeof(TheirAllocFlags));
MC_SAME_FIELD(OurAllocFlags, TheirAllocFlags, compressionType);
MC_SAME_FIELD(OurAllocFlags, TheirAllocFlags, gpuDirectRDMACapable);
MC_SAME_FIELD(OurAllocFlags, TheirAllocFlags, usage);
MC_SAME_FIELD(OurAllocFlags, TheirAllocFlags, reserved);

static_assert(sizeof(CuMemFabricHandle) == sizeof(CUmemFabricHandle));
static_assert(alignof(CuMemFabricHandle) == alignof(CUmemFabricHandle));
MC_SAME_FIELD(CuMemFabricHandle, CUmemFabricHandle, data);

static_assert(sizeof(CuMemAccessDesc) == sizeof(CUmemAccessDesc));
static_assert(alignof(CuMemAccessDesc) == alignof(CUmemAccessDesc));
MC_SAME_FIELD(CuMemAccessDesc, CUmemAccessDesc, location);
MC_SAME_FIELD(CuMemAccessDesc, CUmemAccessDesc, flags);

// --- Entry points ---------------------------------------------------------------------

// The opaque handles and the by-value IPC handle are ours, not cuda.h's
// types: each maps to its one counterpart (sizes checked above).
template <typename Ours, typename Theirs>
constexpr bool SameOpaqueType() {
  return (std::is_same_v<Ours, CuContext> && std::is_same_v<Theirs, CUcontext>) ||
         (std::is_same_v<Ours, CuModule> && std::is_same_v<Theirs, CUmodule>) ||
         (std::is_same_v<Ours, CuFunction> && std::is_same_v<Theirs, CUfunction>) ||
         (std::is_same_v<Ours, CuStream> && std::is_same_v<Theirs, CUstream>) ||
         (std::is_same_v<Ours, CuIpcMemHandle> && std::is_same_v<Theirs, CUipcMemHandle>);
}

// One parameter (or return) type: the same type; an int where cuda.h has an
// enum; pointers to types of one size and constness.
template <typename Ours, typename Theirs>
constexpr bool SameAbiType() {
  if constexpr (SameOpaqueType<Ours, Theirs>()) {
    return true;
  } else if constexpr (std::is_pointer_v<Ours> != std::is_pointer_v<Theirs>) {
    return false;
  } else if constexpr (std::is_pointer_v<Ours>) {
    using O = std::remove_pointer_t<Ours>;
    using T = std::remove_pointer_t<Theirs>;
    if constexpr (std::is_const_v<O> != std::is_const_v<T>) {
      return false;
    } else if constexpr (std::is_void_v<O> || std::is_void_v<T>) {
      return std::is_void_v<O> && std::is_void_v<T>;
    } else if constexpr (std::is_pointer_v<O> || std::is_pointer_v<T>) {
      return SameAbiType<std::remove_const_t<O>, std::remove_const_t<T>>();
    } else {
      return sizeof(O) == sizeof(T) && alignof(O) == alignof(T);
    }
  } else if constexpr (std::is_enum_v<Theirs>) {
    return std::is_same_v<Ours, int> && sizeof(Theirs) == sizeof(int);
  } else {
    return std::is_same_v<Ours, Theirs>;
  }
}

template <typename R1, typename... A, typename R2, typename... B>
constexpr bool SameAbiFn(R1 (*)(A...), R2 (*)(B...)) {
  if constexpr (sizeof...(A) != sizeof...(B)) {
    return false;
  } else {
    return SameAbiType<R1, R2>() && (SameAbiType<A, B>() && ...);
  }
}

#define MC_STR(x) #x
#define MC_XSTR(x) MC_STR(x)  // expands cuda.h's version macros first

// `cuda_h_name` expands through cuda.h's #defines (cuDeviceTotalMem ->
// cuDeviceTotalMem_v2): the symbol the loader asks dlsym for must be that
// one, and the declared parameters must match cuda.h's.
#define MC_CHECK_ENTRY(slot, proc, cuda_h_name, symbol, legacy, required, params)   \
  static_assert(std::string_view(MC_XSTR(cuda_h_name)) == std::string_view(symbol), \
                "cuda.h maps " proc " to another symbol than " symbol);             \
  static_assert(SameAbiFn(static_cast<CuResult(*) params>(nullptr),                 \
                          static_cast<decltype(&::cuda_h_name)>(nullptr)),          \
                proc ": parameter types differ from cuda.h");
MC_CUDA_DRIVER_ENTRY_POINTS(MC_CHECK_ENTRY)

static_assert(std::string_view(MC_XSTR(cuGetProcAddress)) ==
              std::string_view(internal::kGetProcAddressSymbol));
static_assert(SameAbiFn(static_cast<internal::GetProcAddressFn>(nullptr), &::cuGetProcAddress));

// The names DescribeCuResult prints are cuda.h's enumerator names.
TEST(CudaAbiTest, ResultNamesAreCudaHs) {
#define MC_CHECK_NAME(ours, theirs) \
  EXPECT_THAT(DescribeCuResult(ours), ::testing::StartsWith(#theirs " (")) << #ours;
  MC_RESULTS(MC_CHECK_NAME)
#undef MC_CHECK_NAME
}

TEST(CudaAbiTest, CheckedAgainstThisCudaVersion) {
  // Everything else in this file is checked at compile time.
  std::cout << "checked against cuda.h of CUDA " << CUDA_VERSION << "\n";
  EXPECT_GE(CUDA_VERSION, internal::kRequestedCudaAbi);
}

}  // namespace
}  // namespace mooncake::drivers
