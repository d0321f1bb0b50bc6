// The RDMA control memfd's layout (client/src/rdma_control_layout.h): every
// ring and every slot page-aligned (what the mlx5 DevX provider requires),
// nothing overlapping, every byte inside the slot.
#include "rdma_control_layout.h"

#include <gtest/gtest.h>

#include <cstdint>

namespace mooncake {
namespace {

TEST(RdmaControlLayout, RingsArePageAlignedAndDisjoint) {
  for (uint32_t depth : {1u, 2u, 32u, 63u, 64u, 65u, 256u, 4096u, 32768u}) {
    const uint64_t slot_bytes = QpControlSlotBytes(depth);
    EXPECT_EQ(slot_bytes % kRdmaRingAlign, 0u) << depth;
    for (uint64_t slot : {uint64_t{0}, uint64_t{1}, uint64_t{7}, uint64_t{1000}}) {
      const QpControlLayout l = QpControlAt(depth, slot);
      const uint64_t ring = uint64_t{depth} * device::mlx5::kSendWqeBb;
      EXPECT_EQ(l.sq % kRdmaRingAlign, 0u) << depth << " " << slot;
      EXPECT_EQ(l.cq % kRdmaRingAlign, 0u) << depth << " " << slot;
      EXPECT_EQ(l.misc % 64, 0u) << depth << " " << slot;
      EXPECT_EQ(l.sq, slot * slot_bytes);
      EXPECT_LE(l.sq + ring, l.cq) << "SQ runs into the CQ at depth " << depth;
      EXPECT_LE(l.cq + ring, l.misc) << "CQ runs into the doorbells at depth " << depth;
      EXPECT_LE(l.misc + kRdmaMiscBytes, (slot + 1) * slot_bytes) << "past the slot";
    }
  }
}

TEST(RdmaControlLayout, DoorbellBlockFields) {
  EXPECT_EQ(kSqDbrecAt % 8, 0u);
  EXPECT_EQ(kCqDbrecAt % 8, 0u);
  EXPECT_EQ(kScratchAt % 8, 0u);
  EXPECT_LE(kScratchAt + 8, kRdmaMiscBytes);
  EXPECT_NE(kSqDbrecAt, kCqDbrecAt);
}

// Small rings cost at most a page of padding each, plus a page of doorbells.
TEST(RdmaControlLayout, PaddingIsBounded) {
  EXPECT_EQ(QpControlSlotBytes(64), 3 * kRdmaRingAlign);
  EXPECT_EQ(QpControlSlotBytes(256), 2 * 16384 + kRdmaRingAlign);
  EXPECT_EQ(QpControlSlotBytes(32768), 2 * (uint64_t{32768} * 64) + kRdmaRingAlign);
}

}  // namespace
}  // namespace mooncake
