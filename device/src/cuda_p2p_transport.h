// Internal: the CUDA transport's factory with the driver passed in, so host
// tests run it against a FakeCudaDriver (drivers/fake/). The public
// createCudaP2pTransport is this with LoadCudaDriver()'s driver.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "mooncake/device/device_transport.h"
#include "mooncake/drivers/cuda_driver.h"

namespace mooncake {
namespace device {
namespace internal {

// As createCudaP2pTransport (device_transport.h), on `driver` (not null).
absl::StatusOr<std::unique_ptr<BrokeredP2pTransport>> CreateCudaP2pTransport(
    int num_ranks, std::shared_ptr<HandleExchange> exchange, CudaHandleKind kind,
    std::shared_ptr<drivers::CudaDriver> driver);

}  // namespace internal
}  // namespace device
}  // namespace mooncake
