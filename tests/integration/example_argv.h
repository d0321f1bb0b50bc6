#pragma once
// Command lines of `device_transport_example` ranks on the host platform,
// shared by the integration tests and bench/elastic; callers append what
// their scenario adds (--route, --bytes, --expect-rejoins, ...).

#include <string>
#include <vector>

#include "daemon_process.h"

namespace mooncake::testing {

// Rank `rank` of `world_size` in `group`, through the daemon at `socket`.
inline std::vector<std::string> ExampleArgv(const std::string& socket, const std::string& group,
                                            int rank, int world_size) {
  return {BinDir() + "/device_transport_example",
          "--platform",
          "host",
          "--socket",
          socket,
          "--group",
          group,
          "--rank",
          std::to_string(rank),
          "--world-size",
          std::to_string(world_size)};
}

// A rank of the elastic loop (--mode elastic, world size 4).
inline std::vector<std::string> ElasticRankArgv(const std::string& socket, const std::string& group,
                                                int rank, int timeout_ms) {
  std::vector<std::string> argv = ExampleArgv(socket, group, rank, 4);
  argv.insert(argv.end(), {"--mode", "elastic", "--timeout-ms", std::to_string(timeout_ms)});
  return argv;
}

// `argv` run through sh only to send its stderr (where a refused join says
// why) to the stdout Child captures; exec keeps the pid.
inline std::vector<std::string> WithStderr(const std::vector<std::string>& argv) {
  std::vector<std::string> out = {"/bin/sh", "-c", "exec \"$0\" \"$@\" 2>&1"};
  out.insert(out.end(), argv.begin(), argv.end());
  return out;
}

}  // namespace mooncake::testing
