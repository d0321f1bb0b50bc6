// The contexts a kernel receives: plain structs of pointers to tables the
// host filled (P2pTransport / RdmaTransport, or mooncake::Communicator), passed
// by value as kernel arguments. Compiles with g++ and nvcc.
//
// Ownership: a context owns nothing. Every pointer refers to memory owned by
// the transport that produced it and stays valid until that transport is
// destroyed or re-imports its peers; the tables are read-only for kernels.
#pragma once

#include <cstdint>

namespace mooncake {
namespace device {

// Intra-node peers reachable by load/store (NVLink/PCIe P2P on CUDA, shared
// memory mappings on the host platform).
//
// Symmetric addressing: every rank allocates one buffer of the same layout;
// an address `p` inside this rank's buffer corresponds, at rank r, to
// peer_ptrs[r] + (p - local_base).
struct P2PContext {
  // int32[num_ranks]: nonzero where rank r is reachable and verified.
  const int32_t* available = nullptr;
  // void*[num_ranks]: base of rank r's buffer as mapped into this process
  // (peer_ptrs[rank] == local_base).
  void* const* peer_ptrs = nullptr;
  // Base of this rank's own buffer.
  void* local_base = nullptr;
};

// Queue-pair context of one mlx5 IBGDA queue pair as the GPU sees it:
// defined in ibgda_qp.h (its setup fields and its posting state).
struct IbgdaQpDevCtx;

// Inter-node peers reached by GPU-issued RDMA (IBGDA). Filled by
// RdmaTransport; all pointers null while RDMA is not configured.
struct IbgdaContext {
  // [num_ranks * qps_per_rank]: the QP for (dst, channel) is
  // qp_devctxs[dst * qps_per_rank + channel % qps_per_rank].
  IbgdaQpDevCtx* qp_devctxs = nullptr;
  // u64[num_ranks]: remote address of rank r's buffer base (its MR iova).
  const uint64_t* raddrs = nullptr;
  // u32[num_ranks]: rkey of rank r's buffer.
  const uint32_t* rkeys = nullptr;
  // Local scratch that receives the fetched values of remote atomics.
  const void* local_atomic_base = nullptr;
  // Symmetric base of the signal area the remote atomics target.
  const void* remote_atomic_base = nullptr;
  // Ours, after upstream's five fields (their order is upstream's, so code
  // that fills the struct by position, as upstream's does, fills the same
  // fields): queue pairs per rank, 0 when unknown (upstream-style calls
  // take it as an argument).
  int qps_per_rank = 0;
};

// Everything a communicating kernel needs, by value.
struct CommCtx {
  P2PContext p2p;
  IbgdaContext ibgda;
  int rank = 0;
  int num_ranks = 0;
};

}  // namespace device
}  // namespace mooncake
