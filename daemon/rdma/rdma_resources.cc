#include "rdma/rdma_resources.h"

#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "admission/admission_counter.h"
#include "mooncake/common/escape.h"
#include "mooncake/common/log.h"
#include "mooncake/common/random.h"
#include "mooncake/common/status.h"
#include "rdma/softnic_provider.h"

namespace mooncake::daemon {

namespace {

bool PowerOfTwo(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

// [offset, offset + bytes) inside [0, size), without overflow.
bool Fits(uint64_t offset, uint64_t bytes, uint64_t size) {
  return bytes <= size && offset <= size - bytes;
}

uint64_t PageFloor(uint64_t v) { return v - v % softnic::SharedMapping::PageSize(); }

}  // namespace

RdmaResources::RdmaResources(const SessionRegistry* sessions, RdmaLimits limits,
                             std::unique_ptr<RdmaProvider> provider,
                             softnic::CudaMemoryOptions cuda_options)
    : sessions_(sessions),
      limits_(limits),
      cuda_(softnic::CudaMemory::Create(std::move(cuda_options))),
      provider_(std::move(provider)),
      budget_(limits) {}

RdmaResources::RdmaResources(const SessionRegistry* sessions, std::string nic_name,
                             RdmaLimits limits, softnic::EngineOptions engine_options,
                             softnic::CudaMemoryOptions cuda_options)
    : RdmaResources(sessions, limits,
                    std::make_unique<SoftnicProvider>(std::move(nic_name), engine_options),
                    std::move(cuda_options)) {}

RdmaResources::~RdmaResources() = default;

std::shared_ptr<absl::Mutex> RdmaResources::GateOf(uint64_t session) {
  absl::MutexLock lock(&mu_);
  auto it = gates_.find(session);
  if (it != gates_.end()) return it->second;
  // A session already closed gets a gate of its own, not kept: its call is
  // refused by CheckOpen, and its end (which erased the entry, or finds
  // none because no call ever reached the provider) has nothing to wait for.
  auto gate = std::make_shared<absl::Mutex>();
  if (sessions_->Find(session)) gates_.emplace(session, gate);
  return gate;
}

absl::Status RdmaResources::CheckOpen(const SessionInfo& session) const {
  if (!sessions_->Find(session.id)) {
    return absl::FailedPreconditionError(absl::StrCat("session ", session.id, " has ended"));
  }
  return absl::OkStatus();
}

absl::Status RdmaResources::CheckOpenAndBudget(const SessionInfo& session,
                                               const RdmaUsage& more) const {
  if (absl::Status s = CheckOpen(session); !s.ok()) return s;
  return budget_.Check(session, more);
}

absl::Status RdmaResources::ValidateRegistration(const std::string& kind, uint64_t iova,
                                                 uint64_t length, uint64_t offset) const {
  if (absl::Status s = provider_->CheckMemoryKind(kind); !s.ok()) return s;
  if (length == 0) return absl::InvalidArgumentError("RegisterMemory: length 0");
  if (offset > UINT64_MAX - length || iova > UINT64_MAX - length) {
    return absl::InvalidArgumentError("RegisterMemory: offset/iova + length overflows");
  }
  return absl::OkStatus();
}

absl::StatusOr<RdmaResources::Registered> RdmaResources::RegisterMemory(
    const SessionInfo& session, FdBundlePtr fds, const std::string& kind, uint64_t iova,
    uint64_t length, uint64_t offset, uint32_t access, uint64_t allocation_bytes) {
  if (absl::Status s = ValidateRegistration(kind, iova, length, offset); !s.ok()) return s;
  if (!fds || fds->fds.size() != 1) {
    return absl::InvalidArgumentError("RegisterMemory needs exactly one fd on its ticket");
  }
  const bool gpu = kind == "cuda-vmm-fd";
  const bool dmabuf = kind == "dmabuf";
  // Host memory: only the pages holding the region are mapped. GPU memory:
  // CUDA maps an imported allocation only whole, so the mapping covers
  // allocation_bytes when the client says the allocation is larger than the
  // region (the region's bounds stay offset + length). A dmabuf is not
  // mapped here; the NIC pins the region's bytes, which are charged.
  const uint64_t map_offset = gpu || dmabuf ? 0 : PageFloor(offset);
  const uint64_t map_bytes = gpu      ? std::max(offset + length, allocation_bytes)
                             : dmabuf ? length
                                      : offset + length - map_offset;
  const RdmaUsage cost{0, 1, map_bytes};
  const std::shared_ptr<absl::Mutex> gate = GateOf(session.id);
  absl::MutexLock serial(gate.get());
  {
    // Before mapping anything: a refused call must not map first.
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckOpenAndBudget(session, cost); !s.ok()) return s;
  }
  RegionMemory memory;
  memory.session = session.id;
  memory.kind = kind;
  memory.iova = iova;
  memory.length = length;
  memory.access = access;
  memory.offset = offset - map_offset;
  if (dmabuf) {
    memory.dmabuf_fd = fds->fds[0].get();
  } else if (gpu) {
    // Imported and mapped in the daemon's CUDA context (created with the
    // first GPU region).
    absl::StatusOr<std::shared_ptr<softnic::CudaBuffer>> buffer =
        cuda_->Import(fds->fds[0].get(), map_bytes);
    if (!buffer.ok()) {
      return absl::Status(buffer.status().code(), absl::StrCat("registering GPU memory (", kind,
                                                               "): ", buffer.status().message()));
    }
    memory.cuda = *std::move(buffer);
  } else if (std::shared_ptr<softnic::SharedMapping> sealed =
                 sealed_.Find(fds->fds[0].get(), map_offset, map_bytes)) {
    // Control memory the daemon sealed: it can be mapped writable only
    // through the mapping that is there.
    memory.host = std::move(sealed);
  } else {
    absl::StatusOr<std::shared_ptr<softnic::SharedMapping>> mapping =
        softnic::SharedMapping::FromPopulatedMemfd(fds->fds[0].get(), map_offset, map_bytes);
    if (!mapping.ok()) return mapping.status();
    memory.host = *std::move(mapping);
  }

  {
    absl::MutexLock lock(&mu_);
    // Again: the session may have ended, or its user spent the budget, while
    // this call mapped. Charged now (reserved), so that calls of other
    // sessions of the uid, running while the provider works, see it.
    if (absl::Status s = CheckOpenAndBudget(session, cost); !s.ok()) return s;
    budget_.Charge(session, cost);
    provider_sessions_.insert(session.id);
  }
  // The provider's work (pinning, a NIC context) runs with mu_ free.
  absl::StatusOr<ProviderRegion> region = provider_->RegisterMemory(std::move(memory));
  absl::MutexLock lock(&mu_);
  if (!region.ok()) {
    budget_.Release(session.id, cost);
    return region.status();
  }
  mr_owner_[region->lkey] =
      MrEntry{Owner{session.id, session.cred.uid, session.cred.pid, session.tenant}, map_bytes,
              region->listed_kind};
  return Registered{region->lkey, region->rkey, region->listed_kind};
}

absl::Status RdmaResources::DeregisterMemory(const SessionInfo& session, uint32_t lkey) {
  const std::shared_ptr<absl::Mutex> gate = GateOf(session.id);
  absl::MutexLock serial(gate.get());
  {
    absl::MutexLock lock(&mu_);
    auto it = mr_owner_.find(lkey);
    if (it == mr_owner_.end() || it->second.owner.session != session.id) {
      return absl::NotFoundError("no memory region with that key in this session");
    }
  }
  if (absl::Status s = provider_->DeregisterMemory(session.id, lkey); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  // Still there: only this session's calls (serialized) or its end (which
  // waits for them) remove it.
  auto it = mr_owner_.find(lkey);
  if (it == mr_owner_.end()) return absl::OkStatus();
  budget_.Release(session.id, RdmaUsage{0, 1, it->second.charged_bytes});
  mr_owner_.erase(it);
  return absl::OkStatus();
}

absl::Status RdmaResources::ValidateQueuePairs(uint64_t control_bytes,
                                               const std::vector<QpLayout>& layouts) const {
  if (layouts.empty()) return absl::InvalidArgumentError("CreateQueuePairs: no queue pairs");
  if (control_bytes == 0) return absl::InvalidArgumentError("CreateQueuePairs: control_bytes 0");
  for (size_t i = 0; i < layouts.size(); ++i) {
    const QpLayout& l = layouts[i];
    if (!PowerOfTwo(l.sq_wqe_cnt) || l.sq_wqe_cnt > limits_.max_sq_wqes) {
      return absl::InvalidArgumentError(absl::StrCat("queue pair ", i, ": sq_wqe_cnt ",
                                                     l.sq_wqe_cnt, " is not a power of two in 1..",
                                                     limits_.max_sq_wqes));
    }
    if (!PowerOfTwo(l.cq_cqe_cnt) || l.cq_cqe_cnt < l.sq_wqe_cnt ||
        l.cq_cqe_cnt > provider_->max_cq_cqe_cnt()) {
      return absl::InvalidArgumentError(
          absl::StrCat("queue pair ", i, ": cq_cqe_cnt ", l.cq_cqe_cnt,
                       " is not a power of two in sq_wqe_cnt..", provider_->max_cq_cqe_cnt()));
    }
    const std::pair<uint64_t, uint64_t> rings[] = {{l.sq_offset, uint64_t{l.sq_wqe_cnt} * 64},
                                                   {l.sq_dbrec_offset, 8},
                                                   {l.cq_offset, uint64_t{l.cq_cqe_cnt} * 64},
                                                   {l.cq_dbrec_offset, 8}};
    for (const auto& [at, bytes] : rings) {
      if (!Fits(at, bytes, control_bytes)) {
        return absl::InvalidArgumentError(absl::StrCat("queue pair ", i, ": a ring at offset ", at,
                                                       " (", bytes, " bytes) is outside the ",
                                                       control_bytes, " bytes of control memory"));
      }
    }
  }
  return provider_->CheckLayouts(layouts);
}

absl::Status RdmaResources::ValidateControlKind(const std::string& kind) {
  if (kind.empty() || kind == "memfd" || kind == "dmabuf") return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("control_kind \"", EscapeForDisplay(kind, 32),
                   "\" is not a kind of control memory: \"memfd\" (host memory, a sealed memfd) "
                   "or \"dmabuf\" (GPU memory: the dmabuf fd of the rings' cuMem allocation)"));
}

absl::StatusOr<std::vector<uint32_t>> RdmaResources::CreateQueuePairs(
    const SessionInfo& session, FdBundlePtr control, uint64_t control_bytes,
    const std::vector<QpLayout>& layouts, const std::string& control_kind) {
  if (absl::Status s = ValidateControlKind(control_kind); !s.ok()) return s;
  if (absl::Status s = ValidateQueuePairs(control_bytes, layouts); !s.ok()) return s;
  const bool in_gpu_memory = control_kind == "dmabuf";
  if (!control || control->fds.size() != 1) {
    return absl::InvalidArgumentError(
        "CreateQueuePairs needs exactly one control fd on its ticket");
  }
  // Only the span the rings use is mapped (and charged): a sparse memfd of
  // terabytes costs the client nothing, the daemon address space.
  uint64_t lo = UINT64_MAX, hi = 0;
  for (const QpLayout& l : layouts) {
    lo = std::min({lo, l.sq_offset, l.sq_dbrec_offset, l.cq_offset, l.cq_dbrec_offset});
    hi = std::max({hi, l.sq_offset + uint64_t{l.sq_wqe_cnt} * 64, l.sq_dbrec_offset + 8,
                   l.cq_offset + uint64_t{l.cq_cqe_cnt} * 64, l.cq_dbrec_offset + 8});
  }
  const uint64_t map_offset = PageFloor(lo);
  const uint64_t map_bytes = hi - map_offset;
  const RdmaUsage cost{layouts.size(), 1, map_bytes};
  const std::shared_ptr<absl::Mutex> gate = GateOf(session.id);
  absl::MutexLock serial(gate.get());
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckOpenAndBudget(session, cost); !s.ok()) return s;
  }
  // GPU memory is the provider's to reach (a dmabuf umem); host memory the
  // daemon maps (sealed_memfd_mappings.h: mapped whole, then sealed against
  // hole punching, with every page of the span in memory): softnic reads
  // the rings and writes the CQs, and a NIC pins the whole span, so each
  // hole would be a page charged to the daemon's cgroup (a sparse memfd
  // with rings far apart: gigabytes). The span's pages are the client's
  // and stay in memory while mapped.
  std::shared_ptr<softnic::SharedMapping> mapping;
  if (!in_gpu_memory) {
    absl::StatusOr<std::shared_ptr<softnic::SharedMapping>> mapped =
        sealed_.Map(session.id, control->fds[0].get(), map_offset, map_bytes,
                    SealedMemfdMappings::Purpose::kControl);
    if (!mapped.ok()) {
      return absl::Status(mapped.status().code(),
                          absl::StrCat("RDMA control memory: ", mapped.status().message()));
    }
    mapping = *std::move(mapped);
  }

  uint64_t owner = 0;
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckOpenAndBudget(session, cost); !s.ok()) return s;
    budget_.Charge(session, cost);  // reserved, as in RegisterMemory
    provider_sessions_.insert(session.id);
    owner = OwnerIdLocked(Principal{session.cred.uid, session.tenant});
  }
  // Before its first queue pair: the work a QP brings is the owner's
  // (softnic's GPU workers share threads among owners).
  provider_->SessionOwner(session.id, owner);
  absl::StatusOr<std::vector<uint32_t>> created =
      in_gpu_memory
          ? provider_->CreateQueuePairsInGpuMemory(session.id, control->fds[0].get(), map_offset,
                                                   map_bytes, layouts)
          : provider_->CreateQueuePairs(session.id, std::move(mapping), map_offset, layouts);
  uint32_t clash = 0;
  {
    absl::MutexLock lock(&mu_);
    if (!created.ok()) {
      budget_.Release(session.id, cost);
      return created.status();
    }
    // QPs are known here by number alone. One NIC never hands out a number
    // twice, but two NICs each count their own: a session on another NIC
    // may hold the same number. Taking it over would give one session's QP
    // to another's bookkeeping, so the new QPs are refused instead.
    for (uint32_t qpn : *created) {
      if (qp_owner_.contains(qpn)) clash = qpn;
    }
    if (clash == 0) {
      std::vector<uint32_t> qpns = *std::move(created);
      const uint64_t id = next_control_++;
      controls_[id] = ControlEntry{session.id, map_bytes, static_cast<uint32_t>(qpns.size())};
      for (uint32_t qpn : qpns) {
        qp_owner_[qpn] =
            QpEntry{Owner{session.id, session.cred.uid, session.cred.pid, session.tenant}, id,
                    false, false};
      }
      return qpns;
    }
  }
  for (uint32_t qpn : *created) {
    if (absl::Status s = provider_->DestroyQueuePair(session.id, qpn); !s.ok()) {
      MC_LOG(kWarning, "destroying queue pair ", qpn, " of session ", session.id, ": ",
             s.message());
    }
  }
  absl::MutexLock lock(&mu_);
  budget_.Release(session.id, cost);
  return absl::UnavailableError(absl::StrCat(
      "queue pair number ", clash, " on ", provider_->SessionNic(session.id),
      " is also held by a queue pair on another NIC of this node: mooncaked knows queue pairs by "
      "number only, so sessions on different NICs can collide (a known limitation; creating them "
      "again may get other numbers). Until then, put every rank of a node on one NIC "
      "(SelectNic with one allowed NIC, or rdma_devices in mooncaked.conf)"));
}

absl::Status RdmaResources::Connect(const SessionInfo& session,
                                    const std::vector<QpConnection>& pairs) {
  const std::shared_ptr<absl::Mutex> gate = GateOf(session.id);
  absl::MutexLock serial(gate.get());
  std::vector<uint64_t> remote_sessions;
  remote_sessions.reserve(pairs.size());
  absl::flat_hash_set<std::string> remote_nodes;
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckOpen(session); !s.ok()) return s;
    absl::flat_hash_set<uint32_t> named;
    for (const QpConnection& c : pairs) {
      auto mine = qp_owner_.find(c.qpn);
      if (mine == qp_owner_.end() || mine->second.owner.session != session.id) {
        return absl::NotFoundError(
            absl::StrCat("queue pair ", c.qpn, " is not one of this session's"));
      }
      // Checked here, not left to the provider, so that no pair is connected
      // when a later one is refused.
      if (!named.insert(c.qpn).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("queue pair ", c.qpn, " is named twice: connect each queue pair once"));
      }
      if (mine->second.broken) {
        return absl::FailedPreconditionError(absl::StrCat(
            "queue pair ", c.qpn,
            " failed half way through an earlier connect and is in ERROR: destroy it and "
            "create another"));
      }
      if (mine->second.connected) {
        return absl::FailedPreconditionError(
            absl::StrCat("queue pair ", c.qpn,
                         " is already connected: a queue pair is connected once (destroy it and "
                         "create another to change its peer)"));
      }
      if (!c.remote_node.empty()) {
        // Another node's QP: that node decides whether it answers (its QP
        // must be connected back to this one, with the secret offered).
        remote_nodes.insert(c.remote_node);
        remote_sessions.push_back(0);
        continue;
      }
      auto remote = qp_owner_.find(c.remote_qpn);
      // Another user's QP reads as missing: no oracle for probing numbers.
      if (remote == qp_owner_.end() || remote->second.owner.uid != session.cred.uid ||
          remote->second.owner.tenant != session.tenant) {
        return absl::NotFoundError(
            absl::StrCat("remote queue pair ", c.remote_qpn, " does not exist on this node"));
      }
      remote_sessions.push_back(remote->second.owner.session);
    }
  }
  // Other nodes are checked without mu_ (it may take a PeerHello), still
  // before anything is connected.
  for (const std::string& node : remote_nodes) {
    if (remote_ == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("queue pairs to node ", node,
                       ": this daemon is not part of a cluster (etcd_endpoints and peer_listen in "
                       "mooncaked.conf)"));
    }
    if (absl::Status s = remote_->CheckNode(session.id, node); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("queue pairs to node ", node, ": ", s.message()));
    }
  }
  // The provider pins each responder to the session checked here (a QP of
  // another session destroyed meanwhile is not found, and its number, if
  // reused, names no QP of that session).
  for (size_t i = 0; i < pairs.size(); ++i) {
    const QpConnection& c = pairs[i];
    absl::Status s;
    if (c.remote_node.empty()) {
      s = provider_->Connect(session.id, c.qpn, remote_sessions[i], c.remote_qpn);
    } else {
      // One secret per QP: a retry after a lost reply offers the one the
      // other node may already hold (it takes the same secret again, and
      // refuses another for a connection it has).
      std::string secret;
      {
        absl::MutexLock lock(&mu_);
        std::string& held = qp_owner_[c.qpn].remote_secret;
        if (held.empty()) held = RandomBytes(softnic::Engine::kSecretBytes);
        secret = held;
      }
      absl::StatusOr<QpEndpoint> mine = provider_->EndpointOf(session.id, c.qpn);
      absl::StatusOr<QpEndpoint> theirs =
          mine.ok() ? remote_->Offer(c.remote_node, c.qpn, c.remote_qpn, session.cred.uid,
                                     session.tenant, secret, *mine)
                    : mine.status();
      s = theirs.ok() ? provider_->ConnectRemote(session.id, c.qpn, c.remote_node, c.remote_qpn,
                                                 std::move(secret), *theirs)
                      : theirs.status();
    }
    if (!s.ok()) {
      return HalfConnected(session, pairs, i, s);
    }
    absl::MutexLock lock(&mu_);
    qp_owner_[c.qpn].connected = true;
  }
  return absl::OkStatus();
}

absl::Status RdmaResources::HalfConnected(const SessionInfo& session,
                                          const std::vector<QpConnection>& pairs, size_t failed,
                                          const absl::Status& why) {
  // softnic cannot refuse what Connect checked (unless a peer destroyed its
  // QP meanwhile); a NIC can (a port went down, the firmware refused a
  // transition). Pairs are connected in request order and none is undone:
  // a QP in RTS cannot be moved back without destroying it, which would
  // change its number under the client. So the error says exactly where
  // the call stopped, and the failed QP's state decides what comes next.
  const uint32_t qpn = pairs[failed].qpn;
  bool in_reset = true;
  for (const softnic::QpInfo& q : provider_->ListQps()) {
    if (q.qpn == qpn && q.pd == session.id) in_reset = q.state == softnic::QpState::kReset;
  }
  if (!in_reset) {
    absl::MutexLock lock(&mu_);
    if (auto it = qp_owner_.find(qpn); it != qp_owner_.end()) it->second.broken = true;
  }
  // At most this many QPNs per list in the message; the ranges by request
  // index stay exact.
  constexpr size_t kListed = 32;
  auto list = [&](size_t from, size_t to) {
    std::string out;
    for (size_t i = from; i < to && i < from + kListed; ++i) {
      absl::StrAppend(&out, i == from ? "" : ", ", pairs[i].qpn);
    }
    if (to - from > kListed) absl::StrAppend(&out, " and ", to - from - kListed, " more");
    return out;
  };
  std::string where = absl::StrCat(provider_->name(), " refused connecting queue pair ", qpn,
                                   " to ", pairs[failed].remote_qpn, " (pair ", failed, " of ",
                                   pairs.size(), "): ", why.message(), ". ");
  if (failed > 0) {
    absl::StrAppend(&where, "Connected (RTS, keep them): pairs 0..", failed - 1, ", queue pairs ",
                    list(0, failed), ". ");
  } else {
    absl::StrAppend(&where, "No pair was connected. ");
  }
  if (failed + 1 < pairs.size()) {
    absl::StrAppend(&where, "Not attempted (RESET, connect them in another call): pairs ",
                    failed + 1, "..", pairs.size() - 1, ", queue pairs ",
                    list(failed + 1, pairs.size()), ". ");
  }
  absl::StrAppend(&where, "Queue pair ", qpn,
                  in_reset ? " is still in RESET: it may be connected again"
                           : " is in ERROR (refused half way): destroy it (DestroyQueuePairs) "
                             "and create another");
  return absl::Status(why.code(), where);
}

void RdmaResources::ForgetQpLocked(uint32_t qpn) {
  auto it = qp_owner_.find(qpn);
  if (it == qp_owner_.end()) return;
  const uint64_t session = it->second.owner.session;
  budget_.Release(session, RdmaUsage{1, 0, 0});
  auto c = controls_.find(it->second.control);
  if (c != controls_.end() && --c->second.qps == 0) {
    budget_.Release(session, RdmaUsage{0, 1, c->second.bytes});
    controls_.erase(c);
  }
  qp_owner_.erase(it);
}

absl::Status RdmaResources::DestroyQueuePairs(const SessionInfo& session,
                                              const std::vector<uint32_t>& qpns) {
  const std::shared_ptr<absl::Mutex> gate = GateOf(session.id);
  absl::MutexLock serial(gate.get());
  {
    absl::MutexLock lock(&mu_);
    absl::flat_hash_set<uint32_t> named;
    for (uint32_t qpn : qpns) {
      auto it = qp_owner_.find(qpn);
      if (it == qp_owner_.end() || it->second.owner.session != session.id) {
        return absl::NotFoundError(
            absl::StrCat("queue pair ", qpn, " is not one of this session's"));
      }
      // A QP named twice would be given back twice.
      if (!named.insert(qpn).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("queue pair ", qpn, " is named twice: destroy each queue pair once"));
      }
    }
  }
  for (uint32_t qpn : qpns) {
    if (absl::Status s = provider_->DestroyQueuePair(session.id, qpn); !s.ok()) {
      MC_LOG(kWarning, "destroying queue pair ", qpn, " of session ", session.id, ": ",
             s.message());
    }
    absl::MutexLock lock(&mu_);
    ForgetQpLocked(qpn);
  }
  return absl::OkStatus();
}

absl::Status RdmaResources::AttachCopyAgent(const SessionInfo& session, FdBundlePtr fds,
                                            uint64_t staging_bytes) {
  if (!fds || fds->fds.size() != 1) {
    return absl::InvalidArgumentError("AttachCopyAgent needs exactly one fd on its ticket");
  }
  MC_RETURN_IF_ERROR(
      copy_agent::CheckStagingBytes(staging_bytes, softnic::SharedMapping::PageSize()));
  const uint64_t bytes = copy_agent::kHeaderBytes + staging_bytes;
  const RdmaUsage cost{0, 0, bytes};
  const std::shared_ptr<absl::Mutex> gate = GateOf(session.id);
  absl::MutexLock serial(gate.get());
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckOpenAndBudget(session, cost); !s.ok()) return s;
  }
  // Populated and sealed (sealed_memfd_mappings.h): the daemon writes the
  // header and the staging area, and must not fault in pages on its own
  // account.
  MC_ASSIGN_OR_RETURN(
      std::shared_ptr<softnic::SharedMapping> mapping,
      sealed_.Map(session.id, fds->fds[0].get(), 0, bytes, SealedMemfdMappings::Purpose::kChannel));
  MC_ASSIGN_OR_RETURN(std::shared_ptr<softnic::CopyAgentLink> link,
                      softnic::CopyAgentLink::Create(
                          std::move(mapping), staging_bytes, session.cred.pid,
                          softnic::CopyAgentLinkOptions{.timeout = copy_agent_timeout_}));
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckOpenAndBudget(session, cost); !s.ok()) return s;
  }
  if (absl::Status s = provider_->AttachCopyAgent(session.id, std::move(link)); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  budget_.Charge(session, cost);
  provider_sessions_.insert(session.id);
  return absl::OkStatus();
}

uint64_t RdmaResources::OwnerIdLocked(const Principal& who) {
  auto [it, fresh] = owner_ids_.try_emplace(who, owner_ids_.size() + 1);
  return it->second;
}

void RdmaResources::SessionEnded(uint64_t session) {
  // After the session's calls in flight: none starts once it is closed in
  // the registry (CheckOpen), which happens before this is called.
  const std::shared_ptr<absl::Mutex> gate = GateOf(session);
  absl::MutexLock serial(gate.get());
  RdmaUsage held;
  {
    absl::MutexLock lock(&mu_);
    gates_.erase(session);
    // A session the provider never saw has nothing there. One it saw may
    // hold state no budget counts (an mlx5 context opened by a call that then
    // failed, or by the doorbell hand-off): the provider is told either way.
    held = budget_.EndSession(session);
    sealed_.SessionEnded(session);
    if (auto h = doorbell_handed_out_.find(session); h != doorbell_handed_out_.end()) {
      // Charged until its process exits (the client holds the context).
      auto pidfd = handoff_pidfds_.extract(session);
      lingering_handoffs_.push_back(
          LingeringHandoff{h->second, pidfd.empty() ? UniqueFd() : std::move(pidfd.mapped())});
      doorbell_handed_out_.erase(h);
      ReapHandoffsLocked();
    }
    if (provider_sessions_.erase(session) == 0) return;
    absl::erase_if(qp_owner_, [&](const auto& kv) { return kv.second.owner.session == session; });
    absl::erase_if(mr_owner_, [&](const auto& kv) { return kv.second.owner.session == session; });
    absl::erase_if(controls_, [&](const auto& kv) { return kv.second.session == session; });
  }
  // Tearing down a NIC context can take a while: not under mu_.
  provider_->SessionEnded(session);
  if (held.empty()) return;
  MC_LOG(kInfo, "session ", session, ": released ", held.qps, " queue pairs and ", held.mrs,
         " memory regions (", held.bytes, " bytes mapped)");
}

absl::StatusOr<DoorbellAccess> RdmaResources::OpenDoorbellAccess(const SessionInfo& session) {
  const std::shared_ptr<absl::Mutex> gate = GateOf(session.id);
  absl::MutexLock serial(gate.get());
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckOpen(session); !s.ok()) return s;
    // Once per session: each hand-off is a context and a command fd held
    // until the ticket is redeemed or expires, so a loop of Open/Release
    // must not pile them up.
    if (doorbell_handed_out_.contains(session.id)) {
      return absl::FailedPreconditionError(
          "the doorbell hand-off was already made in this session (once per session; connect "
          "again for another)");
    }
    // Counted per (uid, tenant), as every budget; root on the main socket
    // is counted, never refused.
    const Principal who{session.cred.uid, session.tenant};
    ReapHandoffsLocked();
    auto held = handoffs_by_principal_.find(who);
    const uint32_t n = held == handoffs_by_principal_.end() ? 0 : held->second;
    if (!AdmissionCounter::Privileged(who) && n >= limits_.max_doorbell_handoffs_per_uid) {
      return absl::ResourceExhaustedError(absl::StrCat(
          who.Describe(), " holds ", n,
          " doorbell hand-offs (a verbs context each, held by its processes until they exit); "
          "the limit is ",
          limits_.max_doorbell_handoffs_per_uid,
          " (max_doorbell_handoffs_per_uid in mooncaked.conf): end processes that are done, or "
          "keep the cpu-assisted doorbell"));
    }
    provider_sessions_.insert(session.id);
  }
  absl::StatusOr<DoorbellAccess> access = provider_->OpenDoorbellAccess(session.id);
  if (!access.ok()) return access.status();
  {
    absl::MutexLock lock(&mu_);
    const Principal who{session.cred.uid, session.tenant};
    doorbell_handed_out_.emplace(session.id, who);
    ++handoffs_by_principal_[who];
    // The process to outlive (SO_PEERCRED's pid; 0 when it is in a pid
    // namespace this daemon cannot see: released with the session then).
    if (session.cred.pid > 0) {
      const int fd = static_cast<int>(::syscall(SYS_pidfd_open, session.cred.pid, 0));
      if (fd >= 0) handoff_pidfds_.emplace(session.id, UniqueFd(fd));
    }
  }
  MC_LOG(kInfo, "session ", session.id, " (uid ", session.cred.uid, ", pid ", session.cred.pid,
         "): doorbell hand-off on ", access->device, ": its kernels ring the NIC (gpu-uar)");
  return access;
}

absl::StatusOr<SessionLink> RdmaResources::LinkOf(const SessionInfo& session) {
  // Under the session's gate: a context its own call is opening meanwhile
  // is waited for, and then reported.
  const std::shared_ptr<absl::Mutex> gate = GateOf(session.id);
  absl::MutexLock serial(gate.get());
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckOpen(session); !s.ok()) return s;
  }
  return provider_->LinkOf(session.id);
}

absl::StatusOr<NicChoice> RdmaResources::SelectNic(const SessionInfo& session,
                                                   const NicRequest& request) {
  MC_ASSIGN_OR_RETURN(NicChoice choice,
                      ChooseSessionNic(topology_, provider_->served_nics(), request));
  const std::shared_ptr<absl::Mutex> gate = GateOf(session.id);
  absl::MutexLock serial(gate.get());
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckOpen(session); !s.ok()) return s;
    if (!budget_.OfSession(session.id).empty()) {
      if (provider_->SessionNic(session.id) == choice.nic) return choice;
      return absl::FailedPreconditionError(absl::StrCat(
          "this session's queue pairs and regions are on ", provider_->SessionNic(session.id),
          " already: choose the NIC before registering memory or creating queue pairs"));
    }
    provider_sessions_.insert(session.id);
  }
  MC_RETURN_IF_ERROR(provider_->BindSessionNic(session.id, choice.nic));
  return choice;
}

absl::Status RdmaResources::ReleaseDoorbellAccess(const SessionInfo& session) {
  const std::shared_ptr<absl::Mutex> gate = GateOf(session.id);
  absl::MutexLock serial(gate.get());
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckOpen(session); !s.ok()) return s;
    if (!doorbell_handed_out_.contains(session.id)) return absl::OkStatus();
  }
  MC_RETURN_IF_ERROR(provider_->ReleaseDoorbellAccess(session.id));
  MC_LOG(kInfo, "session ", session.id, ": doorbell hand-off released: doorbells are ",
         provider_->doorbell_mode());
  return absl::OkStatus();
}

std::vector<QpRow> RdmaResources::ListQps(uint32_t uid, bool all) const {
  std::vector<softnic::QpInfo> qps = provider_->ListQps();
  absl::flat_hash_map<uint32_t, QpRingCounters> counters;
  for (const QpRingCounters& c : provider_->ListRingCounters()) counters[c.qpn] = c;
  absl::MutexLock lock(&mu_);
  std::vector<QpRow> rows;
  for (const softnic::QpInfo& q : qps) {
    auto it = qp_owner_.find(q.qpn);
    if (it == qp_owner_.end()) continue;
    const Owner& o = it->second.owner;
    if (!all && o.uid != uid) continue;
    rows.push_back(QpRow{q, o.session, o.uid, o.pid});
    if (auto c = counters.find(q.qpn); c != counters.end()) rows.back().rings = c->second;
  }
  return rows;
}

std::vector<MrRow> RdmaResources::ListMrs(uint32_t uid, bool all) const {
  std::vector<softnic::RegionInfo> regions = provider_->ListRegions();
  absl::MutexLock lock(&mu_);
  std::vector<MrRow> rows;
  for (const softnic::RegionInfo& r : regions) {
    auto it = mr_owner_.find(r.key);
    if (it == mr_owner_.end()) continue;
    if (!all && it->second.owner.uid != uid) continue;
    rows.push_back(MrRow{r, it->second.owner.session, it->second.owner.uid, it->second.owner.pid,
                         it->second.kind});
  }
  return rows;
}

size_t RdmaResources::QpCountOf(uint64_t session) const {
  return static_cast<size_t>(UsageOfSession(session).qps);
}

RdmaUsage RdmaResources::UsageOfSession(uint64_t session) const {
  absl::MutexLock lock(&mu_);
  return budget_.OfSession(session);
}

absl::StatusOr<QpEndpoint> RdmaResources::AcceptOffer(const std::string& node, uint32_t their_qpn,
                                                      uint32_t qpn, uint32_t uid,
                                                      const std::string& tenant, std::string secret,
                                                      const QpEndpoint& theirs) {
  uint64_t session = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = qp_owner_.find(qpn);
    if (it == qp_owner_.end() || it->second.owner.uid != uid || it->second.owner.tenant != tenant) {
      // The same answer for a missing QP and another owner's: no oracle.
      return absl::NotFoundError(absl::StrCat("no queue pair ", qpn, " of uid ", uid,
                                              " waits for node ", node, "'s queue pair ",
                                              their_qpn));
    }
    session = it->second.owner.session;
  }
  // Only a node of the session's groups: any other node with a certificate
  // of the cluster's CA could otherwise plant its secret on a waiting QP
  // (breaking the connection its owner is making) or learn its endpoint.
  if (remote_ == nullptr || !remote_->AcceptsOfferFrom(session, node, kOfferMemberWait)) {
    return absl::NotFoundError(absl::StrCat("no queue pair ", qpn, " of uid ", uid,
                                            " waits for node ", node, "'s queue pair ", their_qpn));
  }
  if (theirs.provider != provider_->name()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "node ", node, "'s queue pair ", their_qpn, " is on its ",
        theirs.provider.empty() ? "unnamed" : theirs.provider, " provider and queue pair ", qpn,
        " here on ", provider_->name(),
        ": both ends of a queue pair need the same provider (rdma_provider in mooncaked.conf on "
        "both nodes)"));
  }
  MC_RETURN_IF_ERROR(provider_->AcceptRemote(session, qpn, node, their_qpn, std::move(secret)));
  return provider_->EndpointOf(session, qpn);
}

void RdmaResources::ReapHandoffsLocked() {
  std::erase_if(lingering_handoffs_, [&](const LingeringHandoff& h) {
    if (h.pidfd.valid()) {
      pollfd p{h.pidfd.get(), POLLIN, 0};
      if (::poll(&p, 1, 0) == 0) return false;  // still running
    }
    auto n = handoffs_by_principal_.find(h.who);
    if (n != handoffs_by_principal_.end() && --n->second == 0) handoffs_by_principal_.erase(n);
    return true;
  });
}

RdmaUsage RdmaResources::UsageOf(const Principal& who) const {
  absl::MutexLock lock(&mu_);
  return budget_.Of(who);
}

size_t RdmaResources::SessionsHolding() const {
  absl::MutexLock lock(&mu_);
  return budget_.sessions();
}

RdmaUsage RdmaResources::Totals() const {
  absl::MutexLock lock(&mu_);
  RdmaUsage u;
  u.qps = qp_owner_.size();
  u.mrs = mr_owner_.size();
  for (const auto& [key, mr] : mr_owner_) u.bytes += mr.charged_bytes;
  return u;
}

size_t RdmaResources::ControlMappings() const {
  absl::MutexLock lock(&mu_);
  return controls_.size();
}

}  // namespace mooncake::daemon
