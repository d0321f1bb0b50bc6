// The host interfaces of upstream Mooncake's Device API, exactly: the two
// abstract classes Mooncake EP is written against, with upstream's virtual
// methods and nothing else, and the metadata struct the RDMA bring-up
// exchanges. Code that subclasses them (as upstream's own backends do)
// compiles against this header unchanged.
//
//   P2pTransport   intra-node load/store peers (CUDA IPC / cuMem VMM on a
//                  GPU, memfd shared memory on the host platform).
//   RdmaTransport  GPU-issued RDMA (IBGDA): queue pairs, memory registration
//                  and the device tables a kernel posts WQEs with.
//
// This project's implementations add to them without adding pure virtuals
// here: BrokeredP2pTransport (device_transport.h) adds diagnostics and the
// daemon join route; mooncake::DaemonRdmaTransport (client) adds fd
// registration and per-peer QP creation. Upstream's include path
// <transport/device/device_transport.h> (compat/) declares this header's
// classes plus upstream's two factories.
//
// Standard library only (no Abseil, no CUDA): compiles as C++17 in any
// translation unit. Errors follow upstream's conventions: nullptr, an empty
// vector, false or a nonzero int; the implementations keep the reason
// (BrokeredP2pTransport::lastError, DaemonRdmaTransport::lastError).
//
// Thread-safety: none. Calls on one transport are serialised by the caller;
// kernels may read the device tables while no call that rebuilds them
// (importPeerHandles, verifyPeerAccess, create/recreate/connect) runs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "mooncake/common/export.h"

namespace mooncake {
namespace device {

// ---------------------------------------------------------------------------
// P2pTransport
//
// Owns this rank's communication buffer(s), the mappings of the peers'
// buffers, and two device-visible tables: available (int32[num_ranks], 1 =
// reachable by load/store) and peer pointers (void*[num_ranks], each rank's
// buffer base as mapped here). The tables stay valid until the next
// importPeerHandles or the transport's destruction.
// ---------------------------------------------------------------------------
class MOONCAKE_API P2pTransport {
 public:
  virtual ~P2pTransport() = default;

  // Allocates a zero-filled buffer the peers can map; every rank allocates
  // the same `bytes` (symmetric layout). nullptr on failure (bytes == 0, out
  // of memory, driver error).
  virtual void* allocateBuffer(size_t bytes) = 0;

  // Frees a buffer from allocateBuffer. No kernel may still touch it.
  virtual void freeBuffer(void* ptr) = 0;

  // What a peer needs to map `ptr` (from allocateBuffer), as int32 words so
  // it travels through Python and collective libraries unchanged. Every rank
  // exports; the caller moves the words to the other ranks itself. Empty on
  // failure.
  virtual std::vector<int32_t> exportIpcHandle(void* ptr) = 0;

  // Maps the peers' buffers and fills the tables. local_ptr: this rank's
  // buffer; rank: this rank; remote_handles[i]: rank i's exportIpcHandle
  // (this rank's own entry is ignored); active_ranks_mask[i] != 0: rank i
  // takes part (empty = all). A later call replaces the earlier mappings.
  // Peers that cannot be mapped are marked unavailable; the rest work.
  virtual void importPeerHandles(void* local_ptr, int rank, int num_ranks,
                                 const std::vector<std::vector<int32_t>>& remote_handles,
                                 const std::vector<int>& active_ranks_mask) = 0;

  // Device-visible int32[num_ranks]: 1 where rank i is reachable by load/store.
  virtual int32_t* availableTablePtr() = 0;

  // Device-visible void*[num_ranks]: rank i's buffer base in this process.
  virtual void** peerPtrsTablePtr() = 0;

  // True when every active rank is reachable (the all-P2P fast path).
  virtual bool allPeersAccessible() const = 0;

  // Writes and reads back a probe in each available peer's buffer; a peer
  // that fails is marked unavailable. Returns allPeersAccessible().
  virtual bool verifyPeerAccess() = 0;
};

// ---------------------------------------------------------------------------
// RdmaLocalMetadata: what one rank publishes for the RDMA bring-up (its
// buffer's remote address and key, its port's addressing, its QP numbers).
// ---------------------------------------------------------------------------
struct RdmaLocalMetadata {
  int64_t raddr = 0;
  int32_t rkey = 0;
  int64_t subnet_prefix = 0;
  int64_t interface_id = 0;
  std::vector<int32_t> qpns;
  std::vector<int32_t> lids;
};

// ---------------------------------------------------------------------------
// RdmaTransport
//
// Queue pairs toward the other ranks, the registered buffer, and the device
// tables a kernel posts with: raddrs (u64[num_ranks]), rkeys
// (u32[num_ranks]) and the QP contexts (num_qps of them; the QP for
// (dst, channel) is dst * qps_per_rank + channel % qps_per_rank with
// qps_per_rank = num_qps / num_ranks). Every int method returns 0 on
// success.
// ---------------------------------------------------------------------------
class MOONCAKE_API RdmaTransport {
 public:
  virtual ~RdmaTransport() = default;

  // Opens the NIC named `device_name` ("" = choose by topology) for
  // `num_ranks` ranks and `num_qps` queue pairs in all.
  virtual int initialize(const std::string& device_name, int num_ranks, int num_qps) = 0;
  // Registers the communication buffer for remote access.
  virtual int registerMemory(void* ptr, size_t bytes) = 0;
  // Allocates the control memory (send queues, CQs, doorbell records).
  virtual int allocateControlBuffer() = 0;
  // Creates the queue pairs (RESET -> INIT); stream: a cudaStream_t as void*.
  virtual int createQueuePairs(void* stream) = 0;
  // Destroys and creates the queue pairs again (the active ranks changed).
  virtual int recreateQueuePairs(void* stream) = 0;
  // Connects the queue pairs to the peers' published metadata (INIT -> RTS).
  virtual int connectPeers(int local_rank, bool is_roce, const std::vector<int64_t>& remote_addrs,
                           const std::vector<int32_t>& remote_keys,
                           const std::vector<int32_t>& remote_qpns,
                           const std::vector<int32_t>& remote_lids,
                           const std::vector<int64_t>& subnet_prefixes,
                           const std::vector<int64_t>& interface_ids,
                           const std::vector<int>& active_ranks_mask) = 0;
  // What this rank publishes to the others.
  virtual RdmaLocalMetadata localMetadata() const = 0;
  virtual void* raddrsPtr() = 0;     // device u64[num_ranks]
  virtual void* rkeysPtr() = 0;      // device u32[num_ranks]
  virtual void* qpDevCtxsPtr() = 0;  // device IbgdaQpDevCtx[num_qps]
  virtual bool isRoce() const = 0;
  virtual int gidIndex() const = 0;
};

}  // namespace device
}  // namespace mooncake
