// Compiled to PTX only (never run): the post path's ordering as nvcc emits
// it, checked by check_post_path_ptx.sh. Only mlx5/qp_ops.h's entry points
// are instantiated here, so every instruction in the PTX is theirs.
#include "mooncake/device/mlx5/qp_ops.h"

using mooncake::device::IbgdaQpDevCtx;
using mooncake::device::McStatus;
namespace mlx5 = mooncake::device::mlx5;

extern "C" __global__ void post_one(IbgdaQpDevCtx* qp, mlx5::Wqe64 w, int* status) {
  *status = static_cast<int>(mooncake::device::mc_qp_post(qp, w));
}

extern "C" __global__ void post_warp(IbgdaQpDevCtx* qp, mlx5::Wqe64 w, int* status) {
  *status = static_cast<int>(mooncake::device::mc_qp_post_warp(qp, w, threadIdx.x % 3 != 0));
}

extern "C" __global__ void quiet(IbgdaQpDevCtx* qp, int* status) {
  *status = static_cast<int>(mooncake::device::mc_qp_quiet(qp));
}
