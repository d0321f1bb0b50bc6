// Internal: the one P2pTransport implementation every platform shares.
//
// P2pTransportCore owns everything that does not depend on where memory
// lives: the buffers' bookkeeping, the peer tables (host mirrors, published
// to the platform's table memory), the import / verify / unmap loops, the
// off-node check, lastError, and both routes in:
//
//   join route      exportLocal(buffer) -> {handle, fds}   (fds travel with the join)
//                   mapPeers(rank, [{handle, fds}...])
//   upstream route  exportIpcHandle = exportLocal + HandleExchange::exportFds,
//                   the export name written into the handle's payload
//                   importPeerHandles = decode + HandleExchange::importFds
//                   per peer, then the same MapPeer
//
// A platform (host memfd, CUDA VMM / legacy IPC, and next the RDMA
// transport's own core) writes only what differs, in the hooks below: how
// memory is allocated, exported, mapped, unmapped and probed, and where the
// device-visible tables live.
//
// Thread-safety: none (P2pTransport's contract): calls are serialised by
// the caller.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "buffer_handle.h"
#include "mooncake/common/unique_fd.h"
#include "mooncake/device/device_transport.h"

namespace mooncake {
namespace device {
namespace internal {

class P2pTransportCore : public BrokeredP2pTransport {
 public:
  ~P2pTransportCore() override;

  // Upstream surface.
  void* allocateBuffer(size_t bytes) final;
  void freeBuffer(void* ptr) final;
  std::vector<int32_t> exportIpcHandle(void* ptr) final;
  void importPeerHandles(void* local_ptr, int rank, int num_ranks,
                         const std::vector<std::vector<int32_t>>& remote_handles,
                         const std::vector<int>& active_ranks_mask) final;
  int32_t* availableTablePtr() final { return TableAvailable(); }
  void** peerPtrsTablePtr() final { return TablePeerPtrs(); }
  bool allPeersAccessible() const final;
  bool verifyPeerAccess() final;

  // Additions.
  std::string handleKind() const final { return HandleKindName(kind_); }
  absl::Status lastError() const final { return last_error_; }
  std::vector<int32_t> availableSnapshot() const final { return available_; }
  P2PContext p2pContext() final;
  absl::StatusOr<ExportedBuffer> exportLocal(void* ptr) final;
  absl::Status mapPeers(void* local_ptr, int rank, int num_ranks, std::vector<PeerBuffer> peers,
                        const std::vector<int>& active_ranks_mask) final;
  absl::Status markPeerUnavailable(int peer) final;
  absl::Status remapPeer(int peer, PeerBuffer buffer) final;

 protected:
  // A buffer this rank allocated. `alloc_handle` and `fd` are the
  // platform's (CUDA VMM handle, memfd); the core never interprets them.
  struct Buffer {
    void* base = nullptr;
    size_t map_bytes = 0;
    uint64_t id = 0;
    uint64_t alloc_handle = 0;
    UniqueFd fd;
  };
  // A peer's buffer mapped into this process.
  struct PeerMapping {
    void* base = nullptr;
    size_t map_bytes = 0;
    uint64_t expected_id = 0;
  };
  // One peer verifyPeerAccess checks: the id word it must read and the
  // probe slot it writes and reads back (addresses in this process).
  struct ProbeTarget {
    int rank = -1;
    const uint64_t* id_word = nullptr;
    uint64_t* probe_slot = nullptr;
    uint64_t expected_id = 0;
    uint64_t probe_value = 0;
  };
  struct ProbeResult {
    bool id_ok = false;
    bool probe_ok = false;
    uint64_t observed_id = 0;
    uint64_t observed_probe = 0;
  };

  // `exchange` may be null (then only the join route and fd-less kinds
  // work); `who` names the transport in messages ("GPU 1").
  P2pTransportCore(int num_ranks, std::shared_ptr<HandleExchange> exchange, HandleKind kind,
                   std::string who);

  // ---- platform hooks --------------------------------------------------
  // Rounding of a buffer's mapping size (page size, VMM granularity).
  virtual size_t Granularity() const = 0;
  // Allocates `map_bytes` zero-filled bytes; fills base (and the platform's
  // alloc_handle / fd).
  virtual absl::Status AllocateMemory(size_t map_bytes, Buffer* b) = 0;
  virtual void ReleaseMemory(Buffer& b) = 0;
  // Stores one u64 at `addr` inside a local buffer (the buffer id).
  virtual absl::Status WriteLocalWord(void* addr, uint64_t value) = 0;
  // The fds that share `b` with another process (empty for kinds that need
  // none), and the kind-specific payload (a cudaIpcMemHandle, a fabric
  // handle) for the handle. A kind whose payload says it all (fabric) may
  // still return an fd for same-node peers; the upstream route drops it.
  virtual absl::Status ExportMemory(Buffer& b, std::vector<UniqueFd>* fds,
                                    std::string* payload) = 0;
  // Maps rank r's buffer, described by `h` and backed by `fds`; returns its
  // base in this process.
  virtual absl::StatusOr<void*> MapMemory(int r, const BufferHandle& h,
                                          std::vector<UniqueFd> fds) = 0;
  virtual void UnmapMemory(const PeerMapping& p) = 0;
  // Whether this platform maps a peer's buffer of kind `peer` (default: the
  // same kind as its own). The CUDA platform maps both VMM kinds (POSIX fd,
  // fabric) whatever its own, so a group whose ranks chose differently
  // still works on one node.
  virtual bool MapsKind(HandleKind peer) const { return peer == kind_; }
  // Whether a buffer of kind `peer` exported on another node is mappable
  // here (a fabric handle over a multi-node NVLink domain); otherwise an
  // off-node peer is left to the RDMA route. Default: never.
  virtual bool MapsOffNode(HandleKind /*peer*/) const { return false; }
  // Reads every target's id word, writes its probe value and reads it back,
  // through the same path the platform's kernels use. A non-OK status means
  // the probe itself failed (every target is suspect).
  virtual absl::Status Probe(std::vector<ProbeTarget>& targets,
                             std::vector<ProbeResult>* results) = 0;
  // Where kernels read the tables, and how the host mirrors get there.
  virtual int32_t* TableAvailable() = 0;
  virtual void** TablePeerPtrs() = 0;
  virtual absl::Status PublishTables() = 0;
  // Runs at the start of every public call that touches the platform (the
  // CUDA transport switches to its device); returns an undo action.
  virtual std::shared_ptr<void> EnterPlatform() { return nullptr; }

  int numRanks() const { return num_ranks_; }
  int rank() const { return rank_; }
  HandleKind kind() const { return kind_; }
  const std::vector<int32_t>& hostAvailable() const { return available_; }
  void* const* hostPeerPtrs() const { return peer_ptrs_.data(); }
  void Fail(absl::Status s);
  // Unmaps every peer and releases every buffer. Each platform's destructor
  // calls it: the hooks it uses must not run after the platform is gone.
  void ReleaseAll();

 private:
  absl::StatusOr<void*> Allocate(size_t bytes);
  Buffer* FindBuffer(const void* ptr);
  // The handle fields and the fds that share `ptr`'s buffer (no encoding).
  absl::Status Describe(void* ptr, BufferHandle* h, std::vector<UniqueFd>* fds);
  absl::StatusOr<ExportedBuffer> ExportLocal(void* ptr);
  // Drops every peer mapping and resets the tables.
  void UnmapPeers();
  // Checks the arguments and sets up rank_, local buffer, active set.
  absl::Status BeginImport(void* local_ptr, int rank, int num_ranks, size_t peer_count,
                           const std::vector<int>& mask);
  // The one import loop: for each active peer, `fetch(r, h)` supplies the
  // fds (the join route has them, the upstream route asks the exchange),
  // then MapPeer. Off-node handles are skipped without failing.
  template <class FetchFds>
  absl::Status ImportPeers(const std::vector<std::vector<int32_t>>& handles, FetchFds fetch);
  absl::Status MapPeer(int r, const BufferHandle& h, std::vector<UniqueFd> fds);
  // Verifies every mapped active peer, or only `only` when >= 0.
  absl::Status Verify(int only = -1);

  const int num_ranks_;
  const std::shared_ptr<HandleExchange> exchange_;
  const HandleKind kind_;
  const std::string who_;
  const uint64_t node_key_;
  std::vector<std::unique_ptr<Buffer>> buffers_;
  // Host mirrors of the device-visible tables (the source of truth).
  std::vector<int32_t> available_;
  std::vector<void*> peer_ptrs_;
  std::vector<PeerMapping> peers_;
  std::vector<int> active_;
  std::vector<int> off_node_;
  int rank_ = -1;
  void* local_base_ = nullptr;
  size_t local_map_bytes_ = 0;
  absl::Status last_error_;
};

}  // namespace internal
}  // namespace device
}  // namespace mooncake
