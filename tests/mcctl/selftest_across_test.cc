// The answering side of `mcctl selftest rdma --across` (selftest_across.h)
// when the other rank lies: requests written straight into its mailbox
// over RDMA, naming ranges outside the selftest buffer, over the read
// limit, or wrapping past 2^64. Each is refused (the reply carries
// kRefused), no byte lands in the asker's readback area, the answerer
// goes on serving honest requests, and the daemon keeps serving. Two
// ranks of this process through a real mooncaked (softnic).
#include "selftest_across.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "daemon_process.h"
#include "mooncake/client/communicator.h"
#include "mooncake/device/comm_device.h"
#include "mooncake/mcctl/selftest_rdma.h"

namespace mooncake::mcctl::selftest {
namespace {

using mooncake::testing::DaemonProcess;
using mooncake::testing::TempDir;

TEST(ReadableRangeTest, OnlyRangesInsideTheBufferAndUnderTheLimit) {
  EXPECT_TRUE(ReadableRange(0, 8));
  EXPECT_TRUE(ReadableRange(kBufferBytes - 8, 8));
  EXPECT_TRUE(ReadableRange(0, kMaxReadBytes));
  EXPECT_FALSE(ReadableRange(0, 0));
  EXPECT_FALSE(ReadableRange(0, kMaxReadBytes + 1));
  EXPECT_FALSE(ReadableRange(kBufferBytes - 8, 16));
  EXPECT_FALSE(ReadableRange(kBufferBytes, 1));
  EXPECT_FALSE(ReadableRange(~uint64_t{0} - 4, 8));  // wraps past 2^64
  EXPECT_FALSE(ReadableRange(0, kTurnOver));
}

class ForgedRequestTest : public ::testing::Test {
 protected:
  void SetUp() override {
    daemon_ = std::make_unique<DaemonProcess>(dir_.path());
    auto options = [&](uint32_t rank) {
      CommunicatorOptions c;
      c.socket_path = daemon_->socket();
      c.group = "forged-requests";
      c.rank = rank;
      c.world_size = 2;
      c.buffer_bytes = kBufferBytes;
      c.platform = Platform::kHost;
      c.route = Route::kRdma;
      c.atomics_route = AtomicsRoute::kDevice;
      c.timeout = absl::Seconds(30);
      return c;
    };
    absl::StatusOr<std::unique_ptr<Communicator>> second = absl::UnknownError("not run");
    std::thread t([&] { second = Communicator::Create(options(1)); });
    absl::StatusOr<std::unique_ptr<Communicator>> first = Communicator::Create(options(0));
    t.join();
    ASSERT_TRUE(first.ok()) << first.status();
    ASSERT_TRUE(second.ok()) << second.status();
    liar_ = *std::move(first);
    answerer_ = *std::move(second);
  }

  uint8_t* Buf(Communicator& c, uint64_t off) { return static_cast<uint8_t*>(c.buffer()) + off; }
  uint64_t Word(Communicator& c, uint64_t off) {
    return std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(Buf(c, off)))
        .load(std::memory_order_acquire);
  }

  // What a lying rank does: the request words and the number, straight
  // into the answerer's mailbox, then waits for the reply word to carry
  // that number (returned, flags included; 0 when none came in 10 s).
  uint64_t Ask(uint64_t seq, uint64_t offset, uint64_t length) {
    const device::McPeer peer = device::mc_peer(liar_->ctx(), 1);
    const uint64_t request[2] = {offset, length};
    EXPECT_EQ(device::mc_put_thread(peer, Buf(*liar_, kRequestOff), request, sizeof(request)),
              device::McStatus::kOk);
    EXPECT_EQ(device::mc_put_thread(peer, Buf(*liar_, kRequestSeqOff), &seq, sizeof(seq)),
              device::McStatus::kOk);
    EXPECT_EQ(device::mc_quiet(liar_->ctx()), device::McStatus::kOk);
    if (length == kTurnOver) return 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      const uint64_t reply = Word(*liar_, kReplySeqOff);
      if ((reply & ~kRefused) == seq) return reply;
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    return 0;
  }

  TempDir dir_;
  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<Communicator> liar_, answerer_;
};

TEST_F(ForgedRequestTest, RangesOutsideTheBufferAreRefusedAndNothingLands) {
  // What the answerer holds (past its mailbox, which starts zeroed), and a
  // sentinel where the liar's read-backs land.
  for (uint64_t i = kSrcOff; i < kBufferBytes; ++i) {
    *Buf(*answerer_, i) = static_cast<uint8_t>(i * 7);
  }
  std::memset(Buf(*liar_, kReadbackOff), 0xab, kMaxReadBytes);

  PeerWatch watch(answerer_.get(), 0);
  PeerAnswerer answerer(answerer_.get(), 0, absl::Seconds(20), &watch);
  absl::Status served = absl::UnknownError("not run");
  std::thread serve([&] { served = answerer.ServeUntilHandOver(); });

  const struct {
    uint64_t offset, length;
  } lies[] = {{kBufferBytes - 8, 64},   // past the end of the buffer
              {kBufferBytes, 8},        // just past it
              {~uint64_t{0} - 4, 16},   // offset + length wraps past 2^64
              {0, kMaxReadBytes + 1},   // over the read limit
              {0, uint64_t{1} << 40},   // far over it
              {uint64_t{1} << 40, 8}};  // far outside
  uint64_t seq = 0;
  for (const auto& lie : lies) {
    const uint64_t reply = Ask(++seq, lie.offset, lie.length);
    EXPECT_EQ(reply, seq | kRefused) << "offset " << lie.offset << " length " << lie.length;
  }
  for (uint64_t i = 0; i < kMaxReadBytes; ++i) {
    ASSERT_EQ(*Buf(*liar_, kReadbackOff + i), 0xab) << "byte " << i << " of the readback area";
  }
  // The answerer goes on: an honest request is answered with the bytes.
  EXPECT_EQ(Ask(++seq, kDstOff, 4096), seq);
  for (uint64_t i = 0; i < 4096; ++i) {
    ASSERT_EQ(*Buf(*liar_, kReadbackOff + i), static_cast<uint8_t>((kDstOff + i) * 7)) << i;
  }
  Ask(++seq, 0, kTurnOver);
  serve.join();
  EXPECT_TRUE(served.ok()) << served;
  EXPECT_EQ(answerer.served(), std::size(lies) + 1);
  EXPECT_TRUE(daemon_->running());
}

}  // namespace
}  // namespace mooncake::mcctl::selftest
