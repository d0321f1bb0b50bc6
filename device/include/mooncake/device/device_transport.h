// Host-side interfaces of the Device API: the objects that allocate the
// communication buffer, share it with the other ranks and fill the tables a
// kernel reads through CommCtx (comm_device.h).
//
//   P2pTransport    intra-node load/store peers: CUDA IPC / cuMem VMM on a GPU,
//                   memfd shared memory on the host platform.
//   RdmaTransport   GPU-issued RDMA (IBGDA); declared here, implemented by a
//                   later issue.
//   HandleExchange  how a transport moves file descriptors to another process
//                   (libmooncake_client implements it over the daemon; tests
//                   use in-process or socketpair fakes).
//
// Two ways to bring peers up, on one core (device/src/p2p_transport_core.h):
//   - the join route (mooncake::Communicator): exportLocal() gives the handle
//     bytes and the fds; both travel with the group join; each peer's handle
//     and fds come back in the view and go to mapPeers(). No export names.
//   - the upstream route (exportIpcHandle / importPeerHandles): the caller
//     moves handle bytes itself (MPI, torch.distributed, files); fds are
//     published through the HandleExchange under a name carried inside the
//     handle. A thin adapter over the same primitives.
//
// The method names and meanings of P2pTransport and RdmaTransport are those of
// upstream Mooncake's device_transport.h, so Mooncake EP code runs unchanged;
// the methods marked "(not upstream)" are additions.
//
// A typical P2P bring-up, on every rank r of n:
//
//   auto t = createHostP2pTransport(n, exchange);           // or createCudaP2pTransport
//   void* buf = (*t)->allocateBuffer(bytes);                 // same bytes on every rank
//   std::vector<int32_t> mine = (*t)->exportIpcHandle(buf);
//   ... exchange `mine` with the other ranks (daemon group, MPI, files) ...
//   (*t)->importPeerHandles(buf, r, n, all_handles, /*active_ranks_mask=*/{});
//   if (!(*t)->verifyPeerAccess()) log((*t)->lastError());  // unreachable peers are marked
//   CommCtx ctx{(*t)->p2pContext(), {}, r, n};               // pass ctx to kernels
//
// Plain C++: never includes CUDA headers (conventions.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "mooncake/common/export.h"
#include "mooncake/common/unique_fd.h"
#include "mooncake/device/contexts_device.h"

namespace mooncake {
namespace device {

// ---------------------------------------------------------------------------
// HandleExchange
//
// Moves file descriptors between processes of the same uid on one node. A
// transport exports the fd that backs its buffer and puts the returned bytes
// into its 64-byte IPC handle; a peer that receives the handle asks its own
// HandleExchange to import those bytes and gets duplicates of the fds.
//
// Thread-safety: implementations must allow concurrent calls (several
// transports may share one exchange).
// ---------------------------------------------------------------------------
class MOONCAKE_API HandleExchange {
 public:
  // Largest export name exportFds may return: what fits in a P2P handle.
  static constexpr size_t kMaxExportedBytes = 40;

  virtual ~HandleExchange() = default;

  // Publishes `fds` (borrowed, not closed) so another process of the same uid
  // can import them. `kind` names what they are ("memfd", "cuda-vmm-fd") and
  // `size` the bytes they back; both are informational (mcctl shows them).
  // Returns opaque bytes (<= kMaxExportedBytes) naming the export; valid while
  // this process's session lives. Errors: Unavailable when the daemon is
  // gone, ResourceExhausted past its limits, InvalidArgument for no fds.
  virtual absl::StatusOr<std::string> exportFds(const std::vector<int>& fds, std::string_view kind,
                                                uint64_t size) = 0;

  // Returns new fds (owned by the caller) for the export named by `exported`.
  // Errors: NotFound for an unknown or expired export, PermissionDenied for
  // another uid's export, Unavailable when the exporter or daemon is gone.
  virtual absl::StatusOr<std::vector<UniqueFd>> importFds(std::string_view exported) = 0;

  // The node this exchange serves (the daemon's node id); "" = unknown, in
  // which case transports identify the node by the kernel boot id. Goes
  // into every handle so an importer recognises an off-node rank itself.
  virtual std::string nodeId() const { return ""; }
};

// (not upstream) A local buffer ready to travel: the handle bytes (the same
// fixed length for every kind) and, for fd-based kinds, the fds that back
// it (owned; send them with the handle).
struct ExportedBuffer {
  std::vector<int32_t> handle;
  std::vector<UniqueFd> fds;
  // Bytes the fds back (the allocation, rounded up and with the transport's
  // tail): what a process that maps them must map.
  uint64_t map_bytes = 0;
};

// (not upstream) What a peer published: its handle and the fds received for
// it (empty for kinds that need none, e.g. legacy CUDA IPC, or for a rank
// that is not imported).
struct PeerBuffer {
  std::vector<int32_t> handle;
  std::vector<UniqueFd> fds;
};

// ---------------------------------------------------------------------------
// P2pTransport
//
// Owns this rank's communication buffer(s), the mappings of the peers'
// buffers, and two device-visible tables: available (int32[num_ranks]) and
// peer pointers (void*[num_ranks]). Tables live in device memory on CUDA and
// in ordinary host memory on the host platform; they stay valid until the
// next importPeerHandles or the transport's destruction.
//
// Errors: the upstream signatures report failure through their return value
// (nullptr, empty vector, false) or not at all (void); lastError() then says
// what failed and what to do. Peers that fail to import or verify are marked
// unavailable (0) in the available table; the rest keep working.
//
// Thread-safety: none; calls on one transport must be serialised. Kernels may
// read the tables concurrently with anything except importPeerHandles,
// verifyPeerAccess and destruction.
// ---------------------------------------------------------------------------
class MOONCAKE_API P2pTransport {
 public:
  virtual ~P2pTransport() = default;

  // Allocates a zero-filled buffer peers can map; every rank must allocate the
  // same `bytes` (symmetric layout). Returns nullptr on failure (bytes == 0,
  // out of memory, driver error). A few bytes past the end of the mapping are
  // reserved for verifyPeerAccess; the caller owns [ptr, ptr + bytes).
  virtual void* allocateBuffer(size_t bytes) = 0;

  // Frees a buffer from allocateBuffer. Peers that mapped it keep their
  // mapping (the memory lives until they unmap), but the caller must make
  // sure no kernel still writes it. Unknown pointers are ignored (lastError).
  virtual void freeBuffer(void* ptr) = 0;

  // The handle peers need to map `ptr` (a pointer allocateBuffer returned):
  // 128 bytes (32 int32) for every kind: {magic, version, kind, size, buffer
  // id, node key, payload}; the payload names the fds published through the
  // HandleExchange, or holds the 64-byte legacy IPC handle
  // (cuIpcGetMemHandle). Empty on failure.
  virtual std::vector<int32_t> exportIpcHandle(void* ptr) = 0;

  // Maps every active peer's buffer and fills the tables. `local_ptr` is this
  // rank's buffer (from allocateBuffer), `rank` this rank's real rank,
  // remote_handles[i] rank i's exportIpcHandle (this rank's entry is ignored).
  // active_ranks_mask: upstream's std::vector<int>, entry i nonzero = rank i
  // takes part; empty = all ranks. Inactive ranks, and ranks whose handle
  // names another node (they need the RDMA route), get available 0 and a
  // null pointer without being reported as failures. Replaces any earlier
  // import (earlier mappings are unmapped: stop kernels that use the old
  // tables first).
  virtual void importPeerHandles(void* local_ptr, int rank, int num_ranks,
                                 const std::vector<std::vector<int32_t>>& remote_handles,
                                 const std::vector<int>& active_ranks_mask) = 0;

  // Device-visible int32[num_ranks]: 1 if rank i is reachable by load/store.
  virtual int32_t* availableTablePtr() = 0;

  // Device-visible void*[num_ranks]: rank i's buffer base in this process.
  virtual void** peerPtrsTablePtr() = 0;

  // True when every active rank is available (the all-P2P fast path).
  virtual bool allPeersAccessible() const = 0;

  // Writes and reads back a probe word in each available peer's buffer
  // (in the reserved bytes, at a slot indexed by this rank's real rank, so
  // concurrent verifications never collide), and checks that the mapping
  // shows the buffer id the peer exported. Peers that fail are marked
  // unavailable. Returns allPeersAccessible(). Call after importPeerHandles.
  virtual bool verifyPeerAccess() = 0;

  // (not upstream) Which handle kind this transport uses: "memfd",
  // "cuda-vmm-fd" or "cuda-ipc".
  virtual std::string handleKind() const = 0;

  // (not upstream) Why the last failing call failed; OK if none failed. Also
  // set (to the first failure) when import/verify marked a peer unavailable.
  virtual absl::Status lastError() const = 0;

  // (not upstream) Host copy of the available table, for reporting.
  virtual std::vector<int32_t> availableSnapshot() const = 0;

  // (not upstream) The P2P part of a CommCtx for the last import: the tables
  // above and the local buffer as local_base. All null before an import.
  virtual P2PContext p2pContext() = 0;

  // (not upstream) The join route's export: the handle (no export name in
  // it) and the fds that back `ptr`, which the caller sends with its group
  // join. Nothing is published anywhere. The default (a transport that
  // does not implement it) answers Unimplemented.
  virtual absl::StatusOr<ExportedBuffer> exportLocal(void* ptr);

  // (not upstream) The join route's import: like importPeerHandles, with
  // peers[i] = rank i's handle and the fds received for it (this rank's
  // entry is ignored). Failures of single peers mark them unavailable and
  // are reported in the returned status (and lastError) while the other
  // peers stay mapped; argument errors map nothing. Default: Unimplemented.
  virtual absl::Status mapPeers(void* local_ptr, int rank, int num_ranks,
                                std::vector<PeerBuffer> peers,
                                const std::vector<int>& active_ranks_mask);
};

// ---------------------------------------------------------------------------
// RdmaLocalMetadata / RdmaTransport (IBGDA). Declared with upstream's names
// and meanings; the implementation (daemon-backed DevX QPs, softnic) is a
// later issue, so no factory exists yet.
// ---------------------------------------------------------------------------
struct RdmaLocalMetadata {
  int64_t raddr = 0;
  int32_t rkey = 0;
  int64_t subnet_prefix = 0;
  int64_t interface_id = 0;
  std::vector<int32_t> qpns;
  std::vector<int32_t> lids;
};

class MOONCAKE_API RdmaTransport {
 public:
  virtual ~RdmaTransport() = default;

  // Opens the NIC (empty name: pick by topology). 0 = ok, nonzero = IBGDA
  // unavailable.
  virtual int initialize(const std::string& device_name, int num_ranks, int num_qps) = 0;
  // Registers the communication buffer for RDMA.
  virtual int registerMemory(void* ptr, size_t bytes) = 0;
  // Allocates the GPU-visible control memory (WQ, CQ, doorbell records).
  virtual int allocateControlBuffer() = 0;
  // Creates the QPs (RST -> INIT); stream is a cudaStream_t as void*.
  virtual int createQueuePairs(void* stream) = 0;
  // Destroys and recreates the QPs (active ranks changed).
  virtual int recreateQueuePairs(void* stream) = 0;
  // INIT -> RTR -> RTS against the peers' metadata.
  virtual int connectPeers(int local_rank, bool is_roce, const std::vector<int64_t>& remote_addrs,
                           const std::vector<int32_t>& remote_keys,
                           const std::vector<int32_t>& remote_qpns,
                           const std::vector<int32_t>& remote_lids,
                           const std::vector<int64_t>& subnet_prefixes,
                           const std::vector<int64_t>& interface_ids,
                           const std::vector<int>& active_ranks_mask) = 0;
  virtual RdmaLocalMetadata localMetadata() const = 0;
  virtual void* raddrsPtr() = 0;     // device u64[num_ranks]
  virtual void* rkeysPtr() = 0;      // device u32[num_ranks]
  virtual void* qpDevCtxsPtr() = 0;  // device IbgdaQpDevCtx[num_qps]
  virtual bool isRoce() const = 0;
  virtual int gidIndex() const = 0;
};

// ---------------------------------------------------------------------------
// Factories
// ---------------------------------------------------------------------------

// Host platform: buffers are memfd shared memory. Their fds travel with the
// group join (exportLocal / mapPeers), or through `exchange` for the
// upstream exportIpcHandle / importPeerHandles pair (without an exchange
// those two fail with FailedPrecondition). InvalidArgument for num_ranks < 1.
MOONCAKE_API absl::StatusOr<std::unique_ptr<P2pTransport>> createHostP2pTransport(
    int num_ranks, std::shared_ptr<HandleExchange> exchange);

// Which CUDA sharing mechanism createCudaP2pTransport uses.
enum class CudaHandleKind {
  // cuMem VMM with POSIX fds when the device supports it and an exchange is
  // given; legacy IPC otherwise (the choice is logged once).
  kAuto,
  // cuMem VMM allocation, fd shared through HandleExchange.
  kVmmPosixFd,
  // cudaMalloc + cudaIpcGetMemHandle; no exchange needed. One process cannot
  // open its own handle, so in-process multi-rank setups need kVmmPosixFd.
  kLegacyIpc,
};

// CUDA: buffers on the device current at creation (cudaGetDevice()); later
// calls switch to it for their duration and restore the caller's device.
// Tables live in device memory. FailedPrecondition when the build has no
// CUDA, no GPU is visible, or the requested kind is unsupported;
// InvalidArgument for num_ranks < 1 or kVmmPosixFd without an exchange.
MOONCAKE_API absl::StatusOr<std::unique_ptr<P2pTransport>> createCudaP2pTransport(
    int num_ranks, std::shared_ptr<HandleExchange> exchange,
    CudaHandleKind kind = CudaHandleKind::kAuto);

}  // namespace device
}  // namespace mooncake
