// NicSession: what Mlx5Provider needs of one client session's objects on
// one mlx5 NIC. Mlx5Session (mlx5_session.h) implements it over rdma-core
// and DevX, and documents each call; the interface exists so that the
// provider's own logic (which session holds what, connect failures, the
// link it reports, the counters it reads from client memory, what the
// CPU-assisted doorbell watches) is tested without a NIC, against a fake
// (tests/daemon/mlx5_provider_test.cc), as DCGM tests its modules against
// a mock CudaLib.
//
// Thread-safety: an implementation serializes its own calls; the
// accessors of what Open fixed (device, endpoint, uar, doorbell_register)
// may be called from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "mooncake/common/unique_fd.h"
#include "rdma/mlx5/devx_commands.h"
#include "rdma/mlx5/session_params.h"

namespace mooncake::daemon::mlx5 {

// The UAR page the session's CQs and QPs ring their doorbells on.
struct UarInfo {
  uint32_t page_id = 0;     // goes into the CQ and QP contexts (uar_page)
  int64_t mmap_offset = 0;  // mmap offset on the command fd for a second process
  uint64_t reg_offset = 0;  // the doorbell register's offset inside the mapped page
  bool non_cached = false;  // an NC UAR (preferred), else a BlueFlame one
};

// What a peer needs of this end to connect to its QPs (besides the QPN),
// fixed when the session opened: the port's link layer (ibv_query_port)
// and the GID the session chose (ChooseGid, or the configured index).
struct LocalEndpoint {
  LinkLayer link_layer = LinkLayer::kInfiniBand;
  uint32_t lid = 0;
  GidEntry gid;             // the chosen local GID (index, bytes, type)
  uint32_t active_mtu = 5;  // ibv_mtu encoding
};

class NicSession {
 public:
  virtual ~NicSession() = default;

  virtual const std::string& device() const = 0;
  virtual const LocalEndpoint& endpoint() const = 0;
  virtual const UarInfo& uar() const = 0;
  // The UAR's doorbell register as mapped in this process (the daemon's
  // CPU-assisted doorbell writes 8 bytes there).
  virtual volatile void* doorbell_register() const = 0;
  // A duplicate of the context's command fd (the doorbell hand-off).
  virtual absl::StatusOr<UniqueFd> DupCommandFd() const = 0;
  // The atomics the NIC answered at open (devx_commands.h DescribeAtomics);
  // empty when unknown.
  virtual std::string atomics() const { return ""; }

  // ---- memory regions ---------------------------------------------------------------------------

  enum class MrPath : uint8_t {
    kDmabuf,   // ibv_reg_dmabuf_mr on the client's dmabuf fd
    kPeermem,  // ibv_reg_mr_iova2 on the daemon's mapping of GPU memory (nvidia-peermem)
    kHost,     // ibv_reg_mr_iova2 on the daemon's mapping of host memory
  };
  struct MemoryRegion {
    uint32_t lkey = 0;
    uint32_t rkey = 0;
    MrPath path = MrPath::kHost;
  };
  // GPU memory: [offset, offset + length) of the dmabuf `dmabuf_fd`, seen by
  // the NIC at `iova` (the client's virtual address, so remote addresses are
  // the client's pointers). The fd is borrowed; the kernel keeps its own
  // reference to the dmabuf for the region's life.
  struct GpuMemory {
    int dmabuf_fd = -1;
    uint64_t offset = 0;
    uint64_t length = 0;
    uint64_t iova = 0;
    uint32_t access = 0;  // MrAccess bits; local write is added (RegistrationAccess)
    // Fallback when the system cannot register a dmabuf
    // (DmabufRefusalAllowsFallback): the daemon's address of the region's
    // first byte (the same GPU memory mapped in the daemon, e.g. softnic's
    // CudaMemory mapping of the client's VMM fd), registered by address
    // through nvidia-peermem. Null: no fallback.
    void* daemon_address = nullptr;
    std::shared_ptr<const void> keep_alive;  // holds that mapping while the region lives
  };
  virtual absl::StatusOr<MemoryRegion> RegisterGpuMemory(const GpuMemory& memory) = 0;
  virtual absl::StatusOr<MemoryRegion> RegisterHostMemory(
      void* daemon_address, uint64_t length, uint64_t iova, uint32_t access,
      std::shared_ptr<const void> keep_alive) = 0;
  virtual absl::StatusOr<MemoryRegion> RegisterPeermemMemory(
      void* daemon_address, uint64_t length, uint64_t iova, uint32_t access,
      std::shared_ptr<const void> keep_alive) = 0;
  virtual absl::Status DeregisterMemory(uint32_t lkey) = 0;

  // ---- umem and queue pairs ---------------------------------------------------------------------

  virtual absl::StatusOr<uint32_t> RegisterHostUmem(void* daemon_address, uint64_t bytes,
                                                    std::shared_ptr<const void> keep_alive) = 0;
  // GPU memory holding rings: [offset, offset + bytes) of the dmabuf
  // `dmabuf_fd` (borrowed; the kernel keeps its own reference).
  virtual absl::StatusOr<uint32_t> RegisterDmabufUmem(int dmabuf_fd, uint64_t offset,
                                                      uint64_t bytes) = 0;
  virtual absl::Status DeregisterUmem(uint32_t umem_id) = 0;

  struct QueuePair {
    uint32_t qpn = 0;
    uint32_t cqn = 0;
  };
  virtual absl::StatusOr<QueuePair> CreateQueuePair(const QpRings& rings) = 0;
  // RESET -> INIT -> RTR -> RTS. On an error the QP is either still in
  // RESET (refused before any transition: it may be connected again) or
  // half way (InReset false: it must be destroyed and created again).
  virtual absl::Status Connect(uint32_t qpn, uint32_t local_psn, const RemoteQp& remote,
                               const ConnectTuning& tuning) = 0;
  // Whether QP `qpn` is held and still in RESET.
  virtual bool InReset(uint32_t qpn) const = 0;
  virtual absl::Status DestroyQueuePair(uint32_t qpn) = 0;
};

}  // namespace mooncake::daemon::mlx5
