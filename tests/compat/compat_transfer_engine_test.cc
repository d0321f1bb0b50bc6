// The engine path (compat/include/transfer_engine.h): EP's buffer asks a
// TransferEngine for its transports. Against a real mooncaked on a
// temporary socket, host platform: the transports are made once and kept,
// a failed factory is tried again, and the transports work as EP uses them
// (a buffer from the P2P one registered with the RDMA one).
#include <gtest/gtest.h>
#include <stdlib.h>

#include <memory>
#include <string>

#include "daemon_process.h"
#include "transfer_engine.h"

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

TEST_F(CompatTransferEngine, WithoutADaemonNothingIsMadeAndALaterCallTriesAgain) {
  ::setenv("MOONCAKE_SOCKET", (dir_.path() + "/nobody.sock").c_str(), 1);
  TransferEngine engine;
  EXPECT_EQ(engine.getOrCreateP2pTransport(2), nullptr);
  EXPECT_EQ(engine.getOrCreateRdmaTransport(), nullptr);
  testing::DaemonProcess daemon(dir_.path());
  ::setenv("MOONCAKE_SOCKET", daemon.socket().c_str(), 1);
  EXPECT_NE(engine.getOrCreateP2pTransport(2), nullptr);
  EXPECT_NE(engine.getOrCreateRdmaTransport(), nullptr);
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

}  // namespace
}  // namespace mooncake
