// The CPU-assisted doorbell's pure part on memory: which WQE it rings for,
// the control word it writes (QPN forced to the QP's), the 16-bit counter's
// wrap; and the watcher thread ringing a "register" that is plain memory.
#include "rdma/mlx5/cpu_doorbell.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
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
  EXPECT_FALSE(NextDoorbell(r.dbrec, 0, kQpn).has_value());
  r.SetCounter(5);
  EXPECT_FALSE(NextDoorbell(r.dbrec, 5, kQpn).has_value());
}

// Issue 24 item 6: the ring is (producer index, QPN) alone, as NVSHMEM's
// ibgda_ring_db writes it: be32(index << 8), be32(qpn << 8). Nothing of
// the WQE is read: a WQE slot the NIC has consumed may already hold the
// client's next WQE, half written.
TEST(NextDoorbellTest, RingsFromTheProducerIndexAndQpnAlone) {
  Rings r(8);
  for (uint16_t i = 0; i < 3; ++i) r.Post(i, 0x08 /*RDMA write*/, 0x123456, 3);
  r.SetCounter(3);
  auto ring = NextDoorbell(r.dbrec, 0, kQpn);
  ASSERT_TRUE(ring.has_value());
  EXPECT_EQ(ring->counter, 3);
  EXPECT_EQ(Bytes(ring->doorbell), (std::vector<uint8_t>{0, 0, 3, 0, 0xab, 0xcd, 0xef, 0}));
  // The WQEs' contents change nothing (the QPN is the QP's own).
  std::memset(r.sq.data(), 0xee, r.sq.size());
  EXPECT_EQ(NextDoorbell(r.dbrec, 0, kQpn)->doorbell, ring->doorbell);
}

TEST(NextDoorbellTest, TheCounterWrapsAt16Bits) {
  Rings r(4);
  r.SetCounter(0x10000);  // the upper bits are ignored: only the low 16 count
  auto ring = NextDoorbell(r.dbrec, 0xffff, kQpn);
  ASSERT_TRUE(ring.has_value());
  EXPECT_EQ(ring->counter, 0);
  EXPECT_EQ(Bytes(ring->doorbell), (std::vector<uint8_t>{0, 0, 0, 0, 0xab, 0xcd, 0xef, 0}));
  EXPECT_FALSE(NextDoorbell(r.dbrec, 0, kQpn).has_value());
  r.SetCounter(0xffff);
  EXPECT_EQ(Bytes(NextDoorbell(r.dbrec, 0, kQpn)->doorbell),
            (std::vector<uint8_t>{0, 0xff, 0xff, 0, 0xab, 0xcd, 0xef, 0}));
}

TEST(CpuDoorbellTest, RingsOncePerAdvanceUntilUnwatched) {
  Rings r(8);
  alignas(8) uint64_t reg = 0;
  CpuDoorbell bell(/*max_idle_sleep_us=*/50, /*spin_us=*/100);
  CpuDoorbell::Qp qp;
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
            (std::vector<uint8_t>{0, 0, 1, 0, 0xab, 0xcd, 0xef, 0}));
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(bell.rings(), 1u);  // the counter did not move again
  bell.Unwatch(7);
  EXPECT_EQ(bell.watched(), 0u);
  r.Post(1, 0x08, kQpn, 3);
  r.SetCounter(2);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(bell.rings(), 1u);  // unwatched: never touched again
}

// Issue 24 item 6: from the record's write to the register's, against a
// "UAR page" in plain memory, with posts 0.3 to 1 ms apart: past the old
// fixed 200 us spin (after which the thread slept up to 100 us), inside the
// adaptive window. The figures are printed; the bound asserted is loose
// enough for a loaded CI machine (the test runs alone: RUN_SERIAL).
TEST(CpuDoorbellTest, TheRingFollowsTheRecordWithinMicrosecondsWhileActive) {
  Rings r(8);
  alignas(8) uint64_t reg = 0;
  CpuDoorbell bell;  // the daemon's defaults
  CpuDoorbell::Qp qp;
  qp.dbrec = r.dbrec;
  qp.qpn = kQpn;
  qp.reg = &reg;
  bell.Watch(1, qp);
  using Clock = std::chrono::steady_clock;
  std::vector<double> us;
  constexpr int kPosts = 1500;
  uint32_t seed = 12345;
  for (int i = 1; i <= kPosts; ++i) {
    seed = seed * 1103515245u + 12345u;
    const auto gap = std::chrono::microseconds(300 + (seed >> 16) % 700);
    const auto until = Clock::now() + gap;
    while (Clock::now() < until) std::this_thread::sleep_for(std::chrono::microseconds(50));
    const auto t0 = Clock::now();
    const uint32_t be = __builtin_bswap32(static_cast<uint32_t>(i));
    __atomic_store_n(reinterpret_cast<uint32_t*>(r.dbrec + 4), be, __ATOMIC_RELEASE);
    const uint16_t want = static_cast<uint16_t>(i);
    for (;;) {
      const std::vector<uint8_t> b = Bytes(__atomic_load_n(&reg, __ATOMIC_ACQUIRE));
      if (static_cast<uint16_t>(b[1] << 8 | b[2]) == want) break;
      if (Clock::now() - t0 > std::chrono::seconds(2)) FAIL() << "post " << i << " never rung";
    }
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  std::sort(us.begin(), us.end());
  const double p50 = us[us.size() / 2], p99 = us[us.size() * 99 / 100];
  std::printf(
      "[ figures ] CPU-assisted doorbell, record write -> register write, %d posts 0.3-1 ms "
      "apart: p50 %.2f us, p99 %.2f us, max %.2f us\n",
      kPosts, p50, p99, us.back());
  EXPECT_LT(p50, 50.0);
  EXPECT_EQ(bell.rings(), static_cast<uint64_t>(kPosts));
}

}  // namespace
}  // namespace mooncake::daemon::mlx5
