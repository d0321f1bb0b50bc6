// Groups across nodes, from one daemon's broker: local ranks join, report
// ready, leave, release vacant ranks, cancel and end, interleaved with what
// the cluster directory delivers in any order: other nodes' records (JSON
// as etcd holds it, parsed by the parser the etcd directory uses, so
// records no daemon would write reach the broker only as that parser lets
// them), records vanishing (a node's lease expired), and the directory's
// answers to this node's claims (claimed, unreachable, refused). Elastic
// groups' re-joins, re-formations and releases across nodes are reached
// through these.
//
// Input: up to 128 operations, each a u8 op, a u8 arg and a u16-length
// chunk. arg & 3 picks one of four client slots (OPEN: arg & 4 picks uid
// kUidB over kUidA); a join or a record names group "c<arg>>4 & 1>" of
// uid kUidA (or kUidB), a rank and a world size (2..4) from the chunk.
// Invariants: no crash and no sanitizer report; every JoinGroup completes
// exactly once with a view of its own group, members by rank; what the
// broker asks the directory names ranks inside the world size and never a
// rank releasing itself; event details are escaped; each uid is charged
// exactly its groups' members; and once every session has ended and every
// other node's record is gone, nothing is left.
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "daemon_core.h"
#include "mooncake/v1/local.pb.h"
#include "peering/etcd_group_directory.h"

namespace mooncake::fuzz {
namespace {

using daemon::ClaimDone;
using daemon::ClaimOutcome;
using daemon::ClusterMember;
using daemon::MemberState;
using daemon::SessionInfo;
using daemon::ValidatedJoin;

enum Op {
  kOpen,
  kJoin,
  kReady,
  kLeave,
  kRelease,
  kCancel,
  kEnd,
  kEvents,
  kRecord,
  kRecordGone,
  kAnswer,
  kList,
  kOps
};

constexpr size_t kSlots = 4;
constexpr size_t kMaxOps = 128;

using Key = std::tuple<uint32_t, std::string, std::string>;  // uid, tenant, group

// The directory as the broker sees it: claims wait here until the input
// answers them; other nodes' records are what the input published.
class FakeDirectory final : public daemon::GroupDirectory {
 public:
  struct Pending {
    Key group;
    uint32_t rank = 0;
    bool vacant = false;
    ClaimDone done;
  };

  void Claim(uint32_t uid, const std::string& tenant, const std::string& group,
             const ClusterMember& me, ClaimDone done) override {
    Add(uid, tenant, group, me, false, std::move(done));
  }
  void ClaimVacant(uint32_t uid, const std::string& tenant, const std::string& group,
                   const ClusterMember& me, ClaimDone done) override {
    Add(uid, tenant, group, me, true, std::move(done));
  }
  void MarkState(uint32_t, const std::string&, const std::string&, uint32_t rank, MemberState,
                 uint64_t) override {
    FUZZ_CHECK(rank < 65536, "MarkState of rank ", rank);
  }
  void Release(uint32_t, const std::string&, const std::string& group, uint32_t rank,
               uint32_t released_rank, uint64_t, std::shared_ptr<const v1::RdmaEndpoint>) override {
    FUZZ_CHECK(rank != released_rank, "rank ", rank, " of '", group, "' released itself");
  }
  void Withdraw(uint32_t uid, const std::string& tenant, const std::string& group,
                uint32_t rank) override {
    // A pending claim of the rank is dropped, as the etcd directory does.
    absl::MutexLock lock(&mu_);
    const Key k{uid, tenant, group};
    for (auto it = pending_.begin(); it != pending_.end();) {
      it = it->group == k && it->rank == rank ? pending_.erase(it) : std::next(it);
    }
  }
  std::vector<ClusterMember> RemoteMembers(uint32_t uid, const std::string& tenant,
                                           const std::string& group) const override {
    absl::MutexLock lock(&mu_);
    std::vector<ClusterMember> out;
    auto g = records_.find(Key{uid, tenant, group});
    if (g == records_.end()) return out;
    for (const auto& [rank, m] : g->second) out.push_back(m);
    return out;
  }
  std::string Trouble() const override { return ""; }

  // The input's side.
  std::optional<Pending> TakePending(size_t pick, bool keep) {
    absl::MutexLock lock(&mu_);
    if (pending_.empty()) return std::nullopt;
    auto it = pending_.begin() + static_cast<std::ptrdiff_t>(pick % pending_.size());
    Pending p = *it;
    if (!keep) pending_.erase(it);
    return p;
  }
  // Returns whether the broker must hear of it (a record that changed).
  bool Publish(const Key& group, uint32_t rank, std::optional<ClusterMember> m) {
    absl::MutexLock lock(&mu_);
    auto& ranks = records_[group];
    if (!m) {
      const bool had = ranks.erase(rank) != 0;
      if (ranks.empty()) records_.erase(group);
      return had;
    }
    ranks.insert_or_assign(rank, *std::move(m));
    return true;
  }
  std::vector<std::pair<Key, uint32_t>> AllRecords() {
    absl::MutexLock lock(&mu_);
    std::vector<std::pair<Key, uint32_t>> out;
    for (const auto& [g, ranks] : records_) {
      for (const auto& [r, m] : ranks) out.emplace_back(g, r);
    }
    return out;
  }
  void DropPending() {
    absl::MutexLock lock(&mu_);
    pending_.clear();
  }

 private:
  void Add(uint32_t uid, const std::string& tenant, const std::string& group,
           const ClusterMember& me, bool vacant, ClaimDone done) {
    FUZZ_CHECK(me.world_size >= 1 && me.rank < me.world_size, "a claim of rank ", me.rank, " of ",
               me.world_size);
    absl::MutexLock lock(&mu_);
    pending_.emplace_back(Pending{Key{uid, tenant, group}, me.rank, vacant, std::move(done)});
  }

  mutable absl::Mutex mu_;
  std::vector<Pending> pending_ ABSL_GUARDED_BY(mu_);
  std::map<Key, std::map<uint32_t, ClusterMember>> records_ ABSL_GUARDED_BY(mu_);
};

// What a chunk says about a group: its name, rank and world size.
struct Target {
  uint32_t uid;
  std::string group;
  uint32_t world_size;
  uint32_t rank;
};

Target TargetOf(uint8_t arg, absl::string_view bytes) {
  const uint8_t b0 = bytes.empty() ? 0 : static_cast<uint8_t>(bytes[0]);
  Target t;
  t.uid = (arg & 0x40) ? kUidB : kUidA;
  t.group = absl::StrCat("c", (arg >> 4) & 1);
  t.world_size = 2 + (b0 & 3) % 3;
  t.rank = (b0 >> 2) % 5;  // one past the largest world size: out of range too
  return t;
}

// Another node's record of `t`'s rank from the chunk: raw JSON when it
// starts with '{', else one built from its bytes (states, epochs, releases
// and RDMA endpoints in and out of range).
std::string RecordJson(const Target& t, absl::string_view bytes) {
  if (!bytes.empty() && bytes[0] == '{') return std::string(bytes);
  auto at = [&bytes](size_t i) { return i < bytes.size() ? static_cast<uint8_t>(bytes[i]) : 0; };
  static const char* kStates[] = {"JOINED", "READY", "FAILED", "LEFT", "LOST", "JOINING"};
  std::string json =
      absl::StrCat(R"({"node_id":")", (at(1) & 1) ? "node-c" : "node-b", R"(","pid":)", 100 + at(2),
                   R"(,"world_size":)", t.world_size,
                   R"(,"gpu_index":-1,"handle_kind":"memfd","handle_size":4096)", R"(,"state":")",
                   kStates[at(3) % 6], R"(","epoch":")", at(4) % 4, R"(")");
  if (at(5) & 1) {
    absl::StrAppend(&json, R"(,"released":[)");
    for (size_t i = 0; i < static_cast<size_t>((at(5) >> 1) % 4); ++i) {
      absl::StrAppend(&json, i ? "," : "", R"({"rank":)", at(6 + i) % 5, R"(,"epoch":")",
                      at(6 + i) / 5 % 4, R"("})");
    }
    absl::StrAppend(&json, "]");
  }
  if (at(5) & 0x20) {
    absl::StrAppend(&json, R"(,"rdma":{"raddr":"4096","rkey":7,"qps_per_peer":1,"qpns":[)");
    const uint32_t n = (at(5) & 0x40) ? t.world_size : t.world_size + 1;  // wrong shape too
    for (uint32_t i = 0; i < n; ++i) absl::StrAppend(&json, i ? "," : "", 0x100 + i);
    absl::StrAppend(&json, R"(],"nic":"softnic0"})");
  }
  return json + "}";
}

class Script {
 public:
  Script(DaemonCore& core, FakeDirectory& directory) : core_(core), directory_(directory) {}

  void Run(ByteReader& in) {
    for (size_t n = 0; n < kMaxOps && !in.empty(); ++n) {
      const auto op = static_cast<Op>(in.U8() % kOps);
      const uint8_t arg = in.U8();
      Step(op, arg, in.Chunk());
    }
  }

  // Every claim still waiting is dropped (the sessions end next) and every
  // other node's record goes (their leases expire): nothing may be left.
  void Finish() {
    directory_.DropPending();
    for (const auto& [group, rank] : directory_.AllRecords()) {
      directory_.Publish(group, rank, std::nullopt);
      core_.broker.RemoteChanged(std::get<0>(group), std::get<1>(group), std::get<2>(group), rank,
                                 std::nullopt);
    }
    core_.Finish();
  }

 private:
  void Step(Op op, uint8_t arg, absl::string_view bytes) {
    Slot& slot = slots_[arg % kSlots];
    const Target t = TargetOf(arg, bytes);
    switch (op) {
      case kOpen: {
        if (slot && core_.sessions.Find(slot->id)) return;
        absl::StatusOr<SessionInfo> s = core_.Open((arg & 4) ? kUidB : kUidA);
        if (s.ok()) slot = *s;
        return;
      }
      case kRecord: {
        if (t.rank >= t.world_size) return;  // the etcd directory drops such keys
        absl::StatusOr<ClusterMember> m =
            daemon::peering::ParseGroupRankRecord(RecordJson(t, bytes), t.rank);
        if (!m.ok()) return;
        const Key group{t.uid, "", t.group};
        if (directory_.Publish(group, t.rank, *m)) {
          core_.broker.RemoteChanged(t.uid, "", t.group, t.rank, *std::move(m));
        }
        return;
      }
      case kRecordGone: {
        if (directory_.Publish(Key{t.uid, "", t.group}, t.rank, std::nullopt)) {
          core_.broker.RemoteChanged(t.uid, "", t.group, t.rank, std::nullopt);
        }
        return;
      }
      case kAnswer: {
        const uint8_t how = bytes.empty() ? 0 : static_cast<uint8_t>(bytes[0]) % 3;
        std::optional<FakeDirectory::Pending> p = directory_.TakePending(arg, /*keep=*/how == 1);
        if (!p) return;
        if (how == 0) p->done(ClaimOutcome::kClaimed, absl::OkStatus());
        if (how == 1) p->done(ClaimOutcome::kUnreachable, absl::UnavailableError("etcd away"));
        if (how == 2) {
          p->done(ClaimOutcome::kFailed,
                  absl::AlreadyExistsError("already taken by pid 7 on node node-b"));
        }
        return;
      }
      case kList: return List();
      default: break;
    }
    if (!slot) return;
    const SessionInfo& me = *slot;
    switch (op) {
      case kJoin: {
        v1::JoinGroupRequest r;
        r.set_group(t.group);
        r.set_rank(t.rank);
        r.set_world_size(t.world_size);
        r.set_timeout_ms(0);  // never decided by the clock (daemon_core.h)
        r.mutable_handle()->set_kind("memfd");
        r.mutable_handle()->set_data("h");
        r.mutable_handle()->set_size(4096);
        if (bytes.size() > 1 && (bytes[1] & 1)) {
          v1::RdmaEndpoint* e = r.mutable_rdma();
          e->set_raddr(4096);
          e->set_rkey(9);
          e->set_qps_per_peer(1);
          for (uint32_t i = 0; i < t.world_size; ++i) e->add_qpns(0x200 + i);
        }
        absl::StatusOr<ValidatedJoin> join = core_.broker.ValidateJoin(r);
        if (!join.ok()) return;
        // The uid of a join is its session's: a record names the group of
        // either uid, so both are reached.
        core_.StartJoin(me, *std::move(join), nullptr);
        return;
      }
      case kReady: {
        v1::ReportReadyRequest r;
        r.set_group(t.group);
        r.set_rank(t.rank);
        r.set_ok(bytes.size() < 2 || (bytes[1] & 1) == 0);
        r.set_detail("peer \x01 failed");
        core_.broker.ReportReady(me, r).IgnoreError();
        return;
      }
      case kLeave: core_.broker.Leave(me, t.group, t.rank).IgnoreError(); return;
      case kCancel: core_.broker.CancelJoin(me, t.group, t.rank); return;
      case kRelease: {
        v1::ReleaseRankRequest r;
        r.set_group(t.group);
        r.set_rank(t.rank);
        r.set_released_rank(bytes.size() > 1 ? static_cast<uint8_t>(bytes[1]) % 5 : 0);
        if (bytes.size() > 2 && (bytes[2] & 1)) {
          v1::RdmaEndpoint* e = r.mutable_rdma();
          e->set_qps_per_peer(1 + (static_cast<uint8_t>(bytes[2]) >> 1) % 2);
          for (uint32_t i = 0; i < t.world_size * e->qps_per_peer(); ++i) e->add_qpns(0x300 + i);
        }
        core_.broker.ReleaseRank(me, r).IgnoreError();
        return;
      }
      case kEnd: core_.lifecycle.End(me.id); return;
      case kEvents: CheckEvents(core_, me.id); return;
      default: return;
    }
  }

  // Admin listings and the per-uid accounting, as broker_fuzzer checks them.
  void List() {
    for (uint32_t uid : {kUidA, kUidB}) {
      uint64_t members = 0;
      for (const daemon::GroupSummary& g : core_.broker.List(uid, false)) {
        FUZZ_CHECK(g.uid == uid, "uid ", uid, " is shown a group of uid ", g.uid);
        for (const daemon::GroupMemberSummary& m : g.members) {
          FUZZ_CHECK(m.rank < g.world_size, "rank ", m.rank, " of ", g.world_size);
          CheckEscaped(m.node_id, 256);
        }
        for (const daemon::GroupMemberSummary& m : g.members) members += m.node_id.empty();
      }
      FUZZ_CHECK(core_.broker.UsageOf(daemon::Principal{uid, ""}).ranks == members, "uid ", uid,
                 " is charged ", core_.broker.UsageOf(daemon::Principal{uid, ""}).ranks,
                 " ranks for ", members, " local members");
    }
  }

  using Slot = std::optional<SessionInfo>;
  DaemonCore& core_;
  FakeDirectory& directory_;
  Slot slots_[kSlots];
};

FakeDirectory& Directory() {
  static FakeDirectory* d = new FakeDirectory();  // outlives the broker (never destroyed)
  return *d;
}

}  // namespace
}  // namespace mooncake::fuzz

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  mooncake::fuzz::QuietLogs();
  mooncake::fuzz::DaemonCore::Get().broker.set_directory(&mooncake::fuzz::Directory());
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mooncake::fuzz;
  RunLeakChecked([&] {
    ByteReader in(data, size);
    Script script(DaemonCore::Get(), Directory());
    script.Run(in);
    script.Finish();
  });
  return 0;
}
