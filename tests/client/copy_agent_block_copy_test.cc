// The copy agent's kernels share each copy among a block's threads
// (client/src/copy_agent_block_copy.h); here a loop over thread indices
// stands in for the block, since each thread's loads and stores are its
// own. For every size up to 300 bytes and some large ones, every alignment
// of both sides and two block sizes: every byte arrives, nothing outside
// the destination is written, nothing outside the source is read, and the
// widest co-aligned unit is used.
#include "copy_agent_block_copy.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace mooncake::copy_agent {
namespace {

constexpr uint64_t kGuard = 64;
constexpr uint8_t kSentinel = 0xA5;

// Reads through memcpy, counting any byte read outside [lo, hi).
struct CheckedLoads {
  const uint8_t* lo;
  const uint8_t* hi;
  uint64_t* outside;
  uint64_t* widest;  // the largest unit read

  void Note(const uint8_t* p, uint64_t n) const {
    if (p < lo || p + n > hi) ++*outside;
    if (n > *widest) *widest = n;
  }
  template <class T>
  T operator()(const T* p) const {
    Note(reinterpret_cast<const uint8_t*>(p), sizeof(T));
    T v;
    std::memcpy(&v, p, sizeof(T));
    return v;
  }
  uint8_t Byte(const uint8_t* p) const {
    Note(p, 1);
    return *p;
  }
};

// Copies n bytes with dst and src at the given offsets from 64-byte
// boundaries; returns the widest unit read, or 0 after a failure.
uint64_t CopyAndCheck(uint64_t n, uint64_t dst_off, uint64_t src_off, uint32_t threads) {
  std::vector<uint8_t> src_buf(n + 2 * kGuard + 64), dst_buf(n + 2 * kGuard + 64);
  auto* src_base = reinterpret_cast<uint8_t*>(
      (reinterpret_cast<uintptr_t>(src_buf.data()) + kGuard + 63) & ~uintptr_t{63});
  auto* dst_base = reinterpret_cast<uint8_t*>(
      (reinterpret_cast<uintptr_t>(dst_buf.data()) + kGuard + 63) & ~uintptr_t{63});
  uint8_t* src = src_base + src_off;
  uint8_t* dst = dst_base + dst_off;
  for (uint64_t i = 0; i < src_buf.size(); ++i) src_buf[i] = static_cast<uint8_t>(i * 131 + 7);
  std::memset(dst_buf.data(), kSentinel, dst_buf.size());
  uint64_t outside = 0, widest = 0;
  const CheckedLoads load{src, src + n, &outside, &widest};
  for (uint32_t tid = 0; tid < threads; ++tid) BlockCopy(dst, src, n, tid, threads, load);
  const std::string where = "n " + std::to_string(n) + ", dst +" + std::to_string(dst_off) +
                            ", src +" + std::to_string(src_off) + ", " + std::to_string(threads) +
                            " threads";
  EXPECT_EQ(outside, 0u) << where << ": reads outside the source";
  EXPECT_EQ(std::memcmp(dst, src, n), 0) << where << ": bytes differ";
  for (uint8_t* p = dst_buf.data(); p < dst; ++p) {
    if (*p != kSentinel) {
      ADD_FAILURE() << where << ": written " << (dst - p) << " bytes before the destination";
      return 0;
    }
  }
  for (uint8_t* p = dst + n; p < dst_buf.data() + dst_buf.size(); ++p) {
    if (*p != kSentinel) {
      ADD_FAILURE() << where << ": written " << (p - dst - n) << " bytes past the destination";
      return 0;
    }
  }
  return ::testing::Test::HasFailure() ? 0 : widest;
}

TEST(CopyAgentBlockCopyTest, TheUnitIsTheWidestBothAddressesAreAlignedTo) {
  EXPECT_EQ(CoalignedUnit(0x1000, 0x2000), 16u);
  EXPECT_EQ(CoalignedUnit(0x1013, 0x2003), 16u);  // both 3 past 16
  EXPECT_EQ(CoalignedUnit(0x1008, 0x2000), 8u);
  EXPECT_EQ(CoalignedUnit(0x1004, 0x2000), 4u);
  EXPECT_EQ(CoalignedUnit(0x100c, 0x2000), 4u);
  EXPECT_EQ(CoalignedUnit(0x1002, 0x2000), 2u);
  EXPECT_EQ(CoalignedUnit(0x1001, 0x2000), 1u);
}

TEST(CopyAgentBlockCopyTest, EverySizeAndAlignmentArrivesWhole) {
  for (const uint32_t threads : {256u, 3u}) {
    for (uint64_t n = 0; n <= 300; ++n) {
      for (uint64_t d = 0; d < 16; ++d) {
        for (uint64_t s = 0; s < 16; ++s) {
          if (CopyAndCheck(n, d, s, threads) == 0 && n > 0) return;
        }
      }
    }
  }
}

TEST(CopyAgentBlockCopyTest, LargeCopiesUseTheWidestUnitAndArriveWhole) {
  struct Case {
    uint64_t n, dst_off, src_off, unit;
  };
  for (const Case c : {Case{16384, 0, 0, 16}, Case{65536 + 7, 0, 0, 16}, Case{4096, 8, 0, 8},
                       Case{4096 + 5, 4, 0, 4}, Case{70000, 12, 0, 4}, Case{4096, 2, 0, 2},
                       Case{4097, 1, 0, 1}, Case{65536, 35, 3, 16}}) {
    EXPECT_EQ(CopyAndCheck(c.n, c.dst_off, c.src_off, 256), c.unit)
        << c.n << " bytes, dst +" << c.dst_off << ", src +" << c.src_off;
  }
}

}  // namespace
}  // namespace mooncake::copy_agent
