#pragma once
// The command line of one `device_transport_example --mode elastic` rank on
// the host platform (world size 4), shared by the elastic tests and
// bench/elastic; callers append what their scenario adds (--route,
// --expect-rejoins, --rounds, ...).

#include <string>
#include <vector>

#include "daemon_process.h"

namespace mooncake::testing {

inline std::vector<std::string> ElasticRankArgv(const std::string& socket, const std::string& group,
                                                int rank, int timeout_ms) {
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
          "4",
          "--mode",
          "elastic",
          "--timeout-ms",
          std::to_string(timeout_ms)};
}

}  // namespace mooncake::testing
