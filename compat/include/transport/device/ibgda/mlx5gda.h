// Upstream's <transport/device/ibgda/mlx5gda.h>, as far as Mooncake EP's
// code reaches it (through comm_device.cuh and ibgda_device.cuh):
// MAX_QP_COUNT, the queue pairs per rank EP sizes its tables with (256
// upstream; EP's own configs define the same value, and identical
// definitions may repeat), and the QP context's type name. Upstream's file
// also pulls in the verbs headers and declares the raw mlx5 WQE layouts
// its device code writes; this project's device code posts through
// mlx5/qp_ops.h instead, so neither is needed here (docs/compat.md).
#pragma once

#include "mooncake/device/ibgda_qp.h"

#ifndef MAX_QP_COUNT
#define MAX_QP_COUNT 256
#endif

// Upstream declares its QP context at global scope: here it is this
// project's IbgdaQpDevCtx (a different layout; kernels only pass pointers
// to it around).
using mlx5gda_qp_devctx = mooncake::device::IbgdaQpDevCtx;
