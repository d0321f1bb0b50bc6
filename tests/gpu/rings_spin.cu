// The kernel of rings_test.cc, apart so that the test's host code (which
// includes the client's headers) is compiled by the host compiler.
#include <cuda_runtime.h>

#include <cstdint>

#include "mooncake/device/mlx5/prm.h"

namespace mooncake {
namespace {

namespace mlx5 = device::mlx5;

// Spins on one CQE until its last byte is `want_op_own` (a flush: REQ_ERR
// with the pass's owner bit), or `*stop` is set, or ~10 s pass.
// *result: 1 saw the CQE with the WR_FLUSH_ERR syndrome, 2 stopped, 3 timed out.
__global__ void SpinOnCqe(const volatile uint8_t* cqe, uint8_t want_op_own,
                          const volatile int* stop, int* result) {
  const uint64_t start = clock64();
  for (;;) {
    if (cqe[63] == want_op_own) {
      __threadfence_system();
      *result = cqe[mlx5::kCqeSyndromeByte] == mlx5::kSyndWrFlushErr ? 1 : 4;
      return;
    }
    if (stop != nullptr && *stop != 0) {
      *result = 2;
      return;
    }
    if (clock64() - start > 20'000'000'000ll) {  // ~10 s at 2 GHz
      *result = 3;
      return;
    }
  }
}

}  // namespace

void LaunchSpinOnCqe(const uint8_t* cqe, uint8_t want_op_own, const int* stop, int* result,
                     cudaStream_t stream) {
  SpinOnCqe<<<1, 1, 0, stream>>>(cqe, want_op_own, stop, result);
}

}  // namespace mooncake
