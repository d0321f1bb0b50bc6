// mc_abuse rdma-flood: one user makes mooncaked hold as many queue pairs and
// memory regions as it will, over several sessions (see mc_abuse.cc).
#pragma once

#include <cstdint>
#include <string>

namespace mooncake::abuse {

struct RdmaFloodOptions {
  uint32_t sessions = 1;
  uint32_t hold_ms = 0;         // sessions held open this long after the flood
  uint32_t qps_per_call = 256;  // per CreateQueuePairs (the daemon allows 4096)
  uint64_t region_bytes = 1 << 20;
  uint64_t region_offset = 0;  // into a memfd of offset + bytes
  // The region memfd is left sparse instead of written whole: the daemon
  // must refuse it (it registers only memfds whose every page holds data),
  // and an attacker cannot make it hold a terabyte it never allocated. A
  // populated memfd at a terabyte's offset would exhaust the attacker's
  // own machine first.
  bool sparse_regions = false;
  // Per session, stop here instead of at the first refusal (a victim that
  // wants a few QPs, not a flood).
  uint32_t max_qps = UINT32_MAX;
  uint32_t max_mrs = UINT32_MAX;
  bool connect = false;  // connect each QP (to itself): the provider polls it
};

// Prints "flooded ..." once the daemon refused every session, holds, then
// "refused <rpc>: ..." for the last refusal of each RPC and one "result
// attack=rdma-flood ..." line; the sessions close when it returns.
int RdmaFlood(const std::string& socket, const RdmaFloodOptions& options);

}  // namespace mooncake::abuse
