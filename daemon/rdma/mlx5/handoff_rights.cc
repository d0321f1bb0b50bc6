#include "rdma/mlx5/handoff_rights.h"

#include <linux/capability.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace mooncake::daemon::mlx5 {

absl::Status CheckHandOffRights() {
  __user_cap_header_struct header{};
  header.version = _LINUX_CAPABILITY_VERSION_3;
  header.pid = 0;
  __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3] = {};
  if (::syscall(SYS_capget, &header, data) != 0) {
    return absl::InternalError(absl::StrCat("capget: ", std::strerror(errno)));
  }
  auto effective = [&](int cap) {
    return (data[CAP_TO_INDEX(cap)].effective & CAP_TO_MASK(cap)) != 0;
  };
  std::vector<std::string> held;
  if (effective(CAP_NET_RAW)) held.push_back("CAP_NET_RAW");
  if (effective(CAP_SYS_RAWIO)) held.push_back("CAP_SYS_RAWIO");
  if (held.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "mooncaked holds ", absl::StrJoin(held, " and "),
      ": a DevX context it opens carries those rights to whoever holds its command fd (raw "
      "packets, flow steering, privileged firmware commands), so the gpu-uar doorbell hand-off is "
      "refused; run the daemon without them (the shipped unit: CapabilityBoundingSet=CAP_CHOWN) "
      "or keep the cpu-assisted doorbell"));
}

}  // namespace mooncake::daemon::mlx5
