// Internal: the peer-verification kernel of the CUDA P2pTransport, behind a
// plain C++ launcher so the transport itself compiles with g++.
#pragma once

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

// Runs the probe on the current device for `count` targets that live in
// device memory, and waits for it. Returns the cudaError_t (as int) of the
// launch or of the synchronisation.
int RunVerifyKernel(VerifyTarget* device_targets, int count);

}  // namespace internal
}  // namespace device
}  // namespace mooncake
