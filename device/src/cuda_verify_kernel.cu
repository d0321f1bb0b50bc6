// The GPU side of CudaP2pTransport::verifyPeerAccess: this device's threads
// read and write each peer's buffer through the very mapping kernels will
// use, so a peer that passes is reachable by mc_put/mc_signal.
//
// Built into a fatbin that the library embeds and launches through the
// driver API (cuda_verify_kernel.h), hence extern "C": the name is looked up
// with cuModuleGetFunction.
#include "cuda_verify_kernel.h"
#include "mooncake/device/platform.h"

namespace mooncake {
namespace device {
namespace internal {

extern "C" __global__ void mc_verify_peers(VerifyTarget* targets, int count) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= count) return;
  VerifyTarget& t = targets[i];
  // The id proves the mapping shows the buffer the handle named, not just
  // some writable memory.
  const uint64_t id = mc_ld_acquire(t.id_word);
  t.observed_id = id;
  if (id != t.expected_id) {
    t.result = kVerifyIdMismatch;
    return;
  }
  mc_st_release(t.probe_slot, t.probe_value);
  mc_fence_sc_sys();
  const uint64_t back = mc_ld_acquire(t.probe_slot);
  t.observed_probe = back;
  t.result = back == t.probe_value ? kVerifyOk : kVerifyProbeMismatch;
}

}  // namespace internal
}  // namespace device
}  // namespace mooncake
