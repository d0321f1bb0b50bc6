// The CPU-assisted doorbell's pure part on memory: which WQE it rings for,
// the control word it writes (QPN forced to the QP's), the 16-bit counter's
// wrap; and the watcher thread ringing a "register" that is plain memory.
#include "rdma/mlx5/cpu_doorbell.h"

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace mooncake::daemon::mlx5 {
namespace {

constexpr uint32_t kQpn = 0x00abcdef & 0xffffff;

struct Rings {
  explicit Rings(uint32_t n) : sq(n * 64), wqe_cnt(n) {}
  // A control segment as the device writes it: big-endian words.
  void Post(uint16_t index, uint8_t opcode, uint32_t qpn, uint8_t ds) {
    uint8_t* c = sq.data() + (index & (wqe_cnt - 1)) * 64;
    const uint8_t bytes[8] = {0,
                              static_cast<uint8_t>(index >> 8),
                              static_cast<uint8_t>(index),
                              opcode,
                              static_cast<uint8_t>(qpn >> 16),
                              static_cast<uint8_t>(qpn >> 8),
                              static_cast<uint8_t>(qpn),
                              ds};
    std::memcpy(c, bytes, 8);
  }
  void SetCounter(uint32_t counter) {
    const uint32_t be = __builtin_bswap32(counter);
    std::memcpy(dbrec + 4, &be, 4);
  }
  std::vector<uint8_t> sq;
  uint32_t wqe_cnt;
  alignas(8) uint8_t dbrec[8] = {};
};

std::vector<uint8_t> Bytes(uint64_t v) {
  std::vector<uint8_t> b(8);
  std::memcpy(b.data(), &v, 8);
  return b;
}

TEST(NextDoorbellTest, NothingWhileTheCounterStands) {
  Rings r(8);
  EXPECT_FALSE(NextDoorbell(r.sq.data(), 8, r.dbrec, 0, kQpn).has_value());
  r.SetCounter(5);
  EXPECT_FALSE(NextDoorbell(r.sq.data(), 8, r.dbrec, 5, kQpn).has_value());
}

TEST(NextDoorbellTest, RingsWithTheLastPostedWqesControlWord) {
  Rings r(8);
  for (uint16_t i = 0; i < 3; ++i) r.Post(i, 0x08 /*RDMA write*/, kQpn, 3);
  r.SetCounter(3);
  auto ring = NextDoorbell(r.sq.data(), 8, r.dbrec, 0, kQpn);
  ASSERT_TRUE(ring.has_value());
  EXPECT_EQ(ring->counter, 3);
  // WQE 2's first 8 bytes, in memory order.
  EXPECT_EQ(Bytes(ring->doorbell), (std::vector<uint8_t>{0, 0, 2, 0x08, 0xab, 0xcd, 0xef, 3}));
}

TEST(NextDoorbellTest, SlotWrapsWithTheRingAndCounterWrapsAt16Bits) {
  Rings r(4);
  r.Post(6, 0x0a, kQpn, 2);  // slot 6 & 3 = 2
  r.SetCounter(7);
  auto ring = NextDoorbell(r.sq.data(), 4, r.dbrec, 6, kQpn);
  ASSERT_TRUE(ring.has_value());
  EXPECT_EQ(Bytes(ring->doorbell)[2], 6);
  EXPECT_EQ(Bytes(ring->doorbell)[3], 0x0a);

  // Counter 0 after 0xffff: the WQE rung for is 0xffff, slot 3.
  r.Post(0xffff, 0x08, kQpn, 3);
  r.SetCounter(0x10000);  // the upper bits are ignored: only the low 16 count
  ring = NextDoorbell(r.sq.data(), 4, r.dbrec, 0xfffe, kQpn);
  ASSERT_TRUE(ring.has_value());
  EXPECT_EQ(ring->counter, 0);
  EXPECT_EQ(Bytes(ring->doorbell)[1], 0xff);
  EXPECT_EQ(Bytes(ring->doorbell)[2], 0xff);
  EXPECT_FALSE(NextDoorbell(r.sq.data(), 4, r.dbrec, 0, kQpn).has_value());
}

TEST(NextDoorbellTest, TheQpnIsTheQpsOwnWhateverTheWqeSays) {
  Rings r(2);
  r.Post(0, 0x08, /*another QP*/ 0x123456, 3);
  r.SetCounter(1);
  auto ring = NextDoorbell(r.sq.data(), 2, r.dbrec, 0, kQpn);
  ASSERT_TRUE(ring.has_value());
  EXPECT_EQ(Bytes(ring->doorbell), (std::vector<uint8_t>{0, 0, 0, 0x08, 0xab, 0xcd, 0xef, 3}));
}

TEST(CpuDoorbellTest, RingsOncePerAdvanceUntilUnwatched) {
  Rings r(8);
  alignas(8) uint64_t reg = 0;
  CpuDoorbell bell(/*max_idle_sleep_us=*/50, /*spin_us=*/100);
  CpuDoorbell::Qp qp;
  qp.sq = r.sq.data();
  qp.sq_wqe_cnt = 8;
  qp.dbrec = r.dbrec;
  qp.qpn = kQpn;
  qp.reg = &reg;
  bell.Watch(7, qp);
  EXPECT_EQ(bell.watched(), 1u);
  r.Post(0, 0x08, kQpn, 3);
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  r.SetCounter(1);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (bell.rings() < 1 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  ASSERT_EQ(bell.rings(), 1u);
  EXPECT_EQ(Bytes(__atomic_load_n(&reg, __ATOMIC_ACQUIRE)),
            (std::vector<uint8_t>{0, 0, 0, 0x08, 0xab, 0xcd, 0xef, 3}));
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(bell.rings(), 1u);  // the counter did not move again
  bell.Unwatch(7);
  EXPECT_EQ(bell.watched(), 0u);
  r.Post(1, 0x08, kQpn, 3);
  r.SetCounter(2);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(bell.rings(), 1u);  // unwatched: never touched again
}

}  // namespace
}  // namespace mooncake::daemon::mlx5
