// The CUDA data path of --mode elastic (elastic_data_path.h): kernels on the
// current device stage, put and signal into peers' GPU buffers through the
// Device API (P2P peers by load/store, RDMA peers through their queue pairs,
// softnic where no NIC is), and wait for and check what peers sent. The
// symmetric buffer is device memory: the host never touches it, results
// come back through a small device scratch. Compiled only with CUDA; free of
// Abseil so nvcc sees only plain C++.
#pragma once

#include <memory>
#include <string>

#include "elastic_data_path.h"
#include "mooncake/device/contexts_device.h"

namespace mooncake::example {

// A data path on `buffer` (this rank's symmetric buffer, on the current
// device) that reads `ctx` (Communicator::ctx(): it must outlive the path,
// and its updates by handleEvent are seen at the next call). Null, with the
// CUDA call that failed in *error, when its stream or scratch cannot be made.
std::unique_ptr<ElasticDataPath> MakeCudaElasticPath(const device::CommCtx& ctx, void* buffer,
                                                     ElasticLayout layout, std::string* error);

}  // namespace mooncake::example
