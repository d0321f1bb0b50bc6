#include "rdma/mlx5/mlx5_provider.h"

#include <unistd.h>

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "mooncake/common/escape.h"
#include "mooncake/common/log.h"
#include "mooncake/common/random.h"
#include "mooncake/common/status.h"
#include "mooncake/device/mlx5/prm.h"
#include "mooncake/device/qp_error.h"
#include "rdma/mlx5/cq_error_scan.h"
#include "softnic/cuda_memory.h"

namespace mooncake::daemon::mlx5 {

namespace {

uint64_t RoundUp(uint64_t v, uint64_t to) { return (v + to - 1) / to * to; }

// A QP's initial send PSN: random, as rdma-core's examples and perftest
// choose, so that packets of an earlier QP with the same number (a QPN
// reused on either node) fall outside the sequence the peer expects.
uint32_t RandomPsn() {
  const std::string bytes = RandomBytes(3);
  return (uint32_t{static_cast<uint8_t>(bytes[0])} << 16) |
         (uint32_t{static_cast<uint8_t>(bytes[1])} << 8) | static_cast<uint8_t>(bytes[2]);
}

// The peer's address as PlanConnect takes it.
RemoteQp RemoteOf(const LocalEndpoint& ep, uint32_t qpn, uint32_t psn) {
  RemoteQp remote;
  remote.qpn = qpn;
  remote.psn = psn;
  remote.lid = ep.lid;
  remote.gid = ep.gid.gid;
  remote.gid_type = ep.gid.type;
  remote.mtu = ep.active_mtu;
  return remote;
}

std::optional<GidType> ParseGidType(const std::string& name) {
  for (GidType t : {GidType::kIb, GidType::kRoceV1, GidType::kRoceV2}) {
    if (name == GidTypeName(t)) return t;
  }
  return std::nullopt;
}

}  // namespace

Mlx5Provider::Mlx5Provider(std::vector<Mlx5SessionOptions> nics, Mlx5ProviderOptions options)
    : nics_(std::move(nics)),
      tuning_(options.tuning),
      open_(
          options.open
              ? std::move(options.open)
              : NicSessionOpener(
                    [](const Mlx5SessionOptions& o) -> absl::StatusOr<std::unique_ptr<NicSession>> {
                      MC_ASSIGN_OR_RETURN(std::unique_ptr<Mlx5Session> s, Mlx5Session::Open(o));
                      return std::unique_ptr<NicSession>(std::move(s));
                    })),
      handoff_rights_(options.handoff_rights ? std::move(options.handoff_rights)
                                             : HandOffRightsCheck(&CheckHandOffRights)) {}

std::vector<std::string> Mlx5Provider::served_nics() const {
  std::vector<std::string> out;
  for (const Mlx5SessionOptions& o : nics_) out.push_back(o.device);
  return out;
}

absl::Status Mlx5Provider::BindSessionNic(uint64_t session, const std::string& nic) {
  size_t index = nics_.size();
  for (size_t i = 0; i < nics_.size(); ++i) {
    if (nics_[i].device == nic) index = i;
  }
  if (index == nics_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("the mlx5 provider does not serve ", nic));
  }
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(session);
  if (it != sessions_.end() && it->second->mlx5->device() != nic) {
    return absl::FailedPreconditionError(
        absl::StrCat("the session's objects are on ", it->second->mlx5->device(),
                     " already: choose the NIC before registering memory or creating queue pairs"));
  }
  bound_[session] = index;
  return absl::OkStatus();
}

std::string Mlx5Provider::SessionNic(uint64_t session) const {
  return NicOptionsOf(session).device;
}

const Mlx5SessionOptions& Mlx5Provider::NicOptionsOf(uint64_t session) const {
  absl::MutexLock lock(&mu_);
  auto it = bound_.find(session);
  return nics_[it == bound_.end() ? 0 : it->second];
}

namespace {

SessionLink LinkOfEndpoint(const LocalEndpoint& ep) {
  SessionLink link;
  link.is_roce = ep.link_layer == LinkLayer::kEthernet;
  link.gid_index = ep.gid.index;
  link.gid_type = GidTypeName(ep.gid.type);
  return link;
}

}  // namespace

absl::StatusOr<SessionLink> Mlx5Provider::LinkOf(uint64_t session) {
  if (std::shared_ptr<Session> s = Find(session)) return LinkOfEndpoint(s->mlx5->endpoint());
  // Not opened yet (the client asks before choosing its NIC, and its
  // first object opens the context): what a context on that NIC chooses
  // now, by the same code. Not kept: the session's own open decides.
  // GetRdmaInfo needs no session, so any user could make the daemon open
  // device contexts back to back: one probe at a time, its answer reused
  // for a moment.
  const Mlx5SessionOptions& o = NicOptionsOf(session);
  absl::MutexLock lock(&probe_mu_);
  absl::StatusOr<ProbedLink> probed = ProbeLocked(o);
  if (!probed.ok()) {
    return absl::Status(probed.status().code(), absl::StrCat("querying the link of ", o.device,
                                                             ": ", probed.status().message()));
  }
  return probed->link;
}

absl::StatusOr<Mlx5Provider::ProbedLink> Mlx5Provider::ProbeLocked(const Mlx5SessionOptions& o) {
  const absl::Time now = absl::Now();
  if (auto it = probed_.find(o.device);
      it != probed_.end() && now - it->second.at < kLinkProbeReuse) {
    return it->second.answer;
  }
  absl::StatusOr<std::unique_ptr<NicSession>> probe = open_(o);
  absl::StatusOr<ProbedLink> answer =
      probe.ok() ? absl::StatusOr<ProbedLink>(
                       ProbedLink{LinkOfEndpoint((*probe)->endpoint()), (*probe)->atomics()})
                 : absl::StatusOr<ProbedLink>(probe.status());
  probed_.insert_or_assign(o.device, Probe{answer, now});
  return answer;
}

std::string Mlx5Provider::AtomicsOf(const std::string& nic) {
  const Mlx5SessionOptions* o = nullptr;
  for (const Mlx5SessionOptions& n : nics_) {
    if (n.device == nic) o = &n;
  }
  if (o == nullptr) return "";
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, s] : sessions_) {
      if (s->mlx5 != nullptr && s->mlx5->device() == nic && !s->mlx5->atomics().empty()) {
        return s->mlx5->atomics();
      }
    }
  }
  absl::MutexLock lock(&probe_mu_);
  absl::StatusOr<ProbedLink> probed = ProbeLocked(*o);
  if (!probed.ok()) return absl::StrCat("unknown: ", probed.status().message());
  return probed->atomics;
}

Mlx5Provider::~Mlx5Provider() {
  // Every session's QPs leave the doorbell thread before their UAR goes.
  absl::MutexLock lock(&mu_);
  for (auto& [id, s] : sessions_) {
    for (const auto& [qpn, qp] : s->qps) doorbell_.Unwatch(DoorbellKey(id, qpn));
  }
  sessions_.clear();
}

absl::Status Mlx5Provider::CheckMemoryKind(const std::string& kind) const {
  if (kind == "memfd" || kind == "dmabuf" || kind == "cuda-vmm-fd") return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "memory kind \"", kind, "\" is not one the mlx5 provider registers: \"memfd\" (host memory, ",
      "a sealed memfd), \"dmabuf\" (GPU memory: the dmabuf fd of cuMemGetHandleForAddressRange) "
      "or \"cuda-vmm-fd\" (GPU memory through nvidia-peermem)"));
}

absl::Status Mlx5Provider::CheckLayouts(const std::vector<QpLayout>& layouts) const {
  for (size_t i = 0; i < layouts.size(); ++i) {
    const QpLayout& l = layouts[i];
    const std::pair<const char*, uint64_t> rings[] = {{"sq_offset", l.sq_offset},
                                                      {"cq_offset", l.cq_offset}};
    for (const auto& [name, at] : rings) {
      if (at % kUmemPageSize != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "queue pair ", i, ": ", name, " ", at, " is not a multiple of ", kUmemPageSize,
            ": the mlx5 provider needs each ring on a 4 KiB boundary "
            "of the control memory"));
      }
    }
    const std::pair<const char*, uint64_t> records[] = {{"sq_dbrec_offset", l.sq_dbrec_offset},
                                                        {"cq_dbrec_offset", l.cq_dbrec_offset}};
    for (const auto& [name, at] : records) {
      if (at % kDbrecBytes != 0) {
        return absl::InvalidArgumentError(absl::StrCat("queue pair ", i, ": ", name, " ", at,
                                                       " is not a multiple of ", kDbrecBytes));
      }
    }
  }
  return absl::OkStatus();
}

std::shared_ptr<Mlx5Provider::Session> Mlx5Provider::Find(uint64_t session) const {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(session);
  return it == sessions_.end() ? nullptr : it->second;
}

absl::StatusOr<std::shared_ptr<Mlx5Provider::Session>> Mlx5Provider::SessionFor(uint64_t session) {
  if (std::shared_ptr<Session> s = Find(session)) return s;
  size_t nic = 0;
  {
    absl::MutexLock lock(&mu_);
    if (auto it = bound_.find(session); it != bound_.end()) nic = it->second;
  }
  absl::StatusOr<std::unique_ptr<NicSession>> opened = open_(nics_[nic]);
  if (!opened.ok()) {
    return absl::Status(opened.status().code(),
                        absl::StrCat("opening the mlx5 context for session ", session, ": ",
                                     opened.status().message()));
  }
  auto s = std::make_shared<Session>();
  s->mlx5 = *std::move(opened);
  absl::MutexLock lock(&mu_);
  sessions_.emplace(session, s);
  return s;
}

absl::StatusOr<ProviderRegion> Mlx5Provider::RegisterMemory(RegionMemory m) {
  MC_ASSIGN_OR_RETURN(std::shared_ptr<Session> s, SessionFor(m.session));
  absl::StatusOr<NicSession::MemoryRegion> mr;
  if (m.dmabuf_fd >= 0) {
    NicSession::GpuMemory gpu;
    gpu.dmabuf_fd = m.dmabuf_fd;
    gpu.offset = m.offset;
    gpu.length = m.length;
    gpu.iova = m.iova;
    gpu.access = m.access;
    mr = s->mlx5->RegisterGpuMemory(gpu);
  } else if (m.cuda != nullptr) {
    // The allocation as the daemon's CUDA context maps it; the buffer stays
    // mapped while the region lives.
    void* at = reinterpret_cast<void*>(static_cast<uintptr_t>(m.cuda->base() + m.offset));
    mr = s->mlx5->RegisterPeermemMemory(at, m.length, m.iova, m.access, m.cuda);
    if (!mr.ok()) {
      mr = absl::Status(mr.status().code(),
                        absl::StrCat(mr.status().message(),
                                     " (\"cuda-vmm-fd\" needs nvidia-peermem on mlx5: send the "
                                     "allocation's dmabuf fd as kind \"dmabuf\" instead)"));
    }
  } else if (m.host != nullptr) {
    mr = s->mlx5->RegisterHostMemory(m.host->data() + m.offset, m.length, m.iova, m.access, m.host);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("the mlx5 provider got no memory for a \"", m.kind, "\" region"));
  }
  if (!mr.ok()) return mr.status();
  softnic::RegionInfo info;
  info.key = mr->lkey;
  info.pd = m.session;
  info.iova = m.iova;
  info.length = m.length;
  info.access = m.access | softnic::kLocalWrite;
  info.kind = m.host != nullptr ? softnic::MemoryKind::kHost : softnic::MemoryKind::kCuda;
  absl::MutexLock lock(&mu_);
  s->regions[mr->lkey] = info;
  return ProviderRegion{mr->lkey, mr->rkey, MrPathName(mr->path)};
}

absl::Status Mlx5Provider::DeregisterMemory(uint64_t session, uint32_t lkey) {
  std::shared_ptr<Session> s = Find(session);
  {
    absl::MutexLock lock(&mu_);
    if (s == nullptr || !s->regions.contains(lkey)) {
      return absl::NotFoundError("no memory region with that key in this session");
    }
  }
  MC_RETURN_IF_ERROR(s->mlx5->DeregisterMemory(lkey));
  absl::MutexLock lock(&mu_);
  s->regions.erase(lkey);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint32_t>> Mlx5Provider::CreateQueuePairs(
    uint64_t session, std::shared_ptr<softnic::SharedMapping> control, uint64_t control_offset,
    const std::vector<QpLayout>& layouts) {
  MC_RETURN_IF_ERROR(CheckLayouts(layouts));
  MC_ASSIGN_OR_RETURN(std::shared_ptr<Session> s, SessionFor(session));
  // The mapping starts on a page; a umem covers whole pages (the tail of
  // the last one is mapped with it).
  MC_ASSIGN_OR_RETURN(
      const uint32_t umem,
      s->mlx5->RegisterHostUmem(control->data(), RoundUp(control->size(), kUmemPageSize), control));
  return CreateOnUmem(session, *s, umem, control_offset, layouts, std::move(control));
}

absl::StatusOr<std::vector<uint32_t>> Mlx5Provider::CreateQueuePairsInGpuMemory(
    uint64_t session, int dmabuf_fd, uint64_t control_offset, uint64_t control_bytes,
    const std::vector<QpLayout>& layouts) {
  MC_RETURN_IF_ERROR(CheckLayouts(layouts));
  MC_ASSIGN_OR_RETURN(std::shared_ptr<Session> s, SessionFor(session));
  {
    absl::MutexLock lock(&mu_);
    if (!s->client_rings) {
      // The CPU-assisted doorbell reads the send doorbell record and the
      // WQE it announces: in GPU memory the daemon has neither.
      return absl::FailedPreconditionError(
          "rings in GPU memory need the session to ring its own doorbells (doorbell_mode "
          "\"gpu-uar\", GetDoorbellAccess first): with cpu-assisted doorbells the daemon reads "
          "the doorbell records, so keep the rings in host memory");
    }
  }
  absl::StatusOr<uint32_t> umem =
      s->mlx5->RegisterDmabufUmem(dmabuf_fd, control_offset, RoundUp(control_bytes, kUmemPageSize));
  if (!umem.ok()) {
    return absl::Status(umem.status().code(),
                        absl::StrCat("registering the GPU memory of the rings as umem: ",
                                     umem.status().message(), " (keep the rings in host memory)"));
  }
  return CreateOnUmem(session, *s, *umem, control_offset, layouts, nullptr);
}

absl::StatusOr<std::vector<uint32_t>> Mlx5Provider::CreateOnUmem(
    uint64_t session, Session& s, uint32_t umem, uint64_t control_offset,
    const std::vector<QpLayout>& layouts, std::shared_ptr<softnic::SharedMapping> control) {
  std::vector<uint32_t> qpns;
  std::vector<Qp> made;
  for (size_t i = 0; i < layouts.size(); ++i) {
    const QpLayout& l = layouts[i];
    QpRings rings;
    rings.sq = {umem, l.sq_offset - control_offset};
    rings.sq_wqe_cnt = l.sq_wqe_cnt;
    rings.sq_dbrec = {umem, l.sq_dbrec_offset - control_offset};
    rings.cq = {umem, l.cq_offset - control_offset};
    rings.cq_cqe_cnt = l.cq_cqe_cnt;
    rings.cq_dbrec = {umem, l.cq_dbrec_offset - control_offset};
    absl::StatusOr<NicSession::QueuePair> qp = s.mlx5->CreateQueuePair(rings);
    if (!qp.ok()) {
      for (uint32_t done : qpns) (void)s.mlx5->DestroyQueuePair(done);
      (void)s.mlx5->DeregisterUmem(umem);
      return absl::Status(qp.status().code(),
                          absl::StrCat("queue pair ", i, ": ", qp.status().message(),
                                       control == nullptr ? " (rings in GPU memory)" : ""));
    }
    Qp entry;
    entry.info.qpn = qp->qpn;
    entry.info.pd = session;
    entry.info.sq_wqe_cnt = l.sq_wqe_cnt;
    entry.info.nic = s.mlx5->device();
    entry.info.rings_in_gpu_memory = control == nullptr;
    entry.umem = umem;
    entry.psn = RandomPsn();
    if (control != nullptr) {
      entry.sq_dbrec = control->data() + rings.sq_dbrec.offset;
      entry.cq_dbrec = control->data() + rings.cq_dbrec.offset;
      entry.cq = CqView{control, control->data() + rings.cq.offset, l.cq_cqe_cnt};
      entry.control = control;
    }
    made.push_back(std::move(entry));
    qpns.push_back(qp->qpn);
  }
  absl::MutexLock lock(&mu_);
  for (Qp& q : made) {
    const uint32_t qpn = q.info.qpn;
    s.qps[qpn] = std::move(q);
  }
  s.umem_qps[umem] = static_cast<uint32_t>(qpns.size());
  return qpns;
}

absl::Status Mlx5Provider::Connect(uint64_t session, uint32_t qpn, uint64_t remote_session,
                                   uint32_t remote_qpn) {
  std::shared_ptr<Session> s = Find(session);
  std::shared_ptr<Session> peer = Find(remote_session);
  uint32_t peer_psn = 0;
  {
    absl::MutexLock lock(&mu_);
    if (s == nullptr || !s->qps.contains(qpn) || peer == nullptr ||
        !peer->qps.contains(remote_qpn)) {
      return absl::NotFoundError(
          absl::StrCat("queue pair ", qpn, " or ", remote_qpn, " is not on this mlx5 provider"));
    }
    peer_psn = peer->qps.at(remote_qpn).psn;
  }
  // Both QPs are on this node: the peer's address is its session's
  // endpoint (fixed when its context opened).
  return ConnectTo(session, s, qpn, RemoteOf(peer->mlx5->endpoint(), remote_qpn, peer_psn));
}

absl::StatusOr<QpEndpoint> Mlx5Provider::EndpointOf(uint64_t session, uint32_t qpn) {
  std::shared_ptr<Session> s = Find(session);
  uint32_t psn = 0;
  {
    absl::MutexLock lock(&mu_);
    if (s == nullptr || !s->qps.contains(qpn)) {
      return absl::NotFoundError(absl::StrCat("queue pair ", qpn, " is not one of this session's"));
    }
    psn = s->qps.at(qpn).psn;
  }
  const LocalEndpoint& ep = s->mlx5->endpoint();
  QpEndpoint e;
  e.provider = name_;
  e.is_roce = ep.link_layer == LinkLayer::kEthernet;
  e.lid = ep.lid;
  e.gid = ep.gid.gid;
  e.gid_index = ep.gid.index;
  e.gid_type = GidTypeName(ep.gid.type);
  e.mtu = ep.active_mtu;
  e.psn = psn;
  return e;
}

absl::Status Mlx5Provider::AcceptRemote(uint64_t session, uint32_t qpn, const std::string& node,
                                        uint32_t remote_qpn, std::string secret) {
  // The NIC matches the peer's packets by QPN, GID (or LID) and PSN, with
  // the random PSNs standing where softnic checks a batch's secret; nothing
  // is kept of the offer. The QP must still be this session's, and once
  // connected, connected to exactly that peer (its endpoint, PSN included,
  // goes to no one else; the same answer as for a missing QP).
  (void)secret;
  const absl::Status missing =
      absl::NotFoundError(absl::StrCat("no queue pair ", qpn, " on this mlx5 provider"));
  std::shared_ptr<Session> s = Find(session);
  if (s == nullptr) return missing;
  absl::MutexLock lock(&mu_);
  auto it = s->qps.find(qpn);
  if (it == s->qps.end()) return missing;
  const Qp& qp = it->second;
  const bool connected = qp.info.state != softnic::QpState::kReset;
  if (connected && (qp.remote_node != node || qp.info.remote_qpn != remote_qpn)) return missing;
  return absl::OkStatus();
}

absl::Status Mlx5Provider::ConnectRemote(uint64_t session, uint32_t qpn, const std::string& node,
                                         uint32_t remote_qpn, std::string secret,
                                         const QpEndpoint& peer) {
  (void)secret;  // softnic's; a NIC has the PSNs (AcceptRemote)
  std::shared_ptr<Session> s = Find(session);
  {
    absl::MutexLock lock(&mu_);
    if (s == nullptr || !s->qps.contains(qpn)) {
      return absl::NotFoundError(absl::StrCat("queue pair ", qpn, " is not one of this session's"));
    }
  }
  const std::string whose = absl::StrCat("node ", node, "'s queue pair ", remote_qpn);
  if (peer.provider != name_) {
    return absl::FailedPreconditionError(absl::StrCat(
        whose, " is on its ", peer.provider.empty() ? "unnamed" : peer.provider,
        " provider and this one on mlx5: both ends of a queue pair need the same provider "
        "(rdma_provider in mooncaked.conf on both nodes)"));
  }
  const LocalEndpoint& mine = s->mlx5->endpoint();
  const bool roce = mine.link_layer == LinkLayer::kEthernet;
  if (peer.is_roce != roce) {
    return absl::FailedPreconditionError(absl::StrCat(
        whose, " is on an ", peer.is_roce ? "Ethernet (RoCE)" : "InfiniBand", " port and ",
        s->mlx5->device(), " here on an ", roce ? "Ethernet (RoCE)" : "InfiniBand",
        " one: a queue pair connects only over one link layer (rdma_devices on both nodes)"));
  }
  std::optional<GidType> type = ParseGidType(peer.gid_type);
  if (!type.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(whose, " came with GID type '",
                                                   EscapeForDisplay(peer.gid_type, 16),
                                                   "' (expected IB, RoCE v1 or RoCE v2)"));
  }
  RemoteQp remote;
  remote.qpn = remote_qpn;
  remote.psn = peer.psn;
  remote.lid = peer.lid;
  remote.gid = peer.gid;
  remote.gid_type = *type;
  remote.mtu = peer.mtu;
  absl::Status st = ConnectTo(session, s, qpn, remote);
  if (!st.ok()) return absl::Status(st.code(), absl::StrCat("to ", whose, ": ", st.message()));
  absl::MutexLock lock(&mu_);
  if (auto it = s->qps.find(qpn); it != s->qps.end()) it->second.remote_node = node;
  return st;
}

absl::Status Mlx5Provider::ConnectTo(uint64_t session, const std::shared_ptr<Session>& s,
                                     uint32_t qpn, const RemoteQp& remote) {
  uint32_t local_psn = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = s->qps.find(qpn);
    if (it == s->qps.end()) {
      return absl::NotFoundError(absl::StrCat("queue pair ", qpn, " is not one of this session's"));
    }
    local_psn = it->second.psn;
  }
  if (absl::Status st = s->mlx5->Connect(qpn, local_psn, remote, tuning_); !st.ok()) {
    if (!s->mlx5->InReset(qpn)) {
      // Half way (INIT or RTR): no transition leads back but to RESET via
      // destruction. Listed as ERROR so mcctl and RdmaResources say so.
      absl::MutexLock lock(&mu_);
      if (auto it = s->qps.find(qpn); it != s->qps.end()) {
        it->second.info.state = softnic::QpState::kError;
      }
    }
    return st;
  }
  absl::MutexLock lock(&mu_);
  Qp& qp = s->qps[qpn];
  qp.info.state = softnic::QpState::kRts;
  qp.info.remote_qpn = remote.qpn;
  // A session that rings itself is never watched (the header says why);
  // rings in GPU memory only exist for such a session.
  if (s->client_rings || qp.sq_dbrec == nullptr) return absl::OkStatus();
  CpuDoorbell::Qp watched;
  watched.dbrec = qp.sq_dbrec;
  watched.qpn = qpn;
  watched.reg = s->mlx5->doorbell_register();
  watched.keep_alive = qp.control;
  doorbell_.Watch(DoorbellKey(session, qpn), std::move(watched));
  return absl::OkStatus();
}

absl::Status Mlx5Provider::DestroyQueuePair(uint64_t session, uint32_t qpn) {
  std::shared_ptr<Session> s = Find(session);
  uint32_t umem = 0;
  CqView cq;
  {
    absl::MutexLock lock(&mu_);
    if (s == nullptr || !s->qps.contains(qpn)) {
      return absl::NotFoundError(absl::StrCat("queue pair ", qpn, " is not one of this session's"));
    }
    umem = s->qps.at(qpn).umem;
    cq = s->qps.at(qpn).cq;
  }
  // Why the NIC failed it, if it did: read before the QP goes, logged below.
  const uint8_t syndrome = FailureSyndrome(cq);
  // Out of the doorbell thread before the QP goes.
  doorbell_.Unwatch(DoorbellKey(session, qpn));
  MC_RETURN_IF_ERROR(s->mlx5->DestroyQueuePair(qpn));
  bool last_of_umem = false;
  {
    absl::MutexLock lock(&mu_);
    if (auto it = s->qps.find(qpn); it != s->qps.end()) {
      LogFailureOnce(session, it->second, syndrome, "as it was destroyed");
    }
    s->qps.erase(qpn);
    auto u = s->umem_qps.find(umem);
    if (u != s->umem_qps.end() && --u->second == 0) {
      s->umem_qps.erase(u);
      last_of_umem = true;
    }
  }
  if (last_of_umem) {
    if (absl::Status st = s->mlx5->DeregisterUmem(umem); !st.ok()) {
      MC_LOG(kWarning, "mlx5: ", st.message(), " (freed with the session)");
    }
  }
  return absl::OkStatus();
}

void Mlx5Provider::SessionEnded(uint64_t session) {
  std::shared_ptr<Session> gone;
  std::vector<uint32_t> qpns;
  {
    absl::MutexLock lock(&mu_);
    bound_.erase(session);
    auto it = sessions_.find(session);
    if (it == sessions_.end()) return;
    gone = std::move(it->second);
    sessions_.erase(it);
    for (const auto& [qpn, qp] : gone->qps) qpns.push_back(qpn);
  }
  for (uint32_t qpn : qpns) doorbell_.Unwatch(DoorbellKey(session, qpn));
  // Out of the map: nobody else reads these QPs now, and their rings are
  // read without mu_.
  for (const auto& [qpn, qp] : gone->qps) {
    LogFailureOnce(session, qp, FailureSyndrome(qp.cq), "at its session's end");
  }
  // ~Mlx5Session (QPs, CQs, umems, regions, UAR, PD, context) with the last
  // reference: here, or after a peer's Connect that still holds it.
  gone.reset();
}

absl::Status Mlx5Provider::CheckNothingHeld(const Session& s, const char* what) const {
  if (s.regions.empty() && s.qps.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      what, " must come before the session registers memory or creates queue pairs (it holds ",
      s.regions.size(), " regions and ", s.qps.size(), " queue pairs)"));
}

absl::StatusOr<DoorbellAccess> Mlx5Provider::OpenDoorbellAccess(uint64_t session) {
  // Before any context opens for it: the context's rights are the opener's.
  MC_RETURN_IF_ERROR(handoff_rights_());
  MC_ASSIGN_OR_RETURN(std::shared_ptr<Session> s, SessionFor(session));
  {
    absl::MutexLock lock(&mu_);
    MC_RETURN_IF_ERROR(CheckNothingHeld(*s, "the doorbell hand-off"));
  }
  if (s->mlx5->uar().mmap_offset <= 0) {
    // Offset 0 is the legacy UAR the context opened with, not this
    // session's: a client mapping it would ring through the wrong page.
    // Kernels without dynamic UAR allocation report it (mlx5_ib before
    // UAR_OBJ support).
    return absl::FailedPreconditionError(absl::StrCat(
        s->mlx5->device(), " reported mmap offset ", s->mlx5->uar().mmap_offset,
        " for the session's UAR: this kernel's mlx5_ib driver cannot hand a UAR page to another "
        "process (no dynamic UAR mapping); update the kernel or OFED, or keep the daemon's "
        "cpu-assisted doorbell (do not ask for gpu-uar)"));
  }
  MC_ASSIGN_OR_RETURN(UniqueFd fd, s->mlx5->DupCommandFd());
  DoorbellAccess a;
  a.command_fd = std::move(fd);
  a.device = s->mlx5->device();
  a.uar_mmap_offset = s->mlx5->uar().mmap_offset;
  a.uar_reg_offset = s->mlx5->uar().reg_offset;
  // mlx5_ib_mmap maps a UAR as exactly one system page.
  a.uar_page_bytes = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  a.uar_non_cached = s->mlx5->uar().non_cached;
  absl::MutexLock lock(&mu_);
  s->client_rings = true;
  return a;
}

absl::Status Mlx5Provider::ReleaseDoorbellAccess(uint64_t session) {
  std::shared_ptr<Session> exposed;
  {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(session);
    if (it == sessions_.end() || !it->second->client_rings) return absl::OkStatus();
    MC_RETURN_IF_ERROR(CheckNothingHeld(*it->second, "releasing the doorbell hand-off"));
    // The client's copy of the command fd keeps that context alive for as
    // long as it holds it; the daemon stops using it. The session's next
    // call opens a fresh context nobody else holds.
    exposed = std::move(it->second);
    sessions_.erase(it);
  }
  exposed.reset();
  return absl::OkStatus();
}

std::vector<softnic::QpInfo> Mlx5Provider::ListQps() const {
  std::vector<softnic::QpInfo> out;
  // The CQ rings are read without mu_ (a ring is up to thousands of CQEs,
  // and mu_ guards only the maps: one listing must not stall every
  // session's lookups); the copied mapping keeps each ring readable.
  struct Look {
    size_t row;
    uint64_t session;
    uint32_t qpn;
    CqView cq;
  };
  std::vector<Look> looks;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, s] : sessions_) {
      for (const auto& [qpn, qp] : s->qps) {
        out.push_back(qp.info);
        if (s->client_rings) out.back().doorbell_mode = "gpu-uar";
        if (qp.cq.cq != nullptr) looks.push_back(Look{out.size() - 1, id, qpn, qp.cq});
      }
    }
  }
  // The NIC's error, as softnic's QPs report theirs; logged once per QP.
  std::vector<const Look*> failed;
  for (const Look& l : looks) {
    if (const uint8_t syndrome = FailureSyndrome(l.cq); syndrome != 0) {
      out[l.row].last_syndrome = syndrome;
      out[l.row].state = softnic::QpState::kError;
      failed.push_back(&l);
    }
  }
  if (!failed.empty()) {
    absl::MutexLock lock(&mu_);
    for (const Look* l : failed) {
      auto s = sessions_.find(l->session);
      if (s == sessions_.end()) continue;
      auto qp = s->second->qps.find(l->qpn);
      if (qp != s->second->qps.end()) {
        LogFailureOnce(l->session, qp->second, out[l->row].last_syndrome, "listing queue pairs");
      }
    }
  }
  return out;
}

uint8_t Mlx5Provider::FailureSyndrome(const CqView& v) {
  if (v.cq == nullptr || v.control == nullptr) return 0;  // rings in GPU memory
  // A page the client punched out of an unsealed memfd is not faulted in
  // on the daemon's account.
  if (!v.control->resident(v.cq, uint64_t{v.cqe_cnt} * device::mlx5::kCqeBytes)) return 0;
  return CqFailureSyndrome(v.cq, v.cqe_cnt);
}

void Mlx5Provider::LogFailureOnce(uint64_t session, const Qp& qp, uint8_t syndrome,
                                  const char* when) {
  if (syndrome == 0 || qp.failure_logged) return;
  qp.failure_logged = true;
  MC_LOG(kWarning, "mlx5: queue pair ", qp.info.qpn, " of session ", session, " on ", qp.info.nic,
         " failed (seen ", when, "): ", device::DescribeCqeSyndrome(syndrome));
}

std::vector<QpRingCounters> Mlx5Provider::ListRingCounters() const {
  absl::MutexLock lock(&mu_);
  std::vector<QpRingCounters> out;
  for (const auto& [id, s] : sessions_) {
    // qp.control keeps the mapping the records lie in while the QP is here.
    // Records in GPU memory are out of its reach: not listed.
    for (const auto& [qpn, qp] : s->qps) {
      if (qp.sq_dbrec != nullptr) out.push_back(ReadRingCounters(qpn, qp.sq_dbrec, qp.cq_dbrec));
    }
  }
  return out;
}

std::vector<softnic::RegionInfo> Mlx5Provider::ListRegions() const {
  absl::MutexLock lock(&mu_);
  std::vector<softnic::RegionInfo> out;
  for (const auto& [id, s] : sessions_) {
    for (const auto& [key, r] : s->regions) out.push_back(r);
  }
  return out;
}

size_t Mlx5Provider::sessions_open() const {
  absl::MutexLock lock(&mu_);
  return sessions_.size();
}

}  // namespace mooncake::daemon::mlx5
