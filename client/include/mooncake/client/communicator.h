// mooncake::Communicator — one call from "I am rank r of n in group G" to a
// verified, ready CommCtx that kernels (or host threads) use with the
// Device API (mc_put_*, mc_signal, mc_red_add, mc_wait_until, ...).
//
//   mooncake::CommunicatorOptions o;
//   o.group = "ep0"; o.rank = r; o.world_size = n; o.buffer_bytes = 64 << 20;
//   auto comm = mooncake::Communicator::Create(o);          // blocks for the rendezvous
//   const mooncake::device::CommCtx& ctx = (*comm)->ctx();  // pass to kernels by value
//   void* buf = (*comm)->buffer();                          // this rank's symmetric buffer
//
// Create: connects to mooncaked, allocates the symmetric buffer (memfd on the
// host platform; cuMem VMM or cudaMalloc on CUDA, on the current device),
// joins the group through the daemon with the buffer's handle and fds (no
// files, no MPI), fetches every peer's fds by the view's tickets on one
// fd-channel connection, maps every peer, verifies each peer with its real
// rank, reports the result, and (by default) waits until every rank
// reported ready. Errors name the step that failed.
//
// Daemon round trips per rank for n ranks: Hello, OpenSession, one fd PUT,
// JoinGroup, about n/32 fd GET windows on one connection, ReportReady.
//
// Destruction leaves the group, unmaps the peers, frees the buffer and
// closes the session, in that order. Stop kernels that use ctx() first.
// Events about peers (LEFT/LOST) are available from client().nextEvent().
//
// Elastic groups: a group survives the loss of a rank. Pass every event
// from client().nextEvent() to handleEvent():
//   LOST/LEFT of rank r  r is marked unavailable in ctx()'s tables (P2P
//                        and RDMA: a kernel gets kNoRoute for it), this
//                        rank's queue pairs toward r are replaced by fresh
//                        ones, and the daemon is told r is released here.
//   JOINED of rank r     a replacement process took rank r (epoch + 1):
//                        its buffer is mapped and verified, the fresh queue
//                        pairs connected to its own, and readiness reported
//                        again. Peers other than r are never touched.
// A replacement is an ordinary Create() with the same group, rank and world
// size: it completes once every survivor released the rank. Kernels that
// wait on a lost rank should wait with mc_wait_until_for and come back to
// the host, which then calls handleEvent. Node-local groups only (a
// daemon with cluster_etcd refuses the re-join, saying so).
// Thread-safety: none beyond the Client's; use from one thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "mooncake/client/client.h"
#include "mooncake/client/daemon_rdma_transport.h"
#include "mooncake/common/export.h"
#include "mooncake/device/contexts_device.h"
#include "mooncake/device/device_transport.h"

namespace mooncake {

enum class Platform { kHost, kCuda };
// "host" / "cuda" -> Platform; InvalidArgument otherwise.
MOONCAKE_API absl::StatusOr<Platform> ParsePlatform(const std::string& name);

// How buffer handles travel (see device_transport.h). kJoin is the product
// route; kExportImport is the upstream exportIpcHandle/importPeerHandles
// adapter (2 RPCs + 2 fd round trips more per peer), kept selectable so
// tests and benchmarks exercise and compare it.
enum class HandleRoute { kJoin, kExportImport };

// How peers are reached (the route of each peer ends up in the CommCtx
// tables: P2P where available[dst] is set, RDMA where a QP exists).
//   kAuto  load/store to every peer the daemon says this rank reaches
//          directly; RDMA to the ranks in rdma_peers.
//   kP2p   load/store only (rdma_peers must be empty).
//   kRdma  RDMA to every other rank, even reachable ones (tests, softnic
//          benchmarks, and what a multi-node group does between nodes).
// An RDMA pair needs both ranks to choose it (each creates its QPs toward
// the other before the join).
enum class Route { kAuto, kP2p, kRdma };
// "auto" / "p2p" / "rdma" -> Route; InvalidArgument otherwise.
MOONCAKE_API absl::StatusOr<Route> ParseRoute(const std::string& name);

// Where mc_red_add runs (docs/rdma.md "Atomics across routes"). A NIC
// atomic is atomic only against atomics through the same HCA, not against
// SM/CPU/NVLink atomics on the word, so a counter that RDMA peers and P2P
// peers (or its owner) both add to can lose updates unless one route does
// them all.
//   kNic     every mc_red_add to rank d's buffer is executed by d's NIC,
//            from every rank: this rank gets queue pairs toward every rank,
//            P2P peers and itself (a loopback) included; puts still go
//            over P2P where they can.
//   kDevice  adds to self and P2P peers are SM/CPU atomics, to RDMA peers
//            NIC atomics: only for groups where no word takes adds from
//            both kinds of route.
//   kAuto    kNic when this rank has RDMA peers, else kDevice.
// Every rank of a group must end up with the same choice: Create fails on
// every rank, naming the ranks on each side, when they differ.
enum class AtomicsRoute { kAuto, kDevice, kNic };
// "auto" / "device" / "nic" -> AtomicsRoute; InvalidArgument otherwise.
MOONCAKE_API absl::StatusOr<AtomicsRoute> ParseAtomicsRoute(const std::string& name);

struct CommunicatorOptions {
  std::string socket_path;  // "" = $MOONCAKE_SOCKET or default
  std::string group;
  uint32_t rank = 0;
  uint32_t world_size = 0;
  size_t buffer_bytes = 1 << 20;  // symmetric: the same on every rank
  Platform platform = Platform::kHost;
  device::CudaHandleKind cuda_handle = device::CudaHandleKind::kAuto;
  std::string gpu_uuid;                        // CUDA: "GPU-..."; empty = the current device
  absl::Duration timeout = absl::Seconds(30);  // rendezvous and ready wait
  bool wait_all_ready = true;
  std::string client_name;  // for mcctl sessions
  HandleRoute handle_route = HandleRoute::kJoin;
  Route route = Route::kAuto;
  std::vector<uint32_t> rdma_peers;  // kAuto: these peers go over RDMA
  AtomicsRoute atomics_route = AtomicsRoute::kAuto;
  uint32_t qps_per_peer = 1;     // RDMA channels per peer
  uint32_t rdma_sq_depth = 256;  // WQEs per QP
  uint32_t rdma_cqe_every = 16;  // a completion per this many WQEs (DaemonRdmaOptions)
  // softnic: this process's copy agent moves the bytes of its GPU buffer
  // (DaemonRdmaOptions::copy_agent, on by default); off: the daemon's
  // context does, milliseconds per WQE while a kernel spins.
  bool rdma_copy_agent = true;
  // NICs this rank's QPs may go on (upstream's createIbgdaDeviceTransport
  // filter: "mlx5_0", "softnic0"); empty = any the daemon serves, the one
  // closest to the rank's GPU first. Overrides the daemon's choice for
  // this rank only.
  std::vector<std::string> rdma_nics;
  // Where the QPs' rings live (DaemonRdmaOptions::ring_memory): GPU memory
  // when kernels ring the NIC themselves, host memory otherwise (kAuto).
  DaemonRdmaOptions::RingMemory rdma_ring_memory = DaemonRdmaOptions::RingMemory::kAuto;
  // CUDA over mlx5: kernels ring the NIC themselves when the daemon hands
  // the doorbell over (DaemonRdmaOptions::gpu_doorbells); false: the
  // daemon rings for them.
  bool rdma_gpu_doorbells = true;
};

class MOONCAKE_API Communicator {
 public:
  static absl::StatusOr<std::unique_ptr<Communicator>> Create(CommunicatorOptions options);
  ~Communicator();

  const device::CommCtx& ctx() const { return ctx_; }
  void* buffer() const { return buffer_; }
  size_t bufferBytes() const { return options_.buffer_bytes; }
  int rank() const { return static_cast<int>(options_.rank); }
  int worldSize() const { return static_cast<int>(options_.world_size); }
  const GroupView& view() const { return view_; }
  std::string handleKind() const;
  // Wall time Create took (connect to ready).
  absl::Duration setupTime() const { return setup_time_; }
  Client& client() { return *client_; }
  device::BrokeredP2pTransport& transport() { return *transport_; }
  // Null when no peer is reached over RDMA.
  DaemonRdmaTransport* rdmaTransport() { return rdma_.get(); }
  // Whether rank r is reached over RDMA.
  bool rdmaPeer(int r) const {
    return r >= 0 && static_cast<size_t>(r) < rdma_mask_.size() && rdma_mask_[r] != 0;
  }
  // Whether every mc_red_add goes through the target's NIC (AtomicsRoute).
  bool nicAtomics() const { return nic_atomics_; }

  // Leaves the group now (the destructor does it otherwise). Idempotent.
  absl::Status leave();

  // Elastic groups (see above). Events of other groups and other kinds are
  // ignored (OK). Errors name the peer and the step.
  absl::Status handleEvent(const SessionEvent& event);
  // Whether rank r is part of the group now (false between its LOST/LEFT
  // and its replacement's JOINED). Self is active.
  bool peerActive(int r) const {
    return r >= 0 && static_cast<size_t>(r) < active_.size() && active_[r] != 0;
  }
  // The group's epoch as this rank knows it: 1 at formation, + 1 for each
  // re-formation seen (a replacement starts at the epoch it joined).
  uint64_t epoch() const { return view_.epoch; }

 private:
  explicit Communicator(CommunicatorOptions options) : options_(std::move(options)) {}
  absl::Status Setup();
  absl::StatusOr<JoinOptions> BaseJoin() const;
  std::vector<int> ActiveMask(const GroupView& view) const;
  static std::vector<int32_t> HandleWords(const GroupMember& m);
  absl::StatusOr<GroupView> JoinWithFds();
  absl::StatusOr<GroupView> JoinWithExport();
  absl::Status PrepareRdma();
  absl::Status ConnectRdma(const GroupView& view);
  // After the join: every rank made the same atomics choice.
  absl::Status CheckAtomicsRoute(const GroupView& view) const;
  // Whether `m` published a queue pair toward itself (NIC atomics).
  static bool PublishesLoopback(const GroupMember& m);
  // Whether this rank has queue pairs toward rank r (RDMA peers, and with
  // NIC atomics every rank).
  bool qpPeer(uint32_t r) const { return r < qp_mask_.size() && qp_mask_[r] != 0; }
  absl::Status ReleasePeer(uint32_t r);
  absl::Status AdmitPeer(const SessionEvent& joined);

  CommunicatorOptions options_;
  std::unique_ptr<Client> client_;
  std::shared_ptr<device::HandleExchange> exchange_;
  std::unique_ptr<device::BrokeredP2pTransport> transport_;
  std::unique_ptr<DaemonRdmaTransport> rdma_;
  std::vector<int> rdma_mask_;  // [world_size]: 1 = RDMA peer
  std::vector<int> qp_mask_;    // [world_size]: 1 = this rank has QPs toward it
  bool nic_atomics_ = false;
  std::vector<int> active_;  // [world_size]: 1 = in the group now
  void* buffer_ = nullptr;
  GroupView view_;
  device::CommCtx ctx_{};
  bool joined_ = false;
  absl::Duration setup_time_;
};

}  // namespace mooncake
