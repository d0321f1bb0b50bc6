// DaemonRdmaTransport: the Device API's RdmaTransport over mooncaked. The
// application holds no verbs context and needs no privileges: it allocates
// the control memory (send queues, CQs, doorbell records) as a sealed memfd
// it maps itself, and the daemon registers memory and creates, connects and
// destroys the QPs on it (softnic today; the mlx5 DevX provider behind the
// same RPCs). Kernels then post WQEs and poll CQEs in that memory through
// the IbgdaContext this transport fills (comm_device.h, mlx5/qp_ops.h).
//
// Typical use (mooncake::Communicator does all of it in Create):
//   auto t = DaemonRdmaTransport::Create(&client);
//   t->initialize("", n, n * qps_per_peer);
//   t->registerMemoryFd(buf, bytes, memfd, 0);       // host platform
//   t->allocateControlBuffer();
//   t->createQueuePairsFor(peer_mask);                // QPs toward these peers
//   ... publish endpoint() with the group join; get the peers' endpoints ...
//   t->connectEndpoints(rank, peer_endpoints);        // RESET -> RTS
//   ctx.ibgda = t->ibgdaContext();
//
// Platforms (DaemonRdmaOptions::cuda):
//   host  CPU threads post; every table is host memory.
//   CUDA  kernels post. The control memory is the same sealed memfd, pinned
//         and mapped for the GPU (cuMemHostRegister), so softnic reads the
//         WQEs the GPU writes; or, when kernels ring the NIC themselves
//         ("gpu-uar"), GPU memory the NIC reaches through its dmabuf
//         (DaemonRdmaOptions::ring_memory, docs/rdma.md). The QP contexts
//         (whose posting counters the GPU updates with atomics) and the
//         raddr/rkey tables are device memory; the data buffer is
//         registered from its cuMem VMM fd (registerMemoryFd with kind
//         "cuda-vmm-fd"). Works in the CUDA context current at Create.
// When the daemon goes away (Client::addDaemonLossHandler: before the
// client's kDaemonShutdown / kDisconnected event is queued) the QPs' objects
// go with it, and the transport makes that visible and final: every live QP
// gets one WR_FLUSH_ERR completion (so mc_quiet returns kRdmaError and later
// posts fail at once instead of waiting timeout_ns), and in "gpu-uar" mode
// the UAR page is detached from the daemon's command fd, so the kernel frees
// the daemon's verbs context (QPs, CQs, MRs) instead of keeping it alive for
// this process. The GPU's registration of the page stays until the transport
// is destroyed (a kernel still ringing must not fault): stop the kernels and
// destroy the transport (the Communicator) on that event.
// Upstream methods return 0 on success and keep the reason of a failure in
// lastError(). Not thread-safe (setup happens on one thread); the device
// side is safe from any number of threads.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "mooncake/client/client.h"
#include "mooncake/common/export.h"
#include "mooncake/device/contexts_device.h"
#include "mooncake/device/device_transport.h"

namespace mooncake {

struct DaemonRdmaOptions {
  uint32_t sq_depth = 256;  // WQEs per QP (power of two); CQs get as many CQEs
  // How long a kernel waits for ring space or completions before the QP is
  // declared stalled (kTimedOut). Zero: forever.
  uint64_t timeout_ns = 10'000'000'000ull;
  bool cuda = false;  // kernels post (see the header comment)
  // NICs this rank may use (upstream's createIbgdaDeviceTransport filter);
  // empty = any the daemon serves. initialize() picks the one closest to
  // the current CUDA device (CUDA) among them; a device_name given to
  // initialize() narrows it to that one.
  std::vector<std::string> nics;
  // Where the QPs' rings (send queues, CQs, doorbell records) live, CUDA:
  //   kAuto  GPU memory when the kernels ring the NIC themselves ("gpu-uar"
  //          doorbells, mlx5), else host memory; if the daemon, the NIC or
  //          the driver refuses GPU memory, host memory (logged once, why).
  //   kHost  host memory: a sealed memfd, pinned and mapped for the GPU.
  //   kGpu   GPU memory, or a setup error saying why not.
  // The host platform always uses host memory (kGpu: InvalidArgument).
  enum class RingMemory { kAuto, kHost, kGpu };
  RingMemory ring_memory = RingMemory::kAuto;
  // A WQE asks for a completion every cqe_every WQEs (a power of two;
  // more than sq_depth / 2 counts as sq_depth / 2; 1: every WQE). Fewer
  // CQEs for the NIC to write across PCIe and for kernels to poll;
  // mc_quiet asks for one more when it needs it (mlx5/qp_ops.h).
  uint32_t cqe_every = 16;
  // CUDA on softnic: run a copy agent in this process (client/src/
  // copy_agent.h), so that softnic's copies into and out of this process's
  // GPU memory run on a stream of its own context, beside its kernels,
  // instead of in the daemon's context, where each waits for a GPU time
  // slice while a kernel spins (milliseconds). One thread of this process,
  // asleep when idle, and a pinned staging area of 4 MiB. Off: the daemon
  // copies. A NIC moves the bytes itself: no agent whatever this says.
  // On by default: on the H200 a WRITE + mc_quiet with a spinning kernel
  // takes 44 us with the agent and 2390 us without it, and its copies into
  // GPU memory are called off at the gate when they stall, so none lands
  // late (docs/rdma.md, "the copy agent";
  // bench/results/2026-12-05-h200-quiet-sweep.md). The environment
  // variable MOONCAKE_COPY_AGENT=0 (or 1) overrides this field.
  bool copy_agent = true;
  // CUDA over mlx5: ask the daemon for the doorbell hand-off, so this
  // process's kernels ring the NIC themselves ("gpu-uar"). False: the
  // daemon's thread rings for them ("cpu-assisted"), as after a refused
  // hand-off; `mcctl selftest rdma --gpu` runs both where the node offers
  // both.
  bool gpu_doorbells = true;
};

struct GpuControlMemory;  // client/src/gpu_rings.h
class CopyAgent;          // client/src/copy_agent.h

class MOONCAKE_API DaemonRdmaTransport final : public device::RdmaTransport {
 public:
  // `client` must outlive the transport. FailedPrecondition when the daemon
  // serves no RDMA.
  static absl::StatusOr<std::unique_ptr<DaemonRdmaTransport>> Create(
      Client* client, DaemonRdmaOptions options = {});
  ~DaemonRdmaTransport() override;

  // ---- upstream interface ----
  // num_qps is the total: num_ranks * qps_per_peer, with 1 to
  // kMaxQpsPerPeer per peer (upstream's EP asks for MAX_QP_COUNT / n * n).
  static constexpr int kMaxQpsPerPeer = 256;
  int initialize(const std::string& device_name, int num_ranks, int num_qps) override;
  // Host platform memory has no address-to-fd mapping: use registerMemoryFd.
  int registerMemory(void* ptr, size_t bytes) override;
  int allocateControlBuffer() override;
  // QPs toward every other rank.
  int createQueuePairs(void* stream) override;
  int recreateQueuePairs(void* stream) override;
  // remote_qpns[peer * qps_per_peer + c] is the peer's QP toward this rank.
  int connectPeers(int local_rank, bool is_roce, const std::vector<int64_t>& remote_addrs,
                   const std::vector<int32_t>& remote_keys, const std::vector<int32_t>& remote_qpns,
                   const std::vector<int32_t>& remote_lids,
                   const std::vector<int64_t>& subnet_prefixes,
                   const std::vector<int64_t>& interface_ids,
                   const std::vector<int>& active_ranks_mask) override;
  device::RdmaLocalMetadata localMetadata() const override;
  void* raddrsPtr() override;
  void* rkeysPtr() override;
  void* qpDevCtxsPtr() override;
  // The link of this rank's NIC once initialize() chose it (before: the
  // node's default NIC); softnic: false and 0.
  bool isRoce() const override { return info_.is_roce; }
  int gidIndex() const override { return static_cast<int>(info_.gid_index); }

  // ---- (not upstream) ----
  // kind: "memfd" (host) or "cuda-vmm-fd" (GPU memory, the cuMem POSIX fd).
  // allocation_bytes: the whole allocation's size when the fd names more
  // than [offset, offset + bytes) (CUDA maps imported allocations whole).
  absl::Status registerMemoryFd(void* ptr, size_t bytes, int fd, uint64_t offset,
                                const std::string& kind = "memfd", uint64_t allocation_bytes = 0);
  // QPs toward the ranks whose mask entry is nonzero; this rank's own entry
  // set makes a loopback QP (NIC atomics, Communicator's atomics_route).
  absl::Status createQueuePairsFor(const std::vector<int>& peer_mask);
  // What this rank publishes with its group join.
  RdmaEndpointInfo endpoint() const;
  // Connects to each peer in the mask from its published endpoint and
  // fills raddrs/rkeys (this rank in the mask: its loopback QP is connected
  // to itself). FailedPrecondition naming the peer when it published
  // no QP toward this rank (both sides must choose the RDMA route).
  absl::Status connectEndpoints(int local_rank,
                                const std::vector<std::optional<RdmaEndpointInfo>>& peers,
                                const std::vector<int>& peer_mask);
  // Elastic groups: rank `peer` was lost. Destroys this rank's queue pairs
  // toward it and creates fresh ones in the same slots, unconnected and
  // hidden from the context (a kernel finds no route to `peer`: kNoRoute);
  // endpoint() publishes their numbers. Queue pairs toward other peers are
  // not touched. Stop posting to `peer` first.
  absl::Status replaceQueuePairsToward(int peer);
  // Elastic groups: connects the queue pairs replaceQueuePairsToward made
  // to the replacement's endpoint `e` and shows them to the context again.
  absl::Status connectReplacement(int local_rank, int peer, const RdmaEndpointInfo& e);
  device::IbgdaContext ibgdaContext() const;
  const RdmaNodeInfo& nodeInfo() const { return info_; }
  // The NIC this rank's QPs are on (after initialize), and why.
  const std::string& nic() const { return nic_; }
  const std::string& nicReason() const { return nic_reason_; }
  // How this transport's doorbells reach the NIC: the provider's mode, or
  // "gpu-uar" once the kernels ring a UAR page the GPU mapped (CUDA on a
  // mlx5 provider whose GPU accepts the mapping; see gpu_doorbell.h).
  const std::string& doorbellMode() const { return doorbell_mode_; }
  // Whether softnic's copies for this process's GPU memory run on its own
  // copy agent (DaemonRdmaOptions::copy_agent), once a GPU buffer is
  // registered.
  bool copyAgentRunning() const { return copy_agent_ != nullptr; }
  // Where the rings are once allocateControlBuffer ran: "gpu" or "host".
  const char* ringMemory() const { return gpu_control_ ? "gpu" : "host"; }
  int qpsPerPeer() const { return qps_per_peer_; }
  absl::Status lastError() const { return last_error_; }

 private:
  DaemonRdmaTransport(Client* client, DaemonRdmaOptions options, RdmaNodeInfo info);
  int Fail(absl::Status s);
  void ReleaseQueues();
  // CUDA: copies the QP contexts of `slots` to the device (all of them when
  // the device copy is first made). Only those: the device copy also holds
  // each QP's posting state (resv_head, ready_head, cons_tail, error), which
  // kernels advance there and the host copy never sees; copying a live QP's
  // host entry over it would rewind the QP (its later WQEs go unexecuted).
  absl::Status PublishQps(const std::vector<size_t>& slots);
  // CUDA: copies the raddr and rkey tables to the device.
  absl::Status PublishTables();
  // CUDA over mlx5: the doorbell hand-off; on refusal, logs once why and
  // leaves the daemon ringing (CPU-assisted).
  void SetUpGpuDoorbells();
  // CUDA on softnic: starts the copy agent and attaches it to the session;
  // on refusal, logs once why and leaves the copies to the daemon.
  void StartCopyAgent();
  void ReleaseGpuDoorbells();
  // The control memory: in GPU memory when the options and the doorbell
  // mode allow (AllocateGpuControl), else the host memfd
  // (AllocateHostControl); each registers it as the scratch MR.
  absl::Status AllocateControl(bool in_gpu_memory);
  absl::Status AllocateGpuControl();
  absl::Status AllocateHostControl();
  bool WantGpuRings() const;
  // The rings of `slot` start clean (host: memset; GPU: through the driver).
  absl::Status ClearRings(size_t slot);
  // kAuto: the first CreateQueuePairs on GPU rings was refused; logs why
  // once and moves the control memory to host memory.
  absl::Status FallBackToHostRings(const absl::Status& why);
  // On the client's session thread when the daemon went away (see above).
  void OnDaemonLoss(const std::string& why);

  Client* const client_;
  const DaemonRdmaOptions options_;
  uint64_t loss_handler_ = 0;  // Client::addDaemonLossHandler id
  // Held by OnDaemonLoss and wherever setup changes what it reads: the
  // control memory, qpns_ and the UAR mapping.
  std::mutex loss_mu_;
  RdmaNodeInfo info_;  // nic and link refreshed by initialize()
  absl::Status last_error_;
  int num_ranks_ = 0;
  int qps_per_peer_ = 0;
  void* buffer_ = nullptr;
  size_t buffer_bytes_ = 0;
  RdmaKeys buffer_keys_{};
  bool buffer_registered_ = false;
  // Control memory: one sealed memfd mapped here; per QP slot: SQ, CQ, then
  // 64 bytes of doorbell records and the atomic fetch scratch.
  int control_fd_ = -1;
  uint8_t* control_ = nullptr;
  uint64_t control_bytes_ = 0;
  RdmaKeys control_keys_{};
  device::IbgdaQpDevCtx* qps_ = nullptr;  // [num_ranks * qps_per_peer], 64-byte aligned
  std::vector<uint32_t> qpns_;            // same indexing; 0 = none
  std::vector<uint64_t> raddrs_;
  std::vector<uint32_t> rkeys_;
  // CUDA only: the driver, the control memory as the GPU addresses it, and
  // device copies of the tables (0 when not allocated).
  std::shared_ptr<void> cuda_;  // drivers::CudaDriver, kept opaque here
  uint64_t control_dev_ = 0;
  // Rings in GPU memory (then control_ is null and control_fd_ -1).
  std::unique_ptr<GpuControlMemory> gpu_control_;
  // A queue pair was created on the control memory since it was allocated
  // (from then on it is not swapped for the host form).
  bool any_queue_pair_ = false;
  uint64_t qps_dev_ = 0, raddrs_dev_ = 0, rkeys_dev_ = 0;
  // "gpu-uar": the UAR page as mapped here and its register as the GPU
  // addresses it (0: the daemon rings).
  std::string doorbell_mode_;
  std::string nic_, nic_reason_;
  bool doorbell_tried_ = false;
  bool copy_agent_tried_ = false;
  std::unique_ptr<CopyAgent> copy_agent_;
  void* uar_page_ = nullptr;
  size_t uar_page_bytes_ = 0;
  uint64_t uar_register_dev_ = 0;
  bool uar_detached_ = false;  // the daemon went: the page is anonymous memory now
  // Fresh queue pairs toward a lost rank, kept out of the context until
  // connectReplacement: (slot, its context).
  std::vector<std::pair<size_t, device::IbgdaQpDevCtx>> parked_;
};

}  // namespace mooncake
