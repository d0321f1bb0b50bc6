// Upstream Mooncake's P2P device context and helpers
// (<transport/device/p2p_device.cuh>): P2PContext is the native struct
// (mooncake/device/contexts_device.h, same fields: available, peer_ptrs,
// local_base); the helpers below take it with upstream's arguments.
//
// A P2PContext carries no rank count, so these helpers cannot bound-check
// `dst_rank`: pass a rank of the group. The CommCtx forms
// (comm_device.cuh) do check it.
#pragma once

#include <cstdint>

#include "mooncake/device/contexts_device.h"
#include "transport/device/device_ops.cuh"

namespace mooncake {
namespace device {

// True when `dst_rank` is reachable by load/store: its available entry is
// nonzero and it has a mapped buffer. A context without tables reaches no
// one (upstream would dereference them).
MC_DEVICE bool mc_p2p_available(const P2PContext& ctx, int dst_rank) {
  if (ctx.available == nullptr || ctx.peer_ptrs == nullptr) return false;
  return ctx.available[dst_rank] != 0 && ctx.peer_ptrs[dst_rank] != nullptr;
}

// The address at `dst_rank` of `local_ptr`, a pointer into this rank's
// buffer (symmetric by offset from local_base).
MC_DEVICE void* mc_p2p_peer_ptr(const P2PContext& ctx, int dst_rank, const void* local_ptr) {
  const uintptr_t offset =
      reinterpret_cast<uintptr_t>(local_ptr) - reinterpret_cast<uintptr_t>(ctx.local_base);
  return reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(ctx.peer_ptrs[dst_rank]) + offset);
}

// Release store of `val` to the peer's copy of the signal word
// `local_sig_ptr`. A store, as upstream: one writer per word.
MC_DEVICE void mc_p2p_signal(const P2PContext& ctx, int dst_rank, const int* local_sig_ptr,
                             int32_t val) {
  mc_st_release(static_cast<int*>(mc_p2p_peer_ptr(ctx, dst_rank, local_sig_ptr)), val);
}

}  // namespace device
}  // namespace mooncake
