// The engine path (compat/include/transfer_engine.h): EP's buffer asks a
// TransferEngine for its transports. Against a real mooncaked on a
// temporary socket, host platform: the transports are made once and kept,
// a failed factory is tried again, and the transports work as EP uses them
// (a buffer from the P2P one registered with the RDMA one).
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "daemon_process.h"
#include "transfer_engine.h"
#include "transport/device/ibgda/mlx5gda.h"
#include "upstream_handle_kind.h"

namespace mooncake {
namespace {

class CompatTransferEngine : public ::testing::Test {
 protected:
  void SetUp() override { ::setenv("MOONCAKE_DEVICE_PLATFORM", "host", 1); }
  void TearDown() override {
    ::unsetenv("MOONCAKE_SOCKET");
    ::unsetenv("MOONCAKE_DEVICE_PLATFORM");
  }
  testing::TempDir dir_;
};

// As upstream's, the factories never return nullptr (EP dereferences what
// they return): without a daemon every call of what they return fails, and
// a later call of the engine tries again.
TEST_F(CompatTransferEngine, WithoutADaemonEveryCallFailsAndALaterCallTriesAgain) {
  ::setenv("MOONCAKE_SOCKET", (dir_.path() + "/nobody.sock").c_str(), 1);
  TransferEngine engine;
  device::P2pTransport* p2p = engine.getOrCreateP2pTransport(2);
  device::RdmaTransport* rdma = engine.getOrCreateRdmaTransport();
  ASSERT_NE(p2p, nullptr);
  ASSERT_NE(rdma, nullptr);
  EXPECT_EQ(p2p->allocateBuffer(4096), nullptr);
  EXPECT_TRUE(p2p->exportIpcHandle(nullptr).empty());
  EXPECT_FALSE(p2p->allPeersAccessible());
  EXPECT_NE(rdma->initialize("", 2, 2), 0);
  EXPECT_NE(rdma->createQueuePairs(nullptr), 0);
  EXPECT_EQ(rdma->qpDevCtxsPtr(), nullptr);
  EXPECT_NE(device::createIbgdaDeviceTransport({}), nullptr);
  testing::DaemonProcess daemon(dir_.path());
  ::setenv("MOONCAKE_SOCKET", daemon.socket().c_str(), 1);
  device::P2pTransport* p2p2 = engine.getOrCreateP2pTransport(2);
  device::RdmaTransport* rdma2 = engine.getOrCreateRdmaTransport();
  EXPECT_NE(p2p2, p2p);
  EXPECT_NE(rdma2, rdma);
  void* buf = p2p2->allocateBuffer(4096);
  EXPECT_NE(buf, nullptr);
  EXPECT_EQ(rdma2->initialize("", 2, 2), 0);
  EXPECT_EQ(engine.getOrCreateP2pTransport(2), p2p2) << "a working one is kept";
  p2p2->freeBuffer(buf);
}

TEST_F(CompatTransferEngine, EachTransportIsMadeOnceAndOwnedByTheEngine) {
  testing::DaemonProcess daemon(dir_.path());
  ::setenv("MOONCAKE_SOCKET", daemon.socket().c_str(), 1);
  TransferEngine engine(false, {"softnic0"});
  device::P2pTransport* p2p = engine.getOrCreateP2pTransport(1);
  ASSERT_NE(p2p, nullptr);
  EXPECT_EQ(engine.getOrCreateP2pTransport(1), p2p);
  EXPECT_EQ(engine.getOrCreateP2pTransport(4), p2p) << "upstream keeps the first, too";
  device::RdmaTransport* rdma = engine.getOrCreateRdmaTransport();
  ASSERT_NE(rdma, nullptr);
  EXPECT_EQ(engine.getOrCreateRdmaTransport({"other"}), rdma);

  // As EP's buffer uses them: a buffer from the P2P transport, registered
  // with the RDMA one.
  constexpr size_t kBytes = 1 << 20;
  void* buf = p2p->allocateBuffer(kBytes);
  ASSERT_NE(buf, nullptr);
  ASSERT_EQ(rdma->initialize("", 1, 1), 0);
  EXPECT_EQ(rdma->registerMemory(buf, kBytes), 0);
  EXPECT_EQ(rdma->allocateControlBuffer(), 0);
  p2p->freeBuffer(buf);
}

// EP asks for MAX_QP_COUNT / n * n queue pairs: 128 per peer on two ranks,
// 256 on one; more than that per peer, or none, is refused by name.
TEST_F(CompatTransferEngine, EpsQueuePairCountsAreAccepted) {
  testing::DaemonProcess daemon(dir_.path());
  ::setenv("MOONCAKE_SOCKET", daemon.socket().c_str(), 1);
  for (int ranks : {1, 2, 3}) {
    TransferEngine engine;
    device::RdmaTransport* rdma = engine.getOrCreateRdmaTransport();
    ASSERT_NE(rdma, nullptr);
    EXPECT_EQ(rdma->initialize("", ranks, MAX_QP_COUNT / ranks * ranks), 0) << ranks << " ranks";
    if (ranks != 2) continue;
    // Two ranks, as EP's test on one GPU: 128 queue pairs toward the peer.
    device::P2pTransport* p2p = engine.getOrCreateP2pTransport(ranks);
    ASSERT_NE(p2p, nullptr);
    void* buf = p2p->allocateBuffer(1 << 20);
    ASSERT_NE(buf, nullptr);
    EXPECT_EQ(rdma->registerMemory(buf, 1 << 20), 0);
    EXPECT_EQ(rdma->allocateControlBuffer(), 0);
    EXPECT_EQ(rdma->createQueuePairs(nullptr), 0);
    EXPECT_NE(rdma->qpDevCtxsPtr(), nullptr);
  }
  TransferEngine engine;
  device::RdmaTransport* rdma = engine.getOrCreateRdmaTransport();
  ASSERT_NE(rdma, nullptr);
  // Upstream's callers see a return code only: the reason is logged.
  ::testing::internal::CaptureStderr();
  EXPECT_NE(rdma->initialize("", 1, MAX_QP_COUNT + 1), 0);
  EXPECT_NE(rdma->initialize("", 4, 3), 0);
  EXPECT_NE(rdma->createQueuePairs(nullptr), 0);
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("RdmaTransport::initialize: INVALID_ARGUMENT: initialize(num_ranks 1, "
                     "num_qps 257): 257 queue pairs per peer"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("RdmaTransport::createQueuePairs: "), std::string::npos) << log;
}

// Upstream's recreateQueuePairs makes the queue pairs again and keeps the
// device tables where they are: a kernel or CUDA graph that captured
// qpDevCtxsPtr(), raddrsPtr() or rkeysPtr() stays valid.
TEST_F(CompatTransferEngine, RecreateQueuePairsKeepsTheTablesWhereTheyAre) {
  testing::DaemonProcess daemon(dir_.path());
  ::setenv("MOONCAKE_SOCKET", daemon.socket().c_str(), 1);
  TransferEngine engine;
  device::P2pTransport* p2p = engine.getOrCreateP2pTransport(2);
  device::RdmaTransport* rdma = engine.getOrCreateRdmaTransport();
  ASSERT_NE(p2p, nullptr);
  ASSERT_NE(rdma, nullptr);
  void* buf = p2p->allocateBuffer(1 << 20);
  ASSERT_NE(buf, nullptr);
  ASSERT_EQ(rdma->initialize("", 2, 8), 0);
  ASSERT_EQ(rdma->registerMemory(buf, 1 << 20), 0);
  EXPECT_NE(rdma->recreateQueuePairs(nullptr), 0) << "before allocateControlBuffer";
  ASSERT_EQ(rdma->allocateControlBuffer(), 0);
  ASSERT_EQ(rdma->createQueuePairs(nullptr), 0);
  void* const qps = rdma->qpDevCtxsPtr();
  void* const raddrs = rdma->raddrsPtr();
  void* const rkeys = rdma->rkeysPtr();
  const std::vector<int32_t> before = rdma->localMetadata().qpns;
  for (int round = 0; round < 3; ++round) {
    ASSERT_EQ(rdma->recreateQueuePairs(nullptr), 0) << round;
    EXPECT_EQ(rdma->qpDevCtxsPtr(), qps);
    EXPECT_EQ(rdma->raddrsPtr(), raddrs);
    EXPECT_EQ(rdma->rkeysPtr(), rkeys);
  }
  const std::vector<int32_t> after = rdma->localMetadata().qpns;
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_NE(after[i], 0) << "slot " << i;
    EXPECT_EQ(std::count(before.begin(), before.end(), after[i]), 0)
        << "slot " << i << " kept an old queue pair";
  }
}

TEST_F(CompatTransferEngine, TwoEnginesHoldTheirOwnTransports) {
  testing::DaemonProcess daemon(dir_.path());
  ::setenv("MOONCAKE_SOCKET", daemon.socket().c_str(), 1);
  TransferEngine a, b;
  device::P2pTransport* pa = a.getOrCreateP2pTransport(1);
  device::P2pTransport* pb = b.getOrCreateP2pTransport(1);
  ASSERT_NE(pa, nullptr);
  ASSERT_NE(pb, nullptr);
  EXPECT_NE(pa, pb);
}

// Upstream's switch: only "0" asks for fabric handles (and then strictly).
TEST(CompatNvlinkIpc, OnlyZeroAsksForFabricHandles) {
  using device::CudaHandleKind;
  EXPECT_EQ(device::UpstreamCudaHandleKind(nullptr), CudaHandleKind::kSameNode);
  EXPECT_EQ(device::UpstreamCudaHandleKind("1"), CudaHandleKind::kSameNode);
  EXPECT_EQ(device::UpstreamCudaHandleKind(""), CudaHandleKind::kSameNode);
  EXPECT_EQ(device::UpstreamCudaHandleKind("00"), CudaHandleKind::kSameNode);
  EXPECT_EQ(device::UpstreamCudaHandleKind("0"), CudaHandleKind::kFabric);
}

}  // namespace
}  // namespace mooncake
