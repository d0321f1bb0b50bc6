// The copy-agent channel: shared memory between mooncaked's softnic and a
// client process's copy agent, which moves bytes into and out of that
// process's own GPU memory on its own CUDA stream (issue 24 item 11).
//
// Why: a copy the daemon runs in its own CUDA context waits for a time
// slice while the application's kernel spins on the GPU (about 2.4 ms on an
// H200; softnic/cuda_memory.h). The application's own context runs a copy
// on another stream beside its kernel at once. So softnic asks the agent of
// the process that owns the GPU memory to do the copy, through a staging
// area in this memory, and waits a bounded time for the answer.
//
// The client creates the channel: a memfd of kHeaderBytes + staging bytes,
// sealed against shrinking, every page written (the daemon touches only
// resident pages), and sends it with Rdma.AttachCopyAgent. Layout: the
// header (this struct) in the first page, the staging area after it.
//
// One request at a time (one WQE of the process's at a time):
//   daemon  writes `request`, then request_seq = seq (release); if
//           agent_sleeping, FUTEX_WAKE on request_seq.
//   agent   sees request_seq change (acquire), takes it (claim), runs the
//           copy on its stream, waits for it, writes `result`, then
//           done_seq = seq (release). A small request it hands to its
//           resident kernel instead (copy_agent_gate.h, Resident), which
//           writes busy_since_ns = 0, `result`, then done_seq itself.
//   daemon  waits for done_seq == seq (acquire), bounded; past the bound it
//           cancels the request, unless the agent took it first (claim);
//           a taken copy into GPU memory it calls off at the gate
//           (copy_agent_gate.h), so that it lands nothing later.
// A sleeping agent sets agent_sleeping, re-checks request_seq, then
// FUTEX_WAITs on it (a shared futex: both processes map the page).
//
// Trust: the daemon reads only done_seq, result, state, busy_since_ns,
// phase, claim, the gate's words and an atomic's answer (its old value and
// whether it ran) from this memory, never a pointer, a length or an
// offset: requests are its own, bounded by the staging size it was told in
// the RPC and checked against its own mapping. Its one compare-and-swap
// (claim) is bounded too. An agent can only hurt its own process: it
// copies between its own memory and the staging area, and the atomics it
// answers are on its own words (a false old value tells a peer no more
// than the process could by writing the word).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "mooncake/common/copy_agent_gate.h"

namespace mooncake::copy_agent {

inline constexpr uint32_t kMagic = 0x4143434d;  // "MCCA", little-endian
inline constexpr uint32_t kVersion = 4;         // 3: the gate; 4: within and atomics
inline constexpr uint64_t kHeaderBytes = 4096;  // the staging area starts here
inline constexpr uint64_t kMinStagingBytes = uint64_t{64} << 10;
inline constexpr uint64_t kMaxStagingBytes = uint64_t{16} << 20;
inline constexpr uint64_t kDefaultStagingBytes = uint64_t{4} << 20;

// Whether a staging area of `staging` bytes is one both sides accept: a
// multiple of the page size `page`, from kMinStagingBytes to
// kMaxStagingBytes. The client checks before it makes the channel, the
// daemon before it maps one.
inline absl::Status CheckStagingBytes(uint64_t staging, uint64_t page) {
  if (staging >= kMinStagingBytes && staging <= kMaxStagingBytes && page != 0 &&
      staging % page == 0) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat("copy agent staging of ", staging,
                                                 " bytes: give a multiple of ", page, " from ",
                                                 kMinStagingBytes, " to ", kMaxStagingBytes));
}

// Where the agent is in the current request (Channel::phase): which CUDA
// call a copy that takes too long sits in, for the daemon's message.
enum class Phase : uint32_t {
  kIdle = 0,
  kSubmitting = 1,  // inside cuLaunchKernel (a landing) or cuMemcpy*Async
  kWaiting = 2,     // the copy is queued; polling the stream until it ran
  kResident = 3,    // handed to the agent's resident kernel, not yet served
};

// The agent's state, which it writes.
enum class State : uint32_t {
  kStarting = 0,
  kServing = 1,  // answering requests
  kClosed = 2,   // gone for good: the daemon copies itself from now on
};

struct Channel {
  // Written by the client before attaching; read by the daemon once, when
  // it attaches: a sanity check of magic and version, and the token.
  alignas(64) uint32_t magic;
  uint32_t version;
  uint64_t staging_bytes;
  // Random, the same in every channel of one client process, read by the
  // daemon once: two channels of the same pid and token are one
  // process's.
  uint64_t process_token;
  // The agent's CUDA context (its handle as a number; 0: none), read by
  // the daemon once: two agents of one process in one context share its
  // address space, so either's kernel reaches the other's memory
  // (CopyAgentLink::Between). A false value can only make this process's
  // own kernel fault.
  uint64_t context;
  // Daemon -> agent.
  alignas(64) Request request;
  alignas(64) uint32_t request_seq;  // the futex word
  uint32_t agent_sleeping;           // 1 while the agent waits on the futex
  // Bumped by the daemon each time it writes newer bytes into the staging
  // range of a ToDevice copy it gave up waiting for (a "late copy"). While
  // that copy is still queued on its stream, the agent then queues the
  // same copy again behind it: a copy queued behind a lazy module load
  // carries the bytes it was submitted with, so only a copy submitted
  // after the daemon's write carries the newest (docs/rdma.md).
  uint32_t mirror_seq;
  // Agent -> daemon.
  alignas(64) uint32_t done_seq;
  int32_t result;  // 0: done; else the CUDA error of the copy
  uint32_t state;  // State
  uint32_t reserved;
  // CLOCK_MONOTONIC ns when the agent entered the CUDA calls of the
  // current request; 0 between requests. A CUDA call blocks while another
  // thread of the process synchronizes the context (cudaDeviceSynchronize),
  // which waits for a kernel that waits for this very copy: the daemon
  // stops waiting once this is old (CopyAgentLinkOptions::stall).
  uint64_t busy_since_ns;
  uint32_t phase;  // Phase; read only to word the daemon's message
  uint32_t reserved2;
  // Who decided request `seq` first (both sides, compare-and-swap): the
  // agent takes it (claim = seq) before it runs the copy; the daemon gives
  // up on one nobody took (claim = seq | kCancelled), and the agent then
  // skips it. So a request the agent never took cannot land later: only a
  // taken one can (the daemon's "late copy").
  alignas(64) uint64_t claim;
  // How a taken copy into GPU memory is called off after its submission
  // (copy_agent_gate.h). When gate.gated is 0, a taken copy that the daemon
  // gave up on may still land: mirror_seq keeps it carrying the newest
  // bytes the daemon wrote.
  Gate gate;
  // The agent's and its resident kernel's alone (copy_agent_gate.h); the
  // daemon never reads it.
  Resident resident;
};
inline constexpr uint64_t kCancelled = uint64_t{1} << 32;
static_assert(sizeof(Channel) <= kHeaderBytes);

// Every field of the channel is shared with another process: both sides
// reach it only atomically, through this.
template <class T>
std::atomic_ref<T> Ref(T& field) {
  return std::atomic_ref<T>(field);
}

// Settles Channel::claim for request `seq` to `mine` (seq: the agent takes
// it; seq | kCancelled: the daemon gives up on it) unless the other side
// settled it first. Returns the settled value; after 64 failed attempts
// (the word keeps changing: only a hostile process does that) the last
// value seen, which the daemon then treats as "taken".
inline uint64_t Settle(Channel& c, uint32_t seq, uint64_t mine) {
  uint64_t cur = Ref(c.claim).load(std::memory_order_acquire);
  for (int tries = 0; tries < 64 && static_cast<uint32_t>(cur) != seq; ++tries) {
    if (Ref(c.claim).compare_exchange_weak(cur, mine, std::memory_order_acq_rel,
                                           std::memory_order_acquire)) {
      return mine;
    }
  }
  return cur;
}
static_assert(offsetof(Channel, request_seq) % 64 == 0);
static_assert(offsetof(Channel, done_seq) % 64 == 0);

}  // namespace mooncake::copy_agent
