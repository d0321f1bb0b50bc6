// The GPU side of softnic's atomics on GPU memory (cuda_atomics_kernel.h):
// the fetch-add runs on the device's own atomic units, so it is atomic with
// respect to the client's kernels on that GPU, peers writing over NVLink and
// the CPU. System scope (the .sys variants) because those other writers are
// outside this GPU's kernel. Launched by CudaMemory through the driver API.
#include "cuda_atomics_kernel.h"

namespace mooncake::softnic::internal {

extern "C" __global__ void mc_softnic_fetch_add64(unsigned long long* word, unsigned long long add,
                                                  unsigned long long* old) {
  *old = atomicAdd_system(word, add);
}

extern "C" __global__ void mc_softnic_masked_fetch_add32(unsigned int* word, unsigned int add,
                                                         unsigned int field_boundary,
                                                         unsigned long long* old) {
  // No hardware masked add: a CAS loop, as the host path does.
  unsigned int expected = *reinterpret_cast<volatile unsigned int*>(word);
  for (;;) {
    const unsigned int seen =
        atomicCAS_system(word, expected, MaskedAdd(expected, add, field_boundary));
    if (seen == expected) break;
    expected = seen;
  }
  *old = expected;
}

}  // namespace mooncake::softnic::internal
