// The engine path of upstream's API (compat/include/transfer_engine.h): a
// TransferEngine that only holds the two device transports.
#include "transfer_engine.h"

#include <mutex>

#include "mooncake/common/log.h"
#include "unavailable_transports.h"

namespace mooncake {

struct TransferEngine::Impl {
  std::mutex mu;
  std::unique_ptr<device::P2pTransport> p2p;
  int p2p_ranks = 0;
  std::unique_ptr<device::RdmaTransport> rdma;
  // Unavailable transports handed out before a later call made a real one:
  // kept, since the caller may still hold them.
  std::vector<std::unique_ptr<device::P2pTransport>> old_p2p;
  std::vector<std::unique_ptr<device::RdmaTransport>> old_rdma;
};

namespace {

bool Unavailable(const device::P2pTransport* t) {
  return dynamic_cast<const device::UnavailableP2pTransport*>(t) != nullptr;
}
bool Unavailable(const device::RdmaTransport* t) {
  return dynamic_cast<const device::UnavailableRdmaTransport*>(t) != nullptr;
}

}  // namespace

TransferEngine::TransferEngine(bool /*auto_discover*/) : impl_(std::make_unique<Impl>()) {}

TransferEngine::TransferEngine(bool /*auto_discover*/, const std::vector<std::string>& /*filter*/)
    : impl_(std::make_unique<Impl>()) {}

TransferEngine::~TransferEngine() = default;

device::P2pTransport* TransferEngine::getOrCreateP2pTransport(int num_ranks) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (!impl_->p2p || Unavailable(impl_->p2p.get())) {
    // The first call, or a later one after the factory could not make one
    // (no daemon yet): try again.
    if (impl_->p2p) impl_->old_p2p.push_back(std::move(impl_->p2p));
    impl_->p2p = device::createP2pDeviceTransport(num_ranks);
    impl_->p2p_ranks = num_ranks;
  } else if (num_ranks != impl_->p2p_ranks) {
    // Upstream returns the first transport all the same; say so, since its
    // tables are sized for the first count.
    MC_LOG(kWarning, "TransferEngine::getOrCreateP2pTransport(", num_ranks,
           "): returning the engine's transport made for ", impl_->p2p_ranks, " ranks");
  }
  return impl_->p2p.get();
}

device::RdmaTransport* TransferEngine::getOrCreateRdmaTransport(
    const std::vector<std::string>& device_filter) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (!impl_->rdma || Unavailable(impl_->rdma.get())) {
    if (impl_->rdma) impl_->old_rdma.push_back(std::move(impl_->rdma));
    impl_->rdma = device::createIbgdaDeviceTransport(device_filter);
  }
  return impl_->rdma.get();
}

}  // namespace mooncake
