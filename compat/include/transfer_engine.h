// Upstream Mooncake's <transfer_engine.h>, as far as Mooncake EP uses it:
// EP's buffer asks the engine for its device transports
// (getOrCreateP2pTransport, getOrCreateRdmaTransport). This TransferEngine
// does exactly that, over mooncaked, and nothing else of upstream's
// Transfer Engine (no segments, batches, metadata service or transports of
// its own): code that calls anything else does not compile against it.
//
// Each transport is made on the first call, by upstream's factories
// (<transport/device/device_transport.h>), and owned by the engine: later
// calls return the same object, whatever their arguments, as upstream's
// engine does. A factory that fails (no daemon, no RDMA: the reason is
// logged) returns nullptr, and the next call tries again. Thread-safe.
//
// Standard library only, C++17; link libmooncake_client. See
// docs/compat.md, "The engine path".
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "mooncake/common/export.h"
#include "transport/device/device_transport.h"

namespace mooncake {

class MOONCAKE_API TransferEngine {
 public:
  // Upstream's constructors. auto_discover and filter steer upstream's
  // topology discovery, which this engine does not do: they are kept for
  // the caller's sake only (filter is not the RDMA transport's NIC filter;
  // getOrCreateRdmaTransport takes its own, as upstream's does).
  explicit TransferEngine(bool auto_discover = false);
  TransferEngine(bool auto_discover, const std::vector<std::string>& filter);
  ~TransferEngine();
  TransferEngine(const TransferEngine&) = delete;
  TransferEngine& operator=(const TransferEngine&) = delete;

  // The engine's P2P transport (createP2pDeviceTransport(num_ranks) on the
  // first successful call).
  device::P2pTransport* getOrCreateP2pTransport(int num_ranks);
  // The engine's IBGDA transport (createIbgdaDeviceTransport(device_filter)
  // on the first successful call).
  device::RdmaTransport* getOrCreateRdmaTransport(
      const std::vector<std::string>& device_filter = {});

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mooncake
