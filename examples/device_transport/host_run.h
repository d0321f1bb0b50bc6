// Host-platform transfers for device_transport_example (CPU threads over
// the memfd buffers the daemon brokered, using the Device API functions).
#pragma once

#include "example_common.h"
#include "mooncake/device/contexts_device.h"

namespace mooncake::example {

// Rank 0 writes `msg_bytes` into rank 1's slot 0 and signals; rank 1 waits
// and checks every byte. Other ranks idle.
RunResult RunPairHost(const device::CommCtx& ctx, void* buffer, size_t msg_bytes,
                      uint64_t timeout_ns);
// Every rank writes its slot in every other rank, then atomically adds 1 to
// that rank's arrival counter; each waits for n-1 arrivals and checks all.
RunResult RunAllToAllHost(const device::CommCtx& ctx, void* buffer, size_t msg_bytes,
                          uint64_t timeout_ns);

}  // namespace mooncake::example
