// softnic's atomics on GPU memory, shared by the host (engine.cc,
// cuda_memory.cc) and the kernels in cuda_atomics_kernel.cu: the names and
// parameters of the one-thread kernels mooncaked launches for a fetch-add
// on GPU memory, and the masked-add rule they follow.
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

#include "mooncake/common/masked_add.h"

namespace mooncake::softnic {

// The masked-add rule (mooncake/common/masked_add.h), by its old name here.
using ::mooncake::MaskedAdd;

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
