// The daemon's core without its servers, for the RPC fuzzers: the real
// SessionRegistry, FdBroker, GroupBroker, RdmaResources (softnic) with its
// RdmaService, the PeerService over the softnic engine, and
// SessionLifecycle wired as Daemon wires them, a made-up node with three
// GPUs, and small limits so a short input can reach the ResourceExhausted
// errors. The engine has a link to other nodes, as in a cluster, so queue
// pairs may be connected to another node's; no input posts a WQE, so the
// link never sends anything (UnusedRemoteLink). Sessions are opened with made-up credentials,
// as tests/daemon/group_broker_test.cc does.
//
// One core serves every input of a run (a GroupBroker starts a thread), so
// each input must end every session it opened; CheckReleased() then proves
// the core holds nothing for anyone, which is itself an invariant: a
// session's end releases its groups, tickets, exports, fds, queue pairs and
// memory regions.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "broker/group_broker.h"
#include "fdchannel/fd_broker.h"
#include "fuzz_support.h"
#include "mooncake/common/escape.h"
#include "mooncake/common/populate.h"
#include "rdma/rdma_resources.h"
#include "rdma/softnic_provider.h"
#include "server/node_identity.h"
#include "server/peer_service.h"
#include "server/rdma_service.h"
#include "server/session_lifecycle.h"
#include "session/session_registry.h"
#include "softnic/remote_link.h"

namespace mooncake::fuzz {

// Neither root nor (in any sane setup) the fuzzer's own uid: limits apply.
inline constexpr uint32_t kUidA = 31337;
inline constexpr uint32_t kUidB = 31338;

inline constexpr char kGpuUuid0[] = "GPU-00000000-aaaa-bbbb-cccc-000000000000";
inline constexpr char kGpuUuid1[] = "GPU-11111111-aaaa-bbbb-cccc-111111111111";
inline constexpr char kGpuUuid2[] = "GPU-22222222-aaaa-bbbb-cccc-222222222222";

// GPUs 0 and 1 reach each other (atomics only 0 -> 1); GPU 2 has no P2P.
inline v1::Topology MakeTopology() {
  v1::Topology t;
  const char* uuids[] = {kGpuUuid0, kGpuUuid1, kGpuUuid2};
  const char* pcis[] = {"0000:1b:00.0", "0000:1c:00.0", "0000:3d:00.0"};
  for (int i = 0; i < 3; ++i) {
    v1::Gpu* g = t.add_gpus();
    g->set_index(i);
    g->set_uuid(uuids[i]);
    g->set_pci_bus_id(pcis[i]);
  }
  auto pair = [&t](int s, int d, bool access, bool atomics) {
    v1::GpuPair* p = t.add_gpu_pairs();
    p->set_src(s);
    p->set_dst(d);
    p->set_access_supported(access);
    p->set_native_atomics(atomics);
  };
  pair(0, 1, true, true);
  pair(1, 0, true, false);
  pair(0, 2, false, false);
  pair(2, 0, false, false);
  return t;
}

inline daemon::BrokerLimits SmallLimits() {
  daemon::BrokerLimits l;
  l.max_world_size = 64;
  // Joins wait for the rest of their group for ten minutes, far longer
  // than any input runs: the timer thread never decides an outcome.
  l.default_timeout_ms = 600000;
  l.max_ranks_per_uid = 12;
  l.max_waiting_joins_per_uid = 8;
  l.max_view_bytes_per_uid = 4096;
  return l;
}

// Per session above per uid where two sessions of one uid can pass the
// per-uid limit in one request (request_fuzzer.cc prepares what they hold).
inline daemon::RdmaLimits SmallRdmaLimits() {
  daemon::RdmaLimits l;
  l.max_qps_per_session = 5;
  l.max_mrs_per_session = 3;
  l.max_registered_bytes_per_session = 192 << 10;
  l.max_qps_per_uid = 5;
  l.max_mrs_per_uid = 5;
  l.max_registered_bytes_per_uid = 256 << 10;
  return l;
}

// GPU registrations fail at once: no CUDA driver is loaded in a fuzzer.
inline softnic::CudaMemoryOptions NoCuda() {
  softnic::CudaMemoryOptions o;
  o.cuda_library = "libcuda-not-loaded-by-the-fuzzer.so";
  return o;
}

// One JoinAsync's outcome. `done` must run exactly once (CheckDone), with
// a view that decodes to the group the join asked for.
class JoinOutcome {
 public:
  JoinOutcome(const daemon::ValidatedJoin& join, uint32_t uid)
      : uid_(uid), group_(join.group()), rank_(join.rank()), world_size_(join.world_size()) {}

  uint32_t uid() const { return uid_; }  // the joining session's

  daemon::GroupBroker::JoinDone Callback(std::shared_ptr<JoinOutcome> self) {
    return [self](absl::StatusOr<daemon::EncodedView> view) {
      std::lock_guard<std::mutex> lock(self->mu_);
      self->calls_ += 1;
      if (view.ok()) {
        absl::StatusOr<v1::JoinGroupResponse> v = view->Decode();
        FUZZ_CHECK(v.ok(), "the view of group '", self->group_, "' does not decode");
        self->view_ = *std::move(v);
      } else {
        self->error_ = view.status();
      }
    };
  }

  // Once every session has ended, every join is decided.
  void CheckDone() {
    std::lock_guard<std::mutex> lock(mu_);
    FUZZ_CHECK(calls_ == 1, "JoinGroup done ran ", calls_, " times for rank ", rank_, " of '",
               group_, "'");
    if (!error_.ok()) return;
    FUZZ_CHECK(
        view_.group() == group_ && view_.rank() == rank_ && view_.world_size() == world_size_,
        "view of '", view_.group(), "' rank ", view_.rank(), " for rank ", rank_, " of '", group_,
        "'");
    FUZZ_CHECK(view_.members_size() == static_cast<int>(world_size_), view_.members_size(),
               " members in a formed group of ", world_size_);
    for (int r = 0; r < view_.members_size(); ++r) {
      FUZZ_CHECK(view_.members(r).rank() == static_cast<uint32_t>(r), "members not by rank");
    }
  }

  // Still waiting for the rest of its group.
  bool waiting() {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_ == 0;
  }
  bool formed() {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_ == 1 && error_.ok();
  }
  v1::JoinGroupResponse view() {
    std::lock_guard<std::mutex> lock(mu_);
    return view_;
  }

 private:
  const uint32_t uid_;
  const std::string group_;
  const uint32_t rank_, world_size_;
  std::mutex mu_;
  int calls_ = 0;
  absl::Status error_;
  v1::JoinGroupResponse view_;
};

// The engine's link to other nodes. A batch is sent only for WQEs a client
// posted, and no input posts one: a batch sent is a broken invariant (and
// answering it here, under the engine's lock, could deadlock).
class UnusedRemoteLink final : public softnic::RemoteLink {
 public:
  void Send(softnic::RemoteBatch batch, softnic::RemoteDone) override {
    FUZZ_CHECK(false, "a batch of ", batch.ops.size(), " operations of QP ", batch.requester_qpn,
               " was sent to node '", batch.node, "', but no input posts a WQE");
  }
};

// The cluster as RdmaResources sees it (rdma/remote_connections.h): one
// other node, "node-b", whose daemon takes every offer; the secrets offered
// are kept by QPN so that requests can carry the right one (or not).
class FuzzRemoteConnections final : public daemon::RemoteConnections {
 public:
  absl::Status CheckNode(uint64_t, const std::string& node) override {
    if (node == "node-b") return absl::OkStatus();
    return absl::NotFoundError("not a live node of the cluster");
  }
  bool AcceptsOfferFrom(uint64_t, const std::string& node, absl::Duration) override {
    return node == "node-b";
  }
  absl::StatusOr<daemon::QpEndpoint> Offer(const std::string& node, uint32_t qpn, uint32_t,
                                           uint32_t, const std::string&, const std::string& secret,
                                           const daemon::QpEndpoint& mine) override {
    FUZZ_CHECK(node == "node-b", "an offer to '", EscapeForDisplay(node, 64), "'");
    FUZZ_CHECK(secret.size() == softnic::Engine::kSecretBytes, "a secret of ", secret.size(),
               " bytes");
    FUZZ_CHECK(mine.provider == "softnic", "an endpoint of provider '", mine.provider, "'");
    std::lock_guard<std::mutex> lock(mu_);
    secrets_[qpn] = secret;
    daemon::QpEndpoint theirs;
    theirs.provider = "softnic";
    return theirs;
  }
  // What QP `qpn` of this node expects on batches from its peer ("" none).
  std::string SecretOf(uint32_t qpn) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = secrets_.find(qpn);
    return it == secrets_.end() ? std::string() : it->second;
  }

 private:
  std::mutex mu_;
  std::map<uint32_t, std::string> secrets_;
};

inline daemon::NodeIdentity MakeNode() {
  daemon::NodeIdentity n;
  n.instance_id = "fuzz-instance";
  n.node_id = "node-a";
  n.hostname = "node-a";
  n.topology = MakeTopology();
  return n;
}

struct DaemonCore {
  daemon::SessionRegistry sessions{8};
  daemon::FdBroker fds{absl::Seconds(600), &sessions, daemon::FdLimits{48, 96}};
  daemon::GroupBroker broker{"node-a", MakeTopology(), SmallLimits(), &sessions, &fds};
  // Made here rather than by RdmaResources so that the peer service can
  // reach the engine, as Daemon::Create keeps it (moved into `rdma`).
  std::unique_ptr<daemon::SoftnicProvider> softnic_provider =
      std::make_unique<daemon::SoftnicProvider>("softnic0", softnic::EngineOptions{});
  softnic::Engine* const engine = &softnic_provider->engine();
  daemon::RdmaResources rdma{&sessions, SmallRdmaLimits(), std::move(softnic_provider), NoCuda()};
  // The service's Handle* methods only: no connection table, no server.
  daemon::RdmaService rdma_service{/*connections=*/nullptr, &sessions, &fds, &rdma};
  daemon::SessionLifecycle lifecycle{&sessions, &fds, &rdma, &broker};
  const daemon::NodeIdentity node = MakeNode();
  // No certificate reaches a handler here: requester names are taken as
  // sent (peer_insecure), which leaves the connection secret as the check.
  daemon::PeerService peer_service{&node, daemon::peering::PeerMode::kInsecure};
  std::shared_ptr<FuzzRemoteConnections> remote = std::make_shared<FuzzRemoteConnections>();
  int next_conn = 1000;
  std::vector<std::shared_ptr<JoinOutcome>> joins;  // this input's

  DaemonCore() {
    engine->SetRemoteLink(std::make_shared<UnusedRemoteLink>());
    rdma.set_remote_connections(remote);
    peer_service.set_softnic(engine);
    peer_service.set_rdma(&rdma);
  }

  static DaemonCore& Get() {
    static DaemonCore* core = new DaemonCore();  // never destroyed: inputs share it
    return *core;
  }

  absl::StatusOr<daemon::SessionInfo> Open(uint32_t uid, std::string name = "fuzz") {
    const int conn = next_conn++;
    return lifecycle.Open(PeerCred{conn, uid, uid}, conn, std::move(name));
  }

  // JoinAsync, as LocalService::JoinGroup calls it.
  std::shared_ptr<JoinOutcome> StartJoin(const daemon::SessionInfo& s, daemon::ValidatedJoin join,
                                         daemon::FdBundlePtr bundle) {
    auto outcome = std::make_shared<JoinOutcome>(join, s.cred.uid);
    joins.push_back(outcome);
    broker.JoinAsync(s, std::move(join), std::move(bundle), outcome->Callback(outcome));
    return outcome;
  }

  // The end of an input: every session ends (as when every client exits),
  // every join is decided, and nothing is left for anyone.
  void Finish() {
    for (const daemon::SessionInfo& s : sessions.List()) lifecycle.End(s.id);
    for (const std::shared_ptr<JoinOutcome>& j : joins) j->CheckDone();
    joins.clear();
    CheckReleased();
  }

  void CheckReleased() {
    FUZZ_CHECK(sessions.size() == 0, sessions.size(), " sessions left");
    FUZZ_CHECK(broker.CountVisible(0, true) == 0, broker.CountVisible(0, true),
               " groups outlive every session");
    for (uint32_t uid : {kUidA, kUidB, 0u}) {
      daemon::GroupBroker::Usage u = broker.UsageOf(daemon::Principal{uid, ""});
      FUZZ_CHECK(u.ranks == 0 && u.waiting == 0 && u.view_bytes == 0, "uid ", uid, " still holds ",
                 u.ranks, " ranks, ", u.waiting, " waiting joins, ", u.view_bytes, " view bytes");
    }
    FUZZ_CHECK(fds.TicketCount() == 0, fds.TicketCount(), " fd tickets outlive every session");
    FUZZ_CHECK(fds.FdsHeld() == 0, fds.FdsHeld(), " fds held after every session ended");
    FUZZ_CHECK(rdma.ListQps(0, true).empty() && rdma.ListMrs(0, true).empty(),
               rdma.ListQps(0, true).size(), " QPs and ", rdma.ListMrs(0, true).size(),
               " regions outlive every session");
    FUZZ_CHECK(rdma.ControlMappings() == 0 && rdma.SessionsHolding() == 0, rdma.ControlMappings(),
               " control mappings, ", rdma.SessionsHolding(), " sessions still charged");
    for (uint32_t uid : {kUidA, kUidB, 0u}) {
      daemon::RdmaUsage u = rdma.UsageOf(daemon::Principal{uid, ""});
      FUZZ_CHECK(u.empty(), "uid ", uid, " still charged ", u.qps, " QPs, ", u.mrs, " regions, ",
                 u.bytes, " bytes");
    }
  }
};

// One input of a script fuzzer: `run` plays it on the shared core and ends
// every session; the process must then hold exactly the file descriptors
// it held before.
template <typename F>
void RunLeakChecked(F&& run) {
  const size_t fds_before = OpenFdCount();
  run();
  FUZZ_CHECK(OpenFdCount() == fds_before, "fd leak: ", fds_before, " fds open before, ",
             OpenFdCount(), " after");
}

// A bundle of `n` fresh memfds (the fds a client would PUT).
inline std::vector<UniqueFd> MemFds(size_t n) {
  std::vector<UniqueFd> out;
  for (size_t i = 0; i < n; ++i) {
    out.emplace_back(::memfd_create("fuzz", MFD_CLOEXEC));
    FUZZ_CHECK(out.back().valid(), "memfd_create");
  }
  return out;
}

// A memfd of `bytes` sealed against shrinking, every page populated (the
// daemon registers no other: mooncake/common/populate.h): what a client
// hands over for RDMA memory.
inline UniqueFd SealedMemfd(uint64_t bytes) {
  UniqueFd fd(::memfd_create("fuzz-rdma", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  FUZZ_CHECK(fd.valid() && ::ftruncate(fd.get(), static_cast<off_t>(bytes)) == 0 &&
                 PopulateMemfd(fd.get(), 0, bytes) == 0 &&
                 ::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) == 0,
             "sealed memfd");
  return fd;
}

// What EscapeForDisplay promises for a string a client chose.
inline void CheckEscaped(absl::string_view raw, size_t max_len) {
  const std::string shown = EscapeForDisplay(raw, max_len);
  FUZZ_CHECK(shown.size() <= std::max<size_t>(max_len, 3), shown.size(), " > ", max_len);
  FUZZ_CHECK(IsDisplaySafe(shown), "control characters survive escaping");
}

// Takes `session`'s events: the details they show (client-chosen text in
// part) are escaped.
inline void CheckEvents(DaemonCore& core, uint64_t session) {
  for (const v1::SessionEvent& ev : core.sessions.TakeEvents(session)) {
    CheckEscaped(ev.member().detail(), 1024);
  }
}

}  // namespace mooncake::fuzz
