// createCudaP2pTransport for builds without CUDA: a clear error instead of a
// link failure, so callers need no #ifdef to fall back to the host platform.
#include "mooncake/device/device_transport.h"

namespace mooncake {
namespace device {

absl::StatusOr<std::unique_ptr<BrokeredP2pTransport>> createCudaP2pTransport(
    int /*num_ranks*/, std::shared_ptr<HandleExchange> /*exchange*/, CudaHandleKind /*kind*/) {
  return absl::FailedPreconditionError(
      "createCudaP2pTransport: this Mooncake was built without CUDA; reconfigure with "
      "-DMOONCAKE_WITH_CUDA=ON (nvcc required) or use createHostP2pTransport");
}

}  // namespace device
}  // namespace mooncake
