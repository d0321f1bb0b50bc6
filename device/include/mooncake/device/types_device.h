// Plain types shared by the platform ops and the device functions. Compiles
// as C++20 with g++ and as CUDA with nvcc.
#pragma once

#include <cstdint>

#include "mooncake/device/detail/macros.h"

namespace mooncake {
namespace device {

// One 16-byte vector, the unit of the fast copy paths. Same layout as CUDA's
// uint4, declared here so host code needs no CUDA header.
struct alignas(16) McVec16 {
  uint32_t x, y, z, w;
};

// Comparison used by mc_wait_until: "wait until *ptr <cmp> value". Signed
// types compare signed, unsigned types unsigned (no wrap-around handling:
// a sequence counter that may wrap should be compared with kNe/kEq).
enum class McCmp : int { kEq = 0, kNe, kGe, kGt, kLe, kLt };

// Result of a device function that can fail. kInvalidRank, kNoRoute and
// kNotRegistered are properties of the arguments: a kernel that gets one
// should stop and report it rather than retry. kRdmaError and kTimedOut come
// from the RDMA route: the queue pair to that peer failed (an error
// completion, or no completion within its timeout) and stays failed.
enum class McStatus : int {
  kOk = 0,
  // dst rank outside [0, ctx.num_ranks).
  kInvalidRank = 1,
  // dst is neither this rank, nor a verified P2P peer, nor reachable through
  // an RDMA queue pair of the context. Nothing was written.
  kNoRoute = 2,
  // Before the RDMA route existed this was its name; kept so code written
  // then still compiles.
  kRdmaNotImplemented = kNoRoute,
  // An RDMA completion reported an error (bad key, address outside the
  // peer's region, ...), now or earlier on the same queue pair. What the NIC
  // said is in the QP context's `error` (mcctl qps shows it too).
  kRdmaError = 3,
  // An RDMA queue pair made no progress within its timeout (the NIC, or
  // softnic in the daemon, is gone). The queue pair is unusable.
  kTimedOut = 4,
  // An RDMA put larger than an inline write whose source lies outside this
  // rank's registered buffer (the NIC can only read registered memory).
  kNotRegistered = 5,
  // The CommCtx has no rank count (num_ranks <= 0): it was built field by
  // field, as upstream code builds its contexts, and so cannot bound-check
  // a rank or find its queue pairs. Build it with make_comm_ctx
  // (<transport/device/comm_device.cuh>) or set num_ranks. Builds with
  // MOONCAKE_DEVICE_CHECKS=1 trap instead (comm_device.h).
  kIncompleteContext = 6,
};

// A "low-latency" slot: 8 bytes of data and a 32-bit flag written together
// (NCCL's LL protocol). Each 8-byte half carries the flag next to 32 bits of
// data, so a reader that sees the expected flag in both halves has seen the
// whole value even if the 16-byte store reached memory as two 8-byte pieces;
// no fence is needed between data and flag. Zero-initialise slots; see
// mc_put_signal_ll / mc_wait_ll for the flag rules.
struct alignas(16) McLLSlot {
  uint64_t lo;  // (flag << 32) | data[31:0]
  uint64_t hi;  // (flag << 32) | data[63:32]
};
static_assert(sizeof(McLLSlot) == 16, "McLLSlot must be one 16-byte store");

MC_HOST_DEVICE uint64_t mc_ll_pack(uint32_t data_part, uint32_t flag) {
  return (static_cast<uint64_t>(flag) << 32) | data_part;
}

template <class T>
MC_HOST_DEVICE bool mc_compare(T observed, McCmp cmp, T value) {
  switch (cmp) {
    case McCmp::kEq: return observed == value;
    case McCmp::kNe: return observed != value;
    case McCmp::kGe: return observed >= value;
    case McCmp::kGt: return observed > value;
    case McCmp::kLe: return observed <= value;
    case McCmp::kLt: return observed < value;
  }
  return false;
}

}  // namespace device
}  // namespace mooncake
