#include "host_run.h"

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "mooncake/device/comm_device.h"
#include "mooncake/device/host_coop.h"

namespace mooncake::example {
namespace {

using device::McCmp;
using device::McStatus;

// A "warp" of host threads copies, as a GPU warp would with mc_put_warp.
constexpr unsigned kCopyThreads = 4;

const char* StatusText(McStatus s) {
  switch (s) {
    case McStatus::kOk: return "ok";
    case McStatus::kInvalidRank: return "invalid rank";
    case McStatus::kNoRoute: return "no route (neither P2P nor an RDMA queue pair)";
    case McStatus::kRdmaError: return "RDMA error completion (mcctl qps shows the syndrome)";
    case McStatus::kTimedOut: return "RDMA queue pair made no progress (timed out)";
    case McStatus::kNotRegistered: return "source outside the registered buffer";
  }
  return "unknown status";
}

// Over RDMA the NIC reads the source later and only from registered
// memory: the message is staged in this rank's own slot of its buffer
// (never written by peers), and the put completed (mc_quiet) before the
// slot is reused.
McStatus PutMessage(const device::CommCtx& ctx, uint8_t* buf, int dst, size_t msg_bytes,
                    const std::vector<uint8_t>& src) {
  const device::McPeer peer = device::mc_peer(ctx, dst);
  const uint8_t* from = src.data();
  uint8_t* own_slot = buf + SlotOffset(msg_bytes, ctx.rank);
  if (device::mc_peer_is_rdma(peer)) {
    if (McStatus q = device::mc_quiet(ctx); q != McStatus::kOk) return q;
    std::memcpy(own_slot, src.data(), msg_bytes);
    from = own_slot;
  }
  McStatus st = McStatus::kOk;
  device::host::runWarp(kCopyThreads, [&](unsigned lane) {
    McStatus s = device::mc_put_warp(peer, own_slot, from, msg_bytes, lane);
    if (lane == 0) st = s;
  });
  return st;
}

uint64_t CheckSlot(const uint8_t* buf, size_t msg_bytes, int src, int dst) {
  const uint8_t* slot = buf + SlotOffset(msg_bytes, src);
  uint64_t bad = 0;
  for (size_t i = 0; i < msg_bytes; ++i) bad += (slot[i] != PatternByte(i, src, dst));
  return bad;
}

std::vector<uint8_t> MakeMessage(size_t msg_bytes, int src, int dst) {
  std::vector<uint8_t> m(msg_bytes);
  for (size_t i = 0; i < msg_bytes; ++i) m[i] = PatternByte(i, src, dst);
  return m;
}

}  // namespace

RunResult RunPairHost(const device::CommCtx& ctx, void* buffer, size_t msg_bytes,
                      uint64_t timeout_ns) {
  auto* buf = static_cast<uint8_t*>(buffer);
  RunResult r;
  if (ctx.rank == 0) {
    std::vector<uint8_t> msg = MakeMessage(msg_bytes, 0, 1);
    if (McStatus s = PutMessage(ctx, buf, 1, msg_bytes, msg); s != McStatus::kOk) {
      r.message = absl::StrCat("mc_put_warp to rank 1 failed: ", StatusText(s));
      return r;
    }
    // Release: rank 1 sees every byte once it sees the flag.
    auto* flag = reinterpret_cast<uint64_t*>(buf + FlagOffset(0));
    McStatus s = device::mc_signal(ctx, 1, flag, uint64_t{1});
    // Over RDMA the WQEs must complete before this process (and its QPs) go.
    if (s == McStatus::kOk) s = device::mc_quiet(ctx);
    if (s != McStatus::kOk) {
      r.message = absl::StrCat("signalling rank 1 failed: ", StatusText(s));
      return r;
    }
    r.ok = true;
    r.message = absl::StrCat("rank 0 wrote ", msg_bytes, " bytes to rank 1 and signalled");
    return r;
  }
  if (ctx.rank == 1) {
    const auto* flag = reinterpret_cast<const uint64_t*>(buf + FlagOffset(0));
    uint64_t seen = 0;
    if (!device::mc_wait_until_for(flag, McCmp::kGe, uint64_t{1}, timeout_ns, &seen)) {
      r.message = "timed out waiting for rank 0's signal";
      return r;
    }
    r.bad_bytes = CheckSlot(buf, msg_bytes, 0, 1);
    r.ok = r.bad_bytes == 0;
    r.message = r.ok ? absl::StrCat("rank 1 received ", msg_bytes, " bytes, all correct")
                     : absl::StrCat(r.bad_bytes, " of ", msg_bytes, " bytes wrong");
    return r;
  }
  r.ok = true;
  r.message = absl::StrCat("rank ", ctx.rank, " idle in pair mode");
  return r;
}

RunResult RunAllToAllHost(const device::CommCtx& ctx, void* buffer, size_t msg_bytes,
                          uint64_t timeout_ns) {
  auto* buf = static_cast<uint8_t*>(buffer);
  auto* counter = reinterpret_cast<uint64_t*>(buf + CounterOffset());
  RunResult r;
  for (int step = 1; step < ctx.num_ranks; ++step) {
    // Staggered order so every rank does not hit rank 0 first.
    int dst = (ctx.rank + step) % ctx.num_ranks;
    std::vector<uint8_t> msg = MakeMessage(msg_bytes, ctx.rank, dst);
    if (McStatus s = PutMessage(ctx, buf, dst, msg_bytes, msg); s != McStatus::kOk) {
      r.message = absl::StrCat("mc_put_warp to rank ", dst, " failed: ", StatusText(s));
      return r;
    }
    // Orders the put before the add; mc_red_add is an atomic add on every path.
    device::mc_fence();
    if (McStatus s = device::mc_red_add(ctx, dst, counter, uint64_t{1}); s != McStatus::kOk) {
      r.message = absl::StrCat("mc_red_add to rank ", dst, " failed: ", StatusText(s));
      return r;
    }
  }
  if (McStatus s = device::mc_quiet(ctx); s != McStatus::kOk) {
    r.message = absl::StrCat("mc_quiet failed: ", StatusText(s));
    return r;
  }
  uint64_t seen = 0;
  const uint64_t want = static_cast<uint64_t>(ctx.num_ranks - 1);
  if (!device::mc_wait_until_for(counter, McCmp::kGe, want, timeout_ns, &seen)) {
    r.message = absl::StrCat("timed out with ", seen, " of ", want, " arrivals");
    return r;
  }
  for (int src = 0; src < ctx.num_ranks; ++src) {
    if (src != ctx.rank) r.bad_bytes += CheckSlot(buf, msg_bytes, src, ctx.rank);
  }
  r.ok = r.bad_bytes == 0 && seen == want;
  r.message =
      r.ok ? absl::StrCat("received ", want, " messages of ", msg_bytes, " bytes, all correct")
           : absl::StrCat(r.bad_bytes, " bytes wrong, ", seen, " arrivals");
  return r;
}

}  // namespace mooncake::example
