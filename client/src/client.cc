#include "mooncake/client/client.h"

#include <google/protobuf/arena.h>
#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>
#include <grpcpp/create_channel_posix.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "mooncake/common/fd_passing.h"
#include "mooncake/common/grpc_status.h"
#include "mooncake/common/paths.h"
#include "mooncake/common/status.h"
#include "mooncake/common/version.h"
#include "mooncake/v1/fd_channel.pb.h"
#include "mooncake/v1/local.grpc.pb.h"
#include "mooncake/v1/rdma.grpc.pb.h"

namespace mooncake {

const char* SessionEventKindName(SessionEvent::Kind kind) {
  switch (kind) {
    case SessionEvent::Kind::kJoined: return "joined";
    case SessionEvent::Kind::kLeft: return "left";
    case SessionEvent::Kind::kLost: return "lost";
    case SessionEvent::Kind::kReady: return "ready";
    case SessionEvent::Kind::kFailed: return "failed";
    case SessionEvent::Kind::kDaemonShutdown: return "daemon-shutdown";
    case SessionEvent::Kind::kDisconnected: return "disconnected";
  }
  return "unknown";
}

namespace {

// From the generated version.h: the one source of version numbers.
constexpr uint32_t kClientProtocol = kProtocolVersion;
constexpr const char* kClientVersion = kMooncakeVersion;

GroupMember MemberFromProto(v1::MemberView&& m) {
  GroupMember g;
  g.rank = m.rank();
  g.node_id = std::move(*m.mutable_node_id());
  g.pid = m.pid();
  g.gpu_index = m.gpu_index();
  g.gpu_uuid = std::move(*m.mutable_gpu_uuid());
  g.gpu_pci_bus_id = std::move(*m.mutable_gpu_pci_bus_id());
  g.handle_kind = std::move(*m.mutable_handle_kind());
  g.handle_data = std::move(*m.mutable_handle_data());
  g.handle_size = m.handle_size();
  g.fd_ticket = std::move(*m.mutable_fd_ticket());
  g.fd_count = m.fd_count();
  g.same_node = m.same_node();
  g.p2p_reachable = m.p2p_reachable();
  g.native_atomics = m.native_atomics();
  if (m.has_rdma()) {
    RdmaEndpointInfo r;
    r.raddr = m.rdma().raddr();
    r.rkey = m.rdma().rkey();
    r.qps_per_peer = m.rdma().qps_per_peer();
    r.qpns.assign(m.rdma().qpns().begin(), m.rdma().qpns().end());
    r.nic = m.rdma().nic();
    if (!m.same_node()) r.node = g.node_id;
    g.rdma = std::move(r);
  }
  return g;
}

SessionEvent FromProto(const v1::MemberEvent& m) {
  SessionEvent e;
  switch (m.kind()) {
    case v1::MemberEvent::JOINED: e.kind = SessionEvent::Kind::kJoined; break;
    case v1::MemberEvent::LEFT: e.kind = SessionEvent::Kind::kLeft; break;
    case v1::MemberEvent::LOST: e.kind = SessionEvent::Kind::kLost; break;
    case v1::MemberEvent::READY: e.kind = SessionEvent::Kind::kReady; break;
    case v1::MemberEvent::FAILED: e.kind = SessionEvent::Kind::kFailed; break;
    default: e.kind = SessionEvent::Kind::kDisconnected; break;
  }
  e.group = m.group();
  e.rank = m.rank();
  e.pid = m.pid();
  e.detail = m.detail();
  e.epoch = m.epoch();
  if (m.has_member()) e.member = MemberFromProto(v1::MemberView(m.member()));
  return e;
}

// One connection + session. Replaced wholesale on reconnect.
struct Connection {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Local::Stub> stub;
  std::unique_ptr<v1::Rdma::Stub> rdma;
  std::unique_ptr<grpc::ClientContext> session_ctx;
  std::thread reader;
  std::string instance_id;
  std::string node_id;
  uint64_t session_id = 0;
  std::string token;
};

}  // namespace

// Internal, though nested in an exported class: not part of the ABI.
class MOONCAKE_INTERNAL Client::Impl {
 public:
  explicit Impl(ClientOptions options)
      : options_(std::move(options)), path_(ResolveSocketPath(options_.socket_path)) {}

  ~Impl() { Teardown(); }

  absl::Status Start() {
    std::lock_guard<std::mutex> lock(mu_);
    return ConnectLocked();
  }

  const std::string& path() const { return path_; }

  std::string instanceId() {
    std::lock_guard<std::mutex> lock(mu_);
    return conn_ ? conn_->instance_id : "";
  }
  uint64_t sessionId() {
    std::lock_guard<std::mutex> lock(mu_);
    return conn_ ? conn_->session_id : 0;
  }
  std::string nodeId() {
    std::lock_guard<std::mutex> lock(mu_);
    return conn_ ? conn_->node_id : "";
  }
  bool connected() {
    std::lock_guard<std::mutex> lock(mu_);
    return conn_ != nullptr && !lost_;
  }

  // The live connection, reconnecting first when the old one was lost.
  // Shared: a call in flight keeps its connection (stub, channel) alive even
  // if another thread reconnects meanwhile.
  absl::StatusOr<std::shared_ptr<Connection>> Live() {
    std::lock_guard<std::mutex> lock(mu_);
    if (conn_ && !lost_) return conn_;
    std::string old_instance = conn_ ? conn_->instance_id : "";
    std::string why = lost_reason_;
    TeardownLocked();
    MC_RETURN_IF_ERROR(ConnectLocked());
    if (!old_instance.empty() && old_instance != conn_->instance_id) {
      return absl::FailedPreconditionError(absl::StrCat(
          "mooncaked at ", path_, " restarted (instance ", old_instance, " -> ", conn_->instance_id,
          "): the old session's groups and fds are gone; rejoin your groups"));
    }
    return absl::FailedPreconditionError(
        absl::StrCat("the session with mooncaked at ", path_, " was lost (", why,
                     "); reconnected with a new session: rejoin your groups"));
  }

  // Wraps a failed RPC made on `on`. UNAVAILABLE means the daemon went away.
  absl::Status CallError(const grpc::Status& s, absl::string_view rpc, const Connection* on) {
    if (s.error_code() == grpc::StatusCode::UNAVAILABLE) {
      MarkLost(on, absl::StrCat(rpc, ": ", s.error_message()));
      return absl::UnavailableError(absl::StrCat("mooncaked at ", path_, " went away during ", rpc,
                                                 " (", s.error_message(),
                                                 "): is the service running?"));
    }
    return FromGrpc(s);
  }

  void SetDeadline(grpc::ClientContext* ctx, absl::Duration timeout) {
    ctx->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  }

  absl::Duration call_timeout() const { return options_.call_timeout; }

  // One fd-channel reply: the frame, with its FdReply parsed into `reply`;
  // a refusal becomes the daemon's status.
  absl::StatusOr<Frame> RecvReply(int sock, v1::FdReply* reply) {
    absl::StatusOr<Frame> frame = RecvFrame(sock, options_.call_timeout);
    if (!frame.ok()) return frame.status();
    if (!reply->ParseFromString(frame->payload)) {
      return absl::InternalError("fd channel: malformed reply from mooncaked");
    }
    if (!reply->ok())
      return absl::Status(static_cast<absl::StatusCode>(reply->code()), reply->error());
    return frame;
  }

  // fd channel round trip: one short connection per request.
  absl::StatusOr<Frame> FdRoundTrip(const v1::FdRequest& req, const std::vector<int>& fds) {
    absl::StatusOr<UniqueFd> sock = ConnectUnix(FdSocketPath(path_));
    if (!sock.ok()) return sock.status();
    MC_RETURN_IF_ERROR(SendFrame(sock->get(), req.SerializeAsString(), fds, options_.call_timeout));
    v1::FdReply reply;
    return RecvReply(sock->get(), &reply);
  }

  // Several GETs on one connection: the requests are written in windows
  // (the daemon answers them in order), so n peers cost one connect and
  // about n/kWindow round trips instead of n of each.
  absl::StatusOr<std::vector<std::vector<UniqueFd>>> FetchMany(
      const Connection& c, const std::vector<std::string>& tickets) {
    constexpr size_t kWindow = 32;
    std::vector<std::vector<UniqueFd>> out(tickets.size());
    if (tickets.empty()) return out;
    absl::StatusOr<UniqueFd> sock = ConnectUnix(FdSocketPath(path_));
    if (!sock.ok()) return sock.status();
    for (size_t begin = 0; begin < tickets.size(); begin += kWindow) {
      const size_t end = std::min(tickets.size(), begin + kWindow);
      for (size_t i = begin; i < end; ++i) {
        v1::FdRequest req;
        req.set_op(v1::FdRequest::GET);
        req.set_session_id(c.session_id);
        req.set_session_token(c.token);
        req.set_ticket(tickets[i]);
        MC_RETURN_IF_ERROR(
            SendFrame(sock->get(), req.SerializeAsString(), {}, options_.call_timeout));
      }
      for (size_t i = begin; i < end; ++i) {
        v1::FdReply reply;
        absl::StatusOr<Frame> frame = RecvReply(sock->get(), &reply);
        if (!frame.ok()) {
          return absl::Status(frame.status().code(),
                              absl::StrCat("fd ticket ", i + 1, " of ", tickets.size(), ": ",
                                           frame.status().message()));
        }
        if (frame->fds.size() != reply.fd_count()) {
          return absl::InternalError(absl::StrCat("fd channel: expected ", reply.fd_count(),
                                                  " fds, received ", frame->fds.size()));
        }
        out[i] = std::move(frame->fds);
      }
    }
    return out;
  }

  uint64_t AddLossHandler(std::function<void(const std::string&)> handler) {
    std::lock_guard<std::mutex> lock(loss_mu_);
    const uint64_t id = ++next_loss_id_;
    loss_handlers_.emplace(id, std::move(handler));
    return id;
  }

  // loss_mu_ is held while handlers run: removal waits for a running one.
  void RemoveLossHandler(uint64_t id) {
    std::lock_guard<std::mutex> lock(loss_mu_);
    loss_handlers_.erase(id);
  }

  std::optional<SessionEvent> NextEvent(absl::Duration timeout) {
    std::unique_lock<std::mutex> lock(ev_mu_);
    ev_cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout), [this] { return !events_.empty(); });
    if (events_.empty()) return std::nullopt;
    SessionEvent e = std::move(events_.front());
    events_.pop_front();
    return e;
  }

 private:
  void RunLossHandlers(const std::string& why) {
    std::lock_guard<std::mutex> lock(loss_mu_);
    for (auto& [id, handler] : loss_handlers_) handler(why);
  }

  void PushEvent(SessionEvent e) {
    {
      std::lock_guard<std::mutex> lock(ev_mu_);
      events_.push_back(std::move(e));
    }
    ev_cv_.notify_all();
  }

  // Only the connection the failure happened on: a late failure of a call
  // on a replaced connection must not condemn the new one.
  void MarkLost(const Connection* on, const std::string& why) {
    std::lock_guard<std::mutex> lock(mu_);
    if (conn_.get() == on && !lost_) {
      lost_ = true;
      lost_reason_ = why;
    }
  }

  absl::Status ConnectLocked() {
    absl::StatusOr<UniqueFd> fd = ConnectUnix(path_);
    if (!fd.ok()) return fd.status();
    MC_RETURN_IF_ERROR(SetNonBlocking(fd->get()));
    auto c = std::make_shared<Connection>();
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(64 << 20);
    // The channel owns the fd from here on.
    c->channel = grpc::CreateCustomInsecureChannelFromFd("mooncaked", fd->release(), args);
    c->stub = v1::Local::NewStub(c->channel);
    c->rdma = v1::Rdma::NewStub(c->channel);

    grpc::ClientContext hello_ctx;
    SetDeadline(&hello_ctx, options_.call_timeout);
    v1::HelloRequest hreq;
    hreq.set_protocol_version(kClientProtocol);
    hreq.set_client_version(kClientVersion);
    v1::HelloResponse hresp;
    grpc::Status hs = c->stub->Hello(&hello_ctx, hreq, &hresp);
    if (!hs.ok()) {
      if (hs.error_code() == grpc::StatusCode::UNAVAILABLE ||
          hs.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
        return absl::UnavailableError(absl::StrCat("cannot reach mooncaked at ", path_, " (",
                                                   hs.error_message(),
                                                   "): is the service running?"));
      }
      return FromGrpc(hs);
    }
    c->instance_id = hresp.instance_id();
    c->node_id = hresp.node_id();

    // The session stream: its first message carries the session id/token.
    c->session_ctx = std::make_unique<grpc::ClientContext>();
    auto opened = std::make_shared<std::promise<absl::StatusOr<v1::SessionOpened>>>();
    std::future<absl::StatusOr<v1::SessionOpened>> opened_future = opened->get_future();
    v1::OpenSessionRequest oreq;
    oreq.set_client_name(options_.client_name);
    Connection* raw = c.get();
    c->reader = std::thread([this, raw, oreq, opened] {
      std::unique_ptr<grpc::ClientReader<v1::SessionEvent>> reader =
          raw->stub->OpenSession(raw->session_ctx.get(), oreq);
      v1::SessionEvent ev;
      bool first = true;
      std::string shutdown_reason;
      while (reader->Read(&ev)) {
        if (first) {
          first = false;
          if (!ev.has_opened()) {
            opened->set_value(absl::InternalError("mooncaked did not open a session"));
            // Do not wait in Finish() for a stream the peer keeps open.
            raw->session_ctx->TryCancel();
            break;
          }
          opened->set_value(ev.opened());
          continue;
        }
        if (ev.has_member()) PushEvent(FromProto(ev.member()));
        if (ev.has_shutdown()) shutdown_reason = ev.shutdown().reason();
      }
      grpc::Status st = reader->Finish();
      if (first) {
        // A refusal (bad client_name, too many sessions) keeps its code; a
        // stream that broke or ended without a word means the daemon is gone.
        const absl::StatusCode code = st.ok() || st.error_code() == grpc::StatusCode::UNAVAILABLE
                                          ? absl::StatusCode::kUnavailable
                                          : static_cast<absl::StatusCode>(st.error_code());
        opened->set_value(
            absl::Status(code, absl::StrCat("cannot open a session with mooncaked at ", path_, ": ",
                                            st.error_message())));
        return;
      }
      // A session abandoned during setup (timeout) was never live: no event.
      if (tearing_down_.load()) return;
      SessionEvent e;
      if (!shutdown_reason.empty()) {
        e.kind = SessionEvent::Kind::kDaemonShutdown;
        e.detail = absl::StrCat("mooncaked is shutting down (", shutdown_reason, ")");
      } else {
        e.kind = SessionEvent::Kind::kDisconnected;
        e.detail = st.ok() ? "session closed" : st.error_message();
      }
      MarkLostFromReader(raw, e.detail);
      RunLossHandlers(e.detail);
      PushEvent(std::move(e));
    });
    if (opened_future.wait_for(absl::ToChronoNanoseconds(options_.call_timeout)) !=
        std::future_status::ready) {
      tearing_down_.store(true);
      c->session_ctx->TryCancel();
      c->reader.join();
      tearing_down_.store(false);
      return absl::UnavailableError(absl::StrCat(
          "mooncaked at ", path_, " did not open a session in time: is it overloaded?"));
    }
    absl::StatusOr<v1::SessionOpened> o = opened_future.get();
    if (!o.ok()) {
      tearing_down_.store(true);
      c->reader.join();
      tearing_down_.store(false);
      return o.status();
    }
    c->session_id = o->session_id();
    c->token = o->token();
    conn_ = std::move(c);
    lost_ = false;
    lost_reason_.clear();
    return absl::OkStatus();
  }

  // Called from the reader thread, which must not take mu_ while the owner
  // of mu_ may be joining it: use a separate flag under mu_ via try-lock loop.
  void MarkLostFromReader(const Connection* on, const std::string& why) {
    for (;;) {
      if (mu_.try_lock()) {
        if (!lost_ && conn_.get() == on) {
          lost_ = true;
          lost_reason_ = why;
        }
        mu_.unlock();
        return;
      }
      if (tearing_down_.load()) return;
      std::this_thread::yield();
    }
  }

  void TeardownLocked() {
    if (!conn_) return;
    std::shared_ptr<Connection> old = std::move(conn_);
    tearing_down_.store(true);
    old->session_ctx->TryCancel();
    if (old->reader.joinable()) old->reader.join();
    tearing_down_.store(false);
  }  // calls still in flight on `old` keep it alive until they return

  void Teardown() {
    std::lock_guard<std::mutex> lock(mu_);
    TeardownLocked();
  }

 public:
  std::mutex mu_;
  std::shared_ptr<Connection> conn_;

 private:
  const ClientOptions options_;
  const std::string path_;
  bool lost_ = false;
  std::string lost_reason_;
  std::atomic<bool> tearing_down_{false};
  std::mutex ev_mu_;
  std::condition_variable ev_cv_;
  std::deque<SessionEvent> events_;
  std::mutex loss_mu_;
  uint64_t next_loss_id_ = 0;
  std::map<uint64_t, std::function<void(const std::string&)>> loss_handlers_;
};

// ---------------------------------------------------------------------------

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(ClientOptions options) {
  auto impl = std::make_unique<Impl>(std::move(options));
  MC_RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

const std::string& Client::socketPath() const { return impl_->path(); }
std::string Client::instanceId() const { return impl_->instanceId(); }
uint64_t Client::sessionId() const { return impl_->sessionId(); }
bool Client::connected() const { return impl_->connected(); }

absl::StatusOr<HelloInfo> Client::hello() {
  MC_ASSIGN_OR_RETURN(std::shared_ptr<Connection> c, impl_->Live());
  grpc::ClientContext ctx;
  impl_->SetDeadline(&ctx, impl_->call_timeout());
  v1::HelloRequest req;
  req.set_protocol_version(kClientProtocol);
  req.set_client_version(kClientVersion);
  v1::HelloResponse resp;
  grpc::Status s = c->stub->Hello(&ctx, req, &resp);
  if (!s.ok()) return impl_->CallError(s, "Hello", c.get());
  HelloInfo h;
  h.protocol_version = resp.protocol_version();
  h.daemon_version = resp.daemon_version();
  h.instance_id = resp.instance_id();
  h.node_id = resp.node_id();
  h.uid = resp.uid();
  h.gid = resp.gid();
  h.pid = resp.pid();
  return h;
}

absl::StatusOr<NodeInfo> Client::nodeInfo() {
  MC_ASSIGN_OR_RETURN(std::shared_ptr<Connection> c, impl_->Live());
  grpc::ClientContext ctx;
  impl_->SetDeadline(&ctx, impl_->call_timeout());
  v1::NodeInfo resp;
  grpc::Status s = c->stub->GetNodeInfo(&ctx, v1::GetNodeInfoRequest(), &resp);
  if (!s.ok()) return impl_->CallError(s, "GetNodeInfo", c.get());
  NodeInfo n;
  n.node_id = resp.node_id();
  n.hostname = resp.hostname();
  n.instance_id = resp.instance_id();
  for (const v1::Gpu& g : resp.topology().gpus()) {
    n.gpus.push_back(GpuInfo{g.index(), g.name(), g.uuid(), g.pci_bus_id(), g.numa_node(),
                             g.total_memory_bytes()});
  }
  for (const v1::Nic& nic : resp.topology().nics()) n.nics.push_back(nic.name());
  n.gpu_note = resp.topology().gpu_discovery_note();
  n.nic_note = resp.topology().nic_discovery_note();
  return n;
}

absl::StatusOr<GroupView> Client::joinGroup(const JoinOptions& o) {
  MC_ASSIGN_OR_RETURN(std::shared_ptr<Connection> c, impl_->Live());
  v1::JoinGroupRequest req;
  req.set_group(o.group);
  req.set_rank(o.rank);
  req.set_world_size(o.world_size);
  req.set_timeout_ms(static_cast<uint32_t>(absl::ToInt64Milliseconds(o.timeout)));
  req.mutable_handle()->set_kind(o.handle_kind);
  req.mutable_handle()->set_data(o.handle_data);
  req.mutable_handle()->set_size(o.handle_size);
  req.mutable_device()->set_gpu_uuid(o.gpu_uuid);
  req.mutable_device()->set_gpu_pci_bus_id(o.gpu_pci_bus_id);
  if (!o.group_secret.empty()) {
    req.set_group_secret(o.group_secret);
  } else if (const char* env = std::getenv("MC_GROUP_SECRET"); env != nullptr && *env != '\0') {
    req.set_group_secret(env);
  }
  if (o.rdma) {
    v1::RdmaEndpoint* e = req.mutable_rdma();
    e->set_raddr(o.rdma->raddr);
    e->set_rkey(o.rdma->rkey);
    e->set_qps_per_peer(o.rdma->qps_per_peer);
    e->set_nic(o.rdma->nic);
    e->mutable_qpns()->Add(o.rdma->qpns.begin(), o.rdma->qpns.end());
  }
  if (!o.fds.empty()) {
    MC_ASSIGN_OR_RETURN(std::string ticket, sendFds(o.fds));
    req.mutable_handle()->set_fd_ticket(ticket);
  }
  grpc::ClientContext ctx;
  // The daemon enforces the rendezvous deadline; ours only guards a hung daemon.
  absl::Duration wait = o.timeout > absl::ZeroDuration() ? o.timeout : absl::Seconds(30);
  impl_->SetDeadline(&ctx, wait + impl_->call_timeout());
  // A large view parses into an arena: one bump allocation per string
  // instead of a malloc (the strings are moved out below).
  google::protobuf::Arena arena;
  v1::JoinGroupResponse& resp =
      *google::protobuf::Arena::CreateMessage<v1::JoinGroupResponse>(&arena);
  grpc::Status s = c->stub->JoinGroup(&ctx, req, &resp);
  if (!s.ok()) return impl_->CallError(s, "JoinGroup", c.get());
  GroupView v;
  v.group = resp.group();
  v.rank = resp.rank();
  v.world_size = resp.world_size();
  v.epoch = resp.epoch();
  v.members.reserve(resp.members_size());
  // Move the strings out: at 256 ranks a view holds 65536 of them per process.
  for (v1::MemberView& m : *resp.mutable_members()) {
    v.members.push_back(MemberFromProto(std::move(m)));
  }
  return v;
}

absl::Status Client::leaveGroup(const std::string& group, uint32_t rank) {
  MC_ASSIGN_OR_RETURN(std::shared_ptr<Connection> c, impl_->Live());
  grpc::ClientContext ctx;
  impl_->SetDeadline(&ctx, impl_->call_timeout());
  v1::LeaveGroupRequest req;
  req.set_group(group);
  req.set_rank(rank);
  v1::LeaveGroupResponse resp;
  grpc::Status s = c->stub->LeaveGroup(&ctx, req, &resp);
  if (!s.ok()) return impl_->CallError(s, "LeaveGroup", c.get());
  return absl::OkStatus();
}

absl::Status Client::reportReady(const std::string& group, uint32_t rank, bool ok,
                                 const std::string& detail,
                                 const std::vector<uint32_t>& unreachable) {
  MC_ASSIGN_OR_RETURN(std::shared_ptr<Connection> c, impl_->Live());
  grpc::ClientContext ctx;
  impl_->SetDeadline(&ctx, impl_->call_timeout());
  v1::ReportReadyRequest req;
  req.set_group(group);
  req.set_rank(rank);
  req.set_ok(ok);
  req.set_detail(detail);
  for (uint32_t r : unreachable) req.add_unreachable_ranks(r);
  v1::ReportReadyResponse resp;
  grpc::Status s = c->stub->ReportReady(&ctx, req, &resp);
  if (!s.ok()) return impl_->CallError(s, "ReportReady", c.get());
  return absl::OkStatus();
}

absl::Status Client::releaseRank(const std::string& group, uint32_t rank, uint32_t released_rank,
                                 const std::optional<RdmaEndpointInfo>& rdma) {
  MC_ASSIGN_OR_RETURN(std::shared_ptr<Connection> c, impl_->Live());
  grpc::ClientContext ctx;
  impl_->SetDeadline(&ctx, impl_->call_timeout());
  v1::ReleaseRankRequest req;
  req.set_group(group);
  req.set_rank(rank);
  req.set_released_rank(released_rank);
  if (rdma) {
    v1::RdmaEndpoint* e = req.mutable_rdma();
    e->set_raddr(rdma->raddr);
    e->set_rkey(rdma->rkey);
    e->set_qps_per_peer(rdma->qps_per_peer);
    for (uint32_t q : rdma->qpns) e->add_qpns(q);
    e->set_nic(rdma->nic);
  }
  v1::ReleaseRankResponse resp;
  grpc::Status s = c->stub->ReleaseRank(&ctx, req, &resp);
  if (!s.ok()) return impl_->CallError(s, "ReleaseRank", c.get());
  return absl::OkStatus();
}

absl::StatusOr<std::string> Client::sendFds(const std::vector<int>& fds) {
  if (fds.empty()) return absl::InvalidArgumentError("sendFds: no fds given");
  MC_ASSIGN_OR_RETURN(std::shared_ptr<Connection> c, impl_->Live());
  v1::FdRequest req;
  req.set_op(v1::FdRequest::PUT);
  req.set_session_id(c->session_id);
  req.set_session_token(c->token);
  req.set_fd_count(static_cast<uint32_t>(fds.size()));
  MC_ASSIGN_OR_RETURN(Frame frame, impl_->FdRoundTrip(req, fds));
  v1::FdReply reply;
  reply.ParseFromString(frame.payload);
  return reply.ticket();
}

absl::StatusOr<std::vector<UniqueFd>> Client::fetchFds(const std::string& ticket) {
  MC_ASSIGN_OR_RETURN(std::vector<std::vector<UniqueFd>> fds,
                      fetchFds(std::vector<std::string>{ticket}));
  return std::move(fds[0]);
}

absl::StatusOr<std::vector<std::vector<UniqueFd>>> Client::fetchFds(
    const std::vector<std::string>& tickets) {
  for (const std::string& t : tickets) {
    if (t.empty()) return absl::InvalidArgumentError("fetchFds: empty ticket");
  }
  MC_ASSIGN_OR_RETURN(std::shared_ptr<Connection> c, impl_->Live());
  return impl_->FetchMany(*c, tickets);
}

std::string Client::nodeId() const { return impl_->nodeId(); }

absl::StatusOr<FdExport> Client::exportFds(const std::vector<int>& fds, const std::string& kind,
                                           uint64_t size) {
  MC_ASSIGN_OR_RETURN(std::string ticket, sendFds(fds));
  MC_ASSIGN_OR_RETURN(std::shared_ptr<Connection> c, impl_->Live());
  grpc::ClientContext ctx;
  impl_->SetDeadline(&ctx, impl_->call_timeout());
  v1::ExportFdsRequest req;
  req.set_fd_ticket(ticket);
  req.set_kind(kind);
  req.set_size(size);
  v1::ExportFdsResponse resp;
  grpc::Status s = c->stub->ExportFds(&ctx, req, &resp);
  if (!s.ok()) return impl_->CallError(s, "ExportFds", c.get());
  return FdExport{resp.export_id(), resp.secret()};
}

absl::StatusOr<std::vector<UniqueFd>> Client::importFds(const FdExport& exported) {
  MC_ASSIGN_OR_RETURN(std::shared_ptr<Connection> c, impl_->Live());
  grpc::ClientContext ctx;
  impl_->SetDeadline(&ctx, impl_->call_timeout());
  v1::ImportFdsRequest req;
  req.set_export_id(exported.id);
  req.set_secret(exported.secret);
  v1::ImportFdsResponse resp;
  grpc::Status s = c->stub->ImportFds(&ctx, req, &resp);
  if (!s.ok()) return impl_->CallError(s, "ImportFds", c.get());
  return fetchFds(resp.fd_ticket());
}

absl::StatusOr<RdmaNodeInfo> Client::rdmaInfo() {
  MC_ASSIGN_OR_RETURN(std::shared_ptr<Connection> c, impl_->Live());
  grpc::ClientContext ctx;
  impl_->SetDeadline(&ctx, impl_->call_timeout());
  v1::GetRdmaInfoRequest req;
  v1::RdmaInfo resp;
  grpc::Status s = c->rdma->GetRdmaInfo(&ctx, req, &resp);
  if (!s.ok()) {
    if (s.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
      return absl::FailedPreconditionError(
          "mooncaked on this node serves no RDMA (rdma_provider = off in its config)");
    }
    return impl_->CallError(s, "GetRdmaInfo", c.get());
  }
  RdmaNodeInfo info;
  info.provider = resp.provider();
  info.nic = resp.nic();
  info.doorbell_mode = resp.doorbell_mode();
  info.is_roce = resp.is_roce();
  info.gid_index = resp.gid_index();
  info.max_qps_per_session = resp.max_qps_per_session();
  info.max_sq_wqes = resp.max_sq_wqes();
  return info;
}

absl::StatusOr<RdmaKeys> Client::registerMemory(int fd, uint64_t iova, uint64_t length,
                                                uint64_t offset, bool remote_write,
                                                bool remote_atomic, const std::string& kind,
                                                uint64_t allocation_bytes) {
  MC_ASSIGN_OR_RETURN(std::string ticket, sendFds({fd}));
  MC_ASSIGN_OR_RETURN(std::shared_ptr<Connection> c, impl_->Live());
  grpc::ClientContext ctx;
  impl_->SetDeadline(&ctx, impl_->call_timeout());
  v1::RegisterMemoryRequest req;
  req.set_fd_ticket(ticket);
  req.set_kind(kind);
  req.set_allocation_bytes(allocation_bytes);
  req.set_iova(iova);
  req.set_length(length);
  req.set_offset(offset);
  req.set_remote_write(remote_write);
  req.set_remote_atomic(remote_atomic);
  v1::RegisterMemoryResponse resp;
  grpc::Status s = c->rdma->RegisterMemory(&ctx, req, &resp);
  if (!s.ok()) return impl_->CallError(s, "RegisterMemory", c.get());
  return RdmaKeys{resp.lkey(), resp.rkey()};
}

absl::Status Client::deregisterMemory(uint32_t lkey) {
  MC_ASSIGN_OR_RETURN(std::shared_ptr<Connection> c, impl_->Live());
  grpc::ClientContext ctx;
  impl_->SetDeadline(&ctx, impl_->call_timeout());
  v1::DeregisterMemoryRequest req;
  req.set_lkey(lkey);
  v1::DeregisterMemoryResponse resp;
  grpc::Status s = c->rdma->DeregisterMemory(&ctx, req, &resp);
  if (!s.ok()) return impl_->CallError(s, "DeregisterMemory", c.get());
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint32_t>> Client::createQueuePairs(
    int control_fd, uint64_t control_bytes, const std::vector<RdmaQpLayout>& layouts,
    const std::string& control_kind) {
  MC_ASSIGN_OR_RETURN(std::string ticket, sendFds({control_fd}));
  MC_ASSIGN_OR_RETURN(std::shared_ptr<Connection> c, impl_->Live());
  grpc::ClientContext ctx;
  impl_->SetDeadline(&ctx, impl_->call_timeout());
  v1::CreateQueuePairsRequest req;
  req.set_fd_ticket(ticket);
  req.set_control_bytes(control_bytes);
  req.set_control_kind(control_kind);
  for (const RdmaQpLayout& l : layouts) {
    v1::QueuePairLayout* q = req.add_qps();
    q->set_sq_offset(l.sq_offset);
    q->set_sq_wqe_cnt(l.sq_wqe_cnt);
    q->set_sq_dbrec_offset(l.sq_dbrec_offset);
    q->set_cq_offset(l.cq_offset);
    q->set_cq_cqe_cnt(l.cq_cqe_cnt);
    q->set_cq_dbrec_offset(l.cq_dbrec_offset);
  }
  v1::CreateQueuePairsResponse resp;
  grpc::Status s = c->rdma->CreateQueuePairs(&ctx, req, &resp);
  if (!s.ok()) return impl_->CallError(s, "CreateQueuePairs", c.get());
  return std::vector<uint32_t>(resp.qpns().begin(), resp.qpns().end());
}

absl::Status Client::connectQueuePairs(const std::vector<std::pair<uint32_t, uint32_t>>& pairs,
                                       const std::vector<std::string>& remote_nodes) {
  if (!remote_nodes.empty() && remote_nodes.size() != pairs.size()) {
    return absl::InvalidArgumentError("connectQueuePairs: one remote node per pair, or none");
  }
  MC_ASSIGN_OR_RETURN(std::shared_ptr<Connection> c, impl_->Live());
  grpc::ClientContext ctx;
  impl_->SetDeadline(&ctx, impl_->call_timeout());
  v1::ConnectQueuePairsRequest req;
  for (size_t i = 0; i < pairs.size(); ++i) {
    v1::QueuePairConnection* q = req.add_connections();
    q->set_qpn(pairs[i].first);
    q->set_remote_qpn(pairs[i].second);
    if (!remote_nodes.empty()) q->set_remote_node(remote_nodes[i]);
  }
  v1::ConnectQueuePairsResponse resp;
  grpc::Status s = c->rdma->ConnectQueuePairs(&ctx, req, &resp);
  if (!s.ok()) return impl_->CallError(s, "ConnectQueuePairs", c.get());
  return absl::OkStatus();
}

absl::Status Client::destroyQueuePairs(const std::vector<uint32_t>& qpns) {
  MC_ASSIGN_OR_RETURN(std::shared_ptr<Connection> c, impl_->Live());
  grpc::ClientContext ctx;
  impl_->SetDeadline(&ctx, impl_->call_timeout());
  v1::DestroyQueuePairsRequest req;
  req.mutable_qpns()->Add(qpns.begin(), qpns.end());
  v1::DestroyQueuePairsResponse resp;
  grpc::Status s = c->rdma->DestroyQueuePairs(&ctx, req, &resp);
  if (!s.ok()) return impl_->CallError(s, "DestroyQueuePairs", c.get());
  return absl::OkStatus();
}

uint64_t Client::addDaemonLossHandler(std::function<void(const std::string& why)> handler) {
  return impl_->AddLossHandler(std::move(handler));
}

void Client::removeDaemonLossHandler(uint64_t id) { impl_->RemoveLossHandler(id); }

std::optional<SessionEvent> Client::nextEvent(absl::Duration timeout) {
  return impl_->NextEvent(timeout);
}

absl::StatusOr<std::pair<std::string, std::string>> Client::selectNic(
    const std::vector<std::string>& allowed, const std::string& gpu_pci_bus_id) {
  MC_ASSIGN_OR_RETURN(std::shared_ptr<Connection> c, impl_->Live());
  grpc::ClientContext ctx;
  impl_->SetDeadline(&ctx, impl_->call_timeout());
  v1::SelectNicRequest req;
  for (const std::string& n : allowed) req.add_allowed(n);
  req.set_gpu_pci_bus_id(gpu_pci_bus_id);
  v1::SelectNicResponse resp;
  grpc::Status s = c->rdma->SelectNic(&ctx, req, &resp);
  if (!s.ok()) return impl_->CallError(s, "SelectNic", c.get());
  return std::make_pair(resp.nic(), resp.reason());
}

absl::StatusOr<DoorbellAccess> Client::doorbellAccess() {
  MC_ASSIGN_OR_RETURN(std::shared_ptr<Connection> c, impl_->Live());
  grpc::ClientContext ctx;
  impl_->SetDeadline(&ctx, impl_->call_timeout());
  v1::GetDoorbellAccessRequest req;
  v1::DoorbellAccess resp;
  grpc::Status s = c->rdma->GetDoorbellAccess(&ctx, req, &resp);
  if (!s.ok()) return impl_->CallError(s, "GetDoorbellAccess", c.get());
  MC_ASSIGN_OR_RETURN(std::vector<UniqueFd> fds, fetchFds(resp.fd_ticket()));
  if (fds.size() != 1) {
    return absl::InternalError(
        absl::StrCat("GetDoorbellAccess: the daemon sent ", fds.size(), " fds, not 1"));
  }
  DoorbellAccess a;
  a.command_fd = std::move(fds[0]);
  a.device = resp.device();
  a.uar_mmap_offset = resp.uar_mmap_offset();
  a.uar_reg_offset = resp.uar_reg_offset();
  a.uar_page_bytes = resp.uar_page_bytes();
  a.uar_non_cached = resp.uar_non_cached();
  return a;
}

absl::Status Client::releaseDoorbellAccess() {
  MC_ASSIGN_OR_RETURN(std::shared_ptr<Connection> c, impl_->Live());
  grpc::ClientContext ctx;
  impl_->SetDeadline(&ctx, impl_->call_timeout());
  v1::ReleaseDoorbellAccessRequest req;
  v1::ReleaseDoorbellAccessResponse resp;
  grpc::Status s = c->rdma->ReleaseDoorbellAccess(&ctx, req, &resp);
  if (!s.ok()) return impl_->CallError(s, "ReleaseDoorbellAccess", c.get());
  return absl::OkStatus();
}

absl::Status Client::attachCopyAgent(int channel_fd, uint64_t staging_bytes) {
  MC_ASSIGN_OR_RETURN(std::shared_ptr<Connection> c, impl_->Live());
  MC_ASSIGN_OR_RETURN(std::string ticket, sendFds({channel_fd}));
  grpc::ClientContext ctx;
  impl_->SetDeadline(&ctx, impl_->call_timeout());
  v1::AttachCopyAgentRequest req;
  req.set_fd_ticket(ticket);
  req.set_staging_bytes(staging_bytes);
  v1::AttachCopyAgentResponse resp;
  grpc::Status s = c->rdma->AttachCopyAgent(&ctx, req, &resp);
  if (!s.ok()) return impl_->CallError(s, "AttachCopyAgent", c.get());
  return absl::OkStatus();
}

}  // namespace mooncake
