// The RDMA control memfd's layout (client/src/rdma_control_layout.h): every
// ring and every slot page-aligned (what the mlx5 DevX provider requires),
// nothing overlapping, every byte inside the slot. And FailQueuePairRings,
// what the client does to its QPs when the daemon (their provider) is gone,
// against the real posting code (mlx5/qp_ops.h) on the host platform.
#include "rdma_control_layout.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <vector>

#include "mooncake/device/ibgda_qp.h"
#include "mooncake/device/mlx5/qp_ops.h"
#include "mooncake/device/mlx5/wqe.h"

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

namespace mlx5 = device::mlx5;
using device::IbgdaQpDevCtx;
using device::McStatus;

// One QP's rings in a control buffer laid out as DaemonRdmaTransport lays
// out the memfd (slot 1, so slot 0's bytes must stay untouched), with
// nobody serving them: the provider is gone.
struct DeadProviderQp {
  static constexpr uint32_t kDepth = 64;
  static constexpr uint64_t kSlot = 1;
  static constexpr uint32_t kQpn = 0x2a5;
  DeadProviderQp() : control(2 * QpControlSlotBytes(kDepth), 0) {
    const QpControlLayout at = QpControlAt(kDepth, kSlot);
    std::memset(control.data() + at.cq, 0xff, uint64_t{kDepth} * mlx5::kCqeBytes);
    qp.sq = control.data() + at.sq;
    qp.sq_dbrec = reinterpret_cast<uint32_t*>(control.data() + at.misc + kSqDbrecAt);
    qp.cq = reinterpret_cast<mlx5::Cqe64*>(control.data() + at.cq);
    qp.cq_dbrec = reinterpret_cast<uint32_t*>(control.data() + at.misc + kCqDbrecAt);
    qp.qpn = kQpn;
    qp.sq_wqe_cnt = kDepth;
    qp.cq_cqe_cnt = kDepth;
    // Long enough that a quiet which waits for it is caught by the clock.
    qp.timeout_ns = 3'000'000'000ull;
  }
  // As if `n` WQEs had been posted and completed before (ring positions
  // anywhere, owner bits of a later pass).
  void StartAt(uint64_t n) {
    qp.resv_head = qp.ready_head = qp.cons_tail = qp.cq_ci = n;
    qp.sq_dbrec[mlx5::kSndDbr] = mlx5::be32(static_cast<uint32_t>(n) & 0xffffu);
    qp.cq_dbrec[mlx5::kCqSetCi] = mlx5::be32(static_cast<uint32_t>(n) & mlx5::kCqCiMask);
    // The entries before n were consumed: mark the ring as a NIC leaves it,
    // every entry of the current pass still stale (previous pass's owner).
    for (uint64_t i = n; i < n + kDepth; ++i) {
      uint8_t* c = reinterpret_cast<uint8_t*>(&qp.cq[i & (kDepth - 1)]);
      c[63] =
          static_cast<uint8_t>((mlx5::kCqeReq << 4) | (mlx5::cqe_expected_owner(i, kDepth) ^ 1u));
    }
  }
  McStatus Post() {
    mlx5::Wqe64 w;
    const uint64_t v = 7;
    mlx5::build_rdma_write_inline(&w, 0, qp.qpn, mlx5::kCtrlCqUpdate, 0x1000, 0x55, &v, sizeof(v));
    return device::mc_qp_post(&qp, w);
  }
  void Fail() { FailQueuePairRings(control.data(), kDepth, kSlot, kQpn); }

  std::vector<uint8_t> control;
  IbgdaQpDevCtx qp;
};

double SecondsOf(const std::function<McStatus()>& f, McStatus* st) {
  const auto start = std::chrono::steady_clock::now();
  *st = f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

TEST(FailQueuePairRings, OutstandingWqesEndInAFlushErrorAtOnce) {
  for (uint64_t start : {uint64_t{0}, uint64_t{5}, uint64_t{64 * 3 + 9}, uint64_t{65536 * 2 - 2}}) {
    SCOPED_TRACE(start);
    DeadProviderQp q;
    q.StartAt(start);
    const std::vector<uint8_t> slot0(q.control.begin(),
                                     q.control.begin() + QpControlSlotBytes(q.kDepth));
    for (int i = 0; i < 3; ++i) ASSERT_EQ(q.Post(), McStatus::kOk);
    q.Fail();
    McStatus st = McStatus::kOk;
    EXPECT_LT(SecondsOf([&] { return device::mc_qp_quiet(&q.qp); }, &st), 1.0)
        << "mc_qp_quiet waited for completions that never come";
    EXPECT_EQ(st, McStatus::kRdmaError);
    EXPECT_EQ(q.qp.error, device::kQpErrCqe | mlx5::kSyndWrFlushErr);
    EXPECT_EQ(q.qp.cons_tail, start + 3) << "the flush completes every WQE rung so far";
    EXPECT_EQ(q.qp.cq_ci, start + 1);
    EXPECT_EQ(mlx5::be32(q.qp.cq_dbrec[mlx5::kCqSetCi]),
              static_cast<uint32_t>(start + 1) & mlx5::kCqCiMask);
    // The QP stays failed: nothing more is posted.
    EXPECT_EQ(q.Post(), McStatus::kRdmaError);
    EXPECT_EQ(q.qp.ready_head, q.qp.resv_head) << "the refused post's slot is handed on";
    EXPECT_EQ(mlx5::be32(q.qp.sq_dbrec[mlx5::kSndDbr]), static_cast<uint32_t>(start + 3) & 0xffffu)
        << "nothing rung past the flush";
    EXPECT_TRUE(std::equal(slot0.begin(), slot0.end(), q.control.begin())) << "slot 0 written";
  }
}

// Nothing outstanding when the daemon went, and a post that slips in after
// the flush but before any poll: the error still surfaces at once.
TEST(FailQueuePairRings, APostAfterTheFlushStillFailsAtOnce) {
  DeadProviderQp q;
  q.StartAt(100);
  q.Fail();
  ASSERT_EQ(q.Post(), McStatus::kOk);  // the poller has not seen the flush yet
  McStatus st = McStatus::kOk;
  EXPECT_LT(SecondsOf([&] { return device::mc_qp_quiet(&q.qp); }, &st), 1.0);
  EXPECT_EQ(st, McStatus::kRdmaError);
  EXPECT_EQ(q.qp.error, device::kQpErrCqe | mlx5::kSyndWrFlushErr);
  EXPECT_EQ(q.qp.cons_tail, 100u) << "the flush covered only the WQEs rung before it";
  EXPECT_EQ(q.Post(), McStatus::kRdmaError);
}

}  // namespace
}  // namespace mooncake
