#include "elastic_run.h"

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "mooncake/device/comm_device.h"
#if MOONCAKE_EXAMPLE_HAVE_CUDA
#include "elastic_cuda.h"
#endif

namespace mooncake::example {
namespace {

using device::McCmp;
using device::McStatus;

// A wait on one peer's flag gives up after this and the loop polls events:
// a lost peer never hangs the loop (its LOST event takes it out).
constexpr uint64_t kWaitSliceNs = 200'000;

int64_t NowUs() {
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000 + ts.tv_nsec / 1000;
}

// The host platform: the buffer is mapped here, so the loop's thread stages,
// puts and checks with plain CPU loads and stores through the Device API's
// host implementation.
class HostPath final : public ElasticDataPath {
 public:
  HostPath(const device::CommCtx& ctx, void* buffer, ElasticLayout at)
      : ctx_(ctx), buf_(static_cast<uint8_t*>(buffer)), at_(at), msg_(at.msg) {}

  PathResult Send(int dst, uint64_t seq, std::string* why) override {
    const device::McPeer peer = device::mc_peer(ctx_, dst);
    for (size_t i = 0; i < at_.msg; ++i) msg_[i] = ElasticByte(i, ctx_.rank, dst, seq);
    uint8_t* inbox = buf_ + at_.Inbox(ctx_.rank, seq);  // symmetric: my inbox at dst
    const void* from = msg_.data();
    if (device::mc_peer_is_rdma(peer)) {
      // The NIC reads registered memory, later: stage in this rank's outbox.
      std::memcpy(buf_ + at_.Outbox(dst), msg_.data(), at_.msg);
      from = buf_ + at_.Outbox(dst);
    }
    McStatus st = device::mc_put_thread(peer, inbox, from, at_.msg);
    if (st == McStatus::kOk) st = device::mc_signal(peer, Flag(ctx_.rank), seq);
    if (st == McStatus::kOk && device::mc_peer_is_rdma(peer)) st = device::mc_qp_quiet(peer.qp);
    if (st != McStatus::kOk) {
      *why = absl::StrCat("sending #", seq, " to rank ", dst, " failed (status ",
                          static_cast<int>(st), ")");
      return PathResult::kPeerFailed;
    }
    return PathResult::kOk;
  }

  PathResult WaitFlag(int src, uint64_t want, uint64_t timeout_ns, std::string*) override {
    uint64_t seen = 0;
    return device::mc_wait_until_for(Flag(src), McCmp::kGe, want, timeout_ns, &seen)
               ? PathResult::kOk
               : PathResult::kNotYet;
  }

  PathResult CheckInbox(int src, uint64_t seq, uint64_t* bad, std::string*) override {
    const uint8_t* inbox = buf_ + at_.Inbox(src, seq);
    uint64_t wrong = 0;
    for (size_t i = 0; i < at_.msg; ++i) wrong += inbox[i] != ElasticByte(i, src, ctx_.rank, seq);
    *bad = wrong;
    return PathResult::kOk;
  }

  PathResult ZeroFlag(int src, std::string*) override {
    __atomic_store_n(Flag(src), uint64_t{0}, __ATOMIC_RELEASE);
    return PathResult::kOk;
  }

 private:
  uint64_t* Flag(int src) { return reinterpret_cast<uint64_t*>(buf_ + FlagOffset(src)); }

  const device::CommCtx& ctx_;  // Communicator::ctx(): handleEvent updates it
  uint8_t* const buf_;
  const ElasticLayout at_;
  std::vector<uint8_t> msg_;
};

class ElasticLoop {
 public:
  ElasticLoop(Communicator& comm, const ElasticOptions& o, ElasticDataPath& path)
      : comm_(comm),
        o_(o),
        path_(path),
        n_(comm.worldSize()),
        me_(comm.rank()),
        sent_(n_, 0),
        received_(n_, 0),
        admitted_(n_, false) {}

  RunResult Run();

 private:
  void Say(const std::string& line) {
    std::cout << "rank " << me_ << ": " << line << " t=" << NowUs() << std::endl;
  }
  // Drains pending events; false (with the reason in *why) when the run
  // cannot go on.
  bool PollEvents(absl::Duration wait, std::string* why);
  std::set<int> ActivePeers() const {
    std::set<int> out;
    for (int r = 0; r < n_; ++r) {
      if (r != me_ && comm_.peerActive(r)) out.insert(r);
    }
    return out;
  }

  Communicator& comm_;
  const ElasticOptions o_;
  ElasticDataPath& path_;
  const int n_, me_;
  std::vector<uint64_t> sent_, received_;
  std::vector<bool> admitted_;  // replacement not yet exchanged with
  int rejoins_ = 0;
  int degraded_rounds_ = -1;  // >= 0 while counting after a loss
  std::vector<int> lost_;
};

bool ElasticLoop::PollEvents(absl::Duration wait, std::string* why) {
  for (std::optional<SessionEvent> ev = comm_.client().nextEvent(wait); ev;
       ev = comm_.client().nextEvent(absl::ZeroDuration())) {
    using K = SessionEvent::Kind;
    if (ev->kind == K::kDaemonShutdown || ev->kind == K::kDisconnected) {
      *why = absl::StrCat("lost the daemon: ", ev->detail);
      return false;
    }
    const int r = static_cast<int>(ev->rank);
    if (ev->kind == K::kLost || ev->kind == K::kLeft) {
      Say(absl::StrCat(ev->kind == K::kLost ? "LOST" : "LEFT", " rank ", r));
      if (absl::Status s = comm_.handleEvent(*ev); !s.ok()) {
        *why = std::string(s.message());
        return false;
      }
      // Nothing more comes from the old process; its replacement starts
      // the pair's count again.
      sent_[r] = received_[r] = 0;
      if (path_.ZeroFlag(r, why) != PathResult::kOk) return false;
      Say(absl::StrCat("RELEASED rank ", r));
      if (ev->kind == K::kLost) {
        lost_.push_back(r);
        degraded_rounds_ = 0;
      }
    } else if (ev->kind == K::kJoined) {
      if (absl::Status s = comm_.handleEvent(*ev); !s.ok()) {
        *why = std::string(s.message());
        return false;
      }
      admitted_[r] = true;
      ++rejoins_;
      Say(absl::StrCat("ADMITTED rank ", r, " epoch ", ev->epoch));
    }
  }
  return true;
}

RunResult ElasticLoop::Run() {
  RunResult result;
  const int needed = comm_.epoch() > 1 ? 0 : o_.expect_rejoins;
  if (comm_.epoch() > 1) {
    // A replacement: every peer is new to it as it is to them.
    for (int r = 0; r < n_; ++r) admitted_[r] = r != me_;
  }
  int rdma_peers = 0;
  for (int r = 0; r < n_; ++r) rdma_peers += comm_.rdmaPeer(r) ? 1 : 0;
  Say(absl::StrCat("START epoch ", comm_.epoch(), " rdma_peers ", rdma_peers));
  int full_rounds = 0;
  uint64_t round = 0;
  std::string why;
  for (;;) {
    ++round;
    if (!PollEvents(absl::ZeroDuration(), &why)) break;
    std::set<int> peers = ActivePeers();
    // Sends: a failure to a peer is expected when it was just lost; its
    // LOST event takes it out of the round.
    std::set<int> waiting;
    std::map<int, std::string> send_failed;
    bool failed = false;
    for (int step = 1; step < n_ && !failed; ++step) {
      const int dst = (me_ + step) % n_;
      if (peers.count(dst) == 0) continue;
      std::string send_error;
      switch (path_.Send(dst, ++sent_[dst], &send_error)) {
        case PathResult::kOk: break;
        case PathResult::kBroken:
          why = send_error;
          failed = true;
          break;
        default: send_failed[dst] = send_error;
      }
      waiting.insert(dst);
    }
    // Receives, in slices: a wait on a lost rank comes back with a status
    // (mc_wait_until_for) and the host handles the event.
    int64_t stalled_since = NowUs();
    while (!failed && !waiting.empty()) {
      bool progress = false;
      for (auto it = waiting.begin(); it != waiting.end();) {
        const int src = *it;
        if (!comm_.peerActive(src)) {  // lost meanwhile
          it = waiting.erase(it);
          continue;
        }
        const uint64_t want = received_[src] + 1;
        const PathResult waited = path_.WaitFlag(src, want, kWaitSliceNs, &why);
        if (waited == PathResult::kNotYet) {
          ++it;
          continue;
        }
        uint64_t bad = 0;
        if (waited != PathResult::kOk ||
            path_.CheckInbox(src, want, &bad, &why) != PathResult::kOk) {
          failed = true;
          break;
        }
        if (bad != 0) {
          result.bad_bytes += bad;
          why = absl::StrCat(bad, " of ", o_.msg_bytes, " bytes wrong in message #", want,
                             " from rank ", src);
          failed = true;
          break;
        }
        received_[src] = want;
        progress = true;
        it = waiting.erase(it);
      }
      if (failed) break;
      if (progress) stalled_since = NowUs();
      if (waiting.empty()) break;
      if (!PollEvents(absl::ZeroDuration(), &why)) {
        failed = true;
        break;
      }
      if (static_cast<uint64_t>(NowUs() - stalled_since) * 1000 > o_.timeout_ns) {
        why = absl::StrCat("timed out waiting for ranks ", absl::StrJoin(waiting, ","),
                           " (no message and no LOST event)");
        failed = true;
        break;
      }
    }
    // A send that failed is fine only for a peer that is gone: its LOST
    // (or LEFT) event may come after the failure, so wait for it.
    const int64_t grace_from = NowUs();
    while (!failed) {
      auto still = std::find_if(send_failed.begin(), send_failed.end(),
                                [this](const auto& kv) { return comm_.peerActive(kv.first); });
      if (still == send_failed.end()) break;
      if (static_cast<uint64_t>(NowUs() - grace_from) * 1000 > o_.timeout_ns) {
        why = still->second + " and the rank was not reported lost";
        failed = true;
        break;
      }
      if (!PollEvents(absl::Milliseconds(5), &why)) failed = true;
    }
    if (failed) {
      if (why.empty()) why = "exchange failed";
      break;
    }
    for (int r : peers) {
      if (admitted_[r] && comm_.peerActive(r)) {
        admitted_[r] = false;
        Say(absl::StrCat("EXCHANGED rank ", r, " epoch ", comm_.epoch()));
      }
    }
    const std::set<int> now = ActivePeers();
    const bool full = static_cast<int>(now.size()) == n_ - 1 && now == peers;
    if (degraded_rounds_ >= 0 && !full && ++degraded_rounds_ == o_.degraded_report_rounds) {
      std::vector<int> active = {me_};
      active.insert(active.end(), now.begin(), now.end());
      std::sort(active.begin(), active.end());
      Say(absl::StrCat("DEGRADED-OK active ", absl::StrJoin(active, ","), " rounds ",
                       degraded_rounds_));
    }
    if (full) degraded_rounds_ = -1;
    // Rounds count once the awaited replacements are in; ranks that
    // finished and left shrink the group (LEFT), they do not stop it.
    if (rejoins_ >= needed) ++full_rounds;
    if (rejoins_ >= needed && full_rounds >= o_.rounds) {
      result.ok = true;
      result.message = absl::StrCat(round, " rounds, ", rejoins_,
                                    " replacement(s) admitted, epoch ", comm_.epoch());
      return result;
    }
    if (o_.interval_us > 0) ::usleep(static_cast<useconds_t>(o_.interval_us));
  }
  result.message = why;
  return result;
}

}  // namespace

RunResult RunElastic(Communicator& comm, const ElasticOptions& options, ElasticDataPath& path) {
  return ElasticLoop(comm, options, path).Run();
}

RunResult RunElasticHost(Communicator& comm, const ElasticOptions& options) {
  HostPath path(comm.ctx(), comm.buffer(), ElasticLayout{options.msg_bytes, comm.worldSize()});
  return RunElastic(comm, options, path);
}

RunResult RunElasticCuda(Communicator& comm, const ElasticOptions& options) {
#if MOONCAKE_EXAMPLE_HAVE_CUDA
  std::string error;
  std::unique_ptr<ElasticDataPath> path = MakeCudaElasticPath(
      comm.ctx(), comm.buffer(), ElasticLayout{options.msg_bytes, comm.worldSize()}, &error);
  if (path == nullptr) {
    RunResult r;
    r.message = error;
    return r;
  }
  return RunElastic(comm, options, *path);
#else
  (void)comm;
  (void)options;
  RunResult r;
  r.message = "this build has no CUDA support (rebuild with the CUDA toolkit)";
  return r;
#endif
}

}  // namespace mooncake::example
