// CUDA-platform transfers for device_transport_example: kernels on this
// rank's GPU write straight into peers' memory (NVLink/PCIe P2P) through the
// Device API. Compiled only with CUDA; kept free of Abseil so nvcc sees
// only plain C++.
#pragma once

#include <string>

#include "example_common.h"
#include "mooncake/device/contexts_device.h"

namespace mooncake::example {

// Selects the GPU (`device` >= 0, else rank % device count), creates its
// context and returns its UUID ("GPU-...") for the daemon. Empty = ok,
// otherwise the error.
std::string PrepareCudaDeviceImpl(int device, int rank, std::string* uuid);

RunResult RunPairCuda(const device::CommCtx& ctx, void* buffer, size_t msg_bytes,
                      uint64_t timeout_ns);
RunResult RunAllToAllCuda(const device::CommCtx& ctx, void* buffer, size_t msg_bytes,
                          uint64_t timeout_ns);

}  // namespace mooncake::example

#ifndef __CUDACC__
#include "absl/status/status.h"
namespace mooncake::example {
inline absl::Status PrepareCudaDevice(int device, int rank, std::string* uuid) {
  std::string err = PrepareCudaDeviceImpl(device, rank, uuid);
  return err.empty() ? absl::OkStatus() : absl::FailedPreconditionError(err);
}
}  // namespace mooncake::example
#endif
