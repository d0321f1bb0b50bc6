// A copy agent that lies, for copy_agent_fuzzer.cc: a thread playing the
// client's side of one copy-agent channel (mooncake/common/copy_agent_channel.h)
// from a script, while the daemon's CopyAgentLink sends it requests. The
// channel's header is memory the client writes at any moment; this agent
// writes any word of it with any value, at any time, and mixes that with
// what a real agent does (take a request, pass the gate, answer, sleep on
// the futex), so the daemon meets both the protocol and its violations.
//
// It never touches the staging area: the fuzzer checks that staging pages
// it punched out stay out of memory, which only the daemon could undo.
//
// Script: u8 count (at most kMaxAgentSteps), then count steps of
// [u8 kind][u8 arg][u64 value]; kinds and words below (AgentStep).
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "fuzz_support.h"
#include "mooncake/common/copy_agent_channel.h"
#include "mooncake/common/copy_agent_gate.h"

namespace mooncake::fuzz {

inline constexpr size_t kMaxAgentSteps = 32;

struct AgentStep {
  enum Kind : uint8_t {
    kWaitRequest = 0,  // until request_seq moves (at most 10 ms)
    kWrite = 1,        // one header word (Word(arg % kWords)), value per arg / kWords (Value)
    kSleep = 2,        // value % 2000 us
    kServe = 3,        // the current request, as a real agent does
    kPassGate = 4,     // arg % 65 landing blocks pass the gate; value & 1: none says it landed
    kClose = 5,        // state = kClosed
    kFutexSleep = 6,   // agent_sleeping = 1, then FUTEX_WAIT on request_seq (at most 1 ms)
    kKinds = 7,
  };
  uint8_t kind;
  uint8_t arg;
  uint64_t value;
};

inline std::vector<AgentStep> ReadAgentScript(ByteReader& in) {
  std::vector<AgentStep> steps(in.U8() % (kMaxAgentSteps + 1));
  for (AgentStep& s : steps) {
    s.kind = static_cast<uint8_t>(in.U8() % AgentStep::kKinds);
    s.arg = in.U8();
    s.value = in.U64();
  }
  return steps;
}

class HostileAgent {
 public:
  // Plays `script` on `c`; then, when `serve_after`, answers every request
  // as a real agent would until Stop(), else stays silent.
  HostileAgent(copy_agent::Channel* c, std::vector<AgentStep> script, bool serve_after)
      : c_(c),
        script_(std::move(script)),
        serve_after_(serve_after),
        seen_(Seq()),  // before the daemon's first request, which may come before Run()
        thread_([this] { Run(); }) {}
  ~HostileAgent() { Stop(); }
  void Stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }

 private:
  static constexpr int kWords = 20;

  template <class T>
  static void Store(T& word, uint64_t v) {
    copy_agent::Ref(word).store(static_cast<T>(v), std::memory_order_release);
  }
  static uint64_t MonotonicNs() {
    timespec t{};
    ::clock_gettime(CLOCK_MONOTONIC, &t);
    return uint64_t(t.tv_sec) * 1'000'000'000ull + uint64_t(t.tv_nsec);
  }
  uint32_t Seq() const { return copy_agent::Ref(c_->request_seq).load(std::memory_order_acquire); }

  // What a step writes: the literal value, the current request number (or
  // it cancelled, or near it), or a time `value` ns (up to 100 ms) ago.
  uint64_t Value(uint8_t mode, uint64_t value) const {
    switch (mode % 5) {
      case 0: return value;
      case 1: return Seq();
      case 2: return Seq() | copy_agent::kCancelled;
      case 3: return MonotonicNs() - value % 100'000'000;
      default: return Seq() + static_cast<int8_t>(value);
    }
  }

  void Write(uint8_t arg, uint64_t value) {
    const uint64_t v = Value(static_cast<uint8_t>(arg / kWords), value);
    const uint32_t block = static_cast<uint32_t>(value >> 32) % copy_agent::kMaxLandingBlocks;
    copy_agent::Channel& c = *c_;
    switch (arg % kWords) {
      case 0: return Store(c.done_seq, v);
      case 1: return Store(c.result, v);
      case 2: return Store(c.state, v);
      case 3: return Store(c.busy_since_ns, v);
      case 4: return Store(c.phase, v);
      case 5: return Store(c.claim, v);
      case 6: return Store(c.gate.cancel_seq, v);
      case 7: return Store(c.gate.gated, v);
      case 8: return Store(c.gate.intent[block], v);
      case 9: return Store(c.gate.landed[block], v);
      case 10: return Store(c.mirror_seq, v);
      case 11: return Store(c.request_seq, v);
      case 12: return Store(c.agent_sleeping, v);
      case 13: return Store(c.magic, v);
      case 14: return Store(c.version, v);
      case 15: return Store(c.staging_bytes, v);
      case 16: return Store(c.request.op, v);
      case 17: return Store(c.request.bytes, v);
      case 18: return Store(c.resident.go, v);
      default: return Store(c.resident.stop, v);
    }
  }

  bool WaitRequest() {
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(10);
    while (Seq() == seen_) {
      if (stop_.load() || std::chrono::steady_clock::now() >= until) return false;
      std::this_thread::yield();
    }
    seen_ = Seq();
    return true;
  }

  // A landing kernel's blocks: intent, full fence, the cancel word, landed.
  void PassGate(uint32_t seq, uint32_t blocks, bool never_land) {
    copy_agent::Gate& g = c_->gate;
    for (uint32_t b = 0; b < blocks && b < copy_agent::kMaxLandingBlocks; ++b) {
      copy_agent::Ref(g.intent[b]).store(seq, std::memory_order_seq_cst);
    }
    std::atomic_thread_fence(std::memory_order_seq_cst);
    (void)copy_agent::Ref(g.cancel_seq).load(std::memory_order_seq_cst);
    if (never_land) return;
    for (uint32_t b = 0; b < blocks && b < copy_agent::kMaxLandingBlocks; ++b) {
      copy_agent::Ref(g.landed[b]).store(seq, std::memory_order_release);
    }
  }

  // The current request, as a real agent serves it (with no GPU: the
  // bytes do not move): take it, pass the gate for what writes GPU
  // memory, answer.
  void Serve() {
    const uint32_t seq = Seq();
    Store(c_->busy_since_ns, MonotonicNs());
    if (copy_agent::Settle(*c_, seq, seq) == seq) {
      const auto op = copy_agent::Ref(c_->request.op).load(std::memory_order_relaxed);
      // What writes GPU memory goes through the gate. (An atomic's answer
      // it does not write: the staging area is not its.)
      if (copy_agent::WritesGpuMemory(static_cast<copy_agent::Op>(op)) &&
          copy_agent::Ref(c_->gate.gated).load(std::memory_order_relaxed) == 1) {
        const uint64_t bytes = copy_agent::Ref(c_->request.bytes).load(std::memory_order_relaxed);
        PassGate(seq, copy_agent::LandingBlocks(bytes), false);
      }
      Store(c_->result, 0);
    }
    Store(c_->busy_since_ns, 0);
    Store(c_->done_seq, seq);
  }

  void FutexSleep() {
    Store(c_->agent_sleeping, 1);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    const uint32_t seq = Seq();
    if (seq == seen_) {
      const timespec limit{0, 1'000'000};
      ::syscall(SYS_futex, &c_->request_seq, FUTEX_WAIT, seq, &limit, nullptr, 0);
    }
    Store(c_->agent_sleeping, 0);
  }

  void Run() {
    for (const AgentStep& s : script_) {
      if (stop_.load()) return;
      switch (s.kind) {
        case AgentStep::kWaitRequest: WaitRequest(); break;
        case AgentStep::kWrite: Write(s.arg, s.value); break;
        case AgentStep::kSleep:
          std::this_thread::sleep_for(std::chrono::microseconds(s.value % 2000));
          break;
        case AgentStep::kServe: Serve(); break;
        case AgentStep::kPassGate: PassGate(Seq(), s.arg % 65, (s.value & 1) != 0); break;
        case AgentStep::kClose:
          Store(c_->state, static_cast<uint32_t>(copy_agent::State::kClosed));
          break;
        default: FutexSleep(); break;
      }
    }
    // Serving after the script: whatever request is unanswered, the one a
    // paused link waits on included.
    while (!stop_.load()) {
      if (serve_after_ && copy_agent::Ref(c_->done_seq).load(std::memory_order_acquire) != Seq()) {
        seen_ = Seq();
        Serve();
        continue;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  copy_agent::Channel* const c_;
  const std::vector<AgentStep> script_;
  const bool serve_after_;
  std::atomic<bool> stop_{false};
  uint32_t seen_ = 0;   // the last request number this agent looked at
  std::thread thread_;  // last: starts once the rest is set
};

}  // namespace mooncake::fuzz
