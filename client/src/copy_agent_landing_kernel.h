// The copy agent's landing kernel (copy_agent_landing_kernel.cu), embedded
// in libmooncake_client as a fatbin (SASS for MOONCAKE_CUDA_ARCHITECTURES
// plus PTX of the newest) and loaded by CopyAgent with cuModuleLoadData
// through the driver wrapper: the client links no CUDA runtime. Only CUDA
// builds have it (MC_CLIENT_HAVE_LANDING_KERNEL); without it the agent's
// copies into GPU memory are plain copies that cannot be called off
// (mooncake/common/copy_agent_gate.h says why that matters).
//
//   mc_copy_agent_land(uint8_t* dst, const uint8_t* src, uint64_t bytes,
//                      copy_agent::Gate* gate, uint32_t seq)
// launched with LandingBlocks(bytes) blocks of kLandingThreads threads;
// `src` is the staging area and `gate` the channel's gate, both host memory
// mapped for the device.
#pragma once

#include <cstddef>

namespace mooncake::internal {

extern const unsigned char kCopyAgentLandingImage[];
extern const size_t kCopyAgentLandingImageSize;

}  // namespace mooncake::internal
