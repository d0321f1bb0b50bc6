// Upstream's CUDA ops header path. The ops themselves are in
// <transport/device/device_ops.cuh>, which picks the platform at compile
// time; this path exists so code that names it directly still compiles.
#pragma once

#include "transport/device/device_ops.cuh"
