// Completions a queue pair asks for (mlx5/qp_ops.h): WQE i asks for a CQE
// when (i + 1) % cqe_every == 0, and mc_qp_quiet posts a NOP asking for one
// when the last rung WQE did not. Against a QP in plain memory and a fake
// NIC thread that, like a real one, writes a CQE only for the WQEs that ask
// (a CQE for WQE i completes every WQE up to i).
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "mooncake/device/host_coop.h"
#include "mooncake/device/ibgda_qp.h"
#include "mooncake/device/mlx5/qp_ops.h"
#include "mooncake/device/mlx5/wqe.h"

namespace mooncake::device {
namespace {

class FakeNicQp {
 public:
  FakeNicQp(uint32_t depth, uint32_t cqe_every) : sq_(depth * mlx5::kSendWqeBb), cq_(depth) {
    for (mlx5::Cqe64& c : cq_) {
      std::memset(&c, 0, sizeof(c));
      reinterpret_cast<uint8_t*>(&c)[63] = static_cast<uint8_t>(mlx5::kCqeInvalid << 4) | 1u;
    }
    qp.sq = sq_.data();
    qp.sq_dbrec = dbrec_;
    qp.cq = cq_.data();
    qp.cq_dbrec = cq_dbrec_;
    qp.qpn = 0x77;
    qp.sq_wqe_cnt = depth;
    qp.cq_cqe_cnt = depth;
    qp.cqe_every = cqe_every;
    qp.timeout_ns = 5'000'000'000ull;
  }
  ~FakeNicQp() { Stop(); }

  void Start() {
    nic_ = std::thread([this] { Run(); });
  }
  void Stop() {
    stop_ = true;
    if (nic_.joinable()) nic_.join();
  }

  uint8_t FmCeSe(uint64_t i) const { return Slot(i)[11]; }
  uint8_t Opcode(uint64_t i) const { return Slot(i)[3]; }
  uint8_t Ds(uint64_t i) const { return Slot(i)[7] & 0x3f; }
  uint64_t cqes_written() const { return cqes_.load(); }
  uint64_t wqes_executed() const { return executed_.load(); }

  IbgdaQpDevCtx qp;

 private:
  const uint8_t* Slot(uint64_t i) const {
    return sq_.data() + (i & (qp.sq_wqe_cnt - 1)) * mlx5::kSendWqeBb;
  }
  // Executes every rung WQE in order; a CQE for those that ask.
  void Run() {
    uint64_t done = 0, ci = 0;
    while (!stop_.load()) {
      const uint16_t rung = static_cast<uint16_t>(
          mlx5::be32(__atomic_load_n(&dbrec_[mlx5::kSndDbr], __ATOMIC_ACQUIRE)));
      while (static_cast<uint16_t>(done) != rung) {
        executed_++;
        if ((FmCeSe(done) & mlx5::kCtrlCqUpdate) != 0) {
          uint8_t* cqe = reinterpret_cast<uint8_t*>(&cq_[ci & (qp.cq_cqe_cnt - 1)]);
          const uint32_t word = static_cast<uint32_t>(done >> 8 & 0xff) |
                                static_cast<uint32_t>(done & 0xff) << 8 |
                                static_cast<uint32_t>((mlx5::kCqeReq << 4) |
                                                      mlx5::cqe_expected_owner(ci, qp.cq_cqe_cnt))
                                    << 24;
          __atomic_store_n(reinterpret_cast<uint32_t*>(cqe + 60), word, __ATOMIC_RELEASE);
          ++ci;
          cqes_++;
        }
        ++done;
      }
      std::this_thread::yield();
    }
  }

  std::vector<uint8_t> sq_;
  std::vector<mlx5::Cqe64> cq_;
  alignas(8) uint32_t dbrec_[2] = {};
  alignas(8) uint32_t cq_dbrec_[2] = {};
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> cqes_{0}, executed_{0};
  std::thread nic_;
};

mlx5::Wqe64 Write(const IbgdaQpDevCtx& qp, uint64_t payload, uint8_t flags) {
  mlx5::Wqe64 w;
  mlx5::build_rdma_write_inline(&w, 0, qp.qpn, flags, 0x1000, 0x55, &payload, sizeof(payload));
  return w;
}

TEST(QpCompletions, EveryNthWqeAsksForACqeWhateverTheCallerSaid) {
  FakeNicQp q(64, 4);
  // Singles with and without the caller's CQE bit, then a warp of 8.
  for (int i = 0; i < 10; ++i) {
    ASSERT_EQ(mc_qp_post(&q.qp, Write(q.qp, i, i % 2 ? mlx5::kCtrlCqUpdate : 0)), McStatus::kOk);
  }
  host::runWarp(8, [&](unsigned lane) {
    EXPECT_EQ(mc_qp_post_warp(&q.qp, Write(q.qp, lane, mlx5::kCtrlCqUpdate), true), McStatus::kOk);
  });
  for (uint64_t i = 0; i < 18; ++i) {
    EXPECT_EQ((q.FmCeSe(i) & mlx5::kCtrlCqUpdate) != 0, (i + 1) % 4 == 0) << "WQE " << i;
    EXPECT_EQ(q.FmCeSe(i) & mlx5::kCtrlFence, 0) << "WQE " << i;
  }
  // Quiet's question: did the last rung WQE ask? The warp's batch ended at
  // 18 with WQE 17, which did not; the last batch ending in one that did
  // was WQE 7's.
  EXPECT_EQ(q.qp.signaled_head, 8u);
}

TEST(QpCompletions, QuietPostsANopOnlyWhenTheLastRungWqeAsksForNone) {
  FakeNicQp q(64, 4);
  q.Start();
  for (int i = 0; i < 6; ++i) ASSERT_EQ(mc_qp_post(&q.qp, Write(q.qp, i, 0)), McStatus::kOk);
  // WQE 3 asked; 4 and 5 did not: quiet needs a NOP at 6 that asks.
  ASSERT_EQ(mc_qp_quiet(&q.qp), McStatus::kOk);
  EXPECT_EQ(q.Opcode(6), mlx5::kOpNop);
  EXPECT_EQ(q.Ds(6), 1);
  EXPECT_NE(q.FmCeSe(6) & mlx5::kCtrlCqUpdate, 0);
  EXPECT_EQ(q.qp.resv_head, 7u);
  EXPECT_EQ(q.qp.cons_tail, 7u) << "quiet waited for its own NOP too";
  // 7 rung WQEs ask nothing more: at 8 (WQE 7 asks), quiet adds nothing.
  ASSERT_EQ(mc_qp_post(&q.qp, Write(q.qp, 7, 0)), McStatus::kOk);
  ASSERT_EQ(mc_qp_quiet(&q.qp), McStatus::kOk);
  EXPECT_EQ(q.qp.resv_head, 8u);
  EXPECT_EQ(q.qp.cons_tail, 8u);
  // Nothing outstanding: no NOP either.
  ASSERT_EQ(mc_qp_quiet(&q.qp), McStatus::kOk);
  EXPECT_EQ(q.qp.resv_head, 8u);
  q.Stop();
  EXPECT_EQ(q.cqes_written(), 3u) << "CQEs for WQE 3, the NOP (6) and WQE 7";
}

// The interval is bounded by half the ring: on a ring of 8 with cqe_every
// 64, every 4th WQE asks, so a poster never waits for space that only a
// CQE past the ring's end could free. 40 000 single posts from 4 threads
// and many quiets all complete.
TEST(QpCompletions, AnIntervalPastHalfTheRingIsBoundedAndNeverWedges) {
  FakeNicQp q(8, 64);
  q.Start();
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 10000; ++i) {
        if (mc_qp_post(&q.qp, Write(q.qp, i, 0)) != McStatus::kOk) bad++;
        if ((i + t) % 97 == 0 && mc_qp_quiet(&q.qp) != McStatus::kOk) bad++;
      }
      if (mc_qp_quiet(&q.qp) != McStatus::kOk) bad++;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(q.qp.cons_tail, q.qp.resv_head);
  q.Stop();
  EXPECT_EQ(q.wqes_executed(), q.qp.resv_head);
  // A CQE per 4 WQEs, plus quiets' NOPs: far fewer than one per WQE.
  EXPECT_LT(q.cqes_written(), q.qp.resv_head / 2);
  for (uint64_t i = 0; i < 8; ++i) {
    if (q.Opcode(i) != mlx5::kOpNop) {
      // Slot i last held WQE resv_head - 8 + ((i - resv_head) mod 8).
      const uint64_t idx = q.qp.resv_head - 8 + ((i - q.qp.resv_head) & 7);
      EXPECT_EQ((q.FmCeSe(i) & mlx5::kCtrlCqUpdate) != 0, (idx + 1) % 4 == 0) << "slot " << i;
    }
  }
}

}  // namespace
}  // namespace mooncake::device
