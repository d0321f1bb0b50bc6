#include "config/daemon_config.h"

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "mooncake/common/status.h"

namespace mooncake::daemon {
namespace {

absl::Status ParseU32(absl::string_view key, absl::string_view value, uint32_t lo, uint32_t hi,
                      uint32_t* out) {
  uint32_t v = 0;
  if (!absl::SimpleAtoi(value, &v) || v < lo || v > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat(key, " = '", value, "': expected an integer in [", lo, ", ", hi, "]"));
  }
  *out = v;
  return absl::OkStatus();
}

absl::Status ParseMode(absl::string_view value, uint32_t* out) {
  uint32_t v = 0;
  if (value.empty() || value.size() > 4 ||
      !std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '7'; })) {
    return absl::InvalidArgumentError(
        absl::StrCat("socket_mode = '", value, "': expected an octal mode such as 0660"));
  }
  for (char c : value) v = v * 8 + static_cast<uint32_t>(c - '0');
  if (v > 0777) {
    return absl::InvalidArgumentError(absl::StrCat(
        "socket_mode = '", value, "': setuid, setgid and sticky bits make no sense on a socket"));
  }
  if ((v & 0600) != 0600) {
    return absl::InvalidArgumentError(absl::StrCat(
        "socket_mode = '", value, "': the owner needs read and write (0600) to serve the socket"));
  }
  *out = v;
  return absl::OkStatus();
}

absl::Status Apply(absl::string_view key, absl::string_view value, DaemonConfig* c) {
  if (key == "socket") {
    if (value.empty()) return absl::InvalidArgumentError("socket: empty path");
    c->socket = std::string(value);
  } else if (key == "socket_mode") {
    return ParseMode(value, &c->socket_mode);
  } else if (key == "socket_group") {
    c->socket_group = std::string(value);
  } else if (key == "node_id") {
    c->node_id = std::string(value);
  } else if (key == "log_level") {
    if (!ParseLogLevel(value, &c->log_level)) {
      return absl::InvalidArgumentError(
          absl::StrCat("log_level = '", value, "': expected debug, info, warning or error"));
    }
  } else if (key == "peer_listen") {
    c->peer_listen = std::string(value);
  } else if (key == "sysfs_root") {
    c->sysfs_root = std::string(value);
  } else if (key == "cuda_library") {
    c->cuda_library = std::string(value);
  } else if (key == "join_timeout_ms") {
    return ParseU32(key, value, 1, 3600 * 1000, &c->join_timeout_ms);
  } else if (key == "max_world_size") {
    return ParseU32(key, value, 1, 1 << 20, &c->max_world_size);
  } else if (key == "ticket_ttl_ms") {
    return ParseU32(key, value, 100, 3600 * 1000, &c->ticket_ttl_ms);
  } else if (key == "max_sessions_per_uid") {
    return ParseU32(key, value, 1, 1 << 20, &c->max_sessions_per_uid);
  } else {
    return absl::InvalidArgumentError(absl::StrCat("unknown key '", key, "'"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ParseConfigText(absl::string_view text, absl::string_view origin,
                             DaemonConfig* config) {
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    if (size_t hash = line.find('#'); hash != absl::string_view::npos) line = line.substr(0, hash);
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    size_t eq = line.find('=');
    if (eq == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat(origin, ":", line_no, ": expected 'key = value', got '", line, "'"));
    }
    absl::string_view key = absl::StripAsciiWhitespace(line.substr(0, eq));
    absl::string_view value = absl::StripAsciiWhitespace(line.substr(eq + 1));
    if (absl::Status s = Apply(key, value, config); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(origin, ":", line_no, ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status LoadConfigFile(const std::string& path, DaemonConfig* config) {
  std::ifstream in(path);
  if (!in) return ErrnoStatus(errno, absl::StrCat("cannot read config file ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ParseConfigText(ss.str(), path, config);
}

std::string UsageText() {
  return "usage: mooncaked [--config FILE] [--socket PATH] [--node-id ID]\n"
         "                 [--log-level debug|info|warning|error] [--peer-listen HOST:PORT]\n"
         "                 [--sysfs-root DIR] [--socket-mode MODE] [--cuda-library NAME]\n"
         "                 [--version] [--help]\n"
         "Runs with embedded defaults when no config file is given; flags override the file.\n"
         "Default socket: /run/mooncake/mooncaked.sock (fd channel: <socket>.fd).\n";
}

absl::StatusOr<DaemonConfig> ParseCommandLine(int argc, char** argv, bool* show_help,
                                              bool* show_version) {
  *show_help = false;
  *show_version = false;
  DaemonConfig config;
  std::vector<std::pair<std::string, std::string>> flags;
  std::string config_path;
  static const std::pair<const char*, const char*> kFlagKeys[] = {
      {"--socket", "socket"},
      {"--node-id", "node_id"},
      {"--log-level", "log_level"},
      {"--peer-listen", "peer_listen"},
      {"--sysfs-root", "sysfs_root"},
      {"--socket-mode", "socket_mode"},
      {"--cuda-library", "cuda_library"},
      {"--config", ""}};
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      *show_help = true;
      return config;
    }
    if (arg == "--version") {
      *show_version = true;
      return config;
    }
    std::string value;
    std::string name = arg;
    if (size_t eq = arg.find('='); eq != std::string::npos) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
    }
    const char* key = nullptr;
    for (const auto& [flag, k] : kFlagKeys) {
      if (name == flag) key = k;
    }
    if (key == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown argument '", arg, "'\n", UsageText()));
    }
    if (name == arg) {
      if (i + 1 >= argc) {
        return absl::InvalidArgumentError(absl::StrCat(name, " needs a value\n", UsageText()));
      }
      value = argv[++i];
    }
    if (*key == '\0') {
      config_path = value;
    } else {
      flags.emplace_back(key, value);
    }
  }
  if (!config_path.empty()) MC_RETURN_IF_ERROR(LoadConfigFile(config_path, &config));
  for (const auto& [key, value] : flags) {
    if (absl::Status s = Apply(key, value, &config); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("flag: ", s.message()));
    }
  }
  return config;
}

}  // namespace mooncake::daemon
