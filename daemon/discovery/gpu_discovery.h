// GPU discovery through the CUDA driver API, loaded at run time.
//
// libcuda is dlopen()ed (never linked), so the daemon starts and runs on
// nodes without an NVIDIA driver. Only device queries are used: no CUDA
// context is created. Note that cuInit() runs in the calling process: after
// it, a fork()ed child must not use CUDA.
//
// Thread-safety: DiscoverGpus may be called from several threads; the
// driver's queries are thread-safe. The library handle is never dlclose()d
// (unloading libcuda while the process lives is unsupported by the driver);
// repeated calls reuse it through dlopen's reference count.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "mooncake/v1/node.pb.h"

namespace mooncake::daemon {

struct GpuDiscoveryOptions {
  std::string cuda_library = "libcuda.so.1";  // "" disables GPU discovery
  std::string sysfs_root = "/sys";            // for each GPU's NUMA node
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
