// Client: one session with mooncaked (mooncake::Client). Blocking calls
// release the GIL; results are dicts that mooncake_client/client.py turns
// into dataclasses.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "bindings.h"
#include "status.h"

namespace mooncake::python {
namespace {

// Seconds from Python -> Duration; negative means "no limit" where a call
// allows one, else it is clamped to zero.
absl::Duration Seconds(double s) {
  if (!(s > 0)) return absl::ZeroDuration();
  if (s > 1e9) return absl::InfiniteDuration();
  return absl::Microseconds(static_cast<int64_t>(s * 1e6));
}

py::dict GpuToDict(const GpuInfo& g) {
  py::dict d;
  d["index"] = g.index;
  d["name"] = g.name;
  d["uuid"] = g.uuid;
  d["pci_bus_id"] = g.pci_bus_id;
  d["numa_node"] = g.numa_node;
  d["total_memory_bytes"] = g.total_memory_bytes;
  return d;
}

py::dict NodeInfoToDict(const NodeInfo& n) {
  py::dict d;
  d["node_id"] = n.node_id;
  d["hostname"] = n.hostname;
  d["instance_id"] = n.instance_id;
  py::list gpus;
  for (const GpuInfo& g : n.gpus) gpus.append(GpuToDict(g));
  d["gpus"] = gpus;
  d["nics"] = n.nics;
  d["gpu_note"] = n.gpu_note;
  d["nic_note"] = n.nic_note;
  return d;
}

py::dict HelloToDict(const HelloInfo& h) {
  py::dict d;
  d["protocol_version"] = h.protocol_version;
  d["daemon_version"] = h.daemon_version;
  d["instance_id"] = h.instance_id;
  d["node_id"] = h.node_id;
  d["uid"] = h.uid;
  d["gid"] = h.gid;
  d["pid"] = h.pid;
  return d;
}

py::dict RdmaInfoToDict(const RdmaNodeInfo& r) {
  py::dict d;
  d["provider"] = r.provider;
  d["nic"] = r.nic;
  d["doorbell_mode"] = r.doorbell_mode;
  d["is_roce"] = r.is_roce;
  d["gid_index"] = r.gid_index;
  d["max_qps_per_session"] = r.max_qps_per_session;
  d["max_sq_wqes"] = r.max_sq_wqes;
  return d;
}

py::dict MemberToDict(const GroupMember& m) {
  py::dict d;
  d["rank"] = m.rank;
  d["node_id"] = m.node_id;
  d["pid"] = m.pid;
  d["gpu_index"] = m.gpu_index;
  d["gpu_uuid"] = m.gpu_uuid;
  d["gpu_pci_bus_id"] = m.gpu_pci_bus_id;
  d["handle_kind"] = m.handle_kind;
  d["handle_size"] = m.handle_size;
  d["same_node"] = m.same_node;
  d["p2p_reachable"] = m.p2p_reachable;
  d["native_atomics"] = m.native_atomics;
  d["rdma"] = m.rdma.has_value();
  return d;
}

std::shared_ptr<ClientHandle> Connect(const std::optional<std::string>& socket,
                                      const std::string& client_name, double call_timeout) {
  ClientOptions o;
  o.socket_path = socket.value_or("");
  o.client_name = client_name;
  if (call_timeout > 0) o.call_timeout = Seconds(call_timeout);
  absl::StatusOr<std::unique_ptr<Client>> c;
  {
    py::gil_scoped_release unlocked;
    c = Client::Connect(std::move(o));
  }
  std::shared_ptr<Client> owned = ValueOrThrow(std::move(c));
  Client* raw = owned.get();
  return std::make_shared<ClientHandle>(std::move(owned), raw);
}

// Runs `f` on the client with the GIL released.
template <class F>
auto Unlocked(const ClientHandle& h, F&& f) {
  ClientLease c = h.lease();
  py::gil_scoped_release unlocked;
  return f(*c);
}

}  // namespace

ClientLease ClientHandle::lease() const {
  if (client_ == nullptr) {
    ThrowError(absl::StatusCode::kFailedPrecondition, "this mooncake_client.Client is closed");
  }
  return ClientLease{owner_, client_};
}

void ClientHandle::close() {
  client_ = nullptr;
  std::shared_ptr<void> owner = std::move(owner_);
  // Disconnecting is a daemon round trip: no GIL held for it.
  py::gil_scoped_release unlocked;
  owner.reset();
}

py::dict GroupViewToDict(const GroupView& v) {
  py::dict d;
  d["group"] = v.group;
  d["rank"] = v.rank;
  d["world_size"] = v.world_size;
  d["epoch"] = v.epoch;
  py::list members;
  for (const GroupMember& m : v.members) members.append(MemberToDict(m));
  d["members"] = members;
  return d;
}

py::dict SessionEventToDict(const SessionEvent& e) {
  py::dict d;
  d["kind"] = SessionEventKindName(e.kind);
  d["group"] = e.group;
  d["rank"] = e.rank;
  d["pid"] = e.pid;
  d["detail"] = e.detail;
  d["epoch"] = e.epoch;
  d["member"] = e.member ? py::object(MemberToDict(*e.member)) : py::none();
  // The event itself, for Communicator.handle_event: a JOINED carries the
  // replacement's handle, fd ticket and RDMA endpoint, which the dict leaves out.
  d["native"] = py::cast(std::make_shared<SessionEvent>(e));
  return d;
}

void RegisterClient(py::module_& m) {
  py::class_<SessionEvent, std::shared_ptr<SessionEvent>>(
      m, "SessionEvent",
      "One membership event as the client library holds it (opaque; "
      "Communicator.handle_event takes it).");
  py::class_<ClientHandle, std::shared_ptr<ClientHandle>>(m, "Client",
                                                          "A session with mooncaked (low level; "
                                                          "use mooncake_client.Client).")
      .def_static("connect", &Connect, py::arg("socket") = py::none(), py::arg("client_name") = "",
                  py::arg("call_timeout") = 0.0,
                  "Connects and opens a session. socket None: $MOONCAKE_SOCKET or "
                  "/run/mooncake/mooncaked.sock. UNAVAILABLE when no daemon answers.")
      .def("close", &ClientHandle::close)
      .def_property_readonly("closed", &ClientHandle::closed)
      .def_property_readonly("socket_path",
                             [](const ClientHandle& h) { return h.lease()->socketPath(); })
      .def_property_readonly("instance_id",
                             [](const ClientHandle& h) { return h.lease()->instanceId(); })
      .def_property_readonly("session_id",
                             [](const ClientHandle& h) { return h.lease()->sessionId(); })
      .def_property_readonly("node_id", [](const ClientHandle& h) { return h.lease()->nodeId(); })
      .def_property_readonly("connected",
                             [](const ClientHandle& h) { return h.lease()->connected(); })
      .def("hello",
           [](const ClientHandle& h) {
             return HelloToDict(ValueOrThrow(Unlocked(h, [](Client& c) { return c.hello(); })));
           })
      .def("node_info",
           [](const ClientHandle& h) {
             return NodeInfoToDict(
                 ValueOrThrow(Unlocked(h, [](Client& c) { return c.nodeInfo(); })));
           })
      .def("rdma_info",
           [](const ClientHandle& h) {
             return RdmaInfoToDict(
                 ValueOrThrow(Unlocked(h, [](Client& c) { return c.rdmaInfo(); })));
           })
      .def(
          "join_group",
          [](const ClientHandle& h, const std::string& group, int64_t rank, int64_t world_size,
             double timeout) {
            // Range errors are the daemon's to report (INVALID_ARGUMENT), as
            // for any client; only what does not fit the wire type stops here.
            if (rank < 0 || rank > UINT32_MAX || world_size < 0 || world_size > UINT32_MAX) {
              ThrowError(absl::StatusCode::kInvalidArgument,
                         "join_group: rank " + std::to_string(rank) + " / world_size " +
                             std::to_string(world_size) + " do not fit 0..2^32-1");
            }
            JoinOptions j;
            j.group = group;
            j.rank = static_cast<uint32_t>(rank);
            j.world_size = static_cast<uint32_t>(world_size);
            j.timeout = Seconds(timeout);
            return GroupViewToDict(
                ValueOrThrow(Unlocked(h, [&](Client& c) { return c.joinGroup(j); })));
          },
          py::arg("group"), py::arg("rank"), py::arg("world_size"), py::arg("timeout") = 0.0,
          "Joins a group without a buffer (membership only) and blocks until every rank is "
          "in; timeout 0: the daemon's default (30 s).")
      .def(
          "leave_group",
          [](const ClientHandle& h, const std::string& group, uint32_t rank) {
            ThrowIfError(Unlocked(h, [&](Client& c) { return c.leaveGroup(group, rank); }));
          },
          py::arg("group"), py::arg("rank"))
      .def(
          "next_event",
          [](const ClientHandle& h, double timeout) -> py::object {
            std::optional<SessionEvent> ev =
                Unlocked(h, [&](Client& c) { return c.nextEvent(Seconds(timeout)); });
            if (!ev) return py::none();
            return SessionEventToDict(*ev);
          },
          py::arg("timeout"),
          "The next membership event as a dict, or None after `timeout` seconds.");
}

}  // namespace mooncake::python
