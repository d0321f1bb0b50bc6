// mooncake::Client — a process's connection to its node's mooncaked.
//
//   absl::StatusOr<std::unique_ptr<mooncake::Client>> c = mooncake::Client::Connect();
//   if (!c.ok()) { /* "cannot reach mooncaked at ...: is the service running?" */ }
//   mooncake::JoinOptions join{.group = "ep0", .rank = 1, .world_size = 2};
//   absl::StatusOr<mooncake::GroupView> view = (*c)->joinGroup(join);
//
// A Client owns one connection and one session on it. The daemon knows the
// caller's uid/gid/pid from the socket (SO_PEERCRED), never from messages.
// Everything the session owns (group ranks, exported fds, tickets) is
// released by the daemon when the Client is destroyed or the process dies;
// the other members of its groups then receive a LOST event.
//
// Socket path: ClientOptions::socket_path, else $MOONCAKE_SOCKET, else
// /run/mooncake/mooncaked.sock. File descriptors travel on the side socket
// "<socket>.fd" (SCM_RIGHTS) by ticket.
//
// Failure model: every call has a deadline and fails fast with Unavailable
// when the daemon is down. If the daemon restarted, the next call notices
// the new instance id, reconnects with a fresh session and fails ONCE with
// FailedPrecondition naming both instance ids (the old session's groups and
// fds are gone: rejoin); later calls work on the new session.
//
// Thread-safety: all methods may be called from several threads.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "mooncake/common/export.h"
#include "mooncake/common/unique_fd.h"

namespace mooncake {

struct ClientOptions {
  std::string socket_path;  // "" = $MOONCAKE_SOCKET or default
  std::string client_name;  // shown by `mcctl sessions`; at most 256 bytes
  absl::Duration call_timeout = absl::Seconds(10);
};

struct GpuInfo {
  int index = -1;
  std::string name;
  std::string uuid;        // "GPU-..."
  std::string pci_bus_id;  // "0000:1b:00.0"
  int numa_node = -1;
  uint64_t total_memory_bytes = 0;
};

struct NodeInfo {
  std::string node_id;
  std::string hostname;
  std::string instance_id;
  std::vector<GpuInfo> gpus;
  std::vector<std::string> nics;
  std::string gpu_note;  // why there are no GPUs, when there are none
  std::string nic_note;
};

// What a member publishes for RDMA peers (see RdmaEndpoint in local.proto):
// its buffer's registered address and rkey, and its QP toward each (peer,
// channel): qpns[peer * qps_per_peer + channel], 0 = none.
struct RdmaEndpointInfo {
  uint64_t raddr = 0;
  uint32_t rkey = 0;
  uint32_t qps_per_peer = 0;
  std::vector<uint32_t> qpns;
  std::string nic;
  // The member's node when it is another one ("" = this node): its QPs are
  // reached through that node's daemon.
  std::string node;
};

struct JoinOptions {
  std::string group;
  uint32_t rank = 0;
  uint32_t world_size = 0;
  absl::Duration timeout = absl::ZeroDuration();  // zero = daemon default (30 s)
  std::string handle_kind;                        // e.g. "memfd", "cuda-ipc"
  std::string handle_data;                        // opaque bytes, <= 4 KiB
  uint64_t handle_size = 0;
  std::vector<int> fds;  // borrowed; sent on the fd channel
  std::string gpu_uuid;  // empty: host platform
  std::string gpu_pci_bus_id;
  std::optional<RdmaEndpointInfo> rdma;  // unset: no RDMA route to this rank
  // The group secret every rank shares (16..256 bytes), so that only ranks
  // that know it join across nodes (the same uid on another node is not the
  // same person). Empty: $MC_GROUP_SECRET when set, else none.
  std::string group_secret;
};

struct GroupMember {
  uint32_t rank = 0;
  std::string node_id;
  int pid = 0;
  int gpu_index = -1;
  std::string gpu_uuid;
  std::string gpu_pci_bus_id;
  std::string handle_kind;
  std::string handle_data;
  uint64_t handle_size = 0;
  std::string fd_ticket;  // fetchFds() this once for the member's fds
  uint32_t fd_count = 0;
  bool same_node = false;
  bool p2p_reachable = false;
  bool native_atomics = false;
  std::optional<RdmaEndpointInfo> rdma;  // as the member published it
};

// The node's RDMA provider as the daemon reports it (rdma.proto RdmaInfo).
struct RdmaNodeInfo {
  std::string provider;       // "softnic", later "mlx5"
  std::string nic;            // e.g. "softnic0"
  std::string doorbell_mode;  // "doorbell-record", "gpu-uar", "cpu-assisted"
  bool is_roce = false;
  uint32_t gid_index = 0;
  uint32_t max_qps_per_session = 0;
  uint32_t max_sq_wqes = 0;
};

struct RdmaKeys {
  uint32_t lkey = 0;
  uint32_t rkey = 0;
};

// Where one QP's rings sit in the control memory (byte offsets; counts are
// powers of two).
struct RdmaQpLayout {
  uint64_t sq_offset = 0;
  uint32_t sq_wqe_cnt = 0;
  uint64_t sq_dbrec_offset = 0;
  uint64_t cq_offset = 0;
  uint32_t cq_cqe_cnt = 0;
  uint64_t cq_dbrec_offset = 0;
};

// The doorbell hand-off (rdma.proto GetDoorbellAccess; mlx5 only): the
// session's own verbs command fd and where its UAR doorbell register is.
// Mapping `uar_page_bytes` of the fd at `uar_mmap_offset` gives the page;
// the register is at `uar_reg_offset` in it. The mapping (not the fd) keeps
// the context alive, with every QP and region in it, until it is unmapped,
// even after the daemon is gone: unmap it when the session ends.
struct DoorbellAccess {
  UniqueFd command_fd;
  std::string device;  // "mlx5_0"
  int64_t uar_mmap_offset = 0;
  uint64_t uar_reg_offset = 0;
  uint64_t uar_page_bytes = 0;
  bool uar_non_cached = false;
};

struct GroupView {
  std::string group;
  uint32_t rank = 0;
  uint32_t world_size = 0;
  uint64_t epoch = 0;
  std::vector<GroupMember> members;  // indexed by rank
};

struct SessionEvent {
  enum class Kind { kJoined, kLeft, kLost, kReady, kFailed, kDaemonShutdown, kDisconnected };
  Kind kind = Kind::kDisconnected;
  std::string group;
  uint32_t rank = 0;
  int pid = 0;
  std::string detail;
  // kJoined (elastic groups): the replacement's entry, as this member's
  // view would hold it (handle, fd ticket, RDMA endpoint), and the group's
  // new epoch. Communicator::handleEvent connects it.
  std::optional<GroupMember> member;
  uint64_t epoch = 0;
};
MOONCAKE_API const char* SessionEventKindName(SessionEvent::Kind kind);

struct HelloInfo {
  uint32_t protocol_version = 0;
  std::string daemon_version;
  std::string instance_id;
  std::string node_id;
  uint32_t uid = 0;
  uint32_t gid = 0;
  int pid = 0;
};

struct FdExport {
  uint64_t id = 0;
  std::string secret;  // 16 bytes; whoever holds it (same uid) may import
};

class MOONCAKE_API Client {
 public:
  // Connects, checks the protocol version and opens a session. Unavailable
  // with an actionable message when no daemon answers on the socket;
  // PermissionDenied naming the socket's mode and group, and how to be let
  // in, when this user may not connect; InvalidArgument for a client_name
  // over 256 bytes.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(ClientOptions options = {});
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  const std::string& socketPath() const;
  std::string instanceId() const;
  uint64_t sessionId() const;
  // The daemon's node id (from Hello); "" before a connection.
  std::string nodeId() const;
  // False after the daemon went away (until a call reconnects).
  bool connected() const;

  absl::StatusOr<HelloInfo> hello();
  absl::StatusOr<NodeInfo> nodeInfo();

  // Joins and blocks until all ranks are in (or the deadline passes:
  // DeadlineExceeded naming the missing ranks).
  absl::StatusOr<GroupView> joinGroup(const JoinOptions& options);
  absl::Status leaveGroup(const std::string& group, uint32_t rank);
  absl::Status reportReady(const std::string& group, uint32_t rank, bool ok,
                           const std::string& detail = "",
                           const std::vector<uint32_t>& unreachable = {});
  // Elastic groups: this member's `rank` dropped `released_rank` (reported
  // LOST or LEFT) and is ready for its replacement; `rdma`, when set, is
  // this member's new endpoint (fresh queue pairs toward that rank).
  // FailedPrecondition when the rank is not vacant.
  absl::Status releaseRank(const std::string& group, uint32_t rank, uint32_t released_rank,
                           const std::optional<RdmaEndpointInfo>& rdma = std::nullopt);

  // fd channel: send fds (borrowed) for a ticket an RPC can name; fetch the
  // fds a ticket from the daemon stands for (new fds, owned by the caller).
  absl::StatusOr<std::string> sendFds(const std::vector<int>& fds);
  absl::StatusOr<std::vector<UniqueFd>> fetchFds(const std::string& ticket);
  // Fetches several tickets' fds on one fd-channel connection (the view of
  // a group names one ticket per peer); result[i] belongs to tickets[i].
  // Fails as a whole at the first ticket the daemon refuses.
  absl::StatusOr<std::vector<std::vector<UniqueFd>>> fetchFds(
      const std::vector<std::string>& tickets);

  // Publishes fds for other processes of this uid for the session's lifetime.
  absl::StatusOr<FdExport> exportFds(const std::vector<int>& fds, const std::string& kind,
                                     uint64_t size);
  absl::StatusOr<std::vector<UniqueFd>> importFds(const FdExport& exported);

  // RDMA (rdma.proto). Everything created here belongs to this session and
  // is destroyed by the daemon when the session ends.
  absl::StatusOr<RdmaNodeInfo> rdmaInfo();
  // Registers [offset, offset + length) of `fd` (borrowed) at address
  // `iova`. kind "memfd": a memfd sealed with F_SEAL_SHRINK; "cuda-vmm-fd":
  // the POSIX fd of a cuMem allocation (GPU memory).
  absl::StatusOr<RdmaKeys> registerMemory(int fd, uint64_t iova, uint64_t length, uint64_t offset,
                                          bool remote_write, bool remote_atomic,
                                          const std::string& kind = "memfd",
                                          uint64_t allocation_bytes = 0);
  absl::Status deregisterMemory(uint32_t lkey);
  // Creates one QP per layout with rings in `control_fd` (borrowed):
  // `control_kind` "memfd", a sealed memfd of `control_bytes`, or "dmabuf",
  // the dmabuf of GPU memory holding them (rdma.proto control_kind).
  // Returns the QP numbers in layout order.
  absl::StatusOr<std::vector<uint32_t>> createQueuePairs(int control_fd, uint64_t control_bytes,
                                                         const std::vector<RdmaQpLayout>& layouts,
                                                         const std::string& control_kind = "memfd");
  // Connects (my qpn, remote qpn) pairs, on this node or (remote_nodes) on
  // other nodes of the cluster.
  // `remote_nodes`, when given, names each pair's remote node ("" = this
  // node), in the order of `pairs`.
  absl::Status connectQueuePairs(const std::vector<std::pair<uint32_t, uint32_t>>& pairs,
                                 const std::vector<std::string>& remote_nodes = {});
  absl::Status destroyQueuePairs(const std::vector<uint32_t>& qpns);
  // Which NIC this session's QPs and regions go on: the closest to GPU
  // `gpu_pci_bus_id` (empty: none) among `allowed` (empty: any). Before any
  // registerMemory or createQueuePairs. Returns the NIC and why.
  absl::StatusOr<std::pair<std::string, std::string>> selectNic(
      const std::vector<std::string>& allowed, const std::string& gpu_pci_bus_id);
  // The doorbell hand-off, before any registerMemory or createQueuePairs
  // (FailedPrecondition after; also from a provider without a UAR, such as
  // softnic). Once per session. From then on the daemon does not ring this
  // session's doorbells: its kernels write the UAR. If they cannot (the GPU
  // refused to map it), releaseDoorbellAccess() hands the ringing back to
  // the daemon (CPU-assisted); unmap the page first.
  absl::StatusOr<DoorbellAccess> doorbellAccess();
  absl::Status releaseDoorbellAccess();
  // softnic: this process's copy agent (rdma.proto AttachCopyAgent): the
  // channel memfd (borrowed) of copy_agent::kHeaderBytes + staging_bytes.
  // Made and run by DaemonRdmaTransport (client/src/copy_agent.h).
  absl::Status attachCopyAgent(int channel_fd, uint64_t staging_bytes);

  // Next membership event (LEFT/LOST/READY/...), or nullopt on timeout.
  std::optional<SessionEvent> nextEvent(absl::Duration timeout);

  // Daemon loss: `handler` runs each time a session ends because the daemon
  // went away (it shut down, crashed, or the connection broke), with the
  // reason, on the Client's session thread, before the kDaemonShutdown /
  // kDisconnected event is queued: whoever sees that event from nextEvent()
  // knows every handler has returned. Never run for this Client's own
  // teardown. For releasing what holds the daemon's objects alive
  // (DaemonRdmaTransport drops its UAR mapping and fails its queue pairs
  // here). A handler must be short and must not call this Client (a
  // reconnect waits for the thread it runs on). Returns the id that
  // removeDaemonLossHandler takes.
  //   uint64_t id = client->addDaemonLossHandler([](const std::string& why) { ... });
  //   ...
  //   client->removeDaemonLossHandler(id);  // before what the handler uses goes
  uint64_t addDaemonLossHandler(std::function<void(const std::string& why)> handler);
  // Unregisters; if the handler is running, waits until it returns (so not
  // from inside a handler). Unknown ids are ignored.
  void removeDaemonLossHandler(uint64_t id);

  class Impl;

 private:
  explicit Client(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace mooncake
