#include "server/daemon_metrics.h"

#include "google/protobuf/descriptor.h"
#include "mooncake/v1/admin.grpc.pb.h"
#include "mooncake/v1/local.grpc.pb.h"
#include "mooncake/v1/peer.grpc.pb.h"
#include "mooncake/v1/rdma.grpc.pb.h"

namespace mooncake::daemon {

std::vector<std::string> CountedRpcMethods() {
  std::vector<std::string> out;
  for (const char* service : {v1::Local::service_full_name(), v1::Admin::service_full_name(),
                              v1::Rdma::service_full_name(), v1::Peer::service_full_name()}) {
    const google::protobuf::ServiceDescriptor* s =
        google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(service);
    if (s == nullptr) continue;
    for (int i = 0; i < s->method_count(); ++i) {
      out.push_back(s->full_name() + "/" + s->method(i)->name());
    }
  }
  out.push_back("grpc.health.v1.Health/Check");
  return out;
}

metrics::GaugeSources DaemonGaugeSources(const SessionRegistry* sessions, const GroupBroker* broker,
                                         const FdBroker* fds, const RdmaResources* rdma,
                                         const peering::NodeRegistry* nodes) {
  metrics::GaugeSources s;
  s.sessions = [sessions] { return static_cast<uint64_t>(sessions->size()); };
  s.groups_by_state = [broker] { return broker->CountByState(); };
  s.fd_tickets = [fds] { return static_cast<uint64_t>(fds->TicketCount()); };
  s.exports = [fds] { return static_cast<uint64_t>(fds->ExportCount()); };
  s.rdma = [rdma]() -> std::optional<metrics::RdmaGauges> {
    if (rdma == nullptr) return std::nullopt;
    metrics::RdmaGauges g;
    g.provider = rdma->provider();
    g.doorbell_mode = rdma->doorbell_mode();
    RdmaUsage total = rdma->Totals();
    g.qps = total.qps;
    g.mrs = total.mrs;
    g.registered_bytes = total.bytes;
    if (int64_t moved = rdma->provider_bytes_moved(); moved >= 0) {
      g.softnic_bytes = static_cast<uint64_t>(moved);
    }
    if (auto work = rdma->provider_gpu_work()) {
      g.softnic_gpu_workers = work->workers;
      g.softnic_gpu_waiting = work->waiting;
    }
    return g;
  };
  s.cluster_nodes = [nodes]() -> std::optional<uint64_t> {
    if (nodes == nullptr) return std::nullopt;
    return nodes->Nodes().size();
  };
  return s;
}

}  // namespace mooncake::daemon
