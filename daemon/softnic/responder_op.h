// What softnic's requester side hands its responder side: "at the QP
// connected to mine, write these bytes at raddr under rkey" or "fetch-add
// there", and the answer. The engine parses a WQE and checks its local side
// (lkey, bounds) itself; the responder is one of this engine's QPs
// (Engine::ExecuteWqe) or another node's (RemoteLink, Engine::ExecuteForPeer).
#pragma once

#include <cstdint>

#include "softnic/types.h"

namespace mooncake::softnic {

class CudaMemory;     // softnic/cuda_memory.h
class CopyAgentLink;  // softnic/copy_agent_link.h

// Bytes as the daemon reaches them: a host pointer, or a GPU address in the
// daemon's CUDA context.
struct ByteSpan {
  MemoryKind kind = MemoryKind::kHost;
  uint64_t addr = 0;  // host pointer value or CUdeviceptr
  uint64_t length = 0;
  // kCuda: what mapped `addr` and moves its bytes (CudaMemory::Copy); valid
  // while the region it came from is registered. Null: unreachable.
  CudaMemory* cuda = nullptr;
  // kCuda, when the process that owns the memory runs a copy agent: the
  // agent, and the same bytes as that process addresses them (the region's
  // iova space). Copies go through the agent while it is usable, else
  // through `cuda`.
  CopyAgentLink* agent = nullptr;
  uint64_t agent_addr = 0;
};

struct ResponderOp {
  enum class Kind { kWrite, kFetchAdd64, kMaskedFetchAdd32 };
  Kind kind = Kind::kWrite;
  uint32_t remote_qpn = 0;  // the responder QP (the requester's connected peer)
  // A local peer's incarnation (Engine::Connect): a QPN destroyed and
  // handed to another user meanwhile is not it. 0: not checked (a peer
  // node's batch, checked by its node, QPN and secret instead).
  uint64_t remote_serial = 0;
  uint64_t raddr = 0;
  uint32_t rkey = 0;
  // kWrite: the source bytes (already checked against the requester's lkey,
  // or inline bytes copied out of the WQE).
  ByteSpan source;
  uint64_t add = 0;  // atomics: the operand (host order)
  // kMaskedFetchAdd32: the field-boundary mask (0: one 32-bit field); a
  // carry out of a bit set here is dropped.
  uint32_t field_boundary = 0;
};

struct ResponderResult {
  uint8_t syndrome = 0;  // 0 = success, else an mlx5 CQE syndrome
  uint64_t fetched = 0;  // atomics: the value before the add
  // With TRANSPORT_RETRY_EXC_ERR from another node: the responder QP
  // exists but is not connected yet (its owner connects it in a moment), so
  // the requester retries for a while, as a NIC does, before giving up.
  bool not_ready = false;
  // From another node: the batch did not carry the connection's secret
  // (Engine::ExecuteForPeer); nothing was touched. For the peer service's log.
  bool refused = false;
};

}  // namespace mooncake::softnic
