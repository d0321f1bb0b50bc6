// Host-side interfaces of the Device API: the objects that allocate the
// communication buffer, share it with the other ranks and fill the tables a
// kernel reads through CommCtx (comm_device.h).
//
//   P2pTransport, RdmaTransport   upstream Mooncake's abstract classes,
//                   exactly (upstream_transport.h, standard library only).
//   BrokeredP2pTransport  this project's P2P transport: upstream's interface
//                   plus diagnostics and the join route (below). CUDA IPC /
//                   cuMem VMM on a GPU, memfd shared memory on the host
//                   platform.
//   HandleExchange  how a transport moves file descriptors to another process
//                   (libmooncake_client implements it over the daemon; tests
//                   use in-process or socketpair fakes).
//   The RDMA implementation is mooncake::DaemonRdmaTransport (client/).
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
// upstream Mooncake's device_transport.h, so Mooncake EP code runs unchanged
// (upstream's include paths and factories: compat/, docs/compat.md); the
// methods marked "(not upstream)" are additions.
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
#include "mooncake/device/upstream_transport.h"

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
// BrokeredP2pTransport
//
// This project's P2P transport: upstream's P2pTransport (upstream_transport.h,
// whose methods keep upstream's names and meanings, detailed below) plus
// diagnostics, the CommCtx tables, and the join route through the daemon.
// Upstream code holds it as a P2pTransport; code of this project (the
// Communicator, tests) uses the additions.
//
// Upstream methods, as implemented here:
//   allocateBuffer   zero-filled; a few bytes past the end of the mapping are
//                    reserved for verifyPeerAccess; the caller owns
//                    [ptr, ptr + bytes).
//   freeBuffer       peers that mapped the buffer keep their mapping (the
//                    memory lives until they unmap); freeing the buffer
//                    peers were imported for unmaps them and clears the
//                    tables; unknown pointers are ignored (lastError).
//   exportIpcHandle  128 bytes (32 int32) for every kind: {magic, version,
//                    kind, size, buffer id, node key, payload}; the payload
//                    names the fds published through the HandleExchange, or
//                    holds the 64-byte legacy IPC handle (cuIpcGetMemHandle)
//                    or the 64-byte fabric handle.
//   importPeerHandles  `rank` is this rank's real rank. Inactive ranks, and
//                    ranks whose handle names another node (they need the
//                    RDMA route) unless both sides use fabric handles
//                    (multi-node NVLink: mapped, available 1), get
//                    available 0 and a null pointer without being reported
//                    as failures. A second import replaces the first:
//                    earlier mappings are unmapped and the tables, at the
//                    same addresses, rewritten: stop kernels that use the
//                    old tables first.
//   verifyPeerAccess the probe word lives in the reserved bytes at a slot
//                    indexed by this rank's real rank (concurrent
//                    verifications never collide), and the mapping must show
//                    the buffer id the peer exported.
// Tables live in device memory on CUDA and in ordinary host memory on the
// host platform.
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
class MOONCAKE_API BrokeredP2pTransport : public P2pTransport {
 public:
  // (not upstream) Which handle kind this transport uses: "memfd",
  // "cuda-vmm-fd", "cuda-fabric" or "cuda-ipc".
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

  // (not upstream) Elastic groups. After an import (mapPeers or
  // importPeerHandles), marks rank `peer` unavailable in the tables (a
  // kernel then finds no P2P route to it) and keeps its mapping, so a
  // kernel still writing to it touches live memory; remapPeer replaces it.
  // Every other peer is left as it is. Default: Unimplemented.
  virtual absl::Status markPeerUnavailable(int peer);
  // (not upstream) Elastic groups: maps rank `peer`'s new buffer (a
  // replacement process's), verifies it and marks it available; its old
  // mapping, if any, is unmapped first: stop kernels that use the peer
  // before calling. Other peers are not touched. Default: Unimplemented.
  virtual absl::Status remapPeer(int peer, PeerBuffer buffer);
};

// ---------------------------------------------------------------------------
// Factories
// ---------------------------------------------------------------------------

// Host platform: buffers are memfd shared memory. Their fds travel with the
// group join (exportLocal / mapPeers), or through `exchange` for the
// upstream exportIpcHandle / importPeerHandles pair (without an exchange
// those two fail with FailedPrecondition). InvalidArgument for num_ranks < 1.
MOONCAKE_API absl::StatusOr<std::unique_ptr<BrokeredP2pTransport>> createHostP2pTransport(
    int num_ranks, std::shared_ptr<HandleExchange> exchange);

// Which CUDA sharing mechanism createCudaP2pTransport uses.
enum class CudaHandleKind {
  // Fabric handles when the GPU reports them and a test export succeeds;
  // else cuMem VMM with POSIX fds when the device supports it and an
  // exchange is given; else legacy IPC. When the GPU reports fabric support
  // but the export fails (no IMEX channel, as on single-node machines), one
  // log line names the CUDA error and what is missing.
  kAuto,
  // cuMem VMM allocation, fd shared through HandleExchange.
  kVmmPosixFd,
  // cudaMalloc + cudaIpcGetMemHandle; no exchange needed. One process cannot
  // open its own handle, so in-process multi-rank setups need kVmmPosixFd.
  kLegacyIpc,
  // cuMem VMM allocation with the fabric handle type (handleKind()
  // "cuda-fabric"): the 64-byte CUmemFabricHandle travels inside the handle,
  // so no exchange is needed and ranks on other nodes of a multi-node NVLink
  // domain (MNNVL) map the buffer too. Needs an IMEX channel
  // (/dev/nvidia-caps-imex-channels). Each buffer also has a POSIX fd, which
  // the join route (exportLocal) sends beside the handle so a same-node rank
  // using kVmmPosixFd maps it; exportIpcHandle sends only the fabric handle.
  // FailedPrecondition at creation, naming the reason, when the GPU lacks
  // fabric handles or the test export fails.
  kFabric,
  // kAuto without fabric handles: VMM fds where the GPU has them and an
  // exchange is given, else legacy IPC; same-node peers only. Upstream's
  // default (fabric only with MC_USE_NVLINK_IPC=0): a fabric handle maps
  // the buffer for any process of the IMEX domain that learns its 64
  // bytes, with no uid check, so it is opt-in.
  kSameNode,
};

// CUDA: buffers on the device current at creation (cudaGetDevice()); later
// calls switch to it for their duration and restore the caller's device.
// Tables live in device memory. A VMM transport (fabric or POSIX fd) maps
// peers of both VMM kinds, so ranks that chose differently still share on
// one node; another node's rank is mapped only when both use fabric
// handles. FailedPrecondition when the build has no CUDA, no GPU is
// visible, or the requested kind is unsupported;
// InvalidArgument for num_ranks < 1 or kVmmPosixFd without an exchange.
MOONCAKE_API absl::StatusOr<std::unique_ptr<BrokeredP2pTransport>> createCudaP2pTransport(
    int num_ranks, std::shared_ptr<HandleExchange> exchange,
    CudaHandleKind kind = CudaHandleKind::kAuto);

}  // namespace device
}  // namespace mooncake
