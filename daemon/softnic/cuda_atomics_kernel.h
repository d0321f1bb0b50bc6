// softnic's atomics on GPU memory, shared by the host (engine.cc,
// cuda_memory.cc) and the kernels in cuda_atomics_kernel.cu: the masked-add
// rule of the mlx5 extended atomics, and the names and parameters of the
// one-thread kernels mooncaked launches for a fetch-add on GPU memory.
//
// The kernels are compiled by nvcc into a fatbin (SASS for
// MOONCAKE_CUDA_ARCHITECTURES plus PTX of the newest, so later GPUs JIT it),
// embedded in mooncaked as a byte array and loaded with cuModuleLoadData
// through the driver wrapper: the daemon links no CUDA runtime. Only CUDA
// builds have the image (CudaMemory::KernelAtomicsBuilt()); see
// daemon/CMakeLists.txt.
//
// Plain C++ that nvcc compiles too; it includes no CUDA header.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define MC_SOFTNIC_HD __host__ __device__
#else
#define MC_SOFTNIC_HD
#endif

namespace mooncake::softnic {

// A masked add: a carry out of a bit set in `boundary` is dropped, so each
// field (ending at a set bit) wraps on its own. The boundary bits are left
// out of the add (no carry can leave them) and put back as a sum bit.
MC_SOFTNIC_HD inline uint32_t MaskedAdd(uint32_t value, uint32_t add, uint32_t boundary) {
  const uint32_t low = (value & ~boundary) + (add & ~boundary);
  return low ^ ((value ^ add) & boundary);
}

namespace internal {

// The kernels (unmangled names, looked up with cuModuleGetFunction), each
// launched with one block of one thread:
//   mc_softnic_fetch_add64(uint64_t* word, uint64_t add, uint64_t* old)
//   mc_softnic_masked_fetch_add32(uint32_t* word, uint32_t add,
//                                 uint32_t field_boundary, uint64_t* old)
// `*old` receives the value before the add (the 32-bit one zero-extended).
inline constexpr const char* kFetchAdd64Kernel = "mc_softnic_fetch_add64";
inline constexpr const char* kMaskedFetchAdd32Kernel = "mc_softnic_masked_fetch_add32";

// The embedded fatbin (generated at build time: cuda_atomics_kernel_image.cc).
extern const unsigned char kAtomicsKernelImage[];
extern const size_t kAtomicsKernelImageSize;

}  // namespace internal
}  // namespace mooncake::softnic
