// Function qualifiers shared by every Device API header.
//
// MC_DEVICE marks code that runs where the communication happens: on the GPU
// under nvcc, or on an ordinary CPU thread on the host platform.
// MC_HOST_DEVICE marks code callable from both sides of a CUDA build (pure
// arithmetic, layout helpers). On the host platform both are plain `inline`.
#pragma once

// MC_DEVICE_OUTLINE marks a slow path that must stay out of its callers'
// hot loops: the RDMA posting behind every put/signal. Pass it values, not
// references to the caller's locals: a reference makes the compiler keep
// those locals in (addressable) local memory and reload them around every
// store of the P2P loop. With the RDMA route inlined, or outlined but
// taking `const McPeer&`, P2P signals lost 30-190 ns one way on 2x H200.
// `static` on CUDA: nvcc emits a host stub (it calls exit(1)) for every
// non-inline __device__ function, and with external linkage that stub and
// the host platform's definition of the same name in another translation
// unit of one program (the example builds both) are one symbol to the
// linker, which may keep the stub.
#if defined(__CUDACC__)
#define MC_DEVICE __device__ __forceinline__
#define MC_HOST_DEVICE __host__ __device__ __forceinline__
#define MC_DEVICE_OUTLINE static __device__ __noinline__
#else
#define MC_DEVICE inline
#define MC_HOST_DEVICE inline
#define MC_DEVICE_OUTLINE inline
#endif
