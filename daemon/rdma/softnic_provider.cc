#include "rdma/softnic_provider.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace mooncake::daemon {

SoftnicProvider::SoftnicProvider(std::string nic_name, softnic::EngineOptions options)
    : nic_(std::move(nic_name)), engine_(options) {
  engine_.Start();
}

SoftnicProvider::~SoftnicProvider() { engine_.Stop(); }

absl::Status SoftnicProvider::CheckMemoryKind(const std::string& kind) const {
  if (kind == "memfd" || kind == "cuda-vmm-fd") return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "memory kind \"", kind,
      "\" is not one the softnic provider registers: \"memfd\" (host memory, a sealed memfd) "
      "or \"cuda-vmm-fd\" (GPU memory, the POSIX fd of a cuMem allocation)"));
}

absl::StatusOr<ProviderRegion> SoftnicProvider::RegisterMemory(RegionMemory memory) {
  softnic::RegionSpec spec;
  spec.pd = memory.session;
  spec.iova = memory.iova;
  spec.length = memory.length;
  spec.access = memory.access | softnic::kLocalWrite;
  spec.offset = memory.offset;
  const bool gpu = memory.cuda != nullptr;
  if (gpu) {
    spec.kind = softnic::MemoryKind::kCuda;
    spec.cuda = std::move(memory.cuda);
  } else if (memory.host != nullptr) {
    spec.kind = softnic::MemoryKind::kHost;
    spec.mapping = std::move(memory.host);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("the softnic provider cannot register \"", memory.kind, "\" memory"));
  }
  absl::StatusOr<uint32_t> key = engine_.RegisterRegion(std::move(spec));
  if (!key.ok()) return key.status();
  return ProviderRegion{*key, *key, gpu ? "cuda-vmm" : "host"};
}

absl::Status SoftnicProvider::DeregisterMemory(uint64_t session, uint32_t lkey) {
  return engine_.DeregisterRegion(session, lkey);
}

absl::StatusOr<std::vector<uint32_t>> SoftnicProvider::CreateQueuePairs(
    uint64_t session, std::shared_ptr<softnic::SharedMapping> control, uint64_t control_offset,
    const std::vector<QpLayout>& layouts) {
  std::vector<uint32_t> qpns;
  qpns.reserve(layouts.size());
  for (size_t i = 0; i < layouts.size(); ++i) {
    const QpLayout& l = layouts[i];
    softnic::QpSpec spec;
    spec.pd = session;
    spec.mapping = control;
    spec.sq_offset = l.sq_offset - control_offset;
    spec.sq_wqe_cnt = l.sq_wqe_cnt;
    spec.sq_dbrec_offset = l.sq_dbrec_offset - control_offset;
    spec.cq_offset = l.cq_offset - control_offset;
    spec.cq_cqe_cnt = l.cq_cqe_cnt;
    spec.cq_dbrec_offset = l.cq_dbrec_offset - control_offset;
    absl::StatusOr<uint32_t> qpn = engine_.CreateQp(std::move(spec));
    if (!qpn.ok()) {
      for (uint32_t done : qpns) (void)engine_.DestroyQp(session, done);
      return absl::Status(qpn.status().code(),
                          absl::StrCat("queue pair ", i, ": ", qpn.status().message()));
    }
    qpns.push_back(*qpn);
  }
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < layouts.size(); ++i) {
    records_[qpns[i]] =
        Records{session, control->data() + (layouts[i].sq_dbrec_offset - control_offset),
                control->data() + (layouts[i].cq_dbrec_offset - control_offset), control};
  }
  return qpns;
}

absl::Status SoftnicProvider::Connect(uint64_t session, uint32_t qpn, uint64_t remote_session,
                                      uint32_t remote_qpn) {
  return engine_.Connect(session, qpn, remote_qpn, remote_session);
}

absl::Status SoftnicProvider::AcceptRemote(uint64_t session, uint32_t qpn, const std::string& node,
                                           uint32_t remote_qpn, std::string secret) {
  (void)session;  // RdmaResources found `qpn` in it
  return engine_.AcceptConnectionSecret(node, remote_qpn, qpn, std::move(secret));
}

absl::Status SoftnicProvider::ConnectRemote(uint64_t session, uint32_t qpn, const std::string& node,
                                            uint32_t remote_qpn, std::string secret,
                                            const QpEndpoint& peer) {
  if (peer.provider != name()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "node ", node, "'s queue pair ", remote_qpn, " is on its ", peer.provider,
        " provider and this one on softnic: both ends of a queue pair need the same provider "
        "(rdma_provider in mooncaked.conf on both nodes)"));
  }
  return engine_.ConnectRemote(session, qpn, node, remote_qpn, std::move(secret));
}

absl::Status SoftnicProvider::DestroyQueuePair(uint64_t session, uint32_t qpn) {
  {
    // Before the engine frees the number, which another session's
    // CreateQueuePairs may then be given (and record).
    absl::MutexLock lock(&mu_);
    if (auto it = records_.find(qpn); it != records_.end() && it->second.session == session) {
      records_.erase(it);
    }
  }
  return engine_.DestroyQp(session, qpn);
}

void SoftnicProvider::SessionOwner(uint64_t session, uint64_t owner) {
  engine_.SetPdOwner(session, owner);
}

void SoftnicProvider::SessionEnded(uint64_t session) {
  {
    absl::MutexLock lock(&mu_);
    absl::erase_if(records_, [&](const auto& kv) { return kv.second.session == session; });
  }
  engine_.DestroyPd(session);
}

std::vector<QpRingCounters> SoftnicProvider::ListRingCounters() const {
  absl::MutexLock lock(&mu_);
  std::vector<QpRingCounters> out;
  out.reserve(records_.size());
  for (const auto& [qpn, r] : records_)
    out.push_back(ReadRingCounters(qpn, r.sq_dbrec, r.cq_dbrec));
  return out;
}

std::string SoftnicProvider::AtomicsOf(const std::string& nic) {
  if (nic != nic_) return "";
  const softnic::EngineOptions& o = engine_.options();
  if (o.atomics == softnic::AtomicsModel::kHca) {
    return absl::StrCat(
        "hca model: fetch-add 8 B, masked fetch-add 4 B as a read, the add and a "
        "write (window ",
        o.hca_atomic_window_us, " us), atomic only against NIC atomics; fence round trip ",
        o.hca_round_trip_us, " us");
  }
  return "device model: fetch-add 8 B, masked fetch-add 4 B as atomics of the target memory "
         "(atomic against everything, unlike a NIC: softnic_atomics = hca models one)";
}

}  // namespace mooncake::daemon
