#include "server/local_service.h"

#include <deque>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "mooncake/common/grpc_status.h"
#include "mooncake/common/log.h"
#include "mooncake/common/version.h"
#include "server/caller_session.h"

namespace mooncake::daemon {

// version.h takes the number from local.proto at configure time; this
// catches a stale build directory.
static_assert(kProtocolVersion == static_cast<uint32_t>(v1::PROTOCOL_VERSION_CURRENT),
              "mooncake/common/version.h disagrees with local.proto: re-run cmake");

namespace {

grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* ctx, const absl::Status& s) {
  return FinishUnary(ctx, s);
}

// The session stream. Writes are started by Pump() whenever events are
// queued (from any thread); at most one write is in flight. Cancellation
// ends the session immediately, which is how a dead client's peers learn
// LOST within milliseconds. gRPC may run a reaction inline from StartWrite
// or Finish when they are called outside its threads, so neither is ever
// called with mu_ held, and nothing touches `this` after Finish.
class SessionReactor final : public grpc::ServerWriteReactor<v1::SessionEvent> {
 public:
  // Shared with the registry's notifier so a notify racing OnDone never
  // touches a deleted reactor. Recursive: OnDone may run inline inside a
  // notify's Pump on the same thread.
  struct Hook {
    std::recursive_mutex mu;
    SessionReactor* reactor = nullptr;
  };

  SessionReactor(SessionRegistry* sessions, SessionLifecycle* lifecycle,
                 const std::string& instance_id, const SessionInfo& session)
      : sessions_(sessions),
        lifecycle_(lifecycle),
        session_(session),
        hook_(std::make_shared<Hook>()) {
    hook_->reactor = this;
    v1::SessionEvent opened;
    opened.mutable_opened()->set_session_id(session.id);
    opened.mutable_opened()->set_token(session.token);
    opened.mutable_opened()->set_instance_id(instance_id);
    pending_.push_back(std::move(opened));
    std::weak_ptr<Hook> weak = hook_;
    sessions_->SetNotifier(session.id, [weak] {
      if (auto h = weak.lock()) {
        std::lock_guard<std::recursive_mutex> lock(h->mu);
        if (h->reactor != nullptr) h->reactor->Pump();
      }
    });
    Pump();
  }

  // An already-failed stream (no session was opened).
  explicit SessionReactor(const absl::Status& error)
      : sessions_(nullptr), lifecycle_(nullptr), has_session_(false) {
    finished_ = true;
    Finish(ToGrpc(error));
  }

  void OnWriteDone(bool ok) override {
    grpc::Status finish;
    bool do_finish = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      writing_ = false;
      if (finished_) return;
      if (!ok || cancelled_) {
        finish = grpc::Status::CANCELLED;
      } else if (current_.has_shutdown()) {
        finish = grpc::Status(
            grpc::StatusCode::UNAVAILABLE,
            absl::StrCat("mooncaked is shutting down (", current_.shutdown().reason(), ")"));
      } else {
        finish = grpc::Status::OK;
      }
      do_finish = !finish.ok();
      finished_ = do_finish;
    }
    if (do_finish) {
      Finish(finish);
      return;
    }
    Pump();
  }

  void OnCancel() override {
    EndSession();
    bool finish_now = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      cancelled_ = true;
      // With a write in flight, OnWriteDone finishes (Finish must not race it).
      if (!finished_ && !writing_) finished_ = finish_now = true;
    }
    if (finish_now) Finish(grpc::Status::CANCELLED);
  }

  void OnDone() override {
    if (hook_) {
      std::lock_guard<std::recursive_mutex> lock(hook_->mu);
      hook_->reactor = nullptr;
    }
    EndSession();
    delete this;
  }

  void Pump() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (writing_ || finished_ || cancelled_) return;
      for (v1::SessionEvent& ev : sessions_->TakeEvents(session_.id)) {
        pending_.push_back(std::move(ev));
      }
      if (pending_.empty()) return;
      current_ = std::move(pending_.front());
      pending_.pop_front();
      writing_ = true;
    }
    StartWrite(&current_);
  }

 private:
  void EndSession() {
    if (!has_session_ || ended_.exchange(true)) return;
    lifecycle_->End(session_.id);
  }

  SessionRegistry* sessions_;
  SessionLifecycle* lifecycle_;
  SessionInfo session_;
  bool has_session_ = true;
  std::atomic<bool> ended_{false};
  std::shared_ptr<Hook> hook_;
  std::mutex mu_;
  bool writing_ = false;
  bool finished_ = false;
  bool cancelled_ = false;
  std::deque<v1::SessionEvent> pending_;
  v1::SessionEvent current_;
};

// JoinGroup: completed by the broker when the group forms, the deadline
// passes, the session ends, or the client cancels.
class JoinReactor final : public grpc::ServerUnaryReactor {
 public:
  JoinReactor(GroupBroker* broker, SessionInfo session, std::string group, uint32_t rank)
      : broker_(broker), session_(std::move(session)), group_(std::move(group)), rank_(rank) {}

  void OnCancel() override { broker_->CancelJoin(session_, group_, rank_); }
  void OnDone() override { delete this; }

 private:
  GroupBroker* broker_;
  SessionInfo session_;
  std::string group_;
  uint32_t rank_;
};

}  // namespace

absl::StatusOr<SessionInfo> LocalService::CallerSession(const grpc::ServerContextBase* ctx) const {
  return daemon::CallerSession(*connections_, *sessions_, ctx);
}

grpc::ServerUnaryReactor* LocalService::Hello(grpc::CallbackServerContext* ctx,
                                              const v1::HelloRequest* req,
                                              v1::HelloResponse* resp) {
  absl::StatusOr<Caller> caller = connections_->CallerOf(ctx);
  if (!caller.ok()) return Done(ctx, caller.status());
  if (req->protocol_version() != 0 && req->protocol_version() != kProtocolVersion) {
    return Done(ctx, absl::FailedPreconditionError(absl::StrCat(
                         "client speaks protocol ", req->protocol_version(), ", mooncaked ",
                         kMooncakeVersion, " speaks ", kProtocolVersion,
                         ": use matching versions of libmooncake_client and mooncaked")));
  }
  resp->set_protocol_version(kProtocolVersion);
  resp->set_daemon_version(kMooncakeVersion);
  resp->set_instance_id(node_->instance_id);
  resp->set_node_id(node_->node_id);
  resp->set_uid(caller->cred.uid);
  resp->set_gid(caller->cred.gid);
  resp->set_pid(caller->cred.pid);
  resp->set_tenant(caller->tenant);
  return Done(ctx, absl::OkStatus());
}

grpc::ServerWriteReactor<v1::SessionEvent>* LocalService::OpenSession(
    grpc::CallbackServerContext* ctx, const v1::OpenSessionRequest* req) {
  absl::StatusOr<Caller> caller = connections_->CallerOf(ctx);
  if (!caller.ok()) return new SessionReactor(caller.status());
  absl::StatusOr<SessionInfo> session =
      lifecycle_->Open(caller->cred, caller->connection_fd, req->client_name(), caller->tenant);
  if (!session.ok()) return new SessionReactor(session.status());
  return new SessionReactor(sessions_, lifecycle_, node_->instance_id, *session);
}

grpc::ServerUnaryReactor* LocalService::GetNodeInfo(grpc::CallbackServerContext* ctx,
                                                    const v1::GetNodeInfoRequest*,
                                                    v1::NodeInfo* resp) {
  absl::StatusOr<Caller> caller = connections_->CallerOf(ctx);
  if (!caller.ok()) return Done(ctx, caller.status());
  resp->set_node_id(node_->node_id);
  resp->set_hostname(node_->hostname);
  resp->set_instance_id(node_->instance_id);
  *resp->mutable_topology() = node_->topology;
  return Done(ctx, absl::OkStatus());
}

namespace {

// A slice that shares the view's bytes: gRPC releases the reference when
// the reply has been written.
grpc::Slice SharedSlice(std::shared_ptr<const std::string> bytes) {
  auto* keep = new std::shared_ptr<const std::string>(std::move(bytes));
  return grpc::Slice(
      const_cast<char*>((*keep)->data()), (*keep)->size(),
      [](void* p) { delete static_cast<std::shared_ptr<const std::string>*>(p); }, keep);
}

}  // namespace

grpc::ServerUnaryReactor* LocalService::JoinGroup(grpc::CallbackServerContext* ctx,
                                                  const grpc::ByteBuffer* raw,
                                                  grpc::ByteBuffer* resp) {
  v1::JoinGroupRequest req;
  {
    std::vector<grpc::Slice> slices;
    std::string bytes;
    if (raw->Dump(&slices).ok()) {
      for (const grpc::Slice& sl : slices) {
        bytes.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
      }
    }
    if (!req.ParseFromString(bytes)) {
      return Done(ctx, absl::InvalidArgumentError(
                           "the request to /mooncake.v1.Local/JoinGroup could not be parsed: "
                           "malformed protobuf, or invalid UTF-8 in a string field"));
    }
  }
  absl::StatusOr<SessionInfo> session = CallerSession(ctx);
  if (!session.ok()) return Done(ctx, session.status());
  // Validated once, before the fd ticket is consumed: a malformed request
  // must not burn it.
  absl::StatusOr<ValidatedJoin> join = broker_->ValidateJoin(req);
  if (!join.ok()) return Done(ctx, join.status());
  FdBundlePtr fds;
  if (!join->fd_ticket().empty()) {
    absl::StatusOr<FdBundlePtr> taken = fds_->TakeIncoming(session->id, join->fd_ticket());
    if (!taken.ok()) return Done(ctx, taken.status());
    fds = std::move(*taken);
  }
  auto* reactor = new JoinReactor(broker_, *session, join->group(), join->rank());
  // `done` may run before JoinAsync returns (a conflict with the group, or
  // this rank completes it); Finish is allowed then. `resp` lives until the
  // reactor is done.
  broker_->JoinAsync(
      *session, *std::move(join), std::move(fds),
      [reactor, resp](absl::StatusOr<EncodedView> view) {
        if (view.ok()) {
          grpc::Slice parts[2] = {SharedSlice(std::move(view->shared)), grpc::Slice(view->own)};
          *resp = grpc::ByteBuffer(parts, 2);
        }
        reactor->Finish(ToGrpc(view.status()));
      });
  return reactor;
}

grpc::ServerUnaryReactor* LocalService::LeaveGroup(grpc::CallbackServerContext* ctx,
                                                   const v1::LeaveGroupRequest* req,
                                                   v1::LeaveGroupResponse*) {
  absl::StatusOr<SessionInfo> session = CallerSession(ctx);
  if (!session.ok()) return Done(ctx, session.status());
  return Done(ctx, broker_->Leave(*session, req->group(), req->rank()));
}

grpc::ServerUnaryReactor* LocalService::ReportReady(grpc::CallbackServerContext* ctx,
                                                    const v1::ReportReadyRequest* req,
                                                    v1::ReportReadyResponse*) {
  absl::StatusOr<SessionInfo> session = CallerSession(ctx);
  if (!session.ok()) return Done(ctx, session.status());
  return Done(ctx, broker_->ReportReady(*session, *req));
}

grpc::ServerUnaryReactor* LocalService::ReleaseRank(grpc::CallbackServerContext* ctx,
                                                    const v1::ReleaseRankRequest* req,
                                                    v1::ReleaseRankResponse*) {
  absl::StatusOr<SessionInfo> session = CallerSession(ctx);
  if (!session.ok()) return Done(ctx, session.status());
  return Done(ctx, broker_->ReleaseRank(*session, *req));
}

grpc::ServerUnaryReactor* LocalService::ExportFds(grpc::CallbackServerContext* ctx,
                                                  const v1::ExportFdsRequest* req,
                                                  v1::ExportFdsResponse* resp) {
  absl::StatusOr<SessionInfo> session = CallerSession(ctx);
  if (!session.ok()) return Done(ctx, session.status());
  absl::StatusOr<ExportRecord> r =
      fds_->Export(*session, req->fd_ticket(), req->kind(), req->size());
  if (!r.ok()) return Done(ctx, r.status());
  resp->set_export_id(r->id);
  resp->set_secret(r->secret);
  return Done(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* LocalService::ImportFds(grpc::CallbackServerContext* ctx,
                                                  const v1::ImportFdsRequest* req,
                                                  v1::ImportFdsResponse* resp) {
  absl::StatusOr<SessionInfo> session = CallerSession(ctx);
  if (!session.ok()) return Done(ctx, session.status());
  absl::StatusOr<FdBroker::Imported> imported =
      fds_->Import(*session, req->export_id(), req->secret());
  if (!imported.ok()) return Done(ctx, imported.status());
  const ExportRecord& r = imported->record;
  resp->set_fd_ticket(imported->ticket);
  resp->set_fd_count(static_cast<uint32_t>(r.bundle->fds.size()));
  resp->set_kind(r.kind);
  resp->set_size(r.size);
  resp->set_owner_pid(r.pid);
  return Done(ctx, absl::OkStatus());
}

}  // namespace mooncake::daemon
