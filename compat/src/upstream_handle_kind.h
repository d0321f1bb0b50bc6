// How createP2pDeviceTransport picks CUDA's sharing mechanism from
// upstream's switch, MC_USE_NVLINK_IPC (upstream #2956): "0" asks for
// fabric handles (multi-node NVLink) and does not fall back; unset or
// anything else, same-node sharing (VMM fds, else legacy IPC), no fabric
// probe. Fabric stays opt-in: a fabric handle maps the buffer for any
// process of the IMEX domain that learns it, with no uid check.
#pragma once

#include "mooncake/device/device_transport.h"

namespace mooncake {
namespace device {

CudaHandleKind UpstreamCudaHandleKind(const char* mc_use_nvlink_ipc);

}  // namespace device
}  // namespace mooncake
