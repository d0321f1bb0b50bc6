// A softnic engine with GPU memory for tests without a GPU (fake_gpu.h):
// a responder QP in kPdB, requester QPs in kPdA connected to it, and
// regions of GPU memory (a client's allocation, imported as the daemon
// does) or of one host mapping. The fixtures of cuda_memory_test.cc and
// copy_agent_test.cc derive from it.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>

#include "fake_gpu.h"
#include "raw_qp.h"
#include "softnic/cuda_memory.h"
#include "softnic/engine.h"
#include "softnic/shared_mapping.h"

namespace mooncake::softnic::test_util {

class GpuEngineFixture : public ::testing::Test {
 protected:
  static constexpr PdId kPdA = 11;  // requesters
  static constexpr PdId kPdB = 22;  // the responder

  explicit GpuEngineFixture(EngineOptions options = {}) : engine_(options) {}

  // The derived SetUp sets cuda_ first, then calls this.
  void StartEngine() {
    auto host = SharedMapping::Anonymous(64 << 10);
    ASSERT_TRUE(host.ok()) << host.status();
    host_ = *host;
    responder_ = RawQp::Create(engine_, kPdB, 1, 1);
    ASSERT_NE(responder_, nullptr);
    engine_.Start();
  }
  void TearDown() override { engine_.Stop(); }

  // A requester QP of kPdA connected to the responder (kPdB).
  std::unique_ptr<RawQp> NewQp() {
    auto qp = RawQp::Create(engine_, kPdA, 16, 16);
    if (qp == nullptr) return nullptr;
    EXPECT_TRUE(engine_.Connect(kPdA, qp->qpn(), responder_->qpn()).ok());
    return qp;
  }

  // Imports `alloc` as the client registers it (the whole allocation, iova
  // = its address in the client).
  uint32_t GpuRegion(PdId pd, const ClientAllocation& alloc, uint32_t access) {
    auto buffer = cuda_->Import(alloc.fd(), alloc.size());
    EXPECT_TRUE(buffer.ok()) << buffer.status();
    if (!buffer.ok()) return 0;
    auto key = engine_.RegisterRegion(WholeAllocation(pd, alloc, *buffer, access));
    EXPECT_TRUE(key.ok()) << key.status();
    return key.ok() ? *key : 0;
  }

  // [offset, +len) of the host mapping, iova = its address.
  uint32_t HostRegion(PdId pd, uint64_t offset, uint64_t len, uint32_t access) {
    RegionSpec spec;
    spec.pd = pd;
    spec.iova = HostIova(offset);
    spec.length = len;
    spec.access = access;
    spec.mapping = host_;
    spec.offset = offset;
    auto key = engine_.RegisterRegion(spec);
    EXPECT_TRUE(key.ok()) << key.status();
    return key.ok() ? *key : 0;
  }
  uint64_t HostIova(uint64_t offset) const {
    return reinterpret_cast<uintptr_t>(host_->data()) + offset;
  }

  std::shared_ptr<CudaMemory> cuda_;
  std::shared_ptr<SharedMapping> host_;
  Engine engine_;
  std::unique_ptr<RawQp> responder_;
};

}  // namespace mooncake::softnic::test_util
