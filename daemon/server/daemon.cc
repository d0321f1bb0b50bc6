#include "server/daemon.h"

#include <fcntl.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/impl/server_builder_option.h>
#include <grpcpp/impl/server_builder_plugin.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>
#include <grpcpp/server_posix.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "admission/fd_capacity.h"
#include "broker/tenant_span_policy.h"
#include "discovery/discovery.h"
#include "mooncake/common/escape.h"
#include "mooncake/common/log.h"
#include "mooncake/common/paths.h"
#include "mooncake/common/status.h"
#include "mooncake/common/version.h"
#include "peering/connection_offers.h"
#include "peering/peer_identity.h"
#include "peering/peer_tls.h"
#include "peering/trusted_peers.h"
#include "rdma/mlx5/mlx5_provider.h"
#include "rdma/provider_selection.h"
#include "rdma/softnic_provider.h"
#include "server/daemon_metrics.h"
#include "server/rpc_interceptor.h"
#include "server/unix_listener.h"

namespace mooncake::daemon {
namespace {

std::map<std::string, std::string> TenantSocketMap(const std::vector<TenantSocket>& tenants) {
  std::map<std::string, std::string> out;
  for (const TenantSocket& t : tenants) out[t.name] = t.path;
  return out;
}

std::string Hostname() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "localhost";
  return buf;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Create(DaemonConfig config) {
  std::unique_ptr<Daemon> d(new Daemon());
  if (config.join_timeout_ms > config.max_join_timeout_ms) {
    return absl::InvalidArgumentError(
        absl::StrCat("join_timeout_ms = ", config.join_timeout_ms,
                     " exceeds max_join_timeout_ms = ", config.max_join_timeout_ms));
  }
  FdCapacity fd_capacity = FitToFdLimit(RaiseFdLimit(), &config);
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

  MC_LOG(kInfo, "fd limit ", fd_capacity.limit, " (", fd_capacity.reserved,
         " reserved for root); per user: ", cfg.max_connections_per_uid, " connections, ",
         cfg.fd_channel_connections_per_uid, " fd-channel connections, ", cfg.max_fds_per_uid,
         " fds, ", cfg.max_ranks_per_uid, " ranks, ", cfg.max_waiting_joins_per_uid,
         " waiting joins");

  // Wiring, in dependency order; the services are made in Start().
  d->connection_admission_ = std::make_unique<AdmissionCounter>(
      AdmissionLimits{"connections to mooncaked", cfg.max_connections_per_uid,
                      "max_connections_per_uid", cfg.max_connections, "max_connections"});
  d->connections_ = std::make_unique<ConnectionTable>(d->connection_admission_.get());
  d->sessions_ = std::make_unique<SessionRegistry>(cfg.max_sessions_per_uid);
  // A session whose client stopped reading its events: its connection is
  // shut down, which ends the session as a client exit does.
  d->sessions_->SetOverflowHandler(
      [connections = d->connections_.get()](const SessionInfo& s, const std::string& reason) {
        MC_LOG(kWarning, reason);
        connections->ShutDown(s.connection_fd);
      });
  d->fds_ = std::make_unique<FdBroker>(absl::Milliseconds(cfg.ticket_ttl_ms), d->sessions_.get(),
                                       FdLimits{cfg.max_fds_per_uid, cfg.max_fds});
  std::vector<v1::Nic> found(node.topology.nics().begin(), node.topology.nics().end());
  absl::StatusOr<ProviderChoice> choice = ChooseRdmaProvider(
      cfg.rdma_provider, found,
      [&cfg](const std::string& device, uint32_t port) {
        mlx5::Mlx5SessionOptions o;
        o.device = device;
        o.port = port;
        o.gid_index = cfg.rdma_gid_index;
        // Opened and closed at once: proves the context, caps, port, PD and
        // (rdma_gid_index) the configured GID.
        return mlx5::Mlx5Session::Open(o).status();
      },
      cfg.rdma_devices);
  if (!choice.ok()) return choice.status();
  if (choice->provider != "off") {
    RdmaLimits rl;
    rl.max_qps_per_session = cfg.max_qps_per_session;
    rl.max_mrs_per_session = cfg.max_mrs_per_session;
    rl.max_registered_bytes_per_session = cfg.max_registered_bytes_per_session;
    rl.max_qps_per_uid = cfg.max_qps_per_uid;
    rl.max_mrs_per_uid = cfg.max_mrs_per_uid;
    rl.max_registered_bytes_per_uid = cfg.max_registered_bytes_per_uid;
    rl.max_registered_bytes_total = cfg.max_registered_bytes_total;
    rl.max_doorbell_handoffs_per_uid = cfg.max_doorbell_handoffs_per_uid;
    softnic::CudaMemoryOptions co;  // GPU regions: loaded at the first one
    co.cuda_library = cfg.cuda_library;
    std::unique_ptr<RdmaProvider> provider;
    if (choice->provider == "mlx5") {
      // Said once at start (issue 24 item 8): each hand-off is refused the
      // same way while this holds.
      if (absl::Status rights = mlx5::CheckHandOffRights(); !rights.ok()) {
        MC_LOG(kWarning, "gpu-uar doorbell hand-offs will be refused: ", rights.message());
      }
      mlx5::Mlx5ProviderOptions po;
      po.tuning.traffic_class = cfg.rdma_traffic_class;
      po.tuning.service_level = cfg.rdma_service_level;
      std::vector<mlx5::Mlx5SessionOptions> served;
      for (const Mlx5Device& dev : choice->devices) {
        // The tuning's ranges depend on the port's link layer (an Ethernet
        // priority is 0..7): refused here rather than at every connect.
        mlx5::LinkLayer link = mlx5::LinkLayer::kInfiniBand;
        for (const v1::Nic& n : found) {
          for (const v1::NicPort& p : n.ports()) {
            if (n.name() == dev.device && p.port() == dev.port && p.link_layer() == "Ethernet") {
              link = mlx5::LinkLayer::kEthernet;
            }
          }
        }
        if (absl::Status s = mlx5::ValidateConnectTuning(po.tuning, link); !s.ok()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "rdma_traffic_class / rdma_service_level do not suit ", dev.device, " port ",
              dev.port, " (", link == mlx5::LinkLayer::kEthernet ? "Ethernet" : "InfiniBand",
              "): ", s.message()));
        }
        mlx5::Mlx5SessionOptions so;
        so.device = dev.device;
        so.port = dev.port;
        so.gid_index = cfg.rdma_gid_index;
        served.push_back(std::move(so));
      }
      provider = std::make_unique<mlx5::Mlx5Provider>(std::move(served), std::move(po));
    } else {
      // softnic is listed as a NIC of its own.
      v1::Nic* nic = node.topology.add_nics();
      nic->set_name("softnic0");
      nic->set_driver("mooncaked");
      nic->set_provider("softnic");
      nic->set_numa_node(-1);
      v1::NicPort* port = nic->add_ports();
      port->set_port(1);
      port->set_state("ACTIVE");
      port->set_link_layer("softnic");
      softnic::EngineOptions eo;
      eo.sink = cfg.softnic_sink;
      eo.atomics = cfg.softnic_atomics == "hca" ? softnic::AtomicsModel::kHca
                                                : softnic::AtomicsModel::kDevice;
      eo.hca_atomic_window_us = cfg.softnic_hca_atomic_window_us;
      eo.hca_round_trip_us = cfg.softnic_hca_round_trip_us;
      eo.gpu_workers = cfg.softnic_gpu_workers;
      auto softnic = std::make_unique<SoftnicProvider>("softnic0", eo);
      d->softnic_engine_ = &softnic->engine();
      provider = std::move(softnic);
    }
    const std::vector<std::string> serving = provider->served_nics();
    for (v1::Nic& n : *node.topology.mutable_nics()) {
      if (std::find(serving.begin(), serving.end(), n.name()) != serving.end()) {
        n.set_provider(provider->name());
      } else if (n.provider().empty()) {
        n.set_provider(absl::StrCat("none (", absl::StrJoin(serving, ", "), " serve RDMA)"));
      }
    }
    d->rdma_ = std::make_unique<RdmaResources>(d->sessions_.get(), rl, std::move(provider), co);
    d->rdma_->set_topology(node.topology);
    MC_LOG(kInfo, "RDMA: provider ", d->rdma_->provider(), " on ", d->rdma_->nic(),
           " (doorbell mode ", d->rdma_->doorbell_mode(),
           choice->provider == "softnic" && cfg.softnic_sink ? ", sink: WQEs complete without data"
                                                             : "",
           choice->provider == "softnic" && cfg.softnic_atomics == "hca"
               ? absl::StrCat(", hca atomics: window ", cfg.softnic_hca_atomic_window_us,
                              " us, fence round trip ", cfg.softnic_hca_round_trip_us, " us")
               : "",
           "); ", choice->reason);
  } else {
    MC_LOG(kInfo, "RDMA: off (rdma_provider = off)");
  }
  BrokerLimits limits;
  limits.max_world_size = cfg.max_world_size;
  limits.default_timeout_ms = cfg.join_timeout_ms;
  limits.max_timeout_ms = cfg.max_join_timeout_ms;
  limits.max_ranks_per_uid = cfg.max_ranks_per_uid;
  limits.max_waiting_joins_per_uid = cfg.max_waiting_joins_per_uid;
  limits.max_view_bytes_per_uid = cfg.max_view_bytes_per_uid;
  d->broker_ = std::make_unique<GroupBroker>(node.node_id, node.topology, limits,
                                             d->sessions_.get(), d->fds_.get());
  if (!cfg.tenant_policy_file.empty()) {
    absl::StatusOr<std::shared_ptr<const TenantSpanPolicy>> policy =
        TenantSpanPolicy::Load(cfg.tenant_policy_file, ::geteuid());
    if (!policy.ok()) return policy.status();
    MC_LOG(kInfo, "tenant span policy: ", (*policy)->tenant_count(), " tenant lines from ",
           (*policy)->source());
    d->broker_->set_span_policy(*std::move(policy));
  }
  d->lifecycle_ = std::make_unique<SessionLifecycle>(d->sessions_.get(), d->fds_.get(),
                                                     d->rdma_.get(), d->broker_.get());

  // Checked before any socket is bound: a bad tenant list leaves nothing behind.
  absl::StatusOr<std::vector<TenantSocket>> tenants = ResolveTenantSockets(cfg);
  if (!tenants.ok()) return tenants.status();
  auto listen = ListenUnix(cfg.socket, cfg.socket_mode, cfg.socket_group);
  if (!listen.ok()) return listen.status();
  d->acceptor_ = std::make_unique<GrpcAcceptor>(std::move(*listen), d->connections_.get(),
                                                d->connection_admission_.get(),
                                                absl::Milliseconds(cfg.handshake_timeout_ms));
  auto fd_listen = ListenUnix(FdSocketPath(cfg.socket), cfg.socket_mode, cfg.socket_group);
  if (!fd_listen.ok()) {
    ::unlink(cfg.socket.c_str());
    return fd_listen.status();
  }
  FdChannelLimits fd_limits;
  fd_limits.connections_per_uid = cfg.fd_channel_connections_per_uid;
  fd_limits.connections = cfg.fd_channel_connections;
  d->fd_channel_ = std::make_unique<FdChannelServer>(std::move(*fd_listen), d->sessions_.get(),
                                                     d->fds_.get(), fd_limits);
  // One socket and fd channel per tenant, with the main socket's mode and
  // group: who may connect is the directory's business (a pod mounts only
  // its tenant's directory), what a caller sees is its tenant's.
  for (const TenantSocket& t : *tenants) {
    absl::StatusOr<UniqueFd> main_fd = ListenUnix(t.path, cfg.socket_mode, cfg.socket_group);
    absl::StatusOr<UniqueFd> fd_fd =
        main_fd.ok() ? ListenUnix(FdSocketPath(t.path), cfg.socket_mode, cfg.socket_group)
                     : absl::StatusOr<UniqueFd>(main_fd.status());
    if (!fd_fd.ok()) {
      // That tenant is not served; the others and the main socket are (a
      // file planted at one tenant's path while the daemon was down must
      // not take every tenant's daemon away).
      if (main_fd.ok()) ::unlink(t.path.c_str());
      MC_LOG(kError, "tenant '", t.name, "' is not served: ", fd_fd.status().message(),
             "; remove what is at ", EscapeForDisplay(t.path, 256), " (or its .fd) and restart");
      continue;
    }
    d->acceptor_->AddTenantListener(*std::move(main_fd), t.name);
    d->fd_channel_->AddTenantListener(*std::move(fd_fd), t.name);
    MC_LOG(kInfo, "tenant '", t.name, "' on ", t.path);
    d->tenants_.push_back(t);
  }
  if (!cfg.metrics_listen.empty()) {  // served from Start()
    d->metrics_ = std::make_unique<metrics::Metrics>(CountedRpcMethods(), metrics::GaugeSources{},
                                                     kMooncakeVersion);
    d->broker_->set_counters(d->metrics_->counters());
    d->acceptor_->set_counters(d->metrics_->counters());
  }
  d->created_ = true;
  return d;
}

Daemon::~Daemon() { Shutdown("daemon destroyed"); }

absl::Status Daemon::JoinCluster() {
  absl::StatusOr<etcd::EtcdOptions> options;
  {
    etcd::EtcdOptions base;
    base.ca_file = config_.etcd_ca_file;
    base.cert_file = config_.etcd_cert_file;
    base.key_file = config_.etcd_key_file;
    options = etcd::ParseEtcdEndpoints(config_.etcd_endpoints, base);
  }
  if (!options.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("etcd_endpoints: ", options.status().message()));
  }
  absl::StatusOr<std::unique_ptr<etcd::EtcdClient>> client = etcd::EtcdClient::Connect(*options);
  if (!client.ok()) {
    return absl::Status(client.status().code(),
                        absl::StrCat("cannot reach etcd (", config_.etcd_endpoints,
                                     "): ", client.status().message(),
                                     "; start etcd, fix etcd_endpoints or the etcd_*_file TLS "
                                     "settings, or remove etcd_endpoints to run this node alone"));
  }
  etcd_ = *std::move(client);
  v1::NodeRecord self;
  self.set_node_id(node_.node_id);
  self.set_instance_id(node_.instance_id);
  std::string advertise = config_.peer_advertise;
  if (advertise.empty() && !config_.peer_listen.empty()) {
    advertise = config_.peer_listen;
    // A wildcard host is no address to dial: the hostname stands for it.
    for (const char* wild : {"0.0.0.0:", "[::]:", ":"}) {
      if (absl::StartsWith(advertise, wild)) {
        advertise = absl::StrCat(node_.hostname, ":", advertise.substr(std::strlen(wild)));
        break;
      }
    }
  }
  if (advertise.empty()) {
    MC_LOG(kWarning, "etcd: peer_listen is not set: other nodes see this one but cannot reach it");
  }
  self.set_peer_address(advertise);
  self.set_daemon_version(kMooncakeVersion);
  self.set_protocol_version(kProtocolVersion);
  self.set_hostname(node_.hostname);
  self.set_gpu_count(static_cast<uint32_t>(node_.topology.gpus_size()));
  self.set_nic_count(static_cast<uint32_t>(node_.topology.nics_size()));
  self.set_rdma_provider(rdma_ ? rdma_->provider() : "off");
  self.set_started_unix_ms(static_cast<uint64_t>(absl::ToUnixMillis(absl::Now())));
  absl::StatusOr<peering::PeerSecurity> security = peering::DescribePeerSecurity(PeerTls());
  if (!security.ok()) return security.status();
  self.set_peer_insecure(!security->tls);
  if (!advertise.empty()) {
    // Other daemons refuse a record whose address is not host:port; say so here.
    if (absl::Status s = peering::ValidatePeerAddress(advertise); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("peer_advertise (or peer_listen): ", s.message()));
    }
  }
  peering::NodeRegistryOptions ro;
  ro.prefix = config_.etcd_prefix;
  ro.lease_ttl = absl::Seconds(config_.etcd_lease_ttl_s);
  absl::StatusOr<std::unique_ptr<peering::NodeRegistry>> nodes =
      peering::NodeRegistry::Start(etcd_.get(), ro, std::move(self));
  if (!nodes.ok()) return nodes.status();
  nodes_ = *std::move(nodes);
  MC_LOG(kInfo, "etcd: node ", node_.node_id, " registered under ", config_.etcd_prefix,
         "/nodes/ (lease TTL ", config_.etcd_lease_ttl_s, " s); ", nodes_->Nodes().size(),
         " node(s) live");
  // Other nodes are reached only once they prove who they are.
  peering::TrustedPeersOptions po;
  po.mode = security->mode;
  MC_ASSIGN_OR_RETURN(po.credentials,
                      peering::PeerChannelCredentials(PeerTls(), peer_revocations_));
  po.revocations = peer_revocations_;
  po.self_node = node_.node_id;
  po.max_message_bytes = peering::SoftnicPeerLink::kMaxMessageBytes;
  trusted_peers_ = std::make_shared<peering::TrustedPeers>(
      std::move(po),
      [registry = nodes_.get()](const std::string& node) { return registry->Node(node); });
  peering::GroupDirectoryOptions go;
  go.prefix = config_.etcd_prefix;
  go.node_id = node_.node_id;
  go.instance_id = node_.instance_id;
  go.lease = [registry = nodes_.get()] { return registry->lease_id(); };
  go.sink = [broker = broker_.get()](uint32_t uid, const std::string& tenant,
                                     const std::string& group, uint32_t rank,
                                     std::optional<ClusterMember> member) {
    broker->RemoteChanged(uid, tenant, group, rank, std::move(member));
  };
  if (security->mode != peering::PeerMode::kTlsRequired) {
    // Members' RDMA endpoints come from their nodes over the peer channel.
    go.fetch_endpoints = [peers = trusted_peers_](const std::string& node, uint32_t uid,
                                                  const std::string& tenant,
                                                  const std::string& group, uint32_t world_size,
                                                  const std::vector<uint32_t>& ranks) {
      return peering::FetchRankEndpointsFrom(peers.get(), node, uid, tenant, group, world_size,
                                             ranks, absl::Seconds(2));
    };
  }
  absl::StatusOr<std::unique_ptr<peering::EtcdGroupDirectory>> directory =
      peering::EtcdGroupDirectory::Start(etcd_.get(), std::move(go));
  if (!directory.ok()) return directory.status();
  group_directory_ = *std::move(directory);
  broker_->set_directory(group_directory_.get());
  if (rdma_) {
    // Queue pairs go only to nodes of the caller's groups (issue 23 item 6).
    rdma_->set_remote_connections(std::make_shared<peering::ConnectionOffers>(
        trusted_peers_, [broker = broker_.get()](uint64_t session, const std::string& node) {
          return broker->SharesGroupWithNode(session, node);
        }));
  }
  if (softnic_engine_ != nullptr) {
    // QPs connected to other nodes' softnic reach them over the peer port.
    softnic_link_ = std::make_shared<peering::SoftnicPeerLink>(node_.node_id, trusted_peers_.get());
    softnic_engine_->SetRemoteLink(softnic_link_);
  }
  return absl::OkStatus();
}

namespace {

// Drops the reflection plugin from one server: linking grpc++_reflection
// registers it for every ServerBuilder of the process, and the peer port
// must not let other hosts enumerate the daemon's services.
class WithoutReflection final : public grpc::ServerBuilderOption {
 public:
  void UpdateArguments(grpc::ChannelArguments*) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override {
    std::erase_if(*plugins, [](const std::unique_ptr<grpc::ServerBuilderPlugin>& p) {
      return dynamic_cast<grpc::reflection::ProtoServerReflectionPlugin*>(p.get()) != nullptr;
    });
  }
};

}  // namespace

absl::Status Daemon::StartPeerServer() {
  const peering::PeerTlsFiles tls = PeerTls();
  MC_ASSIGN_OR_RETURN(peering::PeerSecurity security, peering::DescribePeerSecurity(tls));
  MC_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials,
                      peering::PeerServerCredentials(tls));
  peer_security_ = security.description;
  peer_service_ = std::make_unique<PeerService>(&node_, security.mode);
  peer_service_->set_softnic(softnic_engine_);
  peer_service_->set_revocations(peer_revocations_);
  peer_service_->set_rdma(rdma_.get());
  if (nodes_) {
    peer_service_->set_live_node([registry = nodes_.get()](const std::string& node) {
      return registry->Node(node).has_value();
    });
  }
  if (group_directory_) {
    // Endpoints of this node's ranks, only to nodes of the same group.
    peer_service_->set_endpoint_source(
        [broker = broker_.get(), directory = group_directory_.get()](
            const std::string& node, uint32_t uid, const std::string& tenant,
            const std::string& group, const std::vector<uint32_t>& ranks)
            -> absl::StatusOr<std::vector<peering::FetchedEndpoint>> {
          MC_RETURN_IF_ERROR(broker->MayFetchEndpoints(uid, tenant, group, node));
          return directory->OwnEndpoints(uid, tenant, group, ranks);
        });
  }
  grpc::ServerBuilder pb;
  pb.SetMaxReceiveMessageSize(peering::SoftnicPeerLink::kMaxMessageBytes);
  pb.SetOption(std::make_unique<WithoutReflection>());
  int port = 0;
  pb.AddListeningPort(config_.peer_listen, credentials, &port);
  pb.RegisterService(peer_service_.get());
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> peer_icpt;
  peer_icpt.push_back(std::make_unique<RpcInterceptorFactory>(
      nullptr, std::vector<std::string>{v1::Peer::service_full_name()},
      metrics_ ? metrics_->counters() : nullptr));
  pb.experimental().SetInterceptorCreators(std::move(peer_icpt));
  peer_server_ = pb.BuildAndStart();
  if (!peer_server_ || port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen for peers on ", config_.peer_listen,
                                               ": address in use or invalid (peer_listen)"));
  }
  switch (security.mode) {
    case peering::PeerMode::kMutualTls:
      MC_LOG(kInfo, "peer API on ", config_.peer_listen, ": ", security.description);
      break;
    case peering::PeerMode::kInsecure:
      MC_LOG(kWarning, "!!! peer API on ", config_.peer_listen, ": ", security.description,
             ". Use this only on an isolated test network; for anything else ",
             peering::kTlsKeysHint, " and remove peer_insecure !!!");
      break;
    case peering::PeerMode::kTlsRequired:
      MC_LOG(kWarning, "peer API on ", config_.peer_listen, ": ", security.description, "; ",
             peering::kTlsKeysHint);
      break;
  }
  return absl::OkStatus();
}

peering::PeerTlsFiles Daemon::PeerTls() const {
  return peering::PeerTlsFiles{config_.peer_tls_ca_file, config_.peer_tls_cert_file,
                               config_.peer_tls_key_file, config_.peer_tls_crl_file,
                               config_.peer_insecure};
}

absl::Status Daemon::Start() {
  if (!config_.peer_listen.empty()) {
    // Checked before anything starts: half the TLS files is a config error.
    MC_ASSIGN_OR_RETURN(peering::PeerSecurity security, peering::DescribePeerSecurity(PeerTls()));
    peer_security_ = security.description;
    MC_ASSIGN_OR_RETURN(peer_revocations_, peering::LoadPeerRevocations(PeerTls()));
    if (peer_revocations_) {
      MC_LOG(kInfo, "peer_tls_crl_file: ", peer_revocations_->Describe());
    }
  }
  if (!config_.etcd_endpoints.empty()) MC_RETURN_IF_ERROR(JoinCluster());
  local_service_ = std::make_unique<LocalService>(&node_, connections_.get(), sessions_.get(),
                                                  lifecycle_.get(), broker_.get(), fds_.get());
  admin_service_ = std::make_unique<AdminService>(
      &node_,
      AdminService::Endpoints{config_.socket, config_.peer_listen, config_.etcd_endpoints,
                              peer_security_, TenantSocketMap(tenants_)},
      connections_.get(), sessions_.get(), broker_.get(), fds_.get(), rdma_.get(), nodes_.get());
  broker_->set_event_sink(admin_service_->event_feed());  // mcctl watch
  std::vector<std::string> served = {v1::Local::service_full_name(),
                                     v1::Admin::service_full_name()};
  if (rdma_) {
    rdma_service_ =
        std::make_unique<RdmaService>(connections_.get(), sessions_.get(), fds_.get(), rdma_.get());
    served.push_back(v1::Rdma::service_full_name());
  }
  if (!config_.peer_listen.empty()) MC_RETURN_IF_ERROR(StartPeerServer());
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  // No listening port: connections are accepted here, credentials read,
  // then handed over with AddInsecureChannelFromFd.
  builder.RegisterService(local_service_.get());
  builder.RegisterService(admin_service_.get());
  if (rdma_service_) builder.RegisterService(rdma_service_.get());
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<RpcInterceptorFactory>(
      connections_.get(), served, metrics_ ? metrics_->counters() : nullptr));
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  server_ = builder.BuildAndStart();
  if (!server_) return absl::InternalError("gRPC server failed to start");
  // grpc.health.v1.Health/Check answers SERVING for "" (the server) and for
  // each service by name; Shutdown() turns them all NOT_SERVING.
  for (const std::string& name : served) {
    server_->GetHealthCheckService()->SetServingStatus(name, true);
  }

  if (metrics_) {
    metrics_->set_sources(
        DaemonGaugeSources(sessions_.get(), broker_.get(), fds_.get(), rdma_.get(), nodes_.get()));
    MC_RETURN_IF_ERROR(metrics_->Serve(config_.metrics_listen));
  }
  fd_channel_->Start();
  acceptor_->Start(server_.get());
  heap_trimmer_ = std::make_unique<HeapTrimmer>();
  MC_LOG(kInfo, "mooncaked ", kMooncakeVersion, " serving ", config_.socket, " (node ",
         node_.node_id, ", instance ", node_.instance_id, ")");
  NotifySystemd("READY=1\nSTATUS=serving " + config_.socket);
  return absl::OkStatus();
}

absl::Status Daemon::ReloadTenantPolicy() {
  if (config_.tenant_policy_file.empty()) {
    MC_LOG(kInfo,
           "SIGHUP: no tenant_policy_file to re-read; restart the service to apply a new "
           "config");
    return absl::OkStatus();
  }
  absl::StatusOr<std::shared_ptr<const TenantSpanPolicy>> policy =
      TenantSpanPolicy::Load(config_.tenant_policy_file, ::geteuid());
  if (!policy.ok()) return policy.status();
  // A warning: it changes which nodes may reach tenants' memory, which an
  // operator filtering the log to warnings still wants to see.
  MC_LOG(kWarning, "tenant span policy reloaded: ", (*policy)->tenant_count(),
         " tenant lines from ", (*policy)->source());
  broker_->set_span_policy(*std::move(policy));
  return absl::OkStatus();
}

void Daemon::Shutdown(const std::string& reason) {
  if (shut_down_.exchange(true)) return;
  if (!created_) return;
  MC_LOG(kInfo, "shutting down: ", reason);
  if (metrics_) metrics_->Stop();  // no scrape reads what is torn down below
  // Remove the socket names first: new clients fail fast instead of hanging.
  ::unlink(config_.socket.c_str());
  ::unlink(FdSocketPath(config_.socket).c_str());
  for (const TenantSocket& t : tenants_) {
    ::unlink(t.path.c_str());
    ::unlink(FdSocketPath(t.path).c_str());
  }
  if (acceptor_) acceptor_->Stop();
  // Leave the cluster now: the others see this node go at once.
  if (group_directory_) {
    broker_->set_directory(nullptr);
    group_directory_->Stop();
  }
  if (softnic_link_) {
    softnic_engine_->SetRemoteLink(nullptr);
    softnic_link_->Stop();  // batches in flight complete with errors
  }
  if (nodes_) nodes_->Stop();
  if (admin_service_) {
    // Watchers end now (UNAVAILABLE) rather than hold the server's shutdown.
    broker_->set_event_sink(nullptr);
    admin_service_->event_feed()->Close();
  }
  broker_->Shutdown();
  sessions_->Shutdown(reason);
  if (server_) server_->GetHealthCheckService()->Shutdown();  // NOT_SERVING, watchers told
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  if (peer_server_)
    peer_server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  if (fd_channel_) fd_channel_->Stop();
  NotifySystemd("STOPPING=1");
}

}  // namespace mooncake::daemon
