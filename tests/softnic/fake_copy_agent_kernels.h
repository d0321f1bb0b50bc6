// Host stand-ins for the copy agent's kernels
// (client/src/copy_agent_landing_kernel.cu) on a FakeCudaDriver, which runs
// them on their stream's thread:
// - the landing: each "block" takes its half of the gate's handshake
//   (mooncake/common/copy_agent_gate.h) when the launch runs (at once, or
//   when the fake's hold ends), then copies its slice from the staging area
//   (or the process's own memory) or writes nothing;
// - the atomic: the same handshake, then the add on the word (the fake's
//   "GPU memory" is host memory) and its answer, or no add;
// - the resident kernel: polls the handed-over request number and the stop
//   word, and serves each request both ways as the real one does (the gate
//   for copies into GPU memory), answering in the channel; it returns by
//   itself past an idle and an age bound (on the host clock), and says so
//   first (Resident::exited). The bounds are the real kernel's only where a
//   test asks (FakeResidentBounds::Real()): on a loaded 2-core machine a
//   stand-in thread waits milliseconds for a core, and with the real ones
//   most requests would find their kernel gone.
// The real kernels run on the H200 (tests/gpu/, `rdma_bench check` with
// agents).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>

#include "fake_cuda_driver.h"
#include "mooncake/common/copy_agent_gate.h"
#include "mooncake/common/masked_add.h"

namespace mooncake::softnic::test_util {

namespace copy_agent_fake {

template <class T>
std::atomic_ref<T> At(T& field) {
  return std::atomic_ref<T>(field);
}

// Thread 0's half of the handshake for block `b`.
inline bool PassGate(copy_agent::Gate* gate, uint32_t b, uint32_t seq) {
  At(gate->intent[b]).store(seq, std::memory_order_seq_cst);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  return At(gate->cancel_seq).load(std::memory_order_seq_cst) != seq;
}

}  // namespace copy_agent_fake

// When the resident stand-in returns by itself.
struct FakeResidentBounds {
  std::chrono::nanoseconds idle{std::chrono::milliseconds(50)};
  std::chrono::nanoseconds life{std::chrono::milliseconds(200)};
  static FakeResidentBounds Real() {
    return {std::chrono::nanoseconds(copy_agent::kResidentIdleNs),
            std::chrono::nanoseconds(copy_agent::kResidentLifeNs)};
  }
};

inline void RegisterFakeCopyAgentKernels(drivers::FakeCudaDriver& cu,
                                         FakeResidentBounds bounds = {}) {
  using copy_agent_fake::At;
  using copy_agent_fake::PassGate;
  cu.setModulesLoadable(true);
  cu.registerKernel(copy_agent::kLandingKernel, [&cu](unsigned grid, unsigned, void** args) {
    const uint64_t dst = *static_cast<uint64_t*>(args[0]);
    const uint64_t src = *static_cast<uint64_t*>(args[1]);
    const uint64_t bytes = *static_cast<uint64_t*>(args[2]);
    auto* gate = reinterpret_cast<copy_agent::Gate*>(*static_cast<uint64_t*>(args[3]));
    const uint32_t seq = *static_cast<uint32_t*>(args[4]);
    return drivers::FakeCudaDriver::FakeKernelBody([&cu, dst, src, bytes, gate, seq, grid] {
      for (uint32_t b = 0; b < grid; ++b) {
        if (PassGate(gate, b, seq)) {
          uint64_t begin = 0, end = 0;
          copy_agent::LandingSlice(bytes, grid, b, &begin, &end);
          if (end > begin) {
            cu.memcpyHtoD(dst + begin, reinterpret_cast<const void*>(src + begin), end - begin);
          }
        }
        At(gate->landed[b]).store(seq, std::memory_order_release);
      }
    });
  });
  cu.registerKernel(copy_agent::kAtomicKernel, [](unsigned, unsigned, void** args) {
    const uint64_t word = *static_cast<uint64_t*>(args[0]);
    const uint64_t add = *static_cast<uint64_t*>(args[1]);
    const uint32_t boundary = *static_cast<uint32_t*>(args[2]);
    const auto op = static_cast<copy_agent::Op>(*static_cast<uint32_t*>(args[3]));
    auto* answer = reinterpret_cast<copy_agent::AtomicAnswer*>(*static_cast<uint64_t*>(args[4]));
    auto* gate = reinterpret_cast<copy_agent::Gate*>(*static_cast<uint64_t*>(args[5]));
    const uint32_t seq = *static_cast<uint32_t*>(args[6]);
    return drivers::FakeCudaDriver::FakeKernelBody([=] {
      uint64_t old = 0;
      uint32_t applied = 0;
      if (PassGate(gate, 0, seq)) {
        if (op == copy_agent::Op::kFetchAdd64) {
          old = At(*reinterpret_cast<uint64_t*>(word)).fetch_add(add);
        } else {
          auto w = At(*reinterpret_cast<uint32_t*>(word));
          uint32_t expected = w.load();
          while (!w.compare_exchange_weak(
              expected, MaskedAdd(expected, static_cast<uint32_t>(add), boundary))) {
          }
          old = expected;
        }
        applied = seq;
      }
      At(answer->old).store(old, std::memory_order_relaxed);
      At(answer->applied).store(applied, std::memory_order_relaxed);
      At(gate->landed[0]).store(seq, std::memory_order_release);
    });
  });
  cu.registerKernel(copy_agent::kServeKernel, [&cu, bounds](unsigned, unsigned, void** args) {
    const copy_agent::ServeArgs a = *static_cast<copy_agent::ServeArgs*>(args[0]);
    return drivers::FakeCudaDriver::FakeKernelBody([&cu, a, bounds] {
      uint32_t served = a.served;
      const auto born = std::chrono::steady_clock::now();
      auto last = born;
      bool first_look = true;  // a launch looks at `go` once whatever the clock says
      for (;;) {
        uint32_t g = served;
        for (;;) {
          const auto now = std::chrono::steady_clock::now();
          if (!first_look && (now - born > bounds.life || now - last > bounds.idle)) {
            break;
          }
          first_look = false;
          g = At(a.resident->go).load(std::memory_order_acquire);
          if (g != served || At(a.resident->stop).load(std::memory_order_acquire) != 0) break;
          std::this_thread::yield();
        }
        if (g == served) {  // told to stop, or idle or old
          At(a.resident->exited).store(a.launch, std::memory_order_release);
          return;
        }
        copy_agent::Request r;
        r.op = At(a.request->op).load(std::memory_order_relaxed);
        r.dst = At(a.request->dst).load(std::memory_order_relaxed);
        r.src = At(a.request->src).load(std::memory_order_relaxed);
        r.bytes = At(a.request->bytes).load(std::memory_order_relaxed);
        r.staging_offset = At(a.request->staging_offset).load(std::memory_order_relaxed);
        const auto op = static_cast<copy_agent::Op>(r.op);
        const bool valid = r.staging_offset <= a.staging_bytes &&
                           r.bytes <= a.staging_bytes - r.staging_offset &&
                           (op == copy_agent::Op::kToDevice || op == copy_agent::Op::kFromDevice);
        uint8_t* staged = a.staging + r.staging_offset;
        if (valid && op == copy_agent::Op::kFromDevice) {
          cu.memcpyDtoH(staged, r.src, r.bytes);
        } else if (valid && PassGate(a.gate, 0, g)) {
          cu.memcpyHtoD(r.dst, staged, r.bytes);
        }
        if (valid && op == copy_agent::Op::kToDevice) {
          At(a.gate->landed[0]).store(g, std::memory_order_release);
        }
        At(*a.busy_since_ns).store(0, std::memory_order_relaxed);
        At(*a.result).store(valid ? 0 : 1, std::memory_order_relaxed);
        At(*a.done_seq).store(g, std::memory_order_release);
        served = g;
        last = std::chrono::steady_clock::now();
      }
    });
  });
}

}  // namespace mooncake::softnic::test_util
