// GPU discovery through the CUDA driver API, loaded at run time.
//
// The driver comes from mooncake::drivers (drivers/): libcuda is dlopen()ed
// there (never linked), so the daemon starts and runs on nodes without an
// NVIDIA driver, and tests pass a FakeCudaDriver instead. Only device
// queries are used: no CUDA context is created. Note that cuInit() runs in
// the calling process: after it, a fork()ed child must not use CUDA.
//
// Thread-safety: DiscoverGpus may be called from several threads; the
// driver's queries are thread-safe. The loaded driver is cached by
// LoadCudaDriver, so repeated calls reuse it.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mooncake/drivers/cuda_driver.h"
#include "mooncake/v1/node.pb.h"

namespace mooncake::daemon {

struct GpuDiscoveryOptions {
  std::string cuda_library = "libcuda.so.1";  // "" disables GPU discovery
  std::string sysfs_root = "/sys";            // for each GPU's NUMA node
  // The driver to ask; null: LoadCudaDriver(cuda_library). Tests pass a
  // FakeCudaDriver here (cuda_library is then ignored).
  std::shared_ptr<drivers::CudaDriver> driver;
};

struct GpuDiscoveryResult {
  std::vector<v1::Gpu> gpus;       // in driver ordinal order
  std::vector<v1::GpuPair> pairs;  // one per ordered (src, dst), src != dst
  int driver_version = 0;          // cuDriverGetVersion, e.g. 13000; 0 without a driver
  // Why `gpus` is empty, or which queries failed (the fields concerned are
  // reported as false/0), in words a user can act on; empty when all worked.
  std::string note;
};

// Never fails: a missing library, a missing symbol (driver too old), a
// failing cuInit (no device, driver/library mismatch) or a failing query
// become `note`.
GpuDiscoveryResult DiscoverGpus(const GpuDiscoveryOptions& options);

// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", lowercase hex, the same form
// nvidia-smi -L and NVML print.
std::string FormatGpuUuid(const std::array<uint8_t, 16>& bytes);

}  // namespace mooncake::daemon
