// Internal: the peer-verification kernel of the CUDA P2pTransport. It is
// compiled by nvcc into a fatbin (SASS for MOONCAKE_CUDA_ARCHITECTURES plus
// PTX of the newest, for later GPUs) that is embedded in the library and
// loaded with the driver API (cuModuleLoadData, cuLaunchKernel): the
// library needs no CUDA runtime at all. See device/CMakeLists.txt.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mooncake {
namespace device {
namespace internal {

// One peer to probe. Pointers are device-visible addresses of the peer
// mapping (its buffer id word and this rank's probe slot).
struct VerifyTarget {
  const uint64_t* id_word = nullptr;
  uint64_t* probe_slot = nullptr;
  uint64_t expected_id = 0;
  uint64_t probe_value = 0;
  uint64_t observed_id = 0;     // out
  uint64_t observed_probe = 0;  // out
  int32_t result = -1;          // out: VerifyResult
  int32_t reserved = 0;
};

enum VerifyResult : int32_t { kVerifyOk = 0, kVerifyIdMismatch = 1, kVerifyProbeMismatch = 2 };

// The kernel's (unmangled) name and parameters:
//   mc_verify_peers(VerifyTarget* targets, int count), one thread per target.
inline constexpr const char* kVerifyKernelName = "mc_verify_peers";
inline constexpr unsigned kVerifyKernelThreads = 128;

// The embedded fatbin (generated at build time: cuda_verify_kernel_image.cc).
extern const unsigned char kVerifyKernelImage[];
extern const size_t kVerifyKernelImageSize;

}  // namespace internal
}  // namespace device
}  // namespace mooncake
