// The mlx5 extended (masked) fetch-add's arithmetic, shared by every place
// that runs one on behalf of a NIC: softnic's engine on host words, its
// CUDA kernel in mooncaked's context, and the copy agent's kernel in the
// client's process (copy_agent_gate.h). One definition, so the three
// cannot disagree on a field boundary.
//
// Plain C++ that nvcc compiles too; it includes no CUDA header.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define MC_MASKED_ADD_HD __host__ __device__
#else
#define MC_MASKED_ADD_HD
#endif

namespace mooncake {

// A masked add: a carry out of a bit set in `boundary` is dropped, so each
// field (ending at a set bit) wraps on its own. The boundary bits are left
// out of the add (no carry can leave them) and put back as a sum bit.
MC_MASKED_ADD_HD inline uint32_t MaskedAdd(uint32_t value, uint32_t add, uint32_t boundary) {
  const uint32_t low = (value & ~boundary) + (add & ~boundary);
  return low ^ ((value ^ add) & boundary);
}

}  // namespace mooncake
