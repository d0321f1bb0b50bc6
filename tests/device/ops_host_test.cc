// Semantics of the host platform ops (ops_host.h) and of the emulated warps
// and blocks (host_coop.h) that the Device API's protocol code runs on in CI.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "mooncake/device/host_coop.h"
#include "mooncake/device/platform.h"

namespace mooncake::device {
namespace {

static_assert(MC_PLATFORM_HOST, "g++ builds must select the host platform");

TEST(OpsHost, LoadsAndStoresRoundTrip) {
  alignas(8) uint32_t u32 = 0;
  alignas(8) int64_t i64 = 0;
  mc_st_release(&u32, 0xdeadbeefu);
  EXPECT_EQ(mc_ld_acquire(&u32), 0xdeadbeefu);
  mc_st_relaxed(&u32, 7u);
  EXPECT_EQ(mc_ld_relaxed(&u32), 7u);
  mc_st_release(&i64, int64_t{-5});
  EXPECT_EQ(mc_ld_acquire(&i64), -5);
}

TEST(OpsHost, AtomicAddReturnsPreviousValue) {
  alignas(8) int32_t s = 10;
  EXPECT_EQ(mc_atomic_add_release(&s, -3), 10);
  EXPECT_EQ(s, 7);
  alignas(8) uint64_t u = ~0ull;
  EXPECT_EQ(mc_atomic_add_relaxed(&u, uint64_t{2}), ~0ull);
  EXPECT_EQ(u, 1u);  // wraps like the GPU's u64 add
  mc_red_add_release(&u, uint64_t{41});
  EXPECT_EQ(u, 42u);
}

TEST(OpsHost, VectorLoadStoreMoveSixteenBytes) {
  alignas(16) unsigned char src[32], dst[32];
  for (int i = 0; i < 32; ++i) src[i] = static_cast<unsigned char>(i * 7 + 1);
  std::memset(dst, 0xee, sizeof(dst));
  mc_st_v4(dst, mc_ld_v4(src));
  mc_st_na_v4(dst + 16, mc_ld_nc_v4(src + 16));
  EXPECT_EQ(std::memcmp(dst, src, 32), 0);
}

TEST(OpsHost, TwoWordStoreAndLoad) {
  McLLSlot slot{};
  mc_st_relaxed_v2u64(&slot, 0x1111222233334444ull, 0x5555666677778888ull);
  uint64_t a = 0, b = 0;
  mc_ld_relaxed_v2u64(&slot, &a, &b);
  EXPECT_EQ(a, 0x1111222233334444ull);
  EXPECT_EQ(b, 0x5555666677778888ull);
}

TEST(OpsHost, ByteSwaps) {
  EXPECT_EQ(mc_bswap16(0x1234), 0x3412);
  EXPECT_EQ(mc_bswap32(0x11223344u), 0x44332211u);
  EXPECT_EQ(mc_bswap64(0x0102030405060708ull), 0x0807060504030201ull);
  EXPECT_EQ(mc_bswap32(mc_bswap32(0xcafef00du)), 0xcafef00du);
}

TEST(OpsHost, CompareCoversEveryOperator) {
  EXPECT_TRUE(mc_compare(3, McCmp::kEq, 3));
  EXPECT_FALSE(mc_compare(3, McCmp::kEq, 4));
  EXPECT_TRUE(mc_compare(3, McCmp::kNe, 4));
  EXPECT_FALSE(mc_compare(3, McCmp::kNe, 3));
  EXPECT_TRUE(mc_compare(4, McCmp::kGe, 4));
  EXPECT_FALSE(mc_compare(3, McCmp::kGe, 4));
  EXPECT_TRUE(mc_compare(5, McCmp::kGt, 4));
  EXPECT_FALSE(mc_compare(4, McCmp::kGt, 4));
  EXPECT_TRUE(mc_compare(4, McCmp::kLe, 4));
  EXPECT_FALSE(mc_compare(5, McCmp::kLe, 4));
  EXPECT_TRUE(mc_compare(3, McCmp::kLt, 4));
  EXPECT_FALSE(mc_compare(4, McCmp::kLt, 4));
  // Signedness follows the type.
  EXPECT_TRUE(mc_compare(int32_t{-1}, McCmp::kLt, int32_t{0}));
  EXPECT_FALSE(mc_compare(uint32_t{0xffffffffu}, McCmp::kLt, uint32_t{0}));
}

TEST(OpsHost, LoneThreadIsAWarpAndBlockOfOne) {
  EXPECT_EQ(mc_warp_size(), 1u);
  EXPECT_EQ(mc_lane_id(), 0u);
  EXPECT_EQ(mc_block_size(), 1u);
  EXPECT_EQ(mc_block_thread_index(), 0u);
  mc_syncwarp();  // must not block
  mc_syncthreads();
}

TEST(OpsHost, WarpGivesLanesAndBarrierOrdersWrites) {
  constexpr unsigned kWidth = 16;
  std::vector<uint32_t> slots(kWidth, 0);
  std::atomic<int> bad{0};
  host::runWarp(kWidth, [&](unsigned lane) {
    if (mc_lane_id() != lane || mc_warp_size() != kWidth) bad++;
    for (uint32_t round = 1; round <= 50; ++round) {
      slots[lane] = round * 100 + lane;  // plain store, ordered by the barrier
      mc_syncwarp();
      for (unsigned l = 0; l < kWidth; ++l) {
        if (slots[l] != round * 100 + l) bad++;
      }
      mc_syncwarp();
    }
  });
  EXPECT_EQ(bad.load(), 0);
}

TEST(OpsHost, BlockIsCutIntoWarpsOf32) {
  constexpr unsigned kThreads = 40;  // one full warp and one of 8
  std::vector<unsigned> lane(kThreads), width(kThreads), index(kThreads), size(kThreads);
  std::vector<uint32_t> slots(kThreads, 0);
  std::atomic<int> bad{0};
  host::runBlock(kThreads, [&](unsigned t) {
    lane[t] = mc_lane_id();
    width[t] = mc_warp_size();
    index[t] = mc_block_thread_index();
    size[t] = mc_block_size();
    slots[t] = t + 1;
    mc_syncthreads();
    for (unsigned i = 0; i < kThreads; ++i) {
      if (slots[i] != i + 1) bad++;
    }
    mc_syncwarp();  // warps of different widths each meet their own barrier
  });
  EXPECT_EQ(bad.load(), 0);
  for (unsigned t = 0; t < kThreads; ++t) {
    EXPECT_EQ(lane[t], t % 32);
    EXPECT_EQ(width[t], t < 32 ? 32u : 8u);
    EXPECT_EQ(index[t], t);
    EXPECT_EQ(size[t], kThreads);
  }
}

// Message passing: data written before a release store is visible after an
// acquire load that reads it (many rounds, to give a broken mapping a
// chance to show).
TEST(OpsHost, ReleaseAcquireMessagePassing) {
  constexpr int kRounds = 20000;
  alignas(64) uint64_t data[4] = {};
  alignas(64) uint32_t flag = 0;
  alignas(64) uint32_t ack = 0;
  std::atomic<int> bad{0};
  std::thread consumer([&] {
    uint32_t spins = 0;
    for (uint32_t r = 1; r <= kRounds; ++r) {
      while (mc_ld_acquire(&flag) != r) mc_spin_backoff(&spins);
      for (int i = 0; i < 4; ++i) {
        if (data[i] != r * 4ull + i) bad++;
      }
      mc_st_release(&ack, r);
    }
  });
  uint32_t spins = 0;
  for (uint32_t r = 1; r <= kRounds; ++r) {
    for (int i = 0; i < 4; ++i) data[i] = r * 4ull + i;
    mc_st_release(&flag, r);
    while (mc_ld_acquire(&ack) != r) mc_spin_backoff(&spins);
  }
  consumer.join();
  EXPECT_EQ(bad.load(), 0);
}

// The GPU traps on these; the host platform must fail as loudly.
TEST(OpsHostDeathTest, MisalignedAccessesAbort) {
  alignas(16) unsigned char buf[64] = {};
  EXPECT_DEATH(mc_st_release(reinterpret_cast<uint32_t*>(buf + 2), 1u), "not 4-byte aligned");
  EXPECT_DEATH(mc_ld_acquire(reinterpret_cast<const uint64_t*>(buf + 4)), "not 8-byte aligned");
  EXPECT_DEATH(mc_st_v4(buf + 8, McVec16{}), "not 16-byte aligned");
  EXPECT_DEATH(mc_st_relaxed_v2u64(buf + 8, 1, 2), "not 16-byte aligned");
}

TEST(OpsHost, TimeIsMonotonic) {
  const uint64_t a = mc_time_ns();
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  const uint64_t b = mc_time_ns();
  EXPECT_GE(b - a, 2'000'000u);
}

}  // namespace
}  // namespace mooncake::device
