// <cuda_alike.h> as Mooncake EP includes it (upstream's
// mooncake-transfer-engine/include/cuda_alike.h): the device-string prefix,
// and nothing CUDA unless USE_CUDA asks (checked without it here: a CPU
// build of code that includes it must not need the toolkit).
#include <cuda_alike.h>
#include <gtest/gtest.h>

#include <string>
#include <type_traits>

#if defined(CUDA_VERSION) || defined(CUDART_VERSION)
#error "cuda_alike.h pulled in the CUDA headers without USE_CUDA"
#endif

namespace {

static_assert(std::is_same_v<decltype(GPU_PREFIX), const std::string>);

TEST(CompatCudaAlike, GpuPrefixIsUpstreams) { EXPECT_EQ(GPU_PREFIX, "cuda:"); }

}  // namespace
