#include "server/rdma_service.h"

#include "absl/strings/str_cat.h"
#include "mooncake/common/status.h"
#include "peering/node_registry.h"
#include "server/caller_session.h"
#include "softnic/types.h"

namespace mooncake::daemon {

namespace {

grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* ctx, const absl::Status& s) {
  return FinishUnary(ctx, s);
}

}  // namespace

absl::StatusOr<SessionInfo> RdmaService::CallerSession(const grpc::ServerContextBase* ctx) const {
  return daemon::CallerSession(*connections_, *sessions_, ctx);
}

grpc::ServerUnaryReactor* RdmaService::GetRdmaInfo(grpc::CallbackServerContext* ctx,
                                                   const v1::GetRdmaInfoRequest*,
                                                   v1::RdmaInfo* resp) {
  absl::StatusOr<Caller> caller = connections_->CallerOf(ctx);
  if (!caller.ok()) return Done(ctx, caller.status());
  // With a session: its NIC and link; without one, the default NIC's.
  absl::StatusOr<SessionInfo> session = CallerSession(ctx);
  return Done(ctx, HandleGetRdmaInfo(session.ok() ? &*session : nullptr, resp));
}

grpc::ServerUnaryReactor* RdmaService::RegisterMemory(grpc::CallbackServerContext* ctx,
                                                      const v1::RegisterMemoryRequest* req,
                                                      v1::RegisterMemoryResponse* resp) {
  absl::StatusOr<SessionInfo> session = CallerSession(ctx);
  if (!session.ok()) return Done(ctx, session.status());
  return Done(ctx, HandleRegisterMemory(*session, *req, resp));
}

grpc::ServerUnaryReactor* RdmaService::DeregisterMemory(grpc::CallbackServerContext* ctx,
                                                        const v1::DeregisterMemoryRequest* req,
                                                        v1::DeregisterMemoryResponse*) {
  absl::StatusOr<SessionInfo> session = CallerSession(ctx);
  if (!session.ok()) return Done(ctx, session.status());
  return Done(ctx, HandleDeregisterMemory(*session, *req));
}

grpc::ServerUnaryReactor* RdmaService::CreateQueuePairs(grpc::CallbackServerContext* ctx,
                                                        const v1::CreateQueuePairsRequest* req,
                                                        v1::CreateQueuePairsResponse* resp) {
  absl::StatusOr<SessionInfo> session = CallerSession(ctx);
  if (!session.ok()) return Done(ctx, session.status());
  return Done(ctx, HandleCreateQueuePairs(*session, *req, resp));
}

grpc::ServerUnaryReactor* RdmaService::ConnectQueuePairs(grpc::CallbackServerContext* ctx,
                                                         const v1::ConnectQueuePairsRequest* req,
                                                         v1::ConnectQueuePairsResponse*) {
  absl::StatusOr<SessionInfo> session = CallerSession(ctx);
  if (!session.ok()) return Done(ctx, session.status());
  return Done(ctx, HandleConnectQueuePairs(*session, *req));
}

grpc::ServerUnaryReactor* RdmaService::DestroyQueuePairs(grpc::CallbackServerContext* ctx,
                                                         const v1::DestroyQueuePairsRequest* req,
                                                         v1::DestroyQueuePairsResponse*) {
  absl::StatusOr<SessionInfo> session = CallerSession(ctx);
  if (!session.ok()) return Done(ctx, session.status());
  return Done(ctx, HandleDestroyQueuePairs(*session, *req));
}

grpc::ServerUnaryReactor* RdmaService::SelectNic(grpc::CallbackServerContext* ctx,
                                                 const v1::SelectNicRequest* req,
                                                 v1::SelectNicResponse* resp) {
  absl::StatusOr<SessionInfo> session = CallerSession(ctx);
  if (!session.ok()) return Done(ctx, session.status());
  return Done(ctx, HandleSelectNic(*session, *req, resp));
}

grpc::ServerUnaryReactor* RdmaService::GetDoorbellAccess(grpc::CallbackServerContext* ctx,
                                                         const v1::GetDoorbellAccessRequest*,
                                                         v1::DoorbellAccess* resp) {
  absl::StatusOr<SessionInfo> session = CallerSession(ctx);
  if (!session.ok()) return Done(ctx, session.status());
  return Done(ctx, HandleGetDoorbellAccess(*session, resp));
}

grpc::ServerUnaryReactor* RdmaService::ReleaseDoorbellAccess(
    grpc::CallbackServerContext* ctx, const v1::ReleaseDoorbellAccessRequest*,
    v1::ReleaseDoorbellAccessResponse*) {
  absl::StatusOr<SessionInfo> session = CallerSession(ctx);
  if (!session.ok()) return Done(ctx, session.status());
  return Done(ctx, rdma_->ReleaseDoorbellAccess(*session));
}

grpc::ServerUnaryReactor* RdmaService::AttachCopyAgent(grpc::CallbackServerContext* ctx,
                                                       const v1::AttachCopyAgentRequest* req,
                                                       v1::AttachCopyAgentResponse*) {
  absl::StatusOr<SessionInfo> session = CallerSession(ctx);
  if (!session.ok()) return Done(ctx, session.status());
  return Done(ctx, HandleAttachCopyAgent(*session, *req));
}

// ---- the RPCs for a session ------------------------------------------------------

absl::Status RdmaService::HandleAttachCopyAgent(const SessionInfo& caller,
                                                const v1::AttachCopyAgentRequest& req) {
  if (req.fd_ticket().empty()) {
    return absl::InvalidArgumentError("fd_ticket is empty: send the channel memfd first");
  }
  absl::StatusOr<FdBundlePtr> fds = fds_->TakeIncoming(caller.id, req.fd_ticket());
  if (!fds.ok()) return fds.status();
  return rdma_->AttachCopyAgent(caller, *std::move(fds), req.staging_bytes());
}

absl::Status RdmaService::HandleGetRdmaInfo(const SessionInfo* caller, v1::RdmaInfo* resp) {
  SessionLink link;
  if (caller != nullptr) {
    MC_ASSIGN_OR_RETURN(link, rdma_->LinkOf(*caller));
    resp->set_nic(rdma_->SessionNic(caller->id));
  } else {
    // No session: the default NIC, whose link a session 0 (never a real
    // one: ids count from 1) reports without binding anything.
    MC_ASSIGN_OR_RETURN(link, rdma_->LinkOfDefaultNic());
    resp->set_nic(rdma_->nic());
  }
  resp->set_provider(rdma_->provider());
  resp->set_doorbell_mode(rdma_->doorbell_mode());
  resp->set_is_roce(link.is_roce);
  resp->set_gid_index(link.gid_index);
  resp->set_gid_type(link.gid_type);
  resp->set_max_qps_per_session(rdma_->limits().max_qps_per_session);
  resp->set_max_mrs_per_session(rdma_->limits().max_mrs_per_session);
  resp->set_max_sq_wqes(rdma_->limits().max_sq_wqes);
  return absl::OkStatus();
}

absl::Status RdmaService::HandleRegisterMemory(const SessionInfo& caller,
                                               const v1::RegisterMemoryRequest& req,
                                               v1::RegisterMemoryResponse* resp) {
  if (req.fd_ticket().empty()) {
    return absl::InvalidArgumentError("fd_ticket is empty: send the memfd first");
  }
  if (absl::Status s =
          rdma_->ValidateRegistration(req.kind(), req.iova(), req.length(), req.offset());
      !s.ok()) {
    return s;
  }
  absl::StatusOr<FdBundlePtr> fds = fds_->TakeIncoming(caller.id, req.fd_ticket());
  if (!fds.ok()) return fds.status();
  uint32_t access = 0;
  if (req.remote_write()) access |= softnic::kRemoteWrite;
  if (req.remote_atomic()) access |= softnic::kRemoteAtomic;
  absl::StatusOr<RdmaResources::Registered> r =
      rdma_->RegisterMemory(caller, *std::move(fds), req.kind(), req.iova(), req.length(),
                            req.offset(), access, req.allocation_bytes());
  if (!r.ok()) return r.status();
  resp->set_lkey(r->lkey);
  resp->set_rkey(r->rkey);
  resp->set_kind(r->kind);
  return absl::OkStatus();
}

absl::Status RdmaService::HandleDeregisterMemory(const SessionInfo& caller,
                                                 const v1::DeregisterMemoryRequest& req) {
  return rdma_->DeregisterMemory(caller, req.lkey());
}

absl::Status RdmaService::HandleCreateQueuePairs(const SessionInfo& caller,
                                                 const v1::CreateQueuePairsRequest& req,
                                                 v1::CreateQueuePairsResponse* resp) {
  if (req.qps_size() == 0 || req.qps_size() > kMaxQpsPerCall) {
    return absl::InvalidArgumentError(
        absl::StrCat("ask for 1..", kMaxQpsPerCall, " queue pairs per call, not ", req.qps_size()));
  }
  if (req.control_bytes() == 0 || req.fd_ticket().empty()) {
    return absl::InvalidArgumentError(
        "control_bytes and fd_ticket (the control memfd) are required");
  }
  std::vector<QpLayout> layouts;
  layouts.reserve(req.qps_size());
  for (const v1::QueuePairLayout& l : req.qps()) {
    layouts.push_back(QpLayout{l.sq_offset(), l.sq_wqe_cnt(), l.sq_dbrec_offset(), l.cq_offset(),
                               l.cq_cqe_cnt(), l.cq_dbrec_offset()});
  }
  if (absl::Status s = RdmaResources::ValidateControlKind(req.control_kind()); !s.ok()) return s;
  if (absl::Status s = rdma_->ValidateQueuePairs(req.control_bytes(), layouts); !s.ok()) return s;
  absl::StatusOr<FdBundlePtr> fds = fds_->TakeIncoming(caller.id, req.fd_ticket());
  if (!fds.ok()) return fds.status();
  absl::StatusOr<std::vector<uint32_t>> qpns =
      rdma_->CreateQueuePairs(caller, *std::move(fds), req.control_bytes(), layouts,
                              req.control_kind().empty() ? "memfd" : req.control_kind());
  if (!qpns.ok()) return qpns.status();
  for (uint32_t q : *qpns) resp->add_qpns(q);
  return absl::OkStatus();
}

absl::Status RdmaService::HandleConnectQueuePairs(const SessionInfo& caller,
                                                  const v1::ConnectQueuePairsRequest& req) {
  if (req.connections_size() > kMaxQpsPerCall) {
    return absl::InvalidArgumentError(
        absl::StrCat("at most ", kMaxQpsPerCall, " connections per call"));
  }
  std::vector<QpConnection> pairs;
  pairs.reserve(req.connections_size());
  for (const v1::QueuePairConnection& c : req.connections()) {
    if (!c.remote_node().empty()) {
      if (absl::Status s = peering::ValidateNodeId(c.remote_node()); !s.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("remote_node: ", s.message()));
      }
    }
    pairs.push_back(QpConnection{c.qpn(), c.remote_qpn(), c.remote_node()});
  }
  return rdma_->Connect(caller, pairs);
}

absl::Status RdmaService::HandleDestroyQueuePairs(const SessionInfo& caller,
                                                  const v1::DestroyQueuePairsRequest& req) {
  // The QPs are checked under the resources' lock: a bounded list keeps
  // that short for every other user.
  if (req.qpns_size() > kMaxQpsPerCall) {
    return absl::InvalidArgumentError(
        absl::StrCat("at most ", kMaxQpsPerCall, " queue pairs per DestroyQueuePairs call"));
  }
  std::vector<uint32_t> qpns(req.qpns().begin(), req.qpns().end());
  return rdma_->DestroyQueuePairs(caller, qpns);
}

absl::Status RdmaService::HandleGetDoorbellAccess(const SessionInfo& caller,
                                                  v1::DoorbellAccess* resp) {
  absl::StatusOr<DoorbellAccess> access = rdma_->OpenDoorbellAccess(caller);
  if (!access.ok()) return access.status();
  auto bundle = std::make_shared<FdBundle>();
  bundle->fds.push_back(std::move(access->command_fd));
  absl::StatusOr<std::string> ticket = fds_->IssueOutgoing(caller.id, caller, std::move(bundle));
  if (!ticket.ok()) {
    (void)rdma_->ReleaseDoorbellAccess(caller);
    return ticket.status();
  }
  resp->set_fd_ticket(*std::move(ticket));
  resp->set_device(access->device);
  resp->set_uar_mmap_offset(access->uar_mmap_offset);
  resp->set_uar_reg_offset(access->uar_reg_offset);
  resp->set_uar_page_bytes(access->uar_page_bytes);
  resp->set_uar_non_cached(access->uar_non_cached);
  return absl::OkStatus();
}

absl::Status RdmaService::HandleSelectNic(const SessionInfo& caller,
                                          const v1::SelectNicRequest& req,
                                          v1::SelectNicResponse* resp) {
  NicRequest request;
  request.allowed.assign(req.allowed().begin(), req.allowed().end());
  request.gpu_pci_bus_id = req.gpu_pci_bus_id();
  absl::StatusOr<NicChoice> choice = rdma_->SelectNic(caller, request);
  if (!choice.ok()) return choice.status();
  resp->set_nic(choice->nic);
  resp->set_reason(choice->reason);
  for (const std::string& n : rdma_->served_nics()) resp->add_served(n);
  return absl::OkStatus();
}

}  // namespace mooncake::daemon
