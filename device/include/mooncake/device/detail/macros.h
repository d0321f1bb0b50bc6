// Function qualifiers shared by every Device API header.
//
// MC_DEVICE marks code that runs where the communication happens: on the GPU
// under nvcc, or on an ordinary CPU thread on the host platform.
// MC_HOST_DEVICE marks code callable from both sides of a CUDA build (pure
// arithmetic, layout helpers). On the host platform both are plain `inline`.
#pragma once

#if defined(__CUDACC__)
#define MC_DEVICE __device__ __forceinline__
#define MC_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define MC_DEVICE inline
#define MC_HOST_DEVICE inline
#endif
