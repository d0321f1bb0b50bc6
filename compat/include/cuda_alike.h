// Upstream's <cuda_alike.h> (mooncake-transfer-engine/include/), which
// Mooncake EP includes directly: the vendor runtime headers and GPU_PREFIX,
// the device-string prefix ("cuda:"). This project builds for CUDA only,
// so the runtime headers come in when USE_CUDA is defined, as upstream's
// build defines it, or when compiling with nvcc; the other vendors'
// branches of upstream's file have no counterpart here.
#pragma once

#if defined(USE_CUDA) || defined(__CUDACC__)
#include <cuda.h>
#include <cuda_runtime.h>
#endif

#include <string>

const static std::string GPU_PREFIX = "cuda:";
