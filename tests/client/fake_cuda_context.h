// A test fixture for client code that runs CUDA driver calls: one fake
// Hopper GPU, initialized, its primary context current on the test's thread
// (retained in SetUp, released in TearDown).
#pragma once

#include "fake_cuda_driver.h"
#include "gtest/gtest.h"

namespace mooncake {

class FakeCudaContextTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cu_.addGpu(drivers::FakeGpu::Hopper(0));
    ASSERT_EQ(cu_.init(0), drivers::kCudaSuccess);
    drivers::CuContext ctx = nullptr;
    ASSERT_EQ(cu_.devicePrimaryCtxRetain(&ctx, drivers::FakeCudaDriver::kHandleBase),
              drivers::kCudaSuccess);
    ASSERT_EQ(cu_.ctxSetCurrent(ctx), drivers::kCudaSuccess);
  }
  void TearDown() override { cu_.devicePrimaryCtxRelease(drivers::FakeCudaDriver::kHandleBase); }

  drivers::FakeCudaDriver cu_;
};

}  // namespace mooncake
