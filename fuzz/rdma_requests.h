// The Rdma service's requests (proto/mooncake/v1/rdma.proto) for
// request_fuzzer.cc: what each input's caller holds before its request, how
// a request names those objects, and the invariants checked after it.
//
// Before an RDMA request, besides what request_fuzzer.cc prepares:
//   session A (the caller, uid kUidA): a region of 4 KiB, queue pairs qa0
//     (RESET) and qa1 (RTS, connected to qa0), created by one call, and an
//     fd-channel ticket "@memfd" for a sealed sparse memfd of kMemfdBytes;
//   session A2 (uid kUidA too): a region of kA2RegionBytes and qa2 (RESET);
//   session B (uid kUidB): a region and qb (RESET).
// Against SmallRdmaLimits (daemon_core.h) uid kUidA then holds 3 QPs, 4
// memory regions (two regions, two control mappings) and a little over
// 128 KiB: one request can pass the per-session and the per-uid limits on
// QPs and bytes.
// Names: a qpn or lkey of 1..N in a request means the Nth prepared object
// (qpns: qa0, qa1, qa2, qb; keys: A's, A2's, B's); fd_ticket "@memfd" and
// "@ticket" (an unsealed memfd) mean A's tickets. Other values go as sent.
//
// Invariants: each RPC fails only with the codes its contract lists, and a
// ResourceExhausted names its config key; what succeeded is listed as the
// caller's (created QPs in RESET, a region of the length asked, connected
// QPs in RTS toward the named remote QP); nothing of A2 or B changed; each
// session's and uid's charges equal what the listings show and stay within
// the limits (privileged uids aside); an RTS QP's remote on this node is of
// its uid.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "admission/admission_counter.h"
#include "daemon_core.h"
#include "mooncake/v1/rdma.pb.h"

namespace mooncake::fuzz {

inline constexpr uint64_t kMemfdBytes = 1 << 20;
inline constexpr uint64_t kA2RegionBytes = 128 << 10;
inline constexpr uint32_t kPreparedDepth = 4;
inline constexpr uint64_t kPreparedSlot = 2ull * kPreparedDepth * 64 + 64;

// One QP's rings in slot `slot` of control memory (as the client library
// lays them out: SQ, CQ, then both doorbell records).
inline daemon::QpLayout PreparedLayout(uint64_t slot) {
  const uint64_t base = slot * kPreparedSlot;
  daemon::QpLayout l;
  l.sq_offset = base;
  l.sq_wqe_cnt = kPreparedDepth;
  l.cq_offset = base + kPreparedDepth * 64ull;
  l.cq_cqe_cnt = kPreparedDepth;
  l.sq_dbrec_offset = base + 2ull * kPreparedDepth * 64;
  l.cq_dbrec_offset = l.sq_dbrec_offset + 8;
  return l;
}

struct RdmaCaller {
  daemon::SessionInfo a2, b;
  std::string memfd_ticket;     // "@memfd"
  std::vector<uint32_t> qpns;   // qa0, qa1, qa2, qb
  std::vector<uint32_t> lkeys;  // A's, A2's, B's
};

inline daemon::FdBundlePtr Bundle(uint64_t bytes) {
  auto b = std::make_shared<daemon::FdBundle>();
  b->fds.push_back(SealedMemfd(bytes));
  return b;
}

inline RdmaCaller PrepareRdma(DaemonCore& core, const daemon::SessionInfo& a) {
  RdmaCaller c;
  absl::StatusOr<daemon::SessionInfo> a2 = core.Open(kUidA, "fuzz-a2");
  absl::StatusOr<daemon::SessionInfo> b = core.Open(kUidB, "fuzz-b");
  FUZZ_CHECK(a2.ok() && b.ok(), "opening A2 and B");
  c.a2 = *a2;
  c.b = *b;
  std::vector<uint32_t> a_qps;
  for (auto [s, region, qps] : {std::tuple<const daemon::SessionInfo*, uint64_t, int>{&a, 4096, 2},
                                {&c.a2, kA2RegionBytes, 1},
                                {&c.b, 4096, 1}}) {
    absl::StatusOr<daemon::RdmaResources::Registered> r =
        core.rdma.RegisterMemory(*s, Bundle(region), "memfd", 0x100000, region, 0, 0);
    FUZZ_CHECK(r.ok(), r.status());
    c.lkeys.push_back(r->lkey);
    std::vector<daemon::QpLayout> layouts;
    for (int i = 0; i < qps; ++i) layouts.push_back(PreparedLayout(i));
    const uint64_t bytes = qps * kPreparedSlot;
    absl::StatusOr<std::vector<uint32_t>> q =
        core.rdma.CreateQueuePairs(*s, Bundle(bytes), bytes, layouts);
    FUZZ_CHECK(q.ok(), q.status());
    c.qpns.insert(c.qpns.end(), q->begin(), q->end());
  }
  absl::Status connected = core.rdma.Connect(a, {{c.qpns[1], c.qpns[0], ""}});
  FUZZ_CHECK(connected.ok(), connected);
  std::vector<UniqueFd> fds;
  fds.push_back(SealedMemfd(kMemfdBytes));
  absl::StatusOr<std::string> t = core.fds.AddIncoming(a, std::move(fds));
  FUZZ_CHECK(t.ok(), t.status());
  c.memfd_ticket = *t;
  return c;
}

// A request's name for a prepared object, or the value as sent.
inline uint32_t Named(uint32_t v, const std::vector<uint32_t>& prepared) {
  return v >= 1 && v <= prepared.size() ? prepared[v - 1] : v;
}

// What every session of this input holds, as the listings show it.
struct RdmaSnapshot {
  std::map<uint32_t, daemon::QpRow> qps;
  std::map<uint32_t, daemon::MrRow> mrs;
};

inline RdmaSnapshot Snapshot(DaemonCore& core) {
  RdmaSnapshot s;
  for (const daemon::QpRow& q : core.rdma.ListQps(0, true)) s.qps[q.info.qpn] = q;
  for (const daemon::MrRow& m : core.rdma.ListMrs(0, true)) s.mrs[m.info.key] = m;
  return s;
}

// The charges equal the listings, stay within the limits, and connections
// stay within a uid.
inline void CheckRdmaAccounting(DaemonCore& core, const RdmaSnapshot& now) {
  const daemon::RdmaLimits& l = core.rdma.limits();
  std::map<uint64_t, uint64_t> qps_of, mrs_of;
  std::map<uint64_t, uint32_t> uid_of;
  for (const auto& [qpn, q] : now.qps) {
    qps_of[q.session] += 1;
    uid_of[q.session] = q.uid;
    // A QP connected to another node's names that node's QP number.
    if (q.info.state != softnic::QpState::kReset && q.info.remote_node.empty()) {
      auto remote = now.qps.find(q.info.remote_qpn);
      FUZZ_CHECK(remote == now.qps.end() || remote->second.uid == q.uid, "QP ", qpn, " of uid ",
                 q.uid, " is connected to a QP of uid ", remote->second.uid);
    }
  }
  for (const auto& [key, m] : now.mrs) {
    mrs_of[m.session] += 1;
    uid_of[m.session] = m.uid;
  }
  uint64_t charged_mrs = 0;
  std::map<uint32_t, daemon::RdmaUsage> by_uid;
  for (const daemon::SessionInfo& s : core.sessions.List()) {
    const daemon::RdmaUsage u = core.rdma.UsageOfSession(s.id);
    FUZZ_CHECK(u.qps == qps_of[s.id], "session ", s.id, " charged ", u.qps, " QPs, holds ",
               qps_of[s.id]);
    FUZZ_CHECK(u.mrs >= mrs_of[s.id] && u.mrs <= mrs_of[s.id] + qps_of[s.id], "session ", s.id,
               " charged ", u.mrs, " regions for ", mrs_of[s.id], " regions and ", qps_of[s.id],
               " QPs");
    FUZZ_CHECK(u.qps <= l.max_qps_per_session && u.mrs <= l.max_mrs_per_session &&
                   u.bytes <= l.max_registered_bytes_per_session,
               "session ", s.id, " past its limits");
    charged_mrs += u.mrs;
    daemon::RdmaUsage& t = by_uid[s.cred.uid];
    t.qps += u.qps;
    t.mrs += u.mrs;
    t.bytes += u.bytes;
  }
  FUZZ_CHECK(charged_mrs == now.mrs.size() + core.rdma.ControlMappings(), charged_mrs,
             " regions charged, ", now.mrs.size(), " listed + ", core.rdma.ControlMappings(),
             " control mappings");
  for (uint32_t uid : {kUidA, kUidB}) {
    const daemon::RdmaUsage u = core.rdma.UsageOf(daemon::Principal{uid, ""});
    const daemon::RdmaUsage& t = by_uid[uid];
    FUZZ_CHECK(u.qps == t.qps && u.mrs == t.mrs && u.bytes == t.bytes, "uid ", uid,
               " charged differently from its sessions");
    if (!daemon::AdmissionCounter::Privileged(daemon::Principal{uid, ""})) {
      FUZZ_CHECK(u.qps <= l.max_qps_per_uid && u.mrs <= l.max_mrs_per_uid &&
                     u.bytes <= l.max_registered_bytes_per_uid,
                 "uid ", uid, " past its limits: ", u.qps, " QPs, ", u.mrs, " regions, ", u.bytes,
                 " bytes");
    }
  }
}

// Nothing of another session than the caller's changed.
inline void CheckOthersUntouched(const RdmaSnapshot& before, const RdmaSnapshot& after,
                                 uint64_t caller) {
  for (const auto& [qpn, q] : before.qps) {
    if (q.session == caller) continue;
    auto it = after.qps.find(qpn);
    FUZZ_CHECK(it != after.qps.end(), "QP ", qpn, " of session ", q.session, " is gone");
    FUZZ_CHECK(it->second.info.state == q.info.state &&
                   it->second.info.remote_qpn == q.info.remote_qpn &&
                   it->second.session == q.session,
               "QP ", qpn, " of session ", q.session, " changed");
  }
  for (const auto& [key, m] : before.mrs) {
    if (m.session == caller) continue;
    auto it = after.mrs.find(key);
    FUZZ_CHECK(it != after.mrs.end() && it->second.session == m.session &&
                   it->second.info.length == m.info.length,
               "region of session ", m.session, " changed");
  }
  for (const auto& [qpn, q] : after.qps) {
    FUZZ_CHECK(before.qps.count(qpn) != 0 || q.session == caller, "QP ", qpn,
               " appeared in session ", q.session);
  }
}

inline bool Allowed(const absl::Status& s, std::initializer_list<absl::StatusCode> codes) {
  if (s.ok()) return true;
  if (s.code() == absl::StatusCode::kResourceExhausted) {
    FUZZ_CHECK(s.message().find(" in mooncaked.conf)") != absl::string_view::npos,
               "ResourceExhausted without its config key: ", s);
  }
  for (absl::StatusCode c : codes) {
    if (s.code() == c) return true;
  }
  return false;
}

// Handles one Rdma request of the caller `a` through RdmaService, with
// prepared objects named as the file comment says, and checks the result.
inline void HandleRdma(DaemonCore& core, const daemon::SessionInfo& a,
                       const std::string& unsealed_ticket, const RdmaCaller& c,
                       const google::protobuf::Message& msg) {
  using absl::StatusCode;
  daemon::RdmaService& svc = core.rdma_service;
  auto ticket = [&](const std::string& t) {
    return t == "@memfd" ? c.memfd_ticket : t == "@ticket" ? unsealed_ticket : t;
  };
  const RdmaSnapshot before = Snapshot(core);
  if (const auto* r = dynamic_cast<const v1::GetRdmaInfoRequest*>(&msg)) {
    (void)r;
    v1::RdmaInfo info;
    absl::Status s = svc.HandleGetRdmaInfo(&a, &info);
    FUZZ_CHECK(Allowed(s, {StatusCode::kFailedPrecondition}), s);  // a session that ended
    FUZZ_CHECK(
        !s.ok() || (info.provider() == "softnic" &&
                    info.max_qps_per_session() == core.rdma.limits().max_qps_per_session &&
                    !info.is_roce() && info.gid_index() == 0 && info.nic() == core.rdma.nic()),
        "RdmaInfo differs from the resources");
  } else if (const auto* r = dynamic_cast<const v1::RegisterMemoryRequest*>(&msg)) {
    v1::RegisterMemoryRequest req = *r;
    req.set_fd_ticket(ticket(req.fd_ticket()));
    v1::RegisterMemoryResponse resp;
    absl::Status s = svc.HandleRegisterMemory(a, req, &resp);
    FUZZ_CHECK(Allowed(s, {StatusCode::kInvalidArgument, StatusCode::kNotFound,
                           StatusCode::kResourceExhausted, StatusCode::kFailedPrecondition}),
               s);
    if (s.ok()) {
      const RdmaSnapshot after = Snapshot(core);
      auto it = after.mrs.find(resp.lkey());
      FUZZ_CHECK(it != after.mrs.end() && it->second.session == a.id &&
                     it->second.info.length == req.length() && resp.lkey() == resp.rkey(),
                 "registered region not listed as asked");
    }
  } else if (const auto* r = dynamic_cast<const v1::DeregisterMemoryRequest*>(&msg)) {
    const uint32_t key = Named(r->lkey(), c.lkeys);
    v1::DeregisterMemoryRequest req;
    req.set_lkey(key);
    absl::Status s = svc.HandleDeregisterMemory(a, req);
    FUZZ_CHECK(Allowed(s, {StatusCode::kNotFound}), s);
    FUZZ_CHECK(s.ok() == (before.mrs.count(key) && before.mrs.at(key).session == a.id),
               "DeregisterMemory of key ", key, ": ", s);
    FUZZ_CHECK(Snapshot(core).mrs.count(key) == (s.ok() ? 0u : before.mrs.count(key)), "region ",
               key, " after DeregisterMemory: ", s);
  } else if (const auto* r = dynamic_cast<const v1::CreateQueuePairsRequest*>(&msg)) {
    v1::CreateQueuePairsRequest req = *r;
    req.set_fd_ticket(ticket(req.fd_ticket()));
    v1::CreateQueuePairsResponse resp;
    absl::Status s = svc.HandleCreateQueuePairs(a, req, &resp);
    // Rings in GPU memory: softnic refuses them (FailedPrecondition), and
    // only them.
    const bool gpu_rings = req.control_kind() == "dmabuf";
    FUZZ_CHECK(gpu_rings ? !s.ok() : s.code() != StatusCode::kFailedPrecondition, "control_kind ",
               req.control_kind(), ": ", s);
    FUZZ_CHECK(Allowed(s, {StatusCode::kInvalidArgument, StatusCode::kNotFound,
                           StatusCode::kResourceExhausted, StatusCode::kFailedPrecondition}),
               s);
    const RdmaSnapshot after = Snapshot(core);
    if (s.ok()) {
      FUZZ_CHECK(resp.qpns_size() == req.qps_size(), resp.qpns_size(), " QPs for ", req.qps_size());
      for (uint32_t q : resp.qpns()) {
        auto it = after.qps.find(q);
        FUZZ_CHECK(it != after.qps.end() && before.qps.count(q) == 0 &&
                       it->second.session == a.id &&
                       it->second.info.state == softnic::QpState::kReset,
                   "created QP ", q, " not listed as a new QP of the caller in RESET");
      }
    } else {
      FUZZ_CHECK(after.qps.size() == before.qps.size(), "a failed CreateQueuePairs left QPs");
    }
  } else if (const auto* r = dynamic_cast<const v1::ConnectQueuePairsRequest*>(&msg)) {
    v1::ConnectQueuePairsRequest req = *r;
    for (v1::QueuePairConnection& p : *req.mutable_connections()) {
      p.set_qpn(Named(p.qpn(), c.qpns));
      p.set_remote_qpn(Named(p.remote_qpn(), c.qpns));
    }
    absl::Status s = svc.HandleConnectQueuePairs(a, req);
    FUZZ_CHECK(Allowed(s, {StatusCode::kInvalidArgument, StatusCode::kNotFound,
                           StatusCode::kFailedPrecondition, StatusCode::kUnimplemented}),
               s);
    const RdmaSnapshot after = Snapshot(core);
    for (const v1::QueuePairConnection& p : req.connections()) {
      if (!s.ok()) break;
      auto it = after.qps.find(p.qpn());
      FUZZ_CHECK(it != after.qps.end() && it->second.info.state == softnic::QpState::kRts &&
                     it->second.info.remote_qpn == p.remote_qpn(),
                 "QP ", p.qpn(), " not connected to ", p.remote_qpn());
    }
    if (!s.ok()) {  // all or nothing
      for (const auto& [qpn, q] : before.qps) {
        FUZZ_CHECK(after.qps.at(qpn).info.state == q.info.state,
                   "a refused ConnectQueuePairs "
                   "changed QP ",
                   qpn);
      }
    }
  } else if (const auto* r = dynamic_cast<const v1::SelectNicRequest*>(&msg)) {
    v1::SelectNicResponse resp;
    absl::Status s = svc.HandleSelectNic(a, *r, &resp);
    // softnic serves one NIC: any GPU gets it; a name other than it, too
    // many names or an overlong field is refused.
    FUZZ_CHECK(Allowed(s, {StatusCode::kInvalidArgument, StatusCode::kFailedPrecondition}), s);
    if (s.ok()) FUZZ_CHECK(resp.nic() == core.rdma.nic(), "SelectNic chose ", resp.nic());
    FUZZ_CHECK(s.message().find('\x1b') == std::string::npos, "unescaped input in: ", s);
  } else if (const auto* r = dynamic_cast<const v1::GetDoorbellAccessRequest*>(&msg)) {
    (void)r;
    v1::DoorbellAccess resp;
    absl::Status s = svc.HandleGetDoorbellAccess(a, &resp);
    FUZZ_CHECK(s.code() == StatusCode::kFailedPrecondition, "softnic handed out a doorbell: ", s);
    FUZZ_CHECK(resp.fd_ticket().empty(), "a ticket with a refusal");
  } else if (const auto* r = dynamic_cast<const v1::AttachCopyAgentRequest*>(&msg)) {
    v1::AttachCopyAgentRequest req = *r;
    req.set_fd_ticket(ticket(req.fd_ticket()));
    absl::Status s = svc.HandleAttachCopyAgent(a, req);
    // The prepared memfds are sparse (not every page written) or unsealed:
    // the daemon maps neither. Sizes outside the bounds, unknown tickets,
    // a second agent are refused; nothing else of the session changes.
    FUZZ_CHECK(Allowed(s, {StatusCode::kInvalidArgument, StatusCode::kNotFound,
                           StatusCode::kResourceExhausted, StatusCode::kFailedPrecondition,
                           StatusCode::kAlreadyExists}),
               s);
    const RdmaSnapshot after = Snapshot(core);
    FUZZ_CHECK(after.qps.size() == before.qps.size() && after.mrs.size() == before.mrs.size(),
               "AttachCopyAgent changed the session's objects");
  } else if (const auto* r = dynamic_cast<const v1::DestroyQueuePairsRequest*>(&msg)) {
    v1::DestroyQueuePairsRequest req;
    for (uint32_t q : r->qpns()) req.add_qpns(Named(q, c.qpns));
    absl::Status s = svc.HandleDestroyQueuePairs(a, req);
    FUZZ_CHECK(Allowed(s, {StatusCode::kInvalidArgument, StatusCode::kNotFound}), s);
    const RdmaSnapshot after = Snapshot(core);
    for (uint32_t q : req.qpns()) {
      FUZZ_CHECK(after.qps.count(q) == (s.ok() ? 0u : before.qps.count(q)), "QP ", q,
                 " after DestroyQueuePairs: ", s);
    }
  }
  const RdmaSnapshot after = Snapshot(core);
  CheckOthersUntouched(before, after, a.id);
  CheckRdmaAccounting(core, after);
}

}  // namespace mooncake::fuzz
