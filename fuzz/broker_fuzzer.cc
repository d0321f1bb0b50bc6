// Sequences of RPCs from several clients against the daemon's core
// (daemon_core.h): sessions open and end, join and leave groups, report
// readiness, cancel joins, PUT fds, export, import and redeem tickets, in
// any order, the way LocalService and the fd channel drive the real
// SessionRegistry, FdBroker and GroupBroker.
//
// Input: up to 128 operations, each a u8 op, a u8 arg, a u16 length and that
// many bytes (a serialized request where the op takes one). arg & 3 picks
// one of four client slots; for OPEN, arg & 4 picks uid kUidB over kUidA
// and arg & 8 root; for PUT and GET, arg >> 4 is a count or an index. In a
// request, "@k" names the slot's k-th PUT ticket (fd_ticket) or the run's
// k-th export (secret; export_id 0 then means its id).
// Invariants: every JoinGroup completes exactly once, with a view of its
// own group; an fd ticket (any client may try any) is redeemed only by the
// sessions and uid it was issued to, no more often than it allows, and
// gives the announced number of fds; each uid is charged exactly its groups'
// members and its waiting joins; listings show a user only its own groups;
// and once every session has ended nothing is left (groups, usage, tickets,
// fds, open file descriptors).
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "daemon_core.h"
#include "mooncake/v1/local.pb.h"
#include "server/admin_service.h"

namespace mooncake::fuzz {
namespace {

using daemon::FdBundlePtr;
using daemon::SessionInfo;
using daemon::ValidatedJoin;

enum Op {
  kOpen,
  kJoin,
  kLeave,
  kReady,
  kPut,
  kExport,
  kImport,
  kGet,
  kEnd,
  kCancel,
  kEvents,
  kList,
  kOps
};

constexpr size_t kSlots = 4;
constexpr size_t kMaxOps = 128;

// A ticket some client received (ImportFds, or a member's fd_ticket in a
// group view): who may redeem it, how often, and for how many fds.
struct Offer {
  std::string ticket;
  uint32_t fd_count = 0;
  uint32_t uid = 0;
  std::set<uint64_t> audience;  // sessions allowed to redeem it
  uint32_t uses_left = 1;
};

struct Slot {
  std::optional<SessionInfo> session;
  std::vector<std::string> puts;  // incoming tickets, "@k"
  std::vector<std::shared_ptr<JoinOutcome>> joins;
};

struct Export {
  uint64_t id = 0;
  std::string secret;
};

class Script {
 public:
  explicit Script(DaemonCore& core) : core_(core) {}

  void Run(ByteReader& in) {
    for (size_t n = 0; n < kMaxOps && !in.empty(); ++n) {
      const auto op = static_cast<Op>(in.U8() % kOps);
      const uint8_t arg = in.U8();
      const absl::string_view bytes = in.Chunk();
      Step(op, arg, bytes);
    }
  }

 private:
  template <typename M>
  static bool Parse(absl::string_view bytes, M* m) {
    return m->ParseFromArray(bytes.data(), static_cast<int>(bytes.size()));
  }

  // "@k" -> the k-th entry of `list`, else `s` unchanged.
  static std::string Named(const std::string& s, const std::vector<std::string>& list) {
    size_t k = 0;
    if (s.size() > 1 && s[0] == '@' && absl::SimpleAtoi(absl::string_view(s).substr(1), &k) &&
        k < list.size()) {
      return list[k];
    }
    return s;
  }

  void Step(Op op, uint8_t arg, absl::string_view bytes) {
    Slot& slot = slots_[arg % kSlots];
    if (op == kOpen) {
      if (slot.session && core_.sessions.Find(slot.session->id)) return;
      const uint32_t uid = (arg & 8) ? 0 : (arg & 4) ? kUidB : kUidA;
      absl::StatusOr<SessionInfo> s = core_.Open(uid);
      if (s.ok()) {
        slot = Slot{*s, {}, {}};
        session_of_pid_[s->cred.pid] = s->id;
      }
      return;
    }
    if (op == kList) return List();
    if (!slot.session) return;
    const SessionInfo& me = *slot.session;
    switch (op) {
      case kJoin: {
        v1::JoinGroupRequest r;
        if (!Parse(bytes, &r)) return;
        r.set_timeout_ms(0);  // never decided by the clock (daemon_core.h)
        r.mutable_handle()->set_fd_ticket(Named(r.handle().fd_ticket(), slot.puts));
        absl::StatusOr<ValidatedJoin> join = core_.broker.ValidateJoin(r);
        if (!join.ok()) return;
        FdBundlePtr fds;
        if (!join->fd_ticket().empty()) {
          absl::StatusOr<FdBundlePtr> taken = core_.fds.TakeIncoming(me.id, join->fd_ticket());
          if (!taken.ok()) return;
          fds = *std::move(taken);
        }
        slot.joins.push_back(core_.StartJoin(me, *std::move(join), std::move(fds)));
        return;
      }
      case kLeave: {
        v1::LeaveGroupRequest r;
        if (Parse(bytes, &r)) core_.broker.Leave(me, r.group(), r.rank()).IgnoreError();
        return;
      }
      case kCancel: {
        v1::LeaveGroupRequest r;
        if (Parse(bytes, &r)) core_.broker.CancelJoin(me, r.group(), r.rank());
        return;
      }
      case kReady: {
        v1::ReportReadyRequest r;
        if (Parse(bytes, &r)) core_.broker.ReportReady(me, r).IgnoreError();
        return;
      }
      case kPut: {
        absl::StatusOr<std::string> t = core_.fds.AddIncoming(me, MemFds(1 + arg / 16));
        if (t.ok()) slot.puts.push_back(*std::move(t));
        return;
      }
      case kExport: {
        v1::ExportFdsRequest r;
        if (!Parse(bytes, &r)) return;
        absl::StatusOr<daemon::ExportRecord> e =
            core_.fds.Export(me, Named(r.fd_ticket(), slot.puts), r.kind(), r.size());
        if (e.ok()) exports_.push_back(Export{e->id, e->secret});
        return;
      }
      case kImport: {
        v1::ImportFdsRequest r;
        if (!Parse(bytes, &r)) return;
        uint64_t id = r.export_id();
        std::string secret = r.secret();
        size_t k = 0;
        if (secret.size() > 1 && secret[0] == '@' &&
            absl::SimpleAtoi(absl::string_view(secret).substr(1), &k) && k < exports_.size()) {
          secret = exports_[k].secret;
          if (id == 0) id = exports_[k].id;
        }
        absl::StatusOr<daemon::FdBroker::Imported> imp = core_.fds.Import(me, id, secret);
        if (imp.ok()) {
          AddOffer(Offer{imp->ticket,
                         static_cast<uint32_t>(imp->record.bundle->fds.size()),
                         me.cred.uid,
                         {me.id},
                         1});
        }
        return;
      }
      case kGet: {
        // Any client may try any ticket any client received.
        CollectViewTickets();
        if (offers_.empty()) return;
        const size_t pick = arg / 16 + (bytes.empty() ? 0 : 16 * static_cast<uint8_t>(bytes[0]));
        Offer& o = offers_[pick % offers_.size()];
        absl::StatusOr<FdBundlePtr> b = core_.fds.Redeem(o.ticket, me.id, me.cred.uid);
        if (!b.ok()) return;
        FUZZ_CHECK(o.audience.count(me.id) == 1 && o.uid == me.cred.uid, "session ", me.id,
                   " (uid ", me.cred.uid, ") redeemed a ticket meant for others");
        FUZZ_CHECK(o.uses_left > 0, "a ticket was redeemed more often than it allows");
        o.uses_left -= 1;
        FUZZ_CHECK((*b)->fds.size() == o.fd_count, "a ticket for ", o.fd_count, " fds gave ",
                   (*b)->fds.size());
        return;
      }
      case kEnd: core_.lifecycle.End(me.id); return;
      case kEvents: CheckEvents(core_, me.id); return;
      case kOpen:
      case kList:
      case kOps: return;
    }
  }

  void AddOffer(Offer o) {
    if (!offered_.insert(o.ticket).second) return;
    offers_.push_back(std::move(o));
  }

  // The fd tickets in the views of formed groups: redeemable by the
  // group's members (the sessions whose pids the view lists), world_size - 1
  // times in all.
  void CollectViewTickets() {
    for (const Slot& slot : slots_) {
      for (const std::shared_ptr<JoinOutcome>& j : slot.joins) {
        if (!j->formed()) continue;
        const v1::JoinGroupResponse view = j->view();
        std::set<uint64_t> audience;
        for (const v1::MemberView& m : view.members()) {
          auto it = session_of_pid_.find(m.pid());
          if (it != session_of_pid_.end()) audience.insert(it->second);
        }
        for (const v1::MemberView& m : view.members()) {
          if (m.fd_ticket().empty()) continue;
          AddOffer(Offer{m.fd_ticket(), m.fd_count(), j->uid(), audience, view.world_size() - 1});
        }
      }
    }
  }

  // What the admin listings show, and the broker's per-uid accounting.
  void List() {
    for (uint32_t uid : {kUidA, kUidB, 0u}) {
      uint64_t members = 0;
      for (const daemon::GroupSummary& g : core_.broker.List(uid, false)) {
        FUZZ_CHECK(g.uid == uid, "uid ", uid, " is shown a group of uid ", g.uid);
        FUZZ_CHECK(g.members.size() <= g.world_size, g.members.size(), " of ", g.world_size);
        for (const daemon::GroupMemberSummary& m : g.members) {
          FUZZ_CHECK(m.rank < g.world_size, "rank ", m.rank, " of ", g.world_size);
        }
        v1::GroupInfo info = daemon::ToGroupInfo(g);
        FUZZ_CHECK(info.joined() <= info.world_size(), info.joined());
        members += g.members.size();
      }
      FUZZ_CHECK(core_.broker.UsageOf(daemon::Principal{uid, ""}).ranks == members, "uid ", uid,
                 " is charged ", core_.broker.UsageOf(daemon::Principal{uid, ""}).ranks,
                 " ranks for ", members, " members");
      uint64_t waiting = 0;
      for (const std::shared_ptr<JoinOutcome>& j : core_.joins)
        waiting += j->uid() == uid && j->waiting();
      FUZZ_CHECK(core_.broker.UsageOf(daemon::Principal{uid, ""}).waiting == waiting, "uid ", uid,
                 " is charged ", core_.broker.UsageOf(daemon::Principal{uid, ""}).waiting,
                 " waiting joins for ", waiting);
    }
    for (const SessionInfo& s : core_.sessions.List()) core_.broker.MembershipsOf(s.id);
  }

  DaemonCore& core_;
  Slot slots_[kSlots];
  std::vector<Export> exports_;
  std::map<int, uint64_t> session_of_pid_;  // sessions' made-up pids are unique
  std::vector<Offer> offers_;
  std::set<std::string> offered_;
};

}  // namespace
}  // namespace mooncake::fuzz

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  mooncake::fuzz::QuietLogs();
  mooncake::fuzz::DaemonCore::Get();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mooncake::fuzz;
  RunLeakChecked([&] {
    DaemonCore& core = DaemonCore::Get();
    ByteReader in(data, size);
    Script script(core);
    script.Run(in);
    core.Finish();
  });
  return 0;
}
