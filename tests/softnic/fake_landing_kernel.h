// A host stand-in for the copy agent's landing kernel
// (client/src/copy_agent_landing_kernel.cu) on a FakeCudaDriver: each
// "block" takes its half of the gate's handshake
// (mooncake/common/copy_agent_gate.h) when the launch runs (at once, or when
// the fake's hold ends), then copies its slice from the staging area or
// writes nothing. The real kernel runs on the H200 (tests/gpu/,
// `rdma_bench check` with agents).
#pragma once

#include <atomic>
#include <cstdint>

#include "fake_cuda_driver.h"
#include "mooncake/common/copy_agent_gate.h"

namespace mooncake::softnic::test_util {

inline void RegisterFakeLandingKernel(drivers::FakeCudaDriver& cu) {
  cu.setModulesLoadable(true);
  cu.registerKernel(copy_agent::kLandingKernel, [&cu](unsigned grid, unsigned, void** args) {
    const uint64_t dst = *static_cast<uint64_t*>(args[0]);
    const uint64_t src = *static_cast<uint64_t*>(args[1]);
    const uint64_t bytes = *static_cast<uint64_t*>(args[2]);
    auto* gate = reinterpret_cast<copy_agent::Gate*>(*static_cast<uint64_t*>(args[3]));
    const uint32_t seq = *static_cast<uint32_t*>(args[4]);
    return drivers::FakeCudaDriver::FakeKernelBody([&cu, dst, src, bytes, gate, seq, grid] {
      for (uint32_t b = 0; b < grid; ++b) {
        std::atomic_ref<uint32_t>(gate->intent[b]).store(seq, std::memory_order_seq_cst);
        std::atomic_thread_fence(std::memory_order_seq_cst);
        if (std::atomic_ref<uint32_t>(gate->cancel_seq).load(std::memory_order_seq_cst) != seq) {
          uint64_t begin = 0, end = 0;
          copy_agent::LandingSlice(bytes, grid, b, &begin, &end);
          if (end > begin) {
            cu.memcpyHtoD(dst + begin, reinterpret_cast<const void*>(src + begin), end - begin);
          }
        }
        std::atomic_ref<uint32_t>(gate->landed[b]).store(seq, std::memory_order_release);
      }
    });
  });
}

}  // namespace mooncake::softnic::test_util
