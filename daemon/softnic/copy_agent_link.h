// CopyAgentLink: softnic's end of one client process's copy agent (the
// channel is described in mooncake/common/copy_agent_channel.h). The engine
// asks it to move bytes into and out of that process's GPU memory; the
// agent runs each copy on its own stream in its own CUDA context, beside
// the process's spinning kernels, where a copy in the daemon's context
// would wait for a GPU time slice (softnic/cuda_memory.h).
//
//   auto link = CopyAgentLink::Create(mapping, staging_bytes, pid, {});
//   engine.AttachCopyAgent(session, *link);  // the session's GPU regions use it
//
// Every call is bounded. A request the agent does not take within
// `timeout` (it is cancelled: an agent that wakes later skips it), a
// channel it marks closed, or a page of it no longer in memory, ends the
// link for good (usable() false, logged once): the engine
// copies through its own CUDA context from then on (slow, but correct). An
// agent that took a request but sits in a CUDA call longer than `stall`
// is blocked, in practice by another thread of its process synchronizing
// the context while a kernel waits for this copy: the link pauses (the
// engine copies that request and the next ones itself) until the blocked
// copy completes, then serves again. A request the agent answers with a
// CUDA error fails only that copy (the engine then tries its own context).
//
// A copy into GPU memory that the agent took but did not answer is called
// off at the gate (mooncake/common/copy_agent_gate.h) when the agent lands
// through its kernel: then nothing of it lands later. A plain copy may
// still land later: MirrorIntoLateCopy keeps what it would write equal to
// what the engine wrote there since, so it cannot undo a later write of
// the engine's (the application's own later writes it cannot cover: the
// gate exists for those).
//
// Thread-safety: calls are serialized by an internal mutex (the engine
// calls from its GPU workers, softnic/gpu_workers.h, without its own lock:
// a link that stalls holds up only the WQEs that need it). A copy between
// two processes' links takes both (Between), in address order; one within
// a process takes the destination's alone; no call takes another link's
// lock while holding its own otherwise.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "mooncake/common/copy_agent_channel.h"
#include "softnic/shared_mapping.h"

namespace mooncake::softnic {

struct CopyAgentLinkOptions {
  // How long one request may take, the copy included (a staging chunk is at
  // most 16 MiB: milliseconds at PCIe speed).
  absl::Duration timeout = absl::Seconds(2);
  // How long the daemon spins on the answer before it sleeps between looks.
  absl::Duration spin = absl::Microseconds(200);
  // How long the agent may sit inside the CUDA calls of one request (it
  // says since when: Channel::busy_since_ns). Longer means a CUDA call of
  // the agent is blocked, in practice by another thread of its process
  // synchronizing the context (cudaDeviceSynchronize, a synchronous
  // cudaMemcpy) while a kernel waits for this copy: it would wait forever.
  // A staged piece of 16 MiB takes about a millisecond; a GPU shared by
  // several processes adds a time slice (2.4 ms) or two.
  absl::Duration stall = absl::Milliseconds(20);
  // How long a landing kernel that passed the gate before the daemon called
  // its request off may take to finish (copy_agent_gate.h): it is running,
  // so microseconds, or a time slice when processes share the GPU.
  // Past it the copy counts as one that may land (mirrored; but a landing
  // has read its bytes already): long, so that only a GPU that stopped
  // running the block gets there.
  absl::Duration landing = absl::Seconds(2);
  // The slowest pace a call (ToDevice, FromDevice, WithinDevice, one side
  // of Between) may keep: after moving k bytes it may have taken `timeout`
  // plus k at this rate. Each request alone is bounded by `timeout`, so an
  // agent answering every piece just inside it held a GPU worker for hours
  // on one large WRITE (a 2 GiB WRITE through a 64 KiB staging area is
  // 32768 requests). Slower ends the link: softnic copies itself after.
  uint64_t min_bytes_per_second = 64ull << 20;
};

class CopyAgentLink {
 public:
  // Over `mapping` (the whole channel memfd, header and staging; mapped by
  // the daemon from a populated, sealed memfd). `staging_bytes` is what the
  // client said in the RPC: mapping->size() must be kHeaderBytes plus it,
  // within [kMinStagingBytes, kMaxStagingBytes]. `pid`: the agent's process
  // (SO_PEERCRED of its session), for the log. InvalidArgument for a size or header that does not
  // fit; FailedPrecondition when the agent has already closed.
  static absl::StatusOr<std::shared_ptr<CopyAgentLink>> Create(
      std::shared_ptr<SharedMapping> mapping, uint64_t staging_bytes, int32_t pid,
      CopyAgentLinkOptions options);

  // Whether requests still go to the agent.
  bool usable() const;
  int32_t pid() const { return pid_; }
  uint64_t staging_bytes() const { return staging_bytes_; }

  // host[0, n) -> the agent's device address `dst`, through the staging
  // area in pieces of at most staging_bytes().
  absl::Status ToDevice(uint64_t dst, const uint8_t* host, uint64_t n);
  // The agent's device address `src`, n bytes, handed to `sink` piece by
  // piece (each piece's bytes, its offset from src, its length) from the
  // staging area. A sink that returns false stops the copy (Aborted).
  using Sink = std::function<bool(const uint8_t* piece, uint64_t offset, uint64_t length)>;
  absl::Status FromDevice(uint64_t src, uint64_t n, const Sink& sink);
  // src -> dst, both addresses of the agent's process. A gated agent
  // lands each piece straight from src (one request): its blocks read src
  // only past the gate, so one called off reads and writes nothing. An
  // ungated one goes through the staging area, two requests per piece,
  // never a device-to-device copy: a plain copy the agent is blocked on
  // lands late (see the header comment), and one that read its source then
  // could write bytes the engine cannot keep current; one from the staging
  // area carries what MirrorIntoLateCopy put there.
  absl::Status WithinDevice(uint64_t dst, uint64_t src, uint64_t n);
  // The NIC's fetch-add on the agent's GPU word `word` (8 bytes; masked: a
  // 4-byte masked fetch-add with `field_boundary`), run by the agent's
  // kernel beside the process's kernels. An atomic cannot be undone or run
  // twice, so the outcome says whether it ran:
  //   kApplied     it ran; `old` is the word before the add;
  //   kNotApplied  it did not and never will (no gated agent, not sent,
  //                cancelled before the agent took it, called off at the
  //                gate, or a CUDA error before it ran): the caller runs
  //                it another way;
  //   kUnknown     the kernel passed the gate and did not finish within
  //                options.landing: it may still add, so the caller must
  //                not (the WQE fails).
  // `why`: the reason for the last two.
  struct AtomicOutcome {
    enum class Kind { kApplied, kNotApplied, kUnknown } kind;
    uint64_t old = 0;
    absl::Status why;
  };
  AtomicOutcome FetchAdd(uint64_t word, bool masked, uint64_t add, uint32_t field_boundary);
  // `src`'s device bytes at src_addr -> `dst`'s at dst_addr, two links
  // (one: WithinDevice). Two agents of one process in one CUDA context
  // (the same pid, process token and context: two sessions of one
  // process, as ranks sharing a GPU have): dst's agent copies within its
  // process (WithinDevice on dst, dst's lock alone). Otherwise two
  // processes: out through src's
  // staging area, in through dst's, piece by piece, with both links locked
  // (in address order, so two threads copying each way between the same
  // two processes cannot wait for each other). Never a sink that takes the
  // other link's lock inside FromDevice: that is the deadlock.
  static absl::Status Between(CopyAgentLink& src, uint64_t src_addr, CopyAgentLink& dst,
                              uint64_t dst_addr, uint64_t n) ABSL_NO_THREAD_SAFETY_ANALYSIS;

  // After the link ended on a request into GPU memory (ToDevice) that the
  // agent did not answer, that copy may still land later, from the staging
  // area, once its CUDA call unblocks. The engine then writes the same
  // process's memory itself; before each such write it calls this with the
  // bytes it is about to write at `dst`: where they overlap the late copy's
  // range, they go into the staging area too, so the late copy carries the
  // newest bytes instead of old ones. Nothing once the late copy has been
  // answered, or when there is none.
  void MirrorIntoLateCopy(uint64_t dst, const uint8_t* bytes, uint64_t n);
  // MirrorIntoLateCopy, then `write` (the engine's own write of those
  // bytes), as one step among such steps (their own mutex, not the link's:
  // the write can wait for a GPU time slice): no other write into this
  // process's memory through this path comes between, so the late copy and
  // the memory end up with the same bytes whoever wrote last. Returns
  // write().
  bool MirrorThenWrite(uint64_t dst, const uint8_t* bytes, uint64_t n,
                       absl::FunctionRef<bool()> write);
  // Whether [dst, dst + n) overlaps a late copy still pending (above).
  bool LateCopyOverlaps(uint64_t dst, uint64_t n) const;

  // Requests the agent completed (tests, listings).
  uint64_t requests_done() const;
  ~CopyAgentLink();  // logs how many requests it sent and their mean round trip

 private:
  CopyAgentLink(std::shared_ptr<SharedMapping> mapping, uint64_t staging_bytes, int32_t pid,
                CopyAgentLinkOptions options);
  // What became of a request RunLocked sent: its number (0: it never went
  // out), and whether it may still write GPU memory: its kernel passed the
  // gate and did not finish within options.landing, after the link gave
  // up on it or after the agent answered it with a CUDA error.
  struct Sent {
    uint32_t seq = 0;
    bool may_still_land = false;
  };
  // Sends one request and waits for its answer; `stage_in` (kToDevice,
  // an atomic's blank answer): the bytes to put in the staging area first,
  // or null when they are there already. A request of a gated agent that
  // writes GPU memory and is answered with a CUDA error is called off at
  // the gate before this returns: the caller redoes it.
  absl::Status RunLocked(copy_agent::Op op, uint64_t dst, uint64_t src, uint64_t bytes,
                         const uint8_t* stage_in, uint32_t field_boundary = 0, Sent* sent = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether the agent decides its writes to GPU memory at the gate (it
  // loaded its kernels): only then does it get kWithinDevice and atomics.
  bool GatedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the link for good, logging why once.
  absl::Status EndLocked(absl::Status why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // OK while `spent` on this link's requests of a call that moved `moved`
  // of its `total` bytes keeps min_bytes_per_second; else ends the link.
  absl::Status PaceLocked(std::chrono::nanoseconds spent, uint64_t moved, uint64_t total)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  copy_agent::Channel* channel() const;
  uint8_t* staging() const;

  const std::shared_ptr<SharedMapping> mapping_;
  const uint64_t staging_bytes_;
  const int32_t pid_;
  // Read from the channel once, at Create (Between): the client's process
  // token and its agent's CUDA context (0: not known).
  uint64_t process_token_ = 0;
  uint64_t context_ = 0;
  // Whether `other` is an agent of the same process in the same CUDA
  // context, so that either reaches the other's memory with a kernel.
  bool SameProcessAndContext(const CopyAgentLink& other) const;
  const CopyAgentLinkOptions options_;
  mutable absl::Mutex mu_;
  absl::Mutex mirror_mu_ ABSL_ACQUIRED_BEFORE(mu_);  // MirrorThenWrite's steps, one at a time
  uint32_t seq_ ABSL_GUARDED_BY(mu_) = 0;
  // The last request called off at the gate: never a request number again
  // (nor 0, the gate's first value), or its landing would skip after the
  // 32-bit sequence wraps.
  uint32_t called_off_seq_ ABSL_GUARDED_BY(mu_) = 0;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t done_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t round_trip_ns_ ABSL_GUARDED_BY(mu_) = 0;
  // A ToDevice request that ended the link unanswered (MirrorIntoLateCopy).
  struct LateCopy {
    uint32_t seq = 0;
    copy_agent::Op op = copy_agent::Op::kNone;
    uint64_t dst = 0;
    uint64_t bytes = 0;
    // When the request went out (the log says how late it was).
    std::chrono::steady_clock::time_point sent;
    // Whether it can still write GPU memory: a request that writes it
    // (all but kFromDevice) the gate could not call off. False otherwise:
    // it still holds the agent (the link stays paused until it is
    // answered) but writes nothing.
    bool may_land = true;
  };
  // Paused on a blocked CUDA call of the agent (stall): late_ is that
  // request; the link serves again once it is answered.
  bool paused_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t pauses_ ABSL_GUARDED_BY(mu_) = 0;
  mutable std::optional<LateCopy> late_ ABSL_GUARDED_BY(mu_);
  void MirrorLocked(uint64_t dst, const uint8_t* bytes, uint64_t n)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops late_ once the agent answered it.
  void SettleLateLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Calls request `seq` (a copy of `bytes` into GPU memory) off at the
  // gate: true when nothing of it can land any more (the agent lands
  // through its kernel, and every block that passed the gate first has
  // finished within options_.landing); false for a plain copy.
  bool CallOffLocked(uint32_t seq, uint64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The late copy for request `seq`, called off where it can be.
  LateCopy LateLocked(uint32_t seq, copy_agent::Op op, uint64_t dst, uint64_t bytes,
                      std::chrono::steady_clock::time_point sent)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
};

}  // namespace mooncake::softnic
