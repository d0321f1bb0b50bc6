// The Device API functions (comm_device.h) on the host platform: routing,
// puts of every size and alignment in their three cooperative forms,
// signal/wait ordering, red_add atomicity, LL put+signal, and the error
// codes of unreachable peers. The RDMA route runs against softnic in
// tests/softnic.
//
// "Ranks" here are plain buffers in this process wired into CommCtx tables;
// host_p2p_transport_test.cc runs the same calls over real shared mappings.
#include "mooncake/device/comm_device.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "mooncake/device/host_coop.h"

namespace mooncake::device {
namespace {

unsigned char PatternByte(size_t i, uint32_t seed) {
  uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull + seed * 0xBF58476D1CE4E5B9ull;
  return static_cast<unsigned char>((x >> 29) ^ (x >> 47) ^ i);
}

// N "ranks" as separately allocated buffers, and the CommCtx each would get.
class FakeWorld {
 public:
  FakeWorld(int n, size_t bytes) : n_(n), bytes_(bytes), available_(n, 1), ptrs_(n) {
    for (int r = 0; r < n; ++r) {
      auto* p = static_cast<unsigned char*>(::operator new[](bytes, std::align_val_t(64)));
      std::memset(p, 0, bytes);
      bufs_.emplace_back(p);
      ptrs_[r] = p;
    }
  }
  CommCtx ctx(int rank) {
    CommCtx c;
    c.p2p = P2PContext{available_.data(), ptrs_.data(), ptrs_[rank]};
    c.rank = rank;
    c.num_ranks = n_;
    return c;
  }
  unsigned char* buf(int r) { return bufs_[r].get(); }
  void setAvailable(int r, bool on) { available_[r] = on ? 1 : 0; }
  size_t bytes() const { return bytes_; }

 private:
  struct AlignedDelete {
    void operator()(unsigned char* p) const { ::operator delete[](p, std::align_val_t(64)); }
  };
  int n_;
  size_t bytes_;
  std::vector<int32_t> available_;
  std::vector<void*> ptrs_;
  std::vector<std::unique_ptr<unsigned char[], AlignedDelete>> bufs_;
};

TEST(RoutePut, SelfPeerAndRdmaAddresses) {
  FakeWorld w(3, 4096);
  w.setAvailable(2, false);
  CommCtx c = w.ctx(0);
  unsigned char* p = w.buf(0) + 1000;
  EXPECT_EQ(mc_route_put(c, 0, p), p);
  EXPECT_EQ(mc_route_put(c, 1, p), w.buf(1) + 1000);
  EXPECT_EQ(mc_route_put(c, 2, p), nullptr);  // RDMA
  EXPECT_EQ(mc_route_put(c, 3, p), nullptr);  // out of range
  EXPECT_EQ(mc_route_put(c, -1, p), nullptr);
  // Rank 1 sees rank 0's buffer at rank 0's base.
  CommCtx c1 = w.ctx(1);
  uint32_t* q = reinterpret_cast<uint32_t*>(w.buf(1) + 64);
  EXPECT_EQ(mc_route_put(c1, 0, q), reinterpret_cast<uint32_t*>(w.buf(0) + 64));
  // Self is routable even if the table says otherwise.
  w.setAvailable(0, false);
  EXPECT_EQ(mc_route_put(c, 0, p), p);
}

TEST(RoutePut, WorksWithoutTablesForSelf) {
  CommCtx c;
  c.rank = 0;
  c.num_ranks = 2;
  int x = 0;
  EXPECT_EQ(mc_route_put(c, 0, &x), &x);
  EXPECT_EQ(mc_route_put(c, 1, &x), nullptr);
}

// Every size 0..4097 at several (dst, src) misalignments, with guard bytes on
// both sides of the destination.
struct PutCase {
  size_t dst_off;
  size_t src_off;
};
void PrintTo(const PutCase& c, std::ostream* os) {
  *os << "dst+" << c.dst_off << " src+" << c.src_off;
}
constexpr size_t kMaxSize = 4097;
constexpr size_t kGuard = 48;
constexpr unsigned char kSentinel = 0xA5;

// Checks rank 1's buffer after a put of `n` bytes at dst_off; returns the
// number of wrong bytes.
size_t CheckPut(const unsigned char* dst_buf, size_t dst_off, size_t src_off, size_t n,
                uint32_t seed) {
  size_t bad = 0;
  for (size_t i = 0; i < kMaxSize + 2 * kGuard + 32; ++i) {
    const bool inside = i >= kGuard + dst_off && i < kGuard + dst_off + n;
    const unsigned char want =
        inside ? PatternByte(src_off + (i - kGuard - dst_off), seed) : kSentinel;
    if (dst_buf[i] != want) ++bad;
  }
  return bad;
}

class PutTest : public ::testing::TestWithParam<PutCase> {};

TEST_P(PutTest, ThreadFormEverySize) {
  const PutCase pc = GetParam();
  FakeWorld w(2, 2 * (kMaxSize + 2 * kGuard + 64));
  CommCtx c = w.ctx(0);
  std::vector<unsigned char> src(kMaxSize + 32);
  size_t failures = 0;
  for (size_t n = 0; n <= kMaxSize; ++n) {
    const uint32_t seed = static_cast<uint32_t>(n);
    for (size_t i = 0; i < src.size(); ++i) src[i] = PatternByte(i, seed);
    std::memset(w.buf(1), kSentinel, w.bytes());
    ASSERT_EQ(mc_put_thread(c, 1, w.buf(0) + kGuard + pc.dst_off, src.data() + pc.src_off, n),
              McStatus::kOk);
    if (CheckPut(w.buf(1), pc.dst_off, pc.src_off, n, seed) != 0) {
      ADD_FAILURE() << "thread put of " << n << " bytes wrong";
      if (++failures > 5) return;
    }
  }
}

// The emulated warp/block runs the whole size sweep in one set of threads:
// lane 0 prepares and checks, everyone puts, barriers keep them in step.
template <class PutFn, class Sync>
size_t SweepCooperative(FakeWorld& w, const PutCase& pc, unsigned id, PutFn put, Sync sync,
                        std::vector<unsigned char>& src, std::atomic<size_t>& failures) {
  CommCtx c = w.ctx(0);
  for (size_t n = 0; n <= kMaxSize; ++n) {
    const uint32_t seed = static_cast<uint32_t>(n * 3 + 1);
    if (id == 0) {
      for (size_t i = 0; i < src.size(); ++i) src[i] = PatternByte(i, seed);
      std::memset(w.buf(1), kSentinel, w.bytes());
    }
    sync();
    if (put(c, w.buf(0) + kGuard + pc.dst_off, src.data() + pc.src_off, n) != McStatus::kOk) {
      failures++;
    }
    // put returned after its own barrier: every participant's bytes are in.
    if (id == 0 && CheckPut(w.buf(1), pc.dst_off, pc.src_off, n, seed) != 0) {
      if (failures++ < 5) ADD_FAILURE() << "cooperative put of " << n << " bytes wrong";
    }
    sync();
  }
  return failures.load();
}

TEST_P(PutTest, WarpFormEverySize) {
  const PutCase pc = GetParam();
  FakeWorld w(2, 2 * (kMaxSize + 2 * kGuard + 64));
  std::vector<unsigned char> src(kMaxSize + 32);
  std::atomic<size_t> failures{0};
  host::runWarp(kMcCudaWarpSize, [&](unsigned lane) {
    SweepCooperative(
        w, pc, lane,
        [lane](const CommCtx& c, void* d, const void* s, size_t n) {
          return mc_put_warp(c, 1, d, s, n, lane);
        },
        [] { mc_syncwarp(); }, src, failures);
  });
  EXPECT_EQ(failures.load(), 0u);
}

TEST_P(PutTest, BlockFormEverySize) {
  const PutCase pc = GetParam();
  FakeWorld w(2, 2 * (kMaxSize + 2 * kGuard + 64));
  std::vector<unsigned char> src(kMaxSize + 32);
  std::atomic<size_t> failures{0};
  host::runBlock(40, [&](unsigned t) {
    SweepCooperative(
        w, pc, t,
        [](const CommCtx& c, void* d, const void* s, size_t n) {
          return mc_put_block(c, 1, d, s, n);
        },
        [] { mc_syncthreads(); }, src, failures);
  });
  EXPECT_EQ(failures.load(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Alignments, PutTest,
                         ::testing::Values(PutCase{0, 0}, PutCase{1, 3}, PutCase{7, 0},
                                           PutCase{0, 13}, PutCase{15, 15}, PutCase{9, 2}),
                         [](const ::testing::TestParamInfo<PutCase>& info) {
                           return "dst" + std::to_string(info.param.dst_off) + "_src" +
                                  std::to_string(info.param.src_off);
                         });

TEST(Put, RdmaAndBadRankWriteNothing) {
  FakeWorld w(3, 256);
  w.setAvailable(2, false);
  CommCtx c = w.ctx(0);
  unsigned char src[16];
  std::memset(src, 0x11, sizeof(src));
  EXPECT_EQ(mc_put_thread(c, 2, w.buf(0), src, 16), McStatus::kNoRoute);
  EXPECT_EQ(mc_put_thread(c, 3, w.buf(0), src, 16), McStatus::kInvalidRank);
  EXPECT_EQ(mc_put_thread(c, -1, w.buf(0), src, 16), McStatus::kInvalidRank);
  uint32_t* sig = reinterpret_cast<uint32_t*>(w.buf(0) + 64);
  EXPECT_EQ(mc_signal(c, 2, sig, 1u), McStatus::kNoRoute);
  EXPECT_EQ(mc_signal_relaxed(c, 2, sig, 1u), McStatus::kNoRoute);
  EXPECT_EQ(mc_red_add(c, 2, sig, 1u), McStatus::kNoRoute);
  McLLSlot* slot = reinterpret_cast<McLLSlot*>(w.buf(0) + 128);
  EXPECT_EQ(mc_put_signal_ll(c, 2, slot, 5, 1), McStatus::kNoRoute);
  host::runWarp(4, [&](unsigned lane) {
    EXPECT_EQ(mc_put_warp(c, 2, w.buf(0), src, 16, lane), McStatus::kNoRoute);
    EXPECT_EQ(mc_put_lanes(c, 2, w.buf(0) + 16 * lane, src, 16), McStatus::kNoRoute);
  });
  for (size_t i = 0; i < 256; ++i) ASSERT_EQ(w.buf(2)[i], 0) << i;
}

// Over P2P each lane of mc_put_lanes copies its own message; sizes differ
// per lane (some lanes send nothing) and every byte lands where it should.
TEST(Put, LanesEachCopyTheirOwnMessage) {
  constexpr unsigned kLanes = 8;
  constexpr size_t kSlot = 512;
  FakeWorld w(2, kLanes * kSlot);
  CommCtx c = w.ctx(0);
  std::vector<unsigned char> src(kLanes * kSlot);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 7 + 1);
  auto size_of = [](unsigned lane) { return lane % 3 == 1 ? size_t{0} : size_t{lane * 61 + 3}; };
  host::runWarp(kLanes, [&](unsigned lane) {
    EXPECT_EQ(mc_put_lanes(c, 1, w.buf(0) + lane * kSlot, src.data() + lane * kSlot, size_of(lane)),
              McStatus::kOk);
  });
  for (unsigned lane = 0; lane < kLanes; ++lane) {
    const size_t n = size_of(lane);
    for (size_t i = 0; i < kSlot; ++i) {
      const unsigned char want = i < n ? src[lane * kSlot + i] : 0;
      ASSERT_EQ(w.buf(1)[lane * kSlot + i], want) << "lane " << lane << " byte " << i;
    }
  }
}

// Producer puts a block of data then signals (release); the consumer waits
// (acquire) and must see all of it. Rounds reuse the buffer, so a stale
// read shows up as a wrong round number.
TEST(SignalWait, DataVisibleAfterSignal) {
  constexpr uint32_t kRounds = 5000;
  constexpr size_t kData = 512;
  FakeWorld w(2, 4096);
  CommCtx c0 = w.ctx(0), c1 = w.ctx(1);
  auto* sig_sym = reinterpret_cast<uint32_t*>(w.buf(0) + 2048);
  auto* ack_sym = reinterpret_cast<uint32_t*>(w.buf(0) + 2112);
  std::atomic<int> bad{0};
  std::thread consumer([&] {
    const auto* sig = reinterpret_cast<const uint32_t*>(w.buf(1) + 2048);
    for (uint32_t r = 1; r <= kRounds; ++r) {
      EXPECT_EQ(mc_wait_until(sig, McCmp::kEq, r), r);
      const uint32_t* d = reinterpret_cast<const uint32_t*>(w.buf(1));
      for (size_t i = 0; i < kData / 4; ++i) {
        if (d[i] != r * 1000 + i) bad++;
      }
      // The ack travels back through rank 1's view of the symmetric layout.
      EXPECT_EQ(mc_signal(c1, 0, reinterpret_cast<uint32_t*>(w.buf(1) + 2112), r), McStatus::kOk);
    }
  });
  std::vector<uint32_t> src(kData / 4);
  for (uint32_t r = 1; r <= kRounds; ++r) {
    for (size_t i = 0; i < src.size(); ++i) src[i] = r * 1000 + static_cast<uint32_t>(i);
    EXPECT_EQ(mc_put_thread(c0, 1, w.buf(0), src.data(), kData), McStatus::kOk);
    EXPECT_EQ(mc_signal(c0, 1, sig_sym, r), McStatus::kOk);
    mc_wait_until(reinterpret_cast<const uint32_t*>(ack_sym), McCmp::kGe, r);
  }
  consumer.join();
  EXPECT_EQ(bad.load(), 0);
}

// A warp puts, then lane 0 alone signals: the put's closing barrier must
// make every lane's bytes part of what the signal publishes.
TEST(SignalWait, WarpPutThenLaneZeroSignal) {
  constexpr uint32_t kRounds = 300;
  constexpr size_t kData = 4096;
  FakeWorld w(2, 3 * kData);
  CommCtx c0 = w.ctx(0);
  auto* sig_sym = reinterpret_cast<uint64_t*>(w.buf(0) + 2 * kData);
  auto* ack = reinterpret_cast<uint64_t*>(w.buf(0) + 2 * kData + 64);
  std::vector<uint64_t> src(kData / 8);
  std::atomic<int> bad{0};
  std::thread consumer([&] {
    const auto* sig = reinterpret_cast<const uint64_t*>(w.buf(1) + 2 * kData);
    const auto* d = reinterpret_cast<const uint64_t*>(w.buf(1));
    for (uint64_t r = 1; r <= kRounds; ++r) {
      mc_wait_until(sig, McCmp::kGe, r);
      for (size_t i = 0; i < kData / 8; ++i) {
        if (d[i] != r * 100000 + i) bad++;
      }
      mc_st_release(ack, r);
    }
  });
  host::runWarp(8, [&](unsigned lane) {
    for (uint64_t r = 1; r <= kRounds; ++r) {
      if (lane == 0) {
        for (size_t i = 0; i < src.size(); ++i) src[i] = r * 100000 + i;
      }
      mc_syncwarp();
      EXPECT_EQ(mc_put_warp(c0, 1, w.buf(0), src.data(), kData, lane), McStatus::kOk);
      if (lane == 0) {
        EXPECT_EQ(mc_signal(c0, 1, sig_sym, r), McStatus::kOk);
        mc_wait_until(reinterpret_cast<const uint64_t*>(ack), McCmp::kEq, r);
      }
      mc_syncwarp();
    }
  });
  consumer.join();
  EXPECT_EQ(bad.load(), 0);
}

// put; mc_fence(); relaxed signal == put; release signal.
TEST(SignalWait, FenceThenRelaxedSignalPublishesData) {
  constexpr uint32_t kRounds = 5000;
  FakeWorld w(2, 1024);
  CommCtx c0 = w.ctx(0);
  auto* sig_sym = reinterpret_cast<uint32_t*>(w.buf(0) + 512);
  auto* ack = reinterpret_cast<uint32_t*>(w.buf(0) + 576);
  std::atomic<int> bad{0};
  std::thread consumer([&] {
    const auto* sig = reinterpret_cast<const uint32_t*>(w.buf(1) + 512);
    const auto* d = reinterpret_cast<const uint64_t*>(w.buf(1));
    for (uint32_t r = 1; r <= kRounds; ++r) {
      mc_wait_until(sig, McCmp::kEq, r);
      for (int i = 0; i < 8; ++i) {
        if (d[i] != (uint64_t{r} << 8) + i) bad++;
      }
      mc_st_release(ack, r);
    }
  });
  uint64_t src[8];
  for (uint32_t r = 1; r <= kRounds; ++r) {
    for (int i = 0; i < 8; ++i) src[i] = (uint64_t{r} << 8) + i;
    EXPECT_EQ(mc_put_thread(c0, 1, w.buf(0), src, sizeof(src)), McStatus::kOk);
    mc_fence();
    EXPECT_EQ(mc_signal_relaxed(c0, 1, sig_sym, r), McStatus::kOk);
    mc_wait_until(reinterpret_cast<const uint32_t*>(ack), McCmp::kEq, r);
  }
  consumer.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(mc_quiet(c0), McStatus::kOk);
}

TEST(SignalWait, EveryComparisonWakesAtTheRightValue) {
  alignas(8) int64_t v = 0;
  struct Case {
    McCmp cmp;
    int64_t target;
    int64_t satisfying;
  };
  for (Case k : {Case{McCmp::kEq, 5, 5}, Case{McCmp::kNe, 0, 3}, Case{McCmp::kGe, 4, 4},
                 Case{McCmp::kGt, 4, 5}, Case{McCmp::kLe, -2, -2}, Case{McCmp::kLt, -2, -3}}) {
    v = k.cmp == McCmp::kNe ? 0 : (k.cmp == McCmp::kLe || k.cmp == McCmp::kLt ? 10 : -10);
    std::thread setter([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      mc_st_release(&v, k.satisfying);
    });
    EXPECT_EQ(mc_wait_until(&v, k.cmp, k.target), k.satisfying);
    setter.join();
  }
}

TEST(SignalWait, WaitWithTimeoutReportsLastValue) {
  alignas(8) uint32_t v = 7;
  uint32_t seen = 0;
  const uint64_t t0 = mc_time_ns();
  EXPECT_FALSE(mc_wait_until_for(&v, McCmp::kEq, 8u, 5'000'000, &seen));
  EXPECT_GE(mc_time_ns() - t0, 5'000'000u);
  EXPECT_EQ(seen, 7u);
  EXPECT_TRUE(mc_wait_until_for(&v, McCmp::kGe, 7u, 5'000'000, &seen));
  EXPECT_EQ(seen, 7u);
}

// 8 threads x 100000 adds to one counter at a peer: no update may be lost
// (upstream's P2P red_add was a store and would lose almost all of them).
TEST(RedAdd, ConcurrentAddsLoseNothing) {
  constexpr int kThreads = 8;
  constexpr int kAdds = 100000;
  FakeWorld w(2, 256);
  std::vector<std::thread> pool;
  for (int t = 0; t < kThreads; ++t) {
    pool.emplace_back([&, t] {
      CommCtx c = w.ctx(t % 2);  // both ranks add into rank 1's counters
      auto* c32 = reinterpret_cast<uint32_t*>(w.buf(t % 2) + 64);
      auto* c64 = reinterpret_cast<int64_t*>(w.buf(t % 2) + 128);
      for (int i = 0; i < kAdds; ++i) {
        if (mc_red_add(c, 1, c32, 1u) != McStatus::kOk) ADD_FAILURE() << "red_add u32";
        if (mc_red_add(c, 1, c64, int64_t{-2}) != McStatus::kOk) ADD_FAILURE() << "red_add s64";
      }
    });
  }
  for (auto& th : pool) th.join();
  EXPECT_EQ(*reinterpret_cast<uint32_t*>(w.buf(1) + 64), uint32_t{kThreads * kAdds});
  EXPECT_EQ(*reinterpret_cast<int64_t*>(w.buf(1) + 128), int64_t{-2} * kThreads * kAdds);
  EXPECT_EQ(*reinterpret_cast<uint32_t*>(w.buf(0) + 64), 0u);
}

TEST(LowLatency, RoundTripsDataAndFlag) {
  FakeWorld w(2, 256);
  CommCtx c0 = w.ctx(0);
  auto* slot_sym = reinterpret_cast<McLLSlot*>(w.buf(0) + 64);
  const auto* slot = reinterpret_cast<const McLLSlot*>(w.buf(1) + 64);
  uint64_t data = 0;
  EXPECT_FALSE(mc_poll_ll(slot, 1, &data));  // empty slot
  ASSERT_EQ(mc_put_signal_ll(c0, 1, slot_sym, 0xfedcba9876543210ull, 1), McStatus::kOk);
  EXPECT_FALSE(mc_poll_ll(slot, 2, &data));
  EXPECT_TRUE(mc_poll_ll(slot, 1, &data));
  EXPECT_EQ(data, 0xfedcba9876543210ull);
  EXPECT_EQ(mc_wait_ll(slot, 1), 0xfedcba9876543210ull);
  // Layout: flag in the top half of both words.
  EXPECT_EQ(slot->lo, (uint64_t{1} << 32) | 0x76543210u);
  EXPECT_EQ(slot->hi, (uint64_t{1} << 32) | 0xfedcba98u);
}

// Ping-pong of LL slots between two threads: every value arrives intact with
// its flag and nothing else orders them.
TEST(LowLatency, PingPongCarriesEveryValue) {
  constexpr uint32_t kRounds = 20000;
  FakeWorld w(2, 256);
  CommCtx c0 = w.ctx(0), c1 = w.ctx(1);
  auto value = [](uint32_t r) { return (uint64_t{r} * 0x9E3779B97F4A7C15ull) ^ r; };
  std::atomic<int> bad{0};
  std::thread pong([&] {
    const auto* in = reinterpret_cast<const McLLSlot*>(w.buf(1) + 64);
    auto* out_sym = reinterpret_cast<McLLSlot*>(w.buf(1) + 128);
    for (uint32_t r = 1; r <= kRounds; ++r) {
      const uint64_t v = mc_wait_ll(in, r);
      if (v != value(r)) bad++;
      if (mc_put_signal_ll(c1, 0, out_sym, ~v, r) != McStatus::kOk) bad++;
    }
  });
  auto* out_sym = reinterpret_cast<McLLSlot*>(w.buf(0) + 64);
  const auto* in = reinterpret_cast<const McLLSlot*>(w.buf(0) + 128);
  for (uint32_t r = 1; r <= kRounds; ++r) {
    EXPECT_EQ(mc_put_signal_ll(c0, 1, out_sym, value(r), r), McStatus::kOk);
    EXPECT_EQ(mc_wait_ll(in, r), ~value(r));
  }
  pong.join();
  EXPECT_EQ(bad.load(), 0);
}

// A half-written slot (only one word carries the new flag) is not accepted.
TEST(LowLatency, TornSlotIsNotAccepted) {
  McLLSlot slot{};
  slot.lo = mc_ll_pack(0x1234, 3);
  slot.hi = mc_ll_pack(0, 2);
  uint64_t data = 0;
  EXPECT_FALSE(mc_poll_ll(&slot, 3, &data));
  slot.hi = mc_ll_pack(0xabcd, 3);
  EXPECT_TRUE(mc_poll_ll(&slot, 3, &data));
  EXPECT_EQ(data, 0x0000abcd00001234ull);
}

TEST(Quiet, SkipsPeersWithoutQueuePairs) {
  CommCtx c;
  c.num_ranks = 2;
  EXPECT_EQ(mc_quiet(c), McStatus::kOk);
  // A table whose entries have no send queue (self, P2P peers) has nothing
  // to wait for; RDMA routes are tested against softnic (tests/softnic).
  IbgdaQpDevCtx qps[2];
  c.ibgda.qp_devctxs = qps;
  c.ibgda.qps_per_rank = 1;
  EXPECT_EQ(mc_quiet(c), McStatus::kOk);
}

}  // namespace
}  // namespace mooncake::device

namespace mooncake::device {
namespace {

TEST(ResolvedPeer, MatchesRoutePutAndCarriesErrors) {
  FakeWorld w(3, 4096);
  w.setAvailable(2, false);
  CommCtx c = w.ctx(0);
  unsigned char* p = w.buf(0) + 777;
  McPeer self = mc_peer(c, 0), one = mc_peer(c, 1), rdma = mc_peer(c, 2), bad = mc_peer(c, 3);
  EXPECT_EQ(self.status, McStatus::kOk);
  EXPECT_EQ(mc_peer_ptr(self, p), p);
  EXPECT_EQ(one.status, McStatus::kOk);
  EXPECT_EQ(mc_peer_ptr(one, p), mc_route_put(c, 1, p));
  EXPECT_EQ(rdma.status, McStatus::kNoRoute);
  EXPECT_EQ(bad.status, McStatus::kInvalidRank);
  // Calls through an unusable peer write nothing and say why.
  uint64_t* sig = reinterpret_cast<uint64_t*>(w.buf(0) + 64);
  EXPECT_EQ(mc_signal(rdma, sig, uint64_t{5}), McStatus::kNoRoute);
  EXPECT_EQ(mc_red_add(bad, sig, uint64_t{5}), McStatus::kInvalidRank);
  EXPECT_EQ(*reinterpret_cast<uint64_t*>(w.buf(2) + 64), 0u);
  // And through a good one they land at the peer.
  EXPECT_EQ(mc_signal(one, sig, uint64_t{7}), McStatus::kOk);
  EXPECT_EQ(mc_red_add(one, sig, uint64_t{3}), McStatus::kOk);
  EXPECT_EQ(*reinterpret_cast<uint64_t*>(w.buf(1) + 64), 10u);
  McLLSlot* slot = reinterpret_cast<McLLSlot*>(w.buf(0) + 128);
  EXPECT_EQ(mc_put_signal_ll(one, slot, 0x1122334455667788ull, 9u), McStatus::kOk);
  uint64_t data = 0;
  EXPECT_TRUE(mc_poll_ll(reinterpret_cast<McLLSlot*>(w.buf(1) + 128), 9u, &data));
  EXPECT_EQ(data, 0x1122334455667788ull);
}

TEST(ResolvedPeer, GridPutCoversEveryByteAcrossBlocks) {
  // 5 emulated blocks of 8 threads share a put that spans several 64 KiB tiles
  // and ends mid-tile at an odd offset.
  constexpr size_t kBytes = 5 * 64 * 1024 + 12345;
  FakeWorld w(2, kBytes + 64);
  CommCtx c = w.ctx(0);
  std::vector<unsigned char> src(kBytes);
  for (size_t i = 0; i < kBytes; ++i) src[i] = PatternByte(i, 3);
  McPeer peer = mc_peer(c, 1);
  constexpr unsigned kBlocks = 5;
  for (unsigned b = 0; b < kBlocks; ++b) {
    host::runBlock(8, [&](unsigned) {
      EXPECT_EQ(mc_put_grid(peer, w.buf(0) + 3, src.data(), kBytes, b, kBlocks), McStatus::kOk);
    });
  }
  for (size_t i = 0; i < kBytes; ++i) ASSERT_EQ(w.buf(1)[3 + i], src[i]) << "byte " << i;
  EXPECT_EQ(w.buf(1)[2], 0);
  EXPECT_EQ(w.buf(1)[3 + kBytes], 0);
}

}  // namespace
}  // namespace mooncake::device
