#include "softnic/copy_agent_link.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "mooncake/common/log.h"
#include "mooncake/common/status.h"

namespace mooncake::softnic {
namespace {

using copy_agent::Channel;
using copy_agent::Op;
using copy_agent::Phase;
using copy_agent::Ref;
using copy_agent::State;

}  // namespace

absl::StatusOr<std::shared_ptr<CopyAgentLink>> CopyAgentLink::Create(
    std::shared_ptr<SharedMapping> mapping, uint64_t staging_bytes, int32_t pid,
    CopyAgentLinkOptions options) {
  if (mapping == nullptr) return absl::InvalidArgumentError("no channel memory");
  MC_RETURN_IF_ERROR(copy_agent::CheckStagingBytes(staging_bytes, SharedMapping::PageSize()));
  if (mapping->size() != copy_agent::kHeaderBytes + staging_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("copy agent channel of ", mapping->size(), " bytes mapped; the header (",
                     copy_agent::kHeaderBytes, ") and the staging area (", staging_bytes, ") make ",
                     copy_agent::kHeaderBytes + staging_bytes));
  }
  auto* c = reinterpret_cast<Channel*>(mapping->data());
  const uint32_t magic = Ref(c->magic).load(std::memory_order_relaxed);
  const uint32_t version = Ref(c->version).load(std::memory_order_relaxed);
  if (magic != copy_agent::kMagic || version != copy_agent::kVersion) {
    return absl::InvalidArgumentError(absl::StrCat(
        "copy agent channel header: magic 0x", absl::Hex(magic), " version ", version,
        "; this daemon speaks version ", copy_agent::kVersion, " (client and daemon differ?)"));
  }
  if (Ref(c->state).load(std::memory_order_acquire) == static_cast<uint32_t>(State::kClosed)) {
    return absl::FailedPreconditionError("the copy agent has already closed its channel");
  }
  // The daemon's sequence continues from whatever the memory holds, so a
  // stale done_seq can never answer a request of this link.
  std::shared_ptr<CopyAgentLink> link(
      new CopyAgentLink(std::move(mapping), staging_bytes, pid, options));
  {
    absl::MutexLock lock(&link->mu_);
    link->seq_ = Ref(c->request_seq).load(std::memory_order_relaxed);
  }
  link->process_token_ = Ref(c->process_token).load(std::memory_order_relaxed);
  link->context_ = Ref(c->context).load(std::memory_order_relaxed);
  return link;
}

CopyAgentLink::CopyAgentLink(std::shared_ptr<SharedMapping> mapping, uint64_t staging_bytes,
                             int32_t pid, CopyAgentLinkOptions options)
    : mapping_(std::move(mapping)), staging_bytes_(staging_bytes), pid_(pid), options_(options) {}

Channel* CopyAgentLink::channel() const { return reinterpret_cast<Channel*>(mapping_->data()); }
uint8_t* CopyAgentLink::staging() const { return mapping_->data() + copy_agent::kHeaderBytes; }

bool CopyAgentLink::usable() const {
  absl::MutexLock lock(&mu_);
  if (paused_) SettleLateLocked();
  return !ended_ && (!paused_ || !late_) &&
         Ref(channel()->state).load(std::memory_order_relaxed) !=
             static_cast<uint32_t>(State::kClosed);
}

uint64_t CopyAgentLink::requests_done() const {
  absl::MutexLock lock(&mu_);
  return done_;
}

absl::Status CopyAgentLink::EndLocked(absl::Status why) {
  if (!ended_) {
    ended_ = true;
    MC_LOG(kWarning, "softnic: the copy agent of pid ", pid_, " is no longer used (", why.message(),
           "): GPU copies for its memory run in mooncaked's own CUDA context");
  }
  return why;
}

absl::Status CopyAgentLink::PaceLocked(std::chrono::nanoseconds spent, uint64_t moved,
                                       uint64_t total) {
  const double allowed_s = absl::ToDoubleSeconds(options_.timeout) +
                           static_cast<double>(moved) / static_cast<double>(std::max<uint64_t>(
                                                            1, options_.min_bytes_per_second));
  const double spent_s = std::chrono::duration<double>(spent).count();
  if (spent_s <= allowed_s) return absl::OkStatus();
  return EndLocked(absl::DeadlineExceededError(
      absl::StrCat("a ", total, "-byte copy moved ", moved, " bytes in ",
                   absl::FormatDuration(absl::Seconds(spent_s)), ", slower than ",
                   options_.min_bytes_per_second >> 20, " MiB/s")));
}

absl::Status CopyAgentLink::RunLocked(Op op, uint64_t dst, uint64_t src, uint64_t bytes,
                                      const uint8_t* stage_in, uint32_t field_boundary,
                                      Sent* sent) {
  Sent ignored;
  if (sent == nullptr) sent = &ignored;
  *sent = Sent{};
  if (ended_) return absl::FailedPreconditionError("the copy agent link has ended");
  if (paused_) {
    SettleLateLocked();
    if (late_) return absl::UnavailableError("the copy agent is paused on a blocked copy");
    paused_ = false;  // the blocked copy completed: the agent serves again
  }
  Channel* c = channel();
  // The daemon writes the header and the staging area: pages the client
  // punched out since would be faulted in on the daemon's account. A
  // channel the daemon sealed (rdma/sealed_memfd_mappings.h) cannot lose
  // pages and needs no look; otherwise only what this request touches is
  // looked at (a mincore of 1000 pages costs microseconds on every WQE).
  const uint64_t touched = copy_agent::kHeaderBytes + bytes;
  if (!mapping_->resident(mapping_->data(), touched)) {
    return EndLocked(
        absl::FailedPreconditionError("a page of the copy agent's channel is no longer in memory"));
  }
  if (Ref(c->state).load(std::memory_order_acquire) == static_cast<uint32_t>(State::kClosed)) {
    return EndLocked(absl::UnavailableError("the agent closed its channel"));
  }
  // Only now, past the checks: while a late copy may still read the
  // staging area (paused), nothing but MirrorIntoLateCopy writes it.
  if (stage_in != nullptr) std::memcpy(staging(), stage_in, bytes);
  Ref(c->request.op).store(static_cast<uint32_t>(op), std::memory_order_relaxed);
  Ref(c->request.field_boundary).store(field_boundary, std::memory_order_relaxed);
  Ref(c->request.dst).store(dst, std::memory_order_relaxed);
  Ref(c->request.src).store(src, std::memory_order_relaxed);
  Ref(c->request.bytes).store(bytes, std::memory_order_relaxed);
  Ref(c->request.staging_offset).store(0, std::memory_order_relaxed);
  uint32_t seq = ++seq_;
  while (seq == 0 || seq == called_off_seq_) seq = ++seq_;
  Ref(c->request_seq).store(seq, std::memory_order_release);
  sent->seq = seq;
  // The agent sets agent_sleeping, then re-reads request_seq before it
  // sleeps; this side stores request_seq, then reads agent_sleeping. With a
  // full fence on both sides one of them sees the other.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (Ref(c->agent_sleeping).load(std::memory_order_relaxed) != 0) {
    ::syscall(SYS_futex, &c->request_seq, FUTEX_WAKE, 1, nullptr, nullptr, 0);
  }
  const auto start = std::chrono::steady_clock::now();
  const auto spin = absl::ToChronoNanoseconds(options_.spin);
  const auto deadline = start + absl::ToChronoNanoseconds(options_.timeout);
  const uint64_t stall_ns = static_cast<uint64_t>(absl::ToInt64Nanoseconds(options_.stall));
  // An unanswered copy into GPU memory may still land later (see
  // MirrorIntoLateCopy); other kinds write only the staging area.
  const auto unanswered = [&](absl::Status why) {
    // Cancelled unless the agent took it first; only a taken request can
    // still land (copy_agent_channel.h, claim).
    if (copy_agent::Settle(*c, seq, seq | copy_agent::kCancelled) !=
        (seq | copy_agent::kCancelled)) {
      late_ = LateLocked(seq, op, dst, bytes, start);
      sent->may_still_land = late_->may_land;
    }
    return EndLocked(std::move(why));
  };
  // A CUDA call that blocks: the agent is alive, so the link only pauses
  // until that call returns and the request is answered (RunLocked).
  const auto stalled = [&](absl::Status why) {
    late_ = LateLocked(seq, op, dst, bytes, start);
    sent->may_still_land = late_->may_land;
    if (!paused_) {
      paused_ = true;
      ++pauses_;
      // The first, then at powers of two: a process that synchronizes
      // while its kernels wait does so every iteration.
      if ((pauses_ & (pauses_ - 1)) == 0) {
        MC_LOG(kWarning, "softnic: the copy agent of pid ", pid_, " is paused (", why.message(),
               "); mooncaked copies in its own CUDA context until the blocked copy completes (",
               pauses_, " pauses so far)");
      }
    }
    return why;
  };
  long sleep_ns = 1000;
  while (Ref(c->done_seq).load(std::memory_order_acquire) != seq) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      return unanswered(absl::DeadlineExceededError(absl::StrCat(
          "a ", bytes, "-byte copy got no answer in ", absl::FormatDuration(options_.timeout))));
    }
    const uint64_t busy_since = Ref(c->busy_since_ns).load(std::memory_order_relaxed);
    if (busy_since != 0) {
      timespec mono{};
      ::clock_gettime(CLOCK_MONOTONIC, &mono);
      const uint64_t mono_ns = uint64_t(mono.tv_sec) * 1'000'000'000ull + uint64_t(mono.tv_nsec);
      if (mono_ns > busy_since && mono_ns - busy_since > stall_ns) {
        const auto phase = static_cast<Phase>(Ref(c->phase).load(std::memory_order_relaxed));
        const char* where =
            phase == Phase::kSubmitting ? "inside the agent's submit call (cuLaunchKernel or "
                                          "cuMemcpy*Async)"
            : phase == Phase::kResident ? "with the agent's resident kernel, unserved"
                                        : "queued on the agent's stream without running";
        const char* why =
            phase == Phase::kSubmitting
                ? ": another thread of the process is probably in a synchronous CUDA call that "
                  "waits for the kernel (cudaMemcpy into pageable memory, for one)"
            : phase == Phase::kResident
                ? ": the GPU is not running that kernel (every SM taken, or another process's "
                  "time slice)"
                : ": the context probably holds new work until its kernels end (another thread "
                  "loading a kernel for the first time under CUDA's lazy loading; "
                  "CUDA_MODULE_LOADING=EAGER avoids it)";
        return stalled(absl::DeadlineExceededError(
            absl::StrCat("a ", bytes, "-byte copy has been ", where, " for ",
                         (mono_ns - busy_since) / 1'000'000, " ms", why)));
      }
    }
    if (Ref(c->state).load(std::memory_order_relaxed) == static_cast<uint32_t>(State::kClosed)) {
      return unanswered(absl::UnavailableError("the agent closed its channel mid-request"));
    }
    if (now - start < spin) {
      __builtin_ia32_pause();
      continue;
    }
    // Beyond the spin: a copy that long is a big one; look every few
    // microseconds up to 100 us.
    const timespec ts{0, sleep_ns};
    ::nanosleep(&ts, nullptr);
    sleep_ns = std::min(sleep_ns * 2, 100'000L);
  }
  const int32_t result = Ref(c->result).load(std::memory_order_relaxed);
  if (result != 0) {
    absl::Status failed =
        absl::InternalError(absl::StrCat("the copy agent of pid ", pid_, " failed a ", bytes,
                                         "-byte request with CUDA error ", result));
    // The agent answers as soon as a CUDA call fails, but a kernel it
    // queued before the failure may still run: the caller is about to
    // redo the request (a copy, an atomic), so it is called off at the
    // gate first. One that passed the gate and does not finish may still
    // write: the agent is not asked again.
    if (copy_agent::WritesGpuMemory(op) && GatedLocked() && !CallOffLocked(seq, bytes)) {
      sent->may_still_land = true;
      return EndLocked(absl::InternalError(
          absl::StrCat(failed.message(), ", and its kernel passed the gate without finishing")));
    }
    return failed;
  }
  ++done_;
  round_trip_ns_ += static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start)
          .count());
  return absl::OkStatus();
}

CopyAgentLink::~CopyAgentLink() {
  if (done_ > 0) {
    MC_LOG(kInfo, "softnic: the copy agent of pid ", pid_, " answered ", done_, " requests, ",
           round_trip_ns_ / done_ / 1000.0,
           " us each on average from request to "
           "answer");
  }
}

bool CopyAgentLink::CallOffLocked(uint32_t seq, uint64_t bytes) {
  copy_agent::Gate& gate = channel()->gate;
  if (Ref(gate.gated).load(std::memory_order_acquire) != 1) return false;
  // The daemon's half of the handshake (copy_agent_gate.h): the store, a
  // full fence, then the blocks' intents.
  called_off_seq_ = seq;
  Ref(gate.cancel_seq).store(seq, std::memory_order_seq_cst);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  const auto deadline =
      std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(options_.landing);
  const uint32_t blocks = copy_agent::LandingBlocks(bytes);
  for (uint32_t b = 0; b < blocks; ++b) {
    if (Ref(gate.intent[b]).load(std::memory_order_seq_cst) != seq) continue;
    // This block passed the gate before the cancel: it is writing now.
    while (Ref(gate.landed[b]).load(std::memory_order_acquire) != seq) {
      if (std::chrono::steady_clock::now() >= deadline) return false;
      std::this_thread::yield();
    }
  }
  return true;
}

CopyAgentLink::LateCopy CopyAgentLink::LateLocked(uint32_t seq, Op op, uint64_t dst, uint64_t bytes,
                                                  std::chrono::steady_clock::time_point sent) {
  LateCopy late{seq, op, dst, bytes, sent};
  late.may_land = copy_agent::WritesGpuMemory(op) && !CallOffLocked(seq, bytes);
  return late;
}

void CopyAgentLink::SettleLateLocked() const {
  if (late_ && Ref(channel()->done_seq).load(std::memory_order_acquire) == late_->seq) {
    // It landed (or, called off, ran and wrote nothing): nothing later can
    // be overwritten by it. Logged as the pauses are (the first, then at
    // powers of two).
    if ((pauses_ & (pauses_ - 1)) == 0) {
      MC_LOG(kInfo, "softnic: the copy agent of pid ", pid_, " answered a ", late_->bytes,
             "-byte copy ",
             absl::FormatDuration(absl::FromChrono(std::chrono::steady_clock::now() - late_->sent)),
             " after it was asked (it had been given up on",
             late_->may_land ? "" : " and called off: it wrote nothing", ")");
    }
    late_.reset();
  }
}

bool CopyAgentLink::LateCopyOverlaps(uint64_t dst, uint64_t n) const {
  absl::MutexLock lock(&mu_);
  SettleLateLocked();
  return late_ && late_->may_land && dst < late_->dst + late_->bytes && late_->dst < dst + n;
}

void CopyAgentLink::MirrorIntoLateCopy(uint64_t dst, const uint8_t* bytes, uint64_t n) {
  absl::MutexLock lock(&mu_);
  MirrorLocked(dst, bytes, n);
}

bool CopyAgentLink::MirrorThenWrite(uint64_t dst, const uint8_t* bytes, uint64_t n,
                                    absl::FunctionRef<bool()> write) {
  // Not mu_ across the write: it is a copy in the daemon's context, which
  // can wait for a time slice, and mu_ answers usable() to the engine.
  absl::MutexLock pair(&mirror_mu_);
  {
    absl::MutexLock lock(&mu_);
    MirrorLocked(dst, bytes, n);
  }
  return write();
}

void CopyAgentLink::MirrorLocked(uint64_t dst, const uint8_t* bytes, uint64_t n) {
  SettleLateLocked();
  // Only a copy from the staging area can carry newer bytes; the other
  // kinds that may still land (a copy within the GPU, an atomic, both
  // through the gate) read nothing the daemon can keep current.
  if (!late_ || !late_->may_land || late_->op != Op::kToDevice) return;
  const uint64_t lo = std::max(dst, late_->dst);
  const uint64_t hi = std::min(dst + n, late_->dst + late_->bytes);
  if (lo >= hi) return;
  // The late copy reads staging[0, bytes) (its request's offset is 0).
  uint8_t* at = staging() + (lo - late_->dst);
  if (!mapping_->resident(at, hi - lo)) return;
  std::memcpy(at, bytes + (lo - dst), hi - lo);
  // The agent queues the copy again, now carrying these bytes (the
  // channel header).
  Ref(channel()->mirror_seq).fetch_add(1, std::memory_order_release);
}

absl::Status CopyAgentLink::ToDevice(uint64_t dst, const uint8_t* host, uint64_t n) {
  absl::MutexLock lock(&mu_);
  const auto start = std::chrono::steady_clock::now();
  for (uint64_t off = 0; off < n;) {
    const uint64_t len = std::min(n - off, staging_bytes_);
    if (absl::Status s = RunLocked(Op::kToDevice, dst + off, 0, len, host + off); !s.ok()) return s;
    off += len;
    MC_RETURN_IF_ERROR(PaceLocked(std::chrono::steady_clock::now() - start, off, n));
  }
  return absl::OkStatus();
}

absl::Status CopyAgentLink::FromDevice(uint64_t src, uint64_t n, const Sink& sink) {
  absl::MutexLock lock(&mu_);
  // The sink's time is the engine's, not the agent's.
  std::chrono::nanoseconds spent{0};
  for (uint64_t off = 0; off < n;) {
    const uint64_t len = std::min(n - off, staging_bytes_);
    const auto t0 = std::chrono::steady_clock::now();
    if (absl::Status s = RunLocked(Op::kFromDevice, 0, src + off, len, nullptr); !s.ok()) return s;
    spent += std::chrono::steady_clock::now() - t0;
    MC_RETURN_IF_ERROR(PaceLocked(spent, off + len, n));
    if (!sink(staging(), off, len)) return absl::AbortedError("the copy's destination refused");
    off += len;
  }
  return absl::OkStatus();
}

bool CopyAgentLink::SameProcessAndContext(const CopyAgentLink& other) const {
  return pid_ > 0 && pid_ == other.pid_ && process_token_ != 0 &&
         process_token_ == other.process_token_ && context_ != 0 && context_ == other.context_;
}

absl::Status CopyAgentLink::Between(CopyAgentLink& src, uint64_t src_addr, CopyAgentLink& dst,
                                    uint64_t dst_addr, uint64_t n) {
  if (&src == &dst) return src.WithinDevice(dst_addr, src_addr, n);
  // One process, one context: its addresses mean the same to both agents,
  // so dst's reaches src's memory (one landing per piece when gated). Only
  // the process itself can make two channels match (the token is random
  // and its own), and a false context can only fault its own kernel.
  if (src.SameProcessAndContext(dst)) return dst.WithinDevice(dst_addr, src_addr, n);
  // Both locks, always in address order: two workers copying A -> B and
  // B -> A at once would otherwise each hold one and wait for the other.
  CopyAgentLink* first = &src < &dst ? &src : &dst;
  CopyAgentLink* second = first == &src ? &dst : &src;
  absl::MutexLock lock_first(&first->mu_);
  absl::MutexLock lock_second(&second->mu_);
  // Each side's pace on its own time: a slow agent ends its own link, not
  // the other process's.
  std::chrono::nanoseconds out_spent{0}, in_spent{0};
  for (uint64_t off = 0; off < n;) {
    const uint64_t len = std::min(n - off, src.staging_bytes_);
    auto t0 = std::chrono::steady_clock::now();
    if (absl::Status s = src.RunLocked(Op::kFromDevice, 0, src_addr + off, len, nullptr); !s.ok()) {
      return s;
    }
    out_spent += std::chrono::steady_clock::now() - t0;
    MC_RETURN_IF_ERROR(src.PaceLocked(out_spent, off + len, n));
    for (uint64_t in = 0; in < len;) {
      const uint64_t piece = std::min(len - in, dst.staging_bytes_);
      t0 = std::chrono::steady_clock::now();
      if (absl::Status s =
              dst.RunLocked(Op::kToDevice, dst_addr + off + in, 0, piece, src.staging() + in);
          !s.ok()) {
        return s;
      }
      in_spent += std::chrono::steady_clock::now() - t0;
      in += piece;
      MC_RETURN_IF_ERROR(dst.PaceLocked(in_spent, off + in, n));
    }
    off += len;
  }
  return absl::OkStatus();
}

bool CopyAgentLink::GatedLocked() const {
  // The header page is looked at first: on a channel the daemon could not
  // seal, a page the client punched out is not faulted in on the daemon's
  // account (RunLocked then ends the link).
  return mapping_->resident(mapping_->data(), copy_agent::kHeaderBytes) &&
         Ref(channel()->gate.gated).load(std::memory_order_acquire) == 1;
}

absl::Status CopyAgentLink::WithinDevice(uint64_t dst, uint64_t src, uint64_t n) {
  absl::MutexLock lock(&mu_);
  const auto start = std::chrono::steady_clock::now();
  // A gated agent lands each piece straight from src: one request, and a
  // landing called off reads nothing (copy_agent_gate.h, kWithinDevice).
  const bool direct = GatedLocked();
  for (uint64_t off = 0; off < n;) {
    const uint64_t len = std::min(n - off, staging_bytes_);
    if (direct) {
      if (absl::Status s = RunLocked(Op::kWithinDevice, dst + off, src + off, len, nullptr);
          !s.ok()) {
        return s;
      }
    } else {
      // Out to the staging area, then in from it: the bytes stay there.
      if (absl::Status s = RunLocked(Op::kFromDevice, 0, src + off, len, nullptr); !s.ok()) {
        return s;
      }
      if (absl::Status s = RunLocked(Op::kToDevice, dst + off, 0, len, nullptr); !s.ok()) return s;
    }
    off += len;
    MC_RETURN_IF_ERROR(PaceLocked(std::chrono::steady_clock::now() - start, off, n));
  }
  return absl::OkStatus();
}

CopyAgentLink::AtomicOutcome CopyAgentLink::FetchAdd(uint64_t word, bool masked, uint64_t add,
                                                     uint32_t field_boundary) {
  using Kind = AtomicOutcome::Kind;
  absl::MutexLock lock(&mu_);
  if (!GatedLocked()) {
    return {Kind::kNotApplied, 0,
            absl::FailedPreconditionError("the copy agent has no atomic kernel")};
  }
  // The answer's place, cleared with the request: a request that never ran
  // leaves `applied` at 0, which no request number is.
  const copy_agent::AtomicAnswer blank{};
  Sent sent;
  absl::Status s =
      RunLocked(masked ? Op::kMaskedFetchAdd32 : Op::kFetchAdd64, word, add, sizeof(blank),
                reinterpret_cast<const uint8_t*>(&blank), field_boundary, &sent);
  if (sent.seq == 0) return {Kind::kNotApplied, 0, std::move(s)};  // never asked
  Channel* c = channel();
  if (sent.may_still_land && !(Ref(c->done_seq).load(std::memory_order_acquire) == sent.seq &&
                               Ref(c->result).load(std::memory_order_relaxed) == 0)) {
    // Past the gate and not finished within the landing bound (nor
    // answered as done since): it may still add, so nobody else may.
    return {Kind::kUnknown, 0, std::move(s)};
  }
  // Answered, or called off with every block that passed the gate landed:
  // the answer is final (the kernel writes it before `landed`, and the
  // agent answers done only once its stream ran it). No later request
  // overwrites it meanwhile: the link ended or pauses until this one is
  // answered.
  auto* answer = reinterpret_cast<copy_agent::AtomicAnswer*>(staging());
  if (!mapping_->resident(staging(), sizeof(*answer))) {
    // The client punched the page out (a channel the daemon could not
    // seal): the answer is gone, and with it whether the add ran.
    return {Kind::kUnknown, 0,
            EndLocked(absl::FailedPreconditionError(
                "the page of an atomic's answer in the copy agent's channel is no longer in "
                "memory"))};
  }
  if (Ref(answer->applied).load(std::memory_order_acquire) == sent.seq) {
    return {Kind::kApplied, Ref(answer->old).load(std::memory_order_relaxed), absl::OkStatus()};
  }
  if (s.ok()) {
    s = absl::InternalError(
        absl::StrCat("the copy agent of pid ", pid_, " answered an atomic its kernel did not run"));
  }
  return {Kind::kNotApplied, 0, std::move(s)};
}

}  // namespace mooncake::softnic
