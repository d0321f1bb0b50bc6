// mc_qp_post_warp and mc_qp_post_block (mlx5/qp_ops.h) on the host platform, against a queue pair
// in plain memory that nobody serves: what a warp's batch leaves in the
// ring, the doorbell record and the doorbell register is checked directly.
// (The softnic route tests run the same code against a live engine.)
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

#include "mooncake/device/host_coop.h"
#include "mooncake/device/ibgda_qp.h"
#include "mooncake/device/mlx5/qp_ops.h"
#include "mooncake/device/mlx5/wqe.h"

namespace mooncake::device {
namespace {

// A QP whose rings live in this struct; the CQ stays empty (owner bits of
// invalid CQEs), so posts only ever need ring space that was never used.
struct PlainQp {
  explicit PlainQp(uint32_t depth) : sq(depth * mlx5::kSendWqeBb), cq(depth) {
    for (mlx5::Cqe64& c : cq) {
      std::memset(&c, 0, sizeof(c));
      reinterpret_cast<uint8_t*>(&c)[63] = static_cast<uint8_t>(mlx5::kCqeInvalid << 4) | 1u;
    }
    qp.sq = sq.data();
    qp.sq_dbrec = dbrec;
    qp.bf_reg = &bf;
    qp.cq = cq.data();
    qp.cq_dbrec = cq_dbrec;
    qp.qpn = 0x1234;
    qp.sq_wqe_cnt = depth;
    qp.cq_cqe_cnt = depth;
    qp.timeout_ns = 200'000'000;
  }
  // Index bits and inline payload (one 8-byte word) of slot i.
  uint16_t index_of(uint64_t i) const {
    const uint8_t* s = sq.data() + (i % qp.sq_wqe_cnt) * mlx5::kSendWqeBb;
    return static_cast<uint16_t>(s[1] << 8 | s[2]);
  }
  uint64_t payload_of(uint64_t i) const {
    uint64_t v = 0;
    // ctrl (16) + raddr (16) + inline byte count (4): the data follows.
    std::memcpy(&v, sq.data() + (i % qp.sq_wqe_cnt) * mlx5::kSendWqeBb + 36, sizeof(v));
    return v;
  }
  uint64_t ctrl_of(uint64_t i) const {
    uint64_t v = 0;
    std::memcpy(&v, sq.data() + (i % qp.sq_wqe_cnt) * mlx5::kSendWqeBb, sizeof(v));
    return v;
  }

  alignas(64) std::vector<uint8_t> sq;
  std::vector<mlx5::Cqe64> cq;
  alignas(8) uint32_t dbrec[2] = {};
  alignas(8) uint32_t cq_dbrec[2] = {};
  alignas(8) uint64_t bf = 0;
  IbgdaQpDevCtx qp;
};

mlx5::Wqe64 InlineWrite(const IbgdaQpDevCtx& qp, uint64_t payload) {
  mlx5::Wqe64 w;
  mlx5::build_rdma_write_inline(&w, 0, qp.qpn, mlx5::kCtrlCqUpdate, 0x1000, 0x55, &payload,
                                sizeof(payload));
  return w;
}

uint32_t DbrecIndex(const PlainQp& p) { return mlx5::be32(p.dbrec[mlx5::kSndDbr]); }

// The 8 bytes a doorbell for producer index `pi` of QP `qpn` writes to the
// register, as they lie in memory.
uint64_t RingWord(uint32_t pi, uint32_t qpn) {
  const uint8_t bytes[8] = {0,
                            static_cast<uint8_t>(pi >> 8),
                            static_cast<uint8_t>(pi),
                            0,
                            static_cast<uint8_t>(qpn >> 16),
                            static_cast<uint8_t>(qpn >> 8),
                            static_cast<uint8_t>(qpn),
                            0};
  uint64_t v = 0;
  std::memcpy(&v, bytes, sizeof(v));
  return v;
}

TEST(QpPostWarp, OneReservationAndOneDoorbellPerWarp) {
  PlainQp p(64);
  // Lanes 1, 4 and 6 have nothing to post; the others post lane + 100.
  auto posts = [](unsigned lane) { return lane != 1 && lane != 4 && lane != 6; };
  std::atomic<int> bad{0};
  host::runWarp(8, [&](unsigned lane) {
    const McStatus st = mc_qp_post_warp(&p.qp, InlineWrite(p.qp, lane + 100), posts(lane));
    if (st != McStatus::kOk) bad++;
  });
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(p.qp.resv_head, 5u);
  EXPECT_EQ(p.qp.ready_head, 5u);
  EXPECT_EQ(DbrecIndex(p), 5u);
  std::set<uint64_t> payloads;
  for (uint64_t i = 0; i < 5; ++i) {
    EXPECT_EQ(p.index_of(i), i);
    payloads.insert(p.payload_of(i));
  }
  EXPECT_EQ(payloads, (std::set<uint64_t>{100, 102, 103, 105, 107}));
  // The doorbell register got (producer index, QPN), as NVSHMEM rings:
  // be32(5 << 8), then be32(qpn << 8); no WQE read back.
  EXPECT_EQ(p.bf, RingWord(5, p.qp.qpn));
  EXPECT_EQ(p.index_of(5), 0u) << "nothing past the batch";
}

TEST(QpPostWarp, NobodyPostingTouchesNothing) {
  PlainQp p(16);
  host::runWarp(8, [&](unsigned) { EXPECT_EQ(mc_qp_post_warp(&p.qp, {}, false), McStatus::kOk); });
  EXPECT_EQ(p.qp.resv_head, 0u);
  EXPECT_EQ(DbrecIndex(p), 0u);
  EXPECT_EQ(p.bf, 0u);
}

// Batches of several warps, and single posts, interleave on one QP: every
// index is used once and the doorbell record ends at the total.
TEST(QpPostWarp, WarpsAndSinglePostersShareAQp) {
  PlainQp p(1024);
  constexpr int kRounds = 20;
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int w = 0; w < 3; ++w) {
    threads.emplace_back([&, w] {
      host::runWarp(8, [&](unsigned lane) {
        for (int r = 0; r < kRounds; ++r) {
          const uint64_t v = (uint64_t{1} << 40) | (uint64_t(w) << 32) | (uint64_t(r) << 8) | lane;
          if (mc_qp_post_warp(&p.qp, InlineWrite(p.qp, v), true) != McStatus::kOk) bad++;
        }
      });
    });
  }
  threads.emplace_back([&] {
    for (int r = 0; r < kRounds; ++r) {
      if (mc_qp_post(&p.qp, InlineWrite(p.qp, 7000 + r)) != McStatus::kOk) bad++;
    }
  });
  for (auto& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0);
  const uint64_t total = 3 * kRounds * 8 + kRounds;
  EXPECT_EQ(p.qp.resv_head, total);
  EXPECT_EQ(p.qp.ready_head, total);
  EXPECT_EQ(DbrecIndex(p), total);
  std::set<uint64_t> seen;
  for (uint64_t i = 0; i < total; ++i) {
    EXPECT_EQ(p.index_of(i), i);
    seen.insert(p.payload_of(i));
  }
  EXPECT_EQ(seen.size(), total) << "every post landed in its own slot";
}

// A batch waits for ring space like a single post: on a ring nobody drains it
// times out, the QP is marked stalled, and every lane gets kTimedOut.
TEST(QpPostWarp, FullRingTimesOutOnEveryLane) {
  PlainQp p(8);
  p.qp.timeout_ns = 20'000'000;
  host::runWarp(8, [&](unsigned lane) {
    EXPECT_EQ(mc_qp_post_warp(&p.qp, InlineWrite(p.qp, lane), true), McStatus::kOk);
  });
  EXPECT_EQ(DbrecIndex(p), 8u);
  std::atomic<int> timed_out{0};
  host::runWarp(8, [&](unsigned lane) {
    if (mc_qp_post_warp(&p.qp, InlineWrite(p.qp, lane), lane % 2 == 0) == McStatus::kTimedOut) {
      timed_out++;
    }
  });
  EXPECT_EQ(timed_out.load(), 8);
  EXPECT_EQ(p.qp.error, kQpErrStalled);
  EXPECT_EQ(DbrecIndex(p), 8u) << "nothing rung past the full ring";
}

// A warp wider than the ring (host stress warps) posts lane by lane.
TEST(QpPostWarp, WarpWiderThanTheRingPostsLaneByLane) {
  PlainQp p(4);
  // Long enough that the four posts that fit ring before a stalled one's
  // timeout marks the QP (a poster waiting to ring then gives up too).
  p.qp.timeout_ns = 300'000'000;
  std::atomic<int> ok{0}, timed_out{0};
  host::runWarp(6, [&](unsigned lane) {
    const McStatus st = mc_qp_post_warp(&p.qp, InlineWrite(p.qp, lane), true);
    (st == McStatus::kOk ? ok : timed_out)++;
  });
  // Four fit; nobody completes them, so the other two time out.
  EXPECT_EQ(ok.load(), 4);
  EXPECT_EQ(timed_out.load(), 2);
}

// An error already on the QP: every lane hears it and nothing is written
// or rung. (The reservation, made in the same round trip as the read of the
// error word, is handed on, so later posters do not wait for it.)
TEST(QpPostWarp, FailedQpPostsNothing) {
  PlainQp p(16);
  p.qp.error = kQpErrCqe | 0x13;
  const std::vector<uint8_t> ring = p.sq;
  host::runWarp(4, [&](unsigned lane) {
    EXPECT_EQ(mc_qp_post_warp(&p.qp, InlineWrite(p.qp, lane), lane != 2), McStatus::kRdmaError);
  });
  EXPECT_EQ(mc_qp_post(&p.qp, InlineWrite(p.qp, 9)), McStatus::kRdmaError);
  EXPECT_EQ(p.qp.ready_head, p.qp.resv_head) << "the reservations were handed on";
  EXPECT_EQ(DbrecIndex(p), 0u);
  EXPECT_EQ(p.bf, 0u);
  EXPECT_EQ(p.sq, ring) << "a slot was written";
}

// ---- mc_qp_post_block --------------------------------------------------------

// Every doorbell record value `p` shows while `post` runs (an observer
// thread reads it as fast as it can): a batch rung once shows no value
// between its start and its end.
template <class F>
std::set<uint32_t> DbrecValuesDuring(PlainQp& p, F&& post) {
  std::set<uint32_t> seen;
  std::atomic<bool> done{false};
  std::thread observer([&] {
    while (!done.load(std::memory_order_relaxed)) {
      seen.insert(mlx5::be32(std::atomic_ref<uint32_t>(p.dbrec[mlx5::kSndDbr]).load()));
    }
  });
  post();
  done.store(true);
  observer.join();
  seen.insert(DbrecIndex(p));
  return seen;
}

// 40 threads (a full warp and a partial one), 7 of them with nothing: the
// 33 WQEs go out with one reservation and one doorbell.
TEST(QpPostBlock, OneReservationAndOneDoorbellPerBlock) {
  PlainQp p(128);
  auto posts = [](unsigned t) { return t % 6 != 1; };
  unsigned want = 0;
  for (unsigned t = 0; t < 40; ++t) want += posts(t);
  std::atomic<int> bad{0};
  const std::set<uint32_t> seen = DbrecValuesDuring(p, [&] {
    host::runBlock(40, [&](unsigned t) {
      if (mc_qp_post_block(&p.qp, InlineWrite(p.qp, t + 100), posts(t)) != McStatus::kOk) bad++;
    });
  });
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(p.qp.resv_head, want);
  EXPECT_EQ(p.qp.ready_head, want);
  EXPECT_EQ(seen, (std::set<uint32_t>{0, want})) << "rung more than once";
  EXPECT_EQ(p.bf, RingWord(want, p.qp.qpn));
  std::set<uint64_t> payloads;
  for (uint64_t i = 0; i < want; ++i) {
    EXPECT_EQ(p.index_of(i), i);
    payloads.insert(p.payload_of(i));
  }
  std::set<uint64_t> expected;
  for (unsigned t = 0; t < 40; ++t) {
    if (posts(t)) expected.insert(t + 100);
  }
  EXPECT_EQ(payloads, expected);
}

// A block batch over half the ring goes out in chunks of half the ring,
// each rung once.
TEST(QpPostBlock, ABatchOverHalfTheRingRingsOncePerChunk) {
  PlainQp p(32);
  std::atomic<int> bad{0};
  const std::set<uint32_t> seen = DbrecValuesDuring(p, [&] {
    host::runBlock(30, [&](unsigned t) {
      if (mc_qp_post_block(&p.qp, InlineWrite(p.qp, t), true) != McStatus::kOk) bad++;
    });
  });
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(DbrecIndex(p), 30u);
  for (uint32_t v : seen) EXPECT_TRUE(v == 0 || v == 16 || v == 30) << "doorbell at " << v;
  std::set<uint64_t> payloads;
  for (uint64_t i = 0; i < 30; ++i) payloads.insert(p.payload_of(i));
  EXPECT_EQ(payloads.size(), 30u);
}

TEST(QpPostBlock, NobodyPostingTouchesNothing) {
  PlainQp p(16);
  host::runBlock(40,
                 [&](unsigned) { EXPECT_EQ(mc_qp_post_block(&p.qp, {}, false), McStatus::kOk); });
  EXPECT_EQ(p.qp.resv_head, 0u);
  EXPECT_EQ(p.bf, 0u);
}

// An error already on the QP: every thread hears it, nothing is written or
// rung, the reservation is handed on; a full ring nobody drains times out
// on every thread.
TEST(QpPostBlock, FailedOrFullQpGivesEveryThreadTheSameStatus) {
  PlainQp failed(16);
  failed.qp.error = kQpErrCqe | 0x13;
  const std::vector<uint8_t> ring = failed.sq;
  host::runBlock(20, [&](unsigned t) {
    EXPECT_EQ(mc_qp_post_block(&failed.qp, InlineWrite(failed.qp, t), t != 2),
              McStatus::kRdmaError);
  });
  EXPECT_EQ(failed.qp.ready_head, failed.qp.resv_head);
  EXPECT_EQ(failed.bf, 0u);
  EXPECT_EQ(failed.sq, ring);

  PlainQp full(8);
  full.qp.timeout_ns = 20'000'000;
  std::atomic<int> timed_out{0};
  host::runBlock(12, [&](unsigned t) {
    if (mc_qp_post_block(&full.qp, InlineWrite(full.qp, t), true) == McStatus::kTimedOut) {
      timed_out++;
    }
  });
  EXPECT_EQ(timed_out.load(), 12);
  EXPECT_EQ(full.qp.error, kQpErrStalled);
  EXPECT_EQ(DbrecIndex(full), 8u) << "the two chunks that fit were rung, nothing after";
}

}  // namespace
}  // namespace mooncake::device
