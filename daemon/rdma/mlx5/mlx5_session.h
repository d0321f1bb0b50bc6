// Mlx5Session: what one client session owns on one mlx5 NIC when mooncaked
// brokers GPU-initiated RDMA (IBGDA) with DevX: its own verbs context, a
// protection domain, a UAR page for doorbells, the memory regions it
// registered, the umems holding its QP rings, and its CQs and RC QPs.
//
// One context per session, never shared: whoever holds a context's command
// fd can act on every object of that context, and the client gets this fd
// (command_fd(), DupCommandFd()) to import the context (ibv_import_device)
// and map the UAR page (mmap on the fd at uar().mmap_offset) itself.
// Note that the kernel fixes a DevX context's rights when it is created,
// from the creating process: a daemon holding CAP_NET_RAW creates contexts
// allowed to send raw Ethernet (uctx cap RAW_TX), and CAP_SYS_RAWIO gives
// INTERNAL_DEV_RES (Linux drivers/infiniband/hw/mlx5/devx.c,
// mlx5_ib_devx_create). Run mooncaked without those capabilities, or the
// client holding the fd inherits them.
//
// Lifetime: Open() creates everything the session needs up front; the
// destructor releases every object the session still holds, newest kind
// first: QPs, then their CQs, umems, memory regions, the UAR, the PD and the
// context. A memory region or umem made from a daemon-side mapping keeps
// that mapping alive (keep_alive) until it is released.
//
// Errors name the rdma-core call, the device, the errno text and what to do
// (verbs_status.h); a DevX command the firmware refuses reports its status
// and syndrome. Parameters are checked before any call (session_params.h).
// Without rdma-core's libibverbs and libmlx5 at build time, Open() fails
// with FailedPrecondition and nothing else can be reached.
//
// Thread-safe: one mutex serializes a session's calls (a session's calls
// come from its one client; sessions do not share anything here).
//
// Example:
//   Mlx5SessionOptions o;
//   o.device = "mlx5_0";
//   MC_ASSIGN_OR_RETURN(std::unique_ptr<Mlx5Session> s, Mlx5Session::Open(o));
//   MC_ASSIGN_OR_RETURN(uint32_t umem, s->RegisterHostUmem(ctrl->data(), ctrl->size(), ctrl));
//   MC_ASSIGN_OR_RETURN(Mlx5Session::QueuePair qp, s->CreateQueuePair(rings));
//   ... send s->endpoint() and qp.qpn to the peer, get its RemoteQp ...
//   MC_RETURN_IF_ERROR(s->Connect(qp.qpn, /*local_psn=*/0, remote, ConnectTuning{}));
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "mooncake/common/unique_fd.h"
#include "rdma/mlx5/devx_commands.h"
#include "rdma/mlx5/nic_session.h"
#include "rdma/mlx5/session_params.h"

// rdma-core's types, opaque here: only mlx5_session.cc includes the headers.
struct ibv_context;
struct ibv_pd;
struct ibv_mr;
struct mlx5dv_devx_uar;
struct mlx5dv_devx_umem;
struct mlx5dv_devx_obj;

namespace mooncake::daemon::mlx5 {

struct Mlx5SessionOptions {
  std::string device;  // the verbs device name, "mlx5_0"
  uint32_t port = 1;   // 1-based port of that device
  // Local GID table index; unset: chosen by ChooseGid (session_params.h).
  std::optional<uint32_t> gid_index;
  // Completion vector whose EQ the session's CQs report to. The CQs are
  // polled, never armed, so any vector does.
  uint32_t completion_vector = 0;
};

// Implements NicSession (nic_session.h: the types below come from there).
class Mlx5Session final : public NicSession {
 public:
  // Opens `options.device` for one session: finds it among the verbs
  // devices, opens a DevX context, checks the device can run our RC QPs
  // (QUERY_HCA_CAP, CheckRcOverDevx, CQE version 1), queries the port and
  // its GID table, allocates the PD and the UAR and looks up the completion
  // EQ. Errors: InvalidArgument for bad options; NotFound naming the device
  // and listing those there are (or "no RDMA devices"); FailedPrecondition
  // when the device is not mlx5, lacks DevX or a needed capability, or
  // mooncaked was built without rdma-core; the call's error otherwise.
  static absl::StatusOr<std::unique_ptr<Mlx5Session>> Open(const Mlx5SessionOptions& options);

  ~Mlx5Session() override;
  Mlx5Session(const Mlx5Session&) = delete;
  Mlx5Session& operator=(const Mlx5Session&) = delete;

  const std::string& device() const override { return options_.device; }
  uint32_t port() const { return options_.port; }
  // The context's command fd, owned by the session (valid while it lives).
  int command_fd() const;
  // A duplicate of the command fd (close-on-exec) to send to the client,
  // which imports the context with ibv_import_device (that call wants an fd
  // of its own: ibv_import_device(3)).
  absl::StatusOr<UniqueFd> DupCommandFd() const override;
  uint32_t pdn() const { return pdn_; }
  // QUERY_HCA_CAP's general caps, with gid_table_size replaced by the
  // port's GID table length as the kernel reports it (ibv_query_port).
  const HcaGeneralCaps& caps() const { return caps_; }
  // The atomics the NIC answers (CheckAtomics passed at open).
  std::string atomics() const override { return atomics_; }
  const UarInfo& uar() const override { return uar_info_; }
  // The UAR's doorbell register as mapped in this process (the daemon's
  // CPU-assisted doorbell writes it: rdma/mlx5/cpu_doorbell.h); null before
  // Open succeeds or in a build without rdma-core.
  volatile void* doorbell_register() const override;
  uint32_t eqn() const { return eqn_; }
  const LocalEndpoint& endpoint() const override { return endpoint_; }

  // ---- memory regions ---------------------------------------------------------------------------

  // Errors: InvalidArgument for a bad range or access; the dmabuf call's
  // error when no fallback applies; when the fallback fails too, an error
  // naming both calls and what each needs.
  absl::StatusOr<MemoryRegion> RegisterGpuMemory(const GpuMemory& memory) override;

  // Host memory the daemon mapped from the client's memfd: `length` bytes at
  // `daemon_address`, seen by the NIC at `iova` (the client's address of the
  // same bytes). `keep_alive` holds the mapping while the region lives.
  absl::StatusOr<MemoryRegion> RegisterHostMemory(void* daemon_address, uint64_t length,
                                                  uint64_t iova, uint32_t access,
                                                  std::shared_ptr<const void> keep_alive) override;

  // GPU memory the daemon mapped itself (softnic's CudaMemory import of the
  // client's cuMem VMM fd): `length` bytes at the device address
  // `daemon_address`, registered by address through nvidia-peermem, seen
  // by the NIC at `iova`. For clients that send no dmabuf.
  absl::StatusOr<MemoryRegion> RegisterPeermemMemory(
      void* daemon_address, uint64_t length, uint64_t iova, uint32_t access,
      std::shared_ptr<const void> keep_alive) override;

  // NotFound for a key this session did not register; the call's error if
  // the kernel refuses (the region is then still held).
  absl::Status DeregisterMemory(uint32_t lkey) override;

  // ---- umem: client memory holding QP rings -----------------------------------------------------

  // The daemon's mapping of the client's control memfd: `bytes` at
  // `daemon_address`, both multiples of kUmemPageSize.
  absl::StatusOr<uint32_t> RegisterHostUmem(void* daemon_address, uint64_t bytes,
                                            std::shared_ptr<const void> keep_alive) override;
  // GPU memory: [offset, offset + bytes) of the dmabuf `dmabuf_fd` (borrowed).
  absl::StatusOr<uint32_t> RegisterDmabufUmem(int dmabuf_fd, uint64_t offset,
                                              uint64_t bytes) override;
  // NotFound for an unknown umem; FailedPrecondition while a QP's rings use it.
  absl::Status DeregisterUmem(uint32_t umem_id) override;

  // ---- queue pairs ------------------------------------------------------------------------------

  // A CQ and a send-only RC QP on `rings` (ValidateQpRings against this
  // session's umems). The client has filled the CQE ring with 0xff bytes
  // (opcode invalid, owner 1: device/mlx5/prm.h) and zeroed both doorbell
  // records before this call; the NIC reads them from then on. Firmware refusals name the command,
  // status and syndrome; a CREATE_QP refused on a dmabuf (GPU) umem says so, as some NICs reject
  // GPU memory for QP rings and host memory works there.
  absl::StatusOr<QueuePair> CreateQueuePair(const QpRings& rings) override;

  // RESET -> INIT -> RTR -> RTS towards `remote`. FailedPrecondition unless
  // the QP is in RESET (a QP whose connect failed half way must be destroyed
  // and created again); NotFound for a QP this session does not hold;
  // InvalidArgument for bad parameters (PlanConnect); the failing
  // transition's error otherwise, naming it.
  absl::Status Connect(uint32_t qpn, uint32_t local_psn, const RemoteQp& remote,
                       const ConnectTuning& tuning) override;
  bool InReset(uint32_t qpn) const override;

  // Destroys the QP and then its CQ. NotFound for an unknown QP.
  absl::Status DestroyQueuePair(uint32_t qpn) override;

  // What the session holds (tests, listings).
  size_t memory_region_count() const;
  size_t umem_count() const;
  size_t queue_pair_count() const;

 private:
  explicit Mlx5Session(Mlx5SessionOptions options);

  // Releases everything, newest kind first (the destructor).
  void ReleaseAll();

  enum class QpState : uint8_t { kReset, kInit, kRtr, kRts };
  struct MrEntry {
    ibv_mr* mr = nullptr;
    MrPath path = MrPath::kHost;
    std::shared_ptr<const void> keep_alive;
  };
  struct UmemEntry {
    mlx5dv_devx_umem* umem = nullptr;
    uint64_t bytes = 0;
    bool dmabuf = false;
    uint32_t users = 0;  // rings of live CQs/QPs in it
    std::shared_ptr<const void> keep_alive;
  };
  struct QpEntry {
    mlx5dv_devx_obj* qp = nullptr;
    mlx5dv_devx_obj* cq = nullptr;
    uint32_t cqn = 0;
    QpRings rings;
    QpState state = QpState::kReset;
  };

  absl::StatusOr<MemoryRegion> AddMr(ibv_mr* mr, MrPath path,
                                     std::shared_ptr<const void> keep_alive)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<uint32_t> AddUmem(mlx5dv_devx_umem* umem, uint64_t bytes, bool dmabuf,
                                   std::shared_ptr<const void> keep_alive)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UseRings(const QpRings& rings, int delta) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Destroys a QP and its CQ objects; the first failure, if any.
  absl::Status DestroyObjects(QpEntry& entry);
  absl::StatusOr<std::array<uint8_t, 6>> ResolveRemoteMac(const Init2RtrParams& rtr,
                                                          const ConnectTuning& tuning);

  const Mlx5SessionOptions options_;
  // Set once by Open, read-only afterwards.
  ibv_context* context_ = nullptr;
  ibv_pd* pd_ = nullptr;
  mlx5dv_devx_uar* uar_ = nullptr;
  uint32_t pdn_ = 0;
  uint32_t eqn_ = 0;
  HcaGeneralCaps caps_;
  std::string atomics_;  // DescribeAtomics of the atomic caps at open
  UarInfo uar_info_;
  LocalEndpoint endpoint_;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint32_t, MrEntry> mrs_ ABSL_GUARDED_BY(mu_);      // by lkey
  absl::flat_hash_map<uint32_t, UmemEntry> umems_ ABSL_GUARDED_BY(mu_);  // by umem id
  absl::flat_hash_map<uint32_t, QpEntry> qps_ ABSL_GUARDED_BY(mu_);      // by QPN
};

const char* MrPathName(NicSession::MrPath path);  // "dmabuf", "peermem", "host"

}  // namespace mooncake::daemon::mlx5
