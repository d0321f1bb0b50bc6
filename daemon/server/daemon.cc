#include "server/daemon.h"

#include <fcntl.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>
#include <grpcpp/server_posix.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "discovery/discovery.h"
#include "mooncake/common/log.h"
#include "mooncake/common/paths.h"
#include "mooncake/common/status.h"
#include "mooncake/common/version.h"
#include "server/unix_listener.h"

namespace mooncake::daemon {
namespace {

std::string Hostname() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "localhost";
  return buf;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Create(DaemonConfig config) {
  std::unique_ptr<Daemon> d(new Daemon());
  d->config_ = std::move(config);
  const DaemonConfig& cfg = d->config_;
  NodeIdentity& node = d->node_;
  node.instance_id = HexEncode(RandomBytes(8));
  node.hostname = Hostname();
  node.node_id = cfg.node_id.empty() ? node.hostname : cfg.node_id;
  node.started = absl::Now();

  DiscoveryOptions opts;
  opts.sysfs_root = cfg.sysfs_root;
  opts.cuda_library = cfg.cuda_library;
  node.topology = DiscoverTopology(opts);
  MC_LOG(kInfo, "discovered ", node.topology.gpus_size(), " GPU(s), ", node.topology.nics_size(),
         " RDMA NIC(s)");
  if (!node.topology.gpu_discovery_note().empty()) {
    MC_LOG(kInfo, "GPUs: ", node.topology.gpu_discovery_note());
  }
  if (!node.topology.nic_discovery_note().empty()) {
    MC_LOG(kInfo, "NICs: ", node.topology.nic_discovery_note());
  }

  // Wiring, in dependency order; the services are made in Start().
  d->sessions_ = std::make_unique<SessionRegistry>(cfg.max_sessions_per_uid);
  d->fds_ = std::make_unique<FdBroker>(absl::Milliseconds(cfg.ticket_ttl_ms), d->sessions_.get());
  BrokerLimits limits;
  limits.max_world_size = cfg.max_world_size;
  limits.default_timeout_ms = cfg.join_timeout_ms;
  d->broker_ = std::make_unique<GroupBroker>(node.node_id, node.topology, limits,
                                             d->sessions_.get(), d->fds_.get());
  d->lifecycle_ =
      std::make_unique<SessionLifecycle>(d->sessions_.get(), d->fds_.get(), d->broker_.get());

  auto listen = ListenUnix(cfg.socket, cfg.socket_mode, cfg.socket_group);
  if (!listen.ok()) return listen.status();
  d->listen_fd_ = std::move(*listen);
  auto fd_listen = ListenUnix(FdSocketPath(cfg.socket), cfg.socket_mode, cfg.socket_group);
  if (!fd_listen.ok()) {
    ::unlink(cfg.socket.c_str());
    return fd_listen.status();
  }
  d->fd_channel_ =
      std::make_unique<FdChannelServer>(std::move(*fd_listen), d->sessions_.get(), d->fds_.get());
  int p[2];
  if (::pipe2(p, O_CLOEXEC | O_NONBLOCK) != 0) return ErrnoStatus(errno, "pipe2");
  d->wake_read_.reset(p[0]);
  d->wake_write_.reset(p[1]);
  d->created_ = true;
  return d;
}

Daemon::~Daemon() { Shutdown("daemon destroyed"); }

absl::Status Daemon::Start() {
  local_service_ = std::make_unique<LocalService>(&node_, &connections_, sessions_.get(),
                                                  lifecycle_.get(), broker_.get(), fds_.get());
  admin_service_ = std::make_unique<AdminService>(
      &node_, AdminService::Endpoints{config_.socket, config_.peer_listen}, &connections_,
      sessions_.get(), broker_.get(), fds_.get());
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  // No listening port: connections are accepted here, credentials read,
  // then handed over with AddInsecureChannelFromFd.
  builder.RegisterService(local_service_.get());
  builder.RegisterService(admin_service_.get());
  server_ = builder.BuildAndStart();
  if (!server_) return absl::InternalError("gRPC server failed to start");

  if (!config_.peer_listen.empty()) {
    peer_service_ = std::make_unique<PeerService>(&node_);
    grpc::ServerBuilder pb;
    int port = 0;
    pb.AddListeningPort(config_.peer_listen, grpc::InsecureServerCredentials(), &port);
    pb.RegisterService(peer_service_.get());
    peer_server_ = pb.BuildAndStart();
    if (!peer_server_ || port == 0) {
      return absl::UnavailableError(absl::StrCat("cannot listen for peers on ", config_.peer_listen,
                                                 ": address in use or invalid (peer_listen)"));
    }
    MC_LOG(kInfo, "peer API on ", config_.peer_listen);
  }

  fd_channel_->Start();
  accept_thread_ = std::thread([this] { AcceptLoop(); });
  MC_LOG(kInfo, "mooncaked ", kMooncakeVersion, " serving ", config_.socket, " (node ",
         node_.node_id, ", instance ", node_.instance_id, ")");
  NotifySystemd("READY=1\nSTATUS=serving " + config_.socket);
  return absl::OkStatus();
}

void Daemon::AcceptLoop() {
  while (!shut_down_.load()) {
    pollfd p[2] = {{listen_fd_.get(), POLLIN, 0}, {wake_read_.get(), POLLIN, 0}};
    int rc = ::poll(p, 2, -1);
    if (rc < 0) {
      if (errno == EINTR) continue;
      MC_LOG(kError, "accept loop: poll: ", std::strerror(errno));
      return;
    }
    if (p[1].revents != 0) return;
    // gRPC needs the fd non-blocking, or every call ends in DEADLINE_EXCEEDED.
    int c = ::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (c < 0) {
      if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED) {
        MC_LOG(kWarning, "accept: ", std::strerror(errno));
        if (errno == EMFILE || errno == ENFILE) ::usleep(100000);
      }
      continue;
    }
    absl::StatusOr<PeerCred> cred = GetPeerCred(c);
    if (!cred.ok()) {
      ::close(c);
      continue;
    }
    connections_.Set(c, *cred);
    MC_LOG(kDebug, "connection fd ", c, " from pid ", cred->pid, " uid ", cred->uid);
    grpc::AddInsecureChannelFromFd(server_.get(), c);
  }
}

void Daemon::Shutdown(const std::string& reason) {
  if (shut_down_.exchange(true)) return;
  if (!created_) return;
  MC_LOG(kInfo, "shutting down: ", reason);
  // Remove the socket names first: new clients fail fast instead of hanging.
  ::unlink(config_.socket.c_str());
  ::unlink(FdSocketPath(config_.socket).c_str());
  if (wake_write_) (void)!::write(wake_write_.get(), "x", 1);
  if (accept_thread_.joinable()) accept_thread_.join();
  broker_->Shutdown();
  sessions_->Shutdown(reason);
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  if (peer_server_)
    peer_server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  if (fd_channel_) fd_channel_->Stop();
  NotifySystemd("STOPPING=1");
}

}  // namespace mooncake::daemon
