// Upstream Mooncake's host-side Device API header
// (<transport/device/device_transport.h>): the abstract P2pTransport and
// RdmaTransport with exactly upstream's virtual methods, RdmaLocalMetadata,
// and upstream's two factories, here backed by mooncaked.
//
// Standard library only: this header compiles as C++17 with nothing but
// -I PREFIX/include (no Abseil, no CUDA). Link libmooncake_client
// (Mooncake::client, or -lmooncake_client).
//
// Typical use, on every rank r of n (the application moves the handles):
//
//   #include <transport/device/device_transport.h>
//   using namespace mooncake::device;
//   std::unique_ptr<P2pTransport> p2p = createP2pDeviceTransport(n);
//   if (!p2p) { /* no daemon or no platform: the reason is on stderr */ }
//   void* buf = p2p->allocateBuffer(bytes);               // same bytes everywhere
//   std::vector<int32_t> mine = p2p->exportIpcHandle(buf);
//   ... all-gather `mine` (MPI, torch.distributed, files) ...
//   p2p->importPeerHandles(buf, r, n, all_handles, {});
//   p2p->verifyPeerAccess();
//   // kernel: make_comm_ctx(buf, p2p->availableTablePtr(), p2p->peerPtrsTablePtr(),
//   //                       ..., r, n, num_qps)   (<transport/device/comm_device.cuh>)
//
// The transports the factories return are this project's: the P2P one is a
// BrokeredP2pTransport (mooncake/device/device_transport.h), whose
// lastError() says why a call failed; the RDMA one a
// mooncake::DaemonRdmaTransport's upstream face. See docs/compat.md.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "mooncake/common/export.h"
#include "mooncake/device/upstream_transport.h"

namespace mooncake {
namespace device {

// The P2P transport of this node's platform, through the local mooncaked:
// the daemon is found as every client finds it ($MOONCAKE_SOCKET, else
// /run/mooncake/mooncaked.sock) and moves the buffers' file descriptors
// between the ranks' processes; the handles themselves are the caller's to
// exchange. Platform: $MOONCAKE_DEVICE_PLATFORM = cuda | host; unset, CUDA
// when this library was built with it and a GPU is usable (buffers on the
// current device), else the host platform (shared memory), logged once.
// Returns nullptr, with the reason logged on stderr, when no daemon answers,
// num_ranks < 1, or the requested platform is missing.
MOONCAKE_API std::unique_ptr<P2pTransport> createP2pDeviceTransport(int num_ranks);

// The IBGDA transport through the local mooncaked: queue pairs on a NIC the
// daemon serves (softnic where there is none). device_filter: NIC names this
// rank may use ({} = any); initialize() picks the one closest to the current
// GPU among them. registerMemory accepts buffers from a transport that
// createP2pDeviceTransport made (their fd goes to the daemon). Platform as
// for createP2pDeviceTransport. Returns nullptr, with the reason logged, when
// no daemon answers or it serves no RDMA.
MOONCAKE_API std::unique_ptr<RdmaTransport> createIbgdaDeviceTransport(
    const std::vector<std::string>& device_filter = {});

}  // namespace device
}  // namespace mooncake
