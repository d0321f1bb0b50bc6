#include "rdma/rdma_resources.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "mooncake/common/log.h"

namespace mooncake::daemon {

namespace {

absl::Status Exhausted(const char* what, uint64_t have, uint64_t limit, const char* key) {
  return absl::ResourceExhaustedError(absl::StrCat("this session already holds ", have, " ", what,
                                                   " (limit ", limit, ", config key ", key, ")"));
}

bool PowerOfTwo(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

}  // namespace

RdmaResources::RdmaResources(const SessionRegistry* sessions, std::string nic_name,
                             RdmaLimits limits, softnic::EngineOptions engine_options,
                             softnic::CudaMemoryOptions cuda_options)
    : sessions_(sessions),
      nic_(std::move(nic_name)),
      limits_(limits),
      cuda_(softnic::CudaMemory::Create(std::move(cuda_options))),
      engine_(engine_options) {
  engine_.Start();
}

RdmaResources::~RdmaResources() { engine_.Stop(); }

absl::Status RdmaResources::CheckOpen(const SessionInfo& session) const {
  if (!sessions_->Find(session.id)) {
    return absl::FailedPreconditionError(absl::StrCat("session ", session.id, " has ended"));
  }
  return absl::OkStatus();
}

absl::StatusOr<RdmaResources::Registered> RdmaResources::RegisterMemory(
    const SessionInfo& session, FdBundlePtr fds, const std::string& kind, uint64_t iova,
    uint64_t length, uint64_t offset, uint32_t access, uint64_t allocation_bytes) {
  const bool gpu = kind == "cuda-vmm-fd";
  if (kind != "memfd" && !gpu) {
    return absl::InvalidArgumentError(absl::StrCat(
        "memory kind \"", kind,
        "\" is not one the softnic provider registers: \"memfd\" (host memory, a sealed memfd) "
        "or \"cuda-vmm-fd\" (GPU memory, the POSIX fd of a cuMem allocation)"));
  }
  if (!fds || fds->fds.size() != 1) {
    return absl::InvalidArgumentError("RegisterMemory needs exactly one fd on its ticket");
  }
  if (length == 0) return absl::InvalidArgumentError("RegisterMemory: length 0");
  if (offset > UINT64_MAX - length || iova > UINT64_MAX - length) {
    return absl::InvalidArgumentError("RegisterMemory: offset/iova + length overflows");
  }
  softnic::RegionSpec spec;
  spec.pd = session.id;
  spec.iova = iova;
  spec.length = length;
  spec.access = access | softnic::kLocalWrite;
  spec.offset = offset;
  if (gpu) {
    // Imported and mapped in the daemon's CUDA context (created with the
    // first GPU region). CUDA maps an imported allocation only whole, so the
    // mapping covers allocation_bytes when the client says the allocation is
    // larger than the region (the region's bounds stay offset + length).
    const uint64_t map_bytes = std::max(offset + length, allocation_bytes);
    absl::StatusOr<std::shared_ptr<softnic::CudaBuffer>> buffer =
        cuda_->Import(fds->fds[0].get(), map_bytes);
    if (!buffer.ok()) {
      return absl::Status(buffer.status().code(), absl::StrCat("registering GPU memory (", kind,
                                                               "): ", buffer.status().message()));
    }
    spec.kind = softnic::MemoryKind::kCuda;
    spec.cuda = *std::move(buffer);
  } else {
    absl::StatusOr<std::shared_ptr<softnic::SharedMapping>> mapping =
        softnic::SharedMapping::FromSealedMemfd(fds->fds[0].get(), offset + length);
    if (!mapping.ok()) return mapping.status();
    spec.kind = softnic::MemoryKind::kHost;
    spec.mapping = *std::move(mapping);
  }
  const std::string listed = gpu ? "cuda-vmm" : "host";

  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckOpen(session); !s.ok()) return s;
  SessionUse& use = use_[session.id];
  if (use.mrs >= limits_.max_mrs_per_session) {
    return Exhausted("memory regions", use.mrs, limits_.max_mrs_per_session, "max_mrs_per_session");
  }
  if (use.registered_bytes + length > limits_.max_registered_bytes_per_session) {
    return Exhausted("registered bytes", use.registered_bytes,
                     limits_.max_registered_bytes_per_session, "max_registered_bytes_per_session");
  }
  absl::StatusOr<uint32_t> key = engine_.RegisterRegion(std::move(spec));
  if (!key.ok()) return key.status();
  use.mrs += 1;
  use.registered_bytes += length;
  mr_owner_[*key] = MrEntry{Owner{session.id, session.cred.uid, session.cred.pid}, length, listed};
  return Registered{*key, *key, listed};
}

absl::Status RdmaResources::DeregisterMemory(const SessionInfo& session, uint32_t lkey) {
  absl::MutexLock lock(&mu_);
  auto it = mr_owner_.find(lkey);
  if (it == mr_owner_.end() || it->second.owner.session != session.id) {
    return absl::NotFoundError("no memory region with that key in this session");
  }
  if (absl::Status s = engine_.DeregisterRegion(session.id, lkey); !s.ok()) return s;
  SessionUse& use = use_[session.id];
  use.mrs -= 1;
  use.registered_bytes -= std::min(use.registered_bytes, it->second.length);
  mr_owner_.erase(it);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint32_t>> RdmaResources::CreateQueuePairs(
    const SessionInfo& session, FdBundlePtr control, uint64_t control_bytes,
    const std::vector<QpLayout>& layouts) {
  if (layouts.empty()) return absl::InvalidArgumentError("CreateQueuePairs: no queue pairs");
  if (!control || control->fds.size() != 1) {
    return absl::InvalidArgumentError(
        "CreateQueuePairs needs exactly one control fd on its ticket");
  }
  for (size_t i = 0; i < layouts.size(); ++i) {
    const QpLayout& l = layouts[i];
    if (!PowerOfTwo(l.sq_wqe_cnt) || l.sq_wqe_cnt > limits_.max_sq_wqes) {
      return absl::InvalidArgumentError(absl::StrCat("queue pair ", i, ": sq_wqe_cnt ",
                                                     l.sq_wqe_cnt, " is not a power of two in 1..",
                                                     limits_.max_sq_wqes));
    }
  }
  absl::StatusOr<std::shared_ptr<softnic::SharedMapping>> mapping =
      softnic::SharedMapping::FromSealedMemfd(control->fds[0].get(), control_bytes);
  if (!mapping.ok()) return mapping.status();

  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckOpen(session); !s.ok()) return s;
  SessionUse& use = use_[session.id];
  if (use.qps + layouts.size() > limits_.max_qps_per_session) {
    return Exhausted("queue pairs", use.qps, limits_.max_qps_per_session, "max_qps_per_session");
  }
  std::vector<uint32_t> qpns;
  qpns.reserve(layouts.size());
  for (size_t i = 0; i < layouts.size(); ++i) {
    const QpLayout& l = layouts[i];
    softnic::QpSpec spec;
    spec.pd = session.id;
    spec.mapping = *mapping;
    spec.sq_offset = l.sq_offset;
    spec.sq_wqe_cnt = l.sq_wqe_cnt;
    spec.sq_dbrec_offset = l.sq_dbrec_offset;
    spec.cq_offset = l.cq_offset;
    spec.cq_cqe_cnt = l.cq_cqe_cnt;
    spec.cq_dbrec_offset = l.cq_dbrec_offset;
    absl::StatusOr<uint32_t> qpn = engine_.CreateQp(std::move(spec));
    if (!qpn.ok()) {
      for (uint32_t done : qpns) {
        (void)engine_.DestroyQp(session.id, done);
        qp_owner_.erase(done);
      }
      use.qps -= static_cast<uint32_t>(qpns.size());
      return absl::Status(qpn.status().code(),
                          absl::StrCat("queue pair ", i, ": ", qpn.status().message()));
    }
    qpns.push_back(*qpn);
    qp_owner_[*qpn] = Owner{session.id, session.cred.uid, session.cred.pid};
    use.qps += 1;
  }
  return qpns;
}

absl::Status RdmaResources::Connect(const SessionInfo& session,
                                    const std::vector<QpConnection>& pairs) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckOpen(session); !s.ok()) return s;
  for (const QpConnection& c : pairs) {
    auto mine = qp_owner_.find(c.qpn);
    if (mine == qp_owner_.end() || mine->second.session != session.id) {
      return absl::NotFoundError(
          absl::StrCat("queue pair ", c.qpn, " is not one of this session's"));
    }
    auto remote = qp_owner_.find(c.remote_qpn);
    // Another user's QP reads as missing: no oracle for probing numbers.
    if (remote == qp_owner_.end() || remote->second.uid != session.cred.uid) {
      return absl::NotFoundError(
          absl::StrCat("remote queue pair ", c.remote_qpn, " does not exist on this node"));
    }
  }
  for (const QpConnection& c : pairs) {
    if (absl::Status s = engine_.Connect(session.id, c.qpn, c.remote_qpn); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status RdmaResources::DestroyQueuePairs(const SessionInfo& session,
                                              const std::vector<uint32_t>& qpns) {
  absl::MutexLock lock(&mu_);
  for (uint32_t qpn : qpns) {
    auto it = qp_owner_.find(qpn);
    if (it == qp_owner_.end() || it->second.session != session.id) {
      return absl::NotFoundError(absl::StrCat("queue pair ", qpn, " is not one of this session's"));
    }
  }
  SessionUse& use = use_[session.id];
  for (uint32_t qpn : qpns) {
    (void)engine_.DestroyQp(session.id, qpn);
    qp_owner_.erase(qpn);
    use.qps -= 1;
  }
  return absl::OkStatus();
}

void RdmaResources::SessionEnded(uint64_t session) {
  absl::MutexLock lock(&mu_);
  auto use = use_.find(session);
  if (use == use_.end()) return;
  engine_.DestroyPd(session);
  absl::erase_if(qp_owner_, [&](const auto& kv) { return kv.second.session == session; });
  absl::erase_if(mr_owner_, [&](const auto& kv) { return kv.second.owner.session == session; });
  if (use->second.qps != 0 || use->second.mrs != 0) {
    MC_LOG(kInfo, "session ", session, ": released ", use->second.qps, " queue pairs and ",
           use->second.mrs, " memory regions");
  }
  use_.erase(use);
}

std::vector<QpRow> RdmaResources::ListQps(uint32_t uid, bool all) const {
  std::vector<softnic::QpInfo> qps = engine_.ListQps();
  absl::MutexLock lock(&mu_);
  std::vector<QpRow> rows;
  for (const softnic::QpInfo& q : qps) {
    auto it = qp_owner_.find(q.qpn);
    if (it == qp_owner_.end()) continue;
    if (!all && it->second.uid != uid) continue;
    rows.push_back(QpRow{q, it->second.session, it->second.uid, it->second.pid});
  }
  return rows;
}

std::vector<MrRow> RdmaResources::ListMrs(uint32_t uid, bool all) const {
  std::vector<softnic::RegionInfo> regions = engine_.ListRegions();
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
  absl::MutexLock lock(&mu_);
  auto it = use_.find(session);
  return it == use_.end() ? 0 : it->second.qps;
}

}  // namespace mooncake::daemon
