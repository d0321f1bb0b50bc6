// Every request message of the daemon's RPCs (proto/mooncake/v1/local.proto,
// admin.proto, peer.proto, rdma.proto, and the fd channel's FdRequest),
// parsed from arbitrary bytes and handled as the services handle it, minus
// the server: the same calls on the real SessionRegistry, FdBroker and
// GroupBroker, the Rdma requests through RdmaService itself on a real
// RdmaResources (softnic) (daemon_core.h, rdma_requests.h), Peer.SoftnicExecute
// through PeerService itself on that softnic engine (softnic_peer_requests.h),
// and the Admin.WatchEvents stream on an EventFeed fed by the broker
// (watch_requests.h).
//
// Input: one byte that picks the message (modulo the number of messages,
// in kMessages order), then the message's bytes; for WatchEvents, whose
// request has no fields, the watch's script comes between the two
// (watch_requests.h).
// Before each input the caller (session A, uid kUidA) holds: rank 0 of the
// formed one-rank group "fuzz-formed", rank 0 of the two-rank group
// "fuzz-forming" (waiting), an fd-channel PUT ticket that a request names
// as "@ticket", and an export whose secret a request names as "@secret"
// (export_id 0 then means its id); an FdRequest names A's session token as
// "@token" (session_id 0 then means A's id). Before an Rdma request A, a
// second session of its uid and one of another uid also hold regions and
// queue pairs (rdma_requests.h says which and how a request names them).
// Invariants, beyond no crash, leak or undefined behaviour: errors carry
// the codes the protocol documents; a message that parses survives a
// round trip; ValidateJoin accepts what its contract says; every JoinGroup
// completes exactly once with a view of its own group; imported fds arrive
// whole; strings a client chose are display-safe once escaped; the Rdma
// invariants of rdma_requests.h, softnic_peer_requests.h and
// watch_requests.h; and when the input's sessions end,
// nothing is left (groups, usage, tickets, fds, QPs, regions, charges).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/strings/ascii.h"
#include "daemon_core.h"
#include "mooncake/v1/admin.pb.h"
#include "mooncake/v1/fd_channel.pb.h"
#include "mooncake/v1/local.pb.h"
#include "mooncake/v1/peer.pb.h"
#include "mooncake/v1/rdma.pb.h"
#include "rdma_requests.h"
#include "server/admin_service.h"
#include "softnic_peer_requests.h"
#include "watch_requests.h"

namespace mooncake::fuzz {
namespace {

using daemon::FdBundlePtr;
using daemon::SessionInfo;
using daemon::ValidatedJoin;

enum Message {
  kHello,
  kOpenSession,
  kGetNodeInfo,
  kJoinGroup,
  kLeaveGroup,
  kReportReady,
  kExportFds,
  kImportFds,
  kGetStatus,
  kGetTopology,
  kListSessions,
  kListGroups,
  kPeerHello,
  kGetPeerTopology,
  kFdRequest,
  kGetRdmaInfo,
  kRegisterMemory,
  kDeregisterMemory,
  kCreateQueuePairs,
  kConnectQueuePairs,
  kDestroyQueuePairs,
  kSelectNic,
  kGetDoorbellAccess,
  kWatchEvents,
  kSoftnicExecute,
  kAttachCopyAgent,  // after the others: seeds keep their meaning
  kMessages
};

bool IsRdma(Message m) {
  return (m >= kGetRdmaInfo && m <= kGetDoorbellAccess) || m == kAttachCopyAgent;
}

std::unique_ptr<google::protobuf::Message> NewMessage(Message m) {
  switch (m) {
    case kHello: return std::make_unique<v1::HelloRequest>();
    case kOpenSession: return std::make_unique<v1::OpenSessionRequest>();
    case kGetNodeInfo: return std::make_unique<v1::GetNodeInfoRequest>();
    case kJoinGroup: return std::make_unique<v1::JoinGroupRequest>();
    case kLeaveGroup: return std::make_unique<v1::LeaveGroupRequest>();
    case kReportReady: return std::make_unique<v1::ReportReadyRequest>();
    case kExportFds: return std::make_unique<v1::ExportFdsRequest>();
    case kImportFds: return std::make_unique<v1::ImportFdsRequest>();
    case kGetStatus: return std::make_unique<v1::GetStatusRequest>();
    case kGetTopology: return std::make_unique<v1::GetTopologyRequest>();
    case kListSessions: return std::make_unique<v1::ListSessionsRequest>();
    case kListGroups: return std::make_unique<v1::ListGroupsRequest>();
    case kPeerHello: return std::make_unique<v1::PeerHelloRequest>();
    case kGetPeerTopology: return std::make_unique<v1::GetPeerTopologyRequest>();
    case kFdRequest: return std::make_unique<v1::FdRequest>();
    case kGetRdmaInfo: return std::make_unique<v1::GetRdmaInfoRequest>();
    case kRegisterMemory: return std::make_unique<v1::RegisterMemoryRequest>();
    case kDeregisterMemory: return std::make_unique<v1::DeregisterMemoryRequest>();
    case kCreateQueuePairs: return std::make_unique<v1::CreateQueuePairsRequest>();
    case kConnectQueuePairs: return std::make_unique<v1::ConnectQueuePairsRequest>();
    case kDestroyQueuePairs: return std::make_unique<v1::DestroyQueuePairsRequest>();
    case kSelectNic: return std::make_unique<v1::SelectNicRequest>();
    case kGetDoorbellAccess: return std::make_unique<v1::GetDoorbellAccessRequest>();
    case kWatchEvents: return std::make_unique<v1::WatchEventsRequest>();
    case kSoftnicExecute: return std::make_unique<v1::SoftnicBatch>();
    case kAttachCopyAgent: return std::make_unique<v1::AttachCopyAgentRequest>();
    case kMessages: break;
  }
  return nullptr;
}

// What each input starts from (see the file comment).
struct Caller {
  SessionInfo session;
  std::string ticket;  // "@ticket"
  uint64_t export_id = 0;
  std::string secret;  // "@secret"
  RdmaCaller rdma;     // before an Rdma request or SoftnicExecute only
  PeerCaller peer;     // before SoftnicExecute only
  WatchScript watch;   // WatchEvents only
};

Caller Prepare(DaemonCore& core, Message m) {
  Caller c;
  absl::StatusOr<SessionInfo> s = core.Open(kUidA, "fuzz-a");
  FUZZ_CHECK(s.ok(), s.status());
  c.session = *s;
  for (auto [name, n] : {std::pair<const char*, uint32_t>{"fuzz-formed", 1}, {"fuzz-forming", 2}}) {
    v1::JoinGroupRequest r;
    r.set_group(name);
    r.set_world_size(n);
    r.mutable_handle()->set_kind("memfd");
    absl::StatusOr<ValidatedJoin> j = core.broker.ValidateJoin(r);
    FUZZ_CHECK(j.ok(), j.status());
    core.StartJoin(c.session, *std::move(j), nullptr);
  }
  absl::StatusOr<std::string> t = core.fds.AddIncoming(c.session, MemFds(1));
  FUZZ_CHECK(t.ok(), t.status());
  c.ticket = *t;
  absl::StatusOr<std::string> e = core.fds.AddIncoming(c.session, MemFds(1));
  FUZZ_CHECK(e.ok(), e.status());
  absl::StatusOr<daemon::ExportRecord> rec = core.fds.Export(c.session, *e, "memfd", 4096);
  FUZZ_CHECK(rec.ok(), rec.status());
  c.export_id = rec->id;
  c.secret = rec->secret;
  if (IsRdma(m) || m == kSoftnicExecute) c.rdma = PrepareRdma(core, c.session);
  if (m == kSoftnicExecute) c.peer = PreparePeer(core, c.rdma);
  return c;
}

// Imports export `id` as `session` and redeems the ticket, as a client's
// ImportFds + fd channel GET do: `n` fds must arrive.
void ImportAndRedeem(DaemonCore& core, const SessionInfo& session, uint64_t id,
                     const std::string& secret, size_t n) {
  absl::StatusOr<daemon::FdBroker::Imported> imported = core.fds.Import(session, id, secret);
  FUZZ_CHECK(imported.ok(), "import of a fresh export failed: ", imported.status());
  absl::StatusOr<FdBundlePtr> bundle =
      core.fds.Redeem(imported->ticket, session.id, session.cred.uid);
  FUZZ_CHECK(bundle.ok(), bundle.status());
  FUZZ_CHECK((*bundle)->fds.size() == n, (*bundle)->fds.size(), " fds imported, ", n, " exported");
}

void JoinGroup(DaemonCore& core, const Caller& c, const v1::JoinGroupRequest& req) {
  absl::StatusOr<ValidatedJoin> join = core.broker.ValidateJoin(req);
  if (!join.ok()) {
    FUZZ_CHECK(join.status().code() == absl::StatusCode::kInvalidArgument, join.status());
    return;
  }
  // The contract of ValidateJoin (group_broker.h, local.proto).
  FUZZ_CHECK(join->group() == req.group() && !req.group().empty() && req.group().size() <= 128,
             "group '", req.group(), "'");
  for (char ch : req.group()) {
    FUZZ_CHECK(absl::ascii_isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == '_' ||
                   ch == '-' || ch == ':',
               "group name with '", std::string(1, ch), "' accepted");
  }
  FUZZ_CHECK(join->rank() < join->world_size() && join->world_size() <= 64, join->rank(), " of ",
             join->world_size());
  FUZZ_CHECK(req.handle().data().size() <= 4096, req.handle().data().size());
  // Joins of this run never time out (daemon_core.h): the same request
  // without its own deadline must validate too.
  v1::JoinGroupRequest untimed = req;
  untimed.set_timeout_ms(0);
  absl::StatusOr<ValidatedJoin> run = core.broker.ValidateJoin(untimed);
  FUZZ_CHECK(run.ok(), "valid only with timeout_ms ", req.timeout_ms(), ": ", run.status());

  FdBundlePtr fds;
  if (!run->fd_ticket().empty()) {
    const std::string ticket = run->fd_ticket() == "@ticket" ? c.ticket : run->fd_ticket();
    absl::StatusOr<FdBundlePtr> taken = core.fds.TakeIncoming(c.session.id, ticket);
    if (!taken.ok()) return;
    fds = *std::move(taken);
  }
  core.StartJoin(c.session, *std::move(run), std::move(fds));
}

// What AdminService reports, for `uid` (all of it for root).
void AdminViews(DaemonCore& core, uint32_t uid) {
  const bool all = uid == 0;
  for (const daemon::GroupSummary& g : core.broker.List(uid, all)) {
    v1::GroupInfo info = daemon::ToGroupInfo(g);
    FUZZ_CHECK(info.joined() <= info.world_size(), info.joined(), " of ", info.world_size());
    FUZZ_CHECK(all || info.uid() == uid, "uid ", uid, " sees a group of uid ", info.uid());
  }
  for (const SessionInfo& s : core.sessions.List()) {
    if (!all && s.cred.uid != uid) continue;
    core.broker.MembershipsOf(s.id);
    core.fds.ExportsOf(s.id);
    core.fds.PendingTicketsFor(s.id);
  }
  core.broker.CountVisible(uid, all);
}

void Handle(DaemonCore& core, Caller& c, Message m, const google::protobuf::Message& msg) {
  const SessionInfo& a = c.session;
  switch (m) {
    case kHello: break;  // LocalService::Hello compares one number; parsing is the risk
    case kOpenSession: {
      const auto& r = static_cast<const v1::OpenSessionRequest&>(msg);
      CheckEscaped(r.client_name(), 4 * daemon::kMaxClientNameBytes);
      absl::StatusOr<SessionInfo> s = core.Open(kUidB, r.client_name());
      FUZZ_CHECK(s.ok() == (r.client_name().size() <= daemon::kMaxClientNameBytes), s.status());
      if (s.ok()) core.lifecycle.End(s->id);
      break;
    }
    case kJoinGroup: JoinGroup(core, c, static_cast<const v1::JoinGroupRequest&>(msg)); break;
    case kLeaveGroup: {
      const auto& r = static_cast<const v1::LeaveGroupRequest&>(msg);
      absl::Status s = core.broker.Leave(a, r.group(), r.rank());
      FUZZ_CHECK(s.ok() || s.code() == absl::StatusCode::kNotFound, s);
      break;
    }
    case kReportReady: {
      const auto& r = static_cast<const v1::ReportReadyRequest&>(msg);
      absl::Status s = core.broker.ReportReady(a, r);
      FUZZ_CHECK(s.ok() || s.code() == absl::StatusCode::kNotFound ||
                     s.code() == absl::StatusCode::kFailedPrecondition,
                 s);
      for (const v1::SessionEvent& ev : core.sessions.TakeEvents(a.id)) {
        CheckEscaped(ev.member().detail(), 1024);
      }
      break;
    }
    case kExportFds: {
      const auto& r = static_cast<const v1::ExportFdsRequest&>(msg);
      const std::string ticket = r.fd_ticket() == "@ticket" ? c.ticket : r.fd_ticket();
      absl::StatusOr<daemon::ExportRecord> e = core.fds.Export(a, ticket, r.kind(), r.size());
      if (e.ok()) {
        FUZZ_CHECK(e->kind == r.kind() && e->size == r.size(), "export record differs");
        ImportAndRedeem(core, a, e->id, e->secret, 1);
      }
      break;
    }
    case kImportFds: {
      const auto& r = static_cast<const v1::ImportFdsRequest&>(msg);
      uint64_t id = r.export_id();
      std::string secret = r.secret();
      if (secret == "@secret") {
        secret = c.secret;
        if (id == 0) id = c.export_id;
      }
      absl::StatusOr<daemon::FdBroker::Imported> imported = core.fds.Import(a, id, secret);
      if (imported.ok()) {
        FUZZ_CHECK(id == c.export_id && secret == c.secret, "imported export ", id,
                   " without its secret");
        absl::StatusOr<FdBundlePtr> b = core.fds.Redeem(imported->ticket, a.id, a.cred.uid);
        FUZZ_CHECK(b.ok() && (*b)->fds.size() == 1, "redeeming an import failed");
      } else {
        FUZZ_CHECK(imported.status().code() == absl::StatusCode::kNotFound ||
                       imported.status().code() == absl::StatusCode::kPermissionDenied,
                   imported.status());
      }
      break;
    }
    case kGetNodeInfo:
    case kGetStatus:
    case kGetTopology:
    case kListSessions:
    case kListGroups:
    case kGetPeerTopology:
      // No fields: only the caller's identity decides the answer.
      AdminViews(core, kUidA);
      AdminViews(core, 0);
      break;
    case kPeerHello: {
      const auto& r = static_cast<const v1::PeerHelloRequest&>(msg);
      CheckEscaped(r.node_id(), 256);
      break;
    }
    case kFdRequest: {
      const auto& r = static_cast<const v1::FdRequest&>(msg);
      uint64_t id = r.session_id();
      std::string token = r.session_token();
      if (token == "@token") {
        token = a.token;
        if (id == 0) id = a.id;
      }
      absl::StatusOr<SessionInfo> who = core.sessions.Authenticate(id, token, kUidA);
      if (!who.ok()) break;
      FUZZ_CHECK(who->id == a.id && token == a.token, "authenticated without the token");
      if (r.op() == v1::FdRequest::GET) {
        const std::string ticket = r.ticket() == "@ticket" ? c.ticket : r.ticket();
        absl::StatusOr<FdBundlePtr> b = core.fds.Redeem(ticket, who->id, kUidA);
        FUZZ_CHECK(!b.ok(), "GET redeemed a ticket nobody issued for it");
      }
      break;
    }
    case kGetRdmaInfo:
    case kRegisterMemory:
    case kDeregisterMemory:
    case kCreateQueuePairs:
    case kConnectQueuePairs:
    case kDestroyQueuePairs:
    case kSelectNic:
    case kGetDoorbellAccess:
    case kAttachCopyAgent: HandleRdma(core, a, c.ticket, c.rdma, msg); break;
    case kWatchEvents: HandleWatchEvents(core, a, c.watch); break;
    case kSoftnicExecute:
      HandleSoftnicExecute(core, c.rdma, c.peer, static_cast<const v1::SoftnicBatch&>(msg));
      break;
    case kMessages: break;
  }
}

}  // namespace
}  // namespace mooncake::fuzz

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  mooncake::fuzz::QuietLogs();
  mooncake::fuzz::DaemonCore::Get();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mooncake::fuzz;
  DaemonCore& core = DaemonCore::Get();
  const size_t fds_before = OpenFdCount();
  ByteReader in(data, size);
  const auto m = static_cast<Message>(in.U8() % kMessages);
  WatchScript watch;
  if (m == kWatchEvents) watch = ReadWatchScript(in);
  const absl::string_view bytes = in.Rest();
  std::unique_ptr<google::protobuf::Message> msg = NewMessage(m);
  if (msg->ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    // What parsed serializes, and parses back to the same message.
    const std::string once = msg->SerializeAsString();
    std::unique_ptr<google::protobuf::Message> again = NewMessage(m);
    FUZZ_CHECK(again->ParseFromString(once), "a parsed message does not re-parse");
    FUZZ_CHECK(again->SerializeAsString() == once, "round trip changed the message");
    Caller caller = Prepare(core, m);
    caller.watch = std::move(watch);
    Handle(core, caller, m, *msg);
    core.Finish();
  }
  FUZZ_CHECK(OpenFdCount() == fds_before, "fd leak: ", fds_before, " fds open before, ",
             OpenFdCount(), " after");
  return 0;
}
