// `mcctl doctor`: is this node ready for GPU-initiated transfers?
//
// Each check reads what the node says about itself and reports ok, warn,
// fail or skip, with what it saw and, when not ok, the fix:
//
//   driver               NVIDIA kernel module and CUDA driver versions
//   gpus                 GPUs the CUDA driver shows
//   p2p                  the GPU x GPU P2P matrix: access both ways, atomics
//   peermem              nvidia-peermem loaded (GPUDirect RDMA without dmabuf)
//   dmabuf               kernel (>= 5.12), NVIDIA open kernel module, GPUs
//   peer-mapping-regkey  NVreg_RegistryDwords PeerMappingOverride=1 (IBGDA)
//   pcie-acs             ACS redirection on the PCIe switch ports between each
//                        GPU and its closest NIC (config space via sysfs)
//   iommu                IOMMU off or passthrough for the GPUs
//   memlock, nofile      this process's limits (and the daemon's, readable)
//   socket-access        the caller may open mooncaked's socket
//   nic-ports            RDMA ports active, with a LID (IB) or RoCE v2 GID
//   daemon-view          mooncaked's topology matches what is read here
//
// The node is ready when no check fails (warn and skip do not count).
//
// Everything is read below `root` (`<root>/sys`, `<root>/proc`,
// `<root>/etc`), so tests point it at a fake tree; GPUs come from the CUDA
// driver (a FakeCudaDriver in tests), through the daemon's own discovery
// code (daemon/discovery). Thread-safe: no shared state.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "mooncake/drivers/cuda_driver.h"
#include "mooncake/v1/admin.pb.h"
#include "mooncake/v1/node.pb.h"

namespace mooncake::mcctl {

enum class CheckStatus { kOk, kWarn, kFail, kSkip };

// "ok", "warn", "fail", "skip".
const char* CheckStatusName(CheckStatus status);

struct DoctorCheck {
  std::string name;  // stable key, as listed above
  CheckStatus status = CheckStatus::kSkip;
  std::string detail;  // what was seen
  std::string fix;     // what to do; empty when ok
};

struct DoctorReport {
  std::vector<DoctorCheck> checks;
  // No check failed.
  bool ready() const;
};

struct DoctorOptions {
  std::string root = "/";  // where sys/, proc/ and etc/ are read
  std::string socket;      // mooncaked's socket, for socket-access
  // The CUDA driver; null: libcuda.so.1, loaded at run time.
  std::shared_ptr<drivers::CudaDriver> cuda_driver;
  // Ask libibverbs to cross-check the NICs (only meaningful for root "/").
  bool use_verbs = true;
};

// What mooncaked said (or why it could not be asked).
struct DaemonFacts {
  absl::StatusOr<mooncake::v1::DaemonStatus> status =
      absl::UnavailableError("mooncaked was not asked");
  absl::StatusOr<mooncake::v1::Topology> topology =
      absl::UnavailableError("mooncaked was not asked");
};

// The node's topology as mooncaked would discover it, read below
// options.root.
mooncake::v1::Topology LocalTopology(const DoctorOptions& options);

// Runs every check.
DoctorReport RunDoctor(const DoctorOptions& options, const DaemonFacts& daemon);

// Text: one line per check ("  ok    name  detail"), the fix under it, and
// a verdict line. Strings are shown escaped (they come from files anyone
// with a device may name).
std::string FormatDoctor(const DoctorReport& report);
// {"ready": bool, "checks": [{"name", "status", "detail", "fix"}]}, compact.
std::string DoctorJson(const DoctorReport& report);

// Pure helpers, public for tests.
// The ACS control register of a PCI function's config space (the extended
// capability 0x000D), or NotFound when it has none; FailedPrecondition when
// `config` is too short to hold extended capabilities (an unprivileged read
// of sysfs `config` yields 64 or 256 bytes).
absl::StatusOr<uint16_t> AcsControlFromConfig(const std::string& config);
// The soft limit named `what` ("Max locked memory") in a /proc/<pid>/limits
// text: -1 for unlimited; NotFound when absent.
absl::StatusOr<int64_t> SoftLimitFromProcLimits(const std::string& text, const std::string& what);

}  // namespace mooncake::mcctl
