// The Admin gRPC service for mcctl (proto/mooncake/v1/admin.proto).
// Callers see their own uid's sessions and groups; root sees all. Through a
// tenant's socket, only that tenant's (root too): Scope in
// session/session_registry.h.
//
// Read only: it gets const views of the pieces it reports on, all owned by
// Daemon and outliving it, and turns the broker's GroupSummary into the
// wire's GroupInfo itself.
//
// WatchEvents is the one streaming method (a callback reactor, so a watch
// holds no RPC thread): it reads the EventFeed this service owns, which the
// daemon sets as the broker's event sink.
#pragma once

#include <map>
#include <string>
#include <utility>

#include "broker/group_broker.h"
#include "fdchannel/fd_broker.h"
#include "mooncake/v1/admin.grpc.pb.h"
#include "peering/node_registry.h"
#include "rdma/rdma_resources.h"
#include "server/connection_table.h"
#include "server/event_feed.h"
#include "server/node_identity.h"
#include "session/session_registry.h"

namespace mooncake::daemon {

class AdminService final : public v1::Admin::WithCallbackMethod_WatchEvents<v1::Admin::Service> {
 public:
  // Where the daemon serves, for GetStatus.
  struct Endpoints {
    std::string socket_path;
    std::string peer_listen;     // empty: no peer API
    std::string etcd_endpoints;  // empty: no cluster membership
    std::string peer_security;   // "mTLS (...)" / "plaintext (...)"; empty: no peer API
    std::map<std::string, std::string> tenant_sockets;  // tenant -> its socket
  };

  AdminService(const NodeIdentity* node, Endpoints endpoints, const ConnectionTable* connections,
               const SessionRegistry* sessions, const GroupBroker* broker, const FdBroker* fds,
               const RdmaResources* rdma = nullptr, const peering::NodeRegistry* nodes = nullptr)
      : node_(node),
        endpoints_(std::move(endpoints)),
        connections_(connections),
        sessions_(sessions),
        broker_(broker),
        fds_(fds),
        rdma_(rdma),
        nodes_(nodes) {}

  grpc::Status GetStatus(grpc::ServerContext* ctx, const v1::GetStatusRequest* req,
                         v1::DaemonStatus* resp) override;
  grpc::Status GetTopology(grpc::ServerContext* ctx, const v1::GetTopologyRequest* req,
                           v1::Topology* resp) override;
  grpc::Status ListSessions(grpc::ServerContext* ctx, const v1::ListSessionsRequest* req,
                            v1::ListSessionsResponse* resp) override;
  grpc::Status ListGroups(grpc::ServerContext* ctx, const v1::ListGroupsRequest* req,
                          v1::ListGroupsResponse* resp) override;
  grpc::Status ListQueuePairs(grpc::ServerContext* ctx, const v1::ListQueuePairsRequest* req,
                              v1::ListQueuePairsResponse* resp) override;
  grpc::Status ListMemoryRegions(grpc::ServerContext* ctx, const v1::ListMemoryRegionsRequest* req,
                                 v1::ListMemoryRegionsResponse* resp) override;
  grpc::Status ListPeers(grpc::ServerContext* ctx, const v1::ListPeersRequest* req,
                         v1::ListPeersResponse* resp) override;
  grpc::ServerWriteReactor<v1::WatchEvent>* WatchEvents(grpc::CallbackServerContext* ctx,
                                                        const v1::WatchEventsRequest* req) override;

  // The feed WatchEvents reads; the daemon makes it the broker's event
  // sink (GroupBroker::set_event_sink) and closes it when stopping.
  EventFeed* event_feed() { return &feed_; }

 private:
  // The socket of `tenant` ("" = the main socket).
  std::string SocketOf(const std::string& tenant) const;
  // Whether `scope` sees a row (QP, MR) owned by `session`: its tenant's.
  bool TenantSees(const Scope& scope, uint64_t session) const;

  const NodeIdentity* const node_;
  const Endpoints endpoints_;
  const ConnectionTable* const connections_;
  const SessionRegistry* const sessions_;
  const GroupBroker* const broker_;
  const FdBroker* const fds_;
  const RdmaResources* const rdma_;           // null: RDMA off
  const peering::NodeRegistry* const nodes_;  // null: no etcd
  EventFeed feed_;
};

// The wire form of a group listing entry.
v1::GroupInfo ToGroupInfo(const GroupSummary& g);

}  // namespace mooncake::daemon
