// A memfd the client shares with mooncaked: sealed against shrinking and
// growing, mapped shared and read-write here, every page written first so
// that it is in memory and charged to this process (the daemon maps only
// populated memfds: mooncake/common/populate.h). The RDMA control memory
// and the copy agent's channel are made this way.
//
//   MC_ASSIGN_OR_RETURN(PopulatedMemfd m,
//                       CreatePopulatedMemfd("mooncake-copy-agent", bytes, "copy agent channel"));
//   ... m.data ...; ::munmap(m.data, bytes) when done (the caller owns the mapping)
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "mooncake/common/unique_fd.h"

namespace mooncake {

struct PopulatedMemfd {
  UniqueFd fd;
  uint8_t* data = nullptr;  // `bytes` long; the caller unmaps it
};

// `name`: the memfd's name (in /proc/PID/fd); `what`: the words errors use
// for it. The errno of the step that failed, named; nothing is left behind.
absl::StatusOr<PopulatedMemfd> CreatePopulatedMemfd(const char* name, uint64_t bytes,
                                                    absl::string_view what);

}  // namespace mooncake
