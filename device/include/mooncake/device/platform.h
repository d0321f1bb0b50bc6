// Picks the platform ops at compile time and provides the copy primitives
// that go with them.
//
//   nvcc (__CUDACC__)  -> ops_cuda.cuh + detail/cuda_copy.cuh   MC_PLATFORM_CUDA
//   MUSA (__MUSACC__)  -> not written yet (see below)            MC_PLATFORM_MUSA
//   anything else      -> ops_host.h   + detail/host_copy.h      MC_PLATFORM_HOST
//
// Define MOONCAKE_DEVICE_FORCE_HOST to get the host platform inside an nvcc
// translation unit (host-side tests of protocol code compiled by nvcc).
//
// Every platform provides the same set of names (mc_ld_acquire,
// mc_st_release, mc_atomic_add_release, mc_ld_nc_v4, mc_st_na_v4,
// mc_bswap32, mc_syncwarp, mc_fence_acq_rel_sys, ..., and
// mc_detail_copy_thread/_warp/_block); comm_device.h is written against
// those names only.
#pragma once

#include "mooncake/device/detail/macros.h"
#include "mooncake/device/types_device.h"

#if defined(__MUSACC__)
// A MUSA port adds ops_musa.cuh with the same names. MUSA lacks scoped
// acquire/release, so it emulates them with volatile accesses plus
// __threadfence_system() (as upstream does).
#define MC_PLATFORM_MUSA 1
#error "Mooncake Device API: MUSA ops are not written yet (add ops_musa.cuh)"
#elif defined(__CUDACC__) && !defined(MOONCAKE_DEVICE_FORCE_HOST)
#define MC_PLATFORM_CUDA 1
#include "mooncake/device/detail/cuda_copy.cuh"
#include "mooncake/device/ops_cuda.cuh"
#else
#define MC_PLATFORM_HOST 1
#include "mooncake/device/detail/host_copy.h"
#include "mooncake/device/ops_host.h"
#endif
