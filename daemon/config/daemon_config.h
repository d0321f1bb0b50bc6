// mooncaked configuration: embedded defaults, an optional `key = value`
// file (deploy/mooncaked.conf.example documents every key), then flags.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "mooncake/common/log.h"

namespace mooncake::daemon {

struct DaemonConfig {
  std::string socket = "/run/mooncake/mooncaked.sock";
  uint32_t socket_mode = 0660;
  std::string socket_group;  // empty: leave the daemon's group
  std::string node_id;       // empty: hostname
  LogLevel log_level = LogLevel::kInfo;
  std::string peer_listen;  // host:port; empty: no peer server
  std::string sysfs_root = "/sys";
  std::string cuda_library = "libcuda.so.1";
  uint32_t join_timeout_ms = 30000;  // JoinGroup default deadline
  uint32_t max_world_size = 65536;
  uint32_t ticket_ttl_ms = 30000;
  uint32_t max_sessions_per_uid = 4096;
};

// Parses the text of a config file into `config` (keys not present keep
// their value). Errors name the line and the key.
absl::Status ParseConfigText(absl::string_view text, absl::string_view origin,
                             DaemonConfig* config);
absl::Status LoadConfigFile(const std::string& path, DaemonConfig* config);

// Parses argv: --config FILE is applied first, then the other flags
// (--socket, --node-id, --log-level, --peer-listen, --sysfs-root,
// --socket-mode, --cuda-library). Returns the usage text in an InvalidArgument on error;
// sets *show_help for --help and *show_version for --version.
absl::StatusOr<DaemonConfig> ParseCommandLine(int argc, char** argv, bool* show_help,
                                              bool* show_version);

std::string UsageText();

}  // namespace mooncake::daemon
