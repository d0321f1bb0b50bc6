// The Device API's RDMA route end to end on the host platform: comm_device.h
// and mlx5/qp_ops.h, unchanged, run on CPU threads and post real mlx5 WQEs
// to rings that softnic serves. Every rank's buffer is reachable only over
// RDMA (no P2P), so every put, signal, atomic and LL write of these tests
// is a WQE executed by the engine thread.
//
// A "world" is 2-4 ranks in this process. Each has a registered data buffer
// (a sealed memfd for rank 0, anonymous memory for the others) followed by
// an unregistered guard, and a control mapping holding its QPs' rings and
// the fetch scratch of its atomics; its IbgdaQpDevCtx structs point there.
// Rank a's QP for b is connected to rank b's QP for a, per channel.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "mooncake/device/comm_device.h"
#include "mooncake/device/host_coop.h"
#include "mooncake/device/ibgda_qp.h"
#include "softnic/engine.h"
#include "softnic/shared_mapping.h"

namespace mooncake::softnic {
namespace {

using device::CommCtx;
using device::IbgdaQpDevCtx;
using device::McCmp;
using device::McLLSlot;
using device::McStatus;
namespace mlx5 = device::mlx5;

// Layout of every rank's (symmetric) buffer.
constexpr uint64_t kBufBytes = 4 << 20;
constexpr uint64_t kGuardBytes = 64 << 10;  // after the buffer, not registered
constexpr uint64_t kSigOff = 0;
constexpr uint64_t kAckOff = 64;
constexpr uint64_t kCounter64Off = 256;
constexpr uint64_t kCounter32Off = 264;
constexpr uint64_t kLlOff = 512;
constexpr uint64_t kLlAckOff = 528;
constexpr uint64_t kArrivalsOff = 1024;
constexpr uint64_t kSrcOff = 64 << 10;
constexpr uint64_t kDstOff = 2 << 20;

constexpr uint64_t kLongNs = 20'000'000'000ull;  // "forever" that still ends a broken test

uint8_t PatternByte(uint64_t i, uint32_t seed = 0) {
  const uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull + seed * 0xBF58476D1CE4E5B9ull;
  return static_cast<uint8_t>((x >> 29) ^ (x >> 47) ^ i);
}

std::shared_ptr<SharedMapping> SealedMemfd(uint64_t bytes) {
  const int fd = ::memfd_create("softnic_route_test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(::ftruncate(fd, static_cast<off_t>(bytes)), 0);
  EXPECT_EQ(::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
  auto m = SharedMapping::FromSealedMemfd(fd, bytes);
  ::close(fd);
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? *m : nullptr;
}

struct WorldOptions {
  int ranks = 3;
  int qps_per_rank = 1;
  uint32_t sq_wqe_cnt = 64;
  uint64_t timeout_ns = kLongNs;
  // Ranks that also reach each other by load/store (P2P); the others are
  // RDMA-only. Every rank has queue pairs toward every other either way.
  std::vector<int> p2p_ranks;
  // Every rank also gets a queue pair toward itself (connected to itself):
  // the context then routes every atomic through the target's NIC
  // (mc_nic_atomics, "Atomics across routes" in comm_device.h).
  bool loopback = false;
  // IbgdaQpDevCtx::cqe_every of every QP (1: a CQE per WQE).
  uint32_t cqe_every = 1;
};

class World {
 public:
  World(Engine& engine, WorldOptions o) : engine_(engine), o_(o), ranks_(o.ranks) {
    const int n = o.ranks, qpr = o.qps_per_rank;
    const uint32_t sq = o.sq_wqe_cnt, cq = o.sq_wqe_cnt;
    const uint64_t nqps = static_cast<uint64_t>(n) * qpr;
    // Control mapping: [scratch: 64 B per QP][per QP: sq | cq | dbrecs (64 B)].
    const uint64_t per_qp = uint64_t{sq} * 64 + uint64_t{cq} * 64 + 64;
    const uint64_t scratch_bytes = nqps * 64;
    for (int r = 0; r < n; ++r) {
      Rank& k = ranks_[r];
      if (r == 0) {
        k.data = SealedMemfd(kBufBytes + kGuardBytes);
      } else {
        auto m = SharedMapping::Anonymous(kBufBytes + kGuardBytes);
        EXPECT_TRUE(m.ok());
        k.data = *m;
      }
      auto ctl = SharedMapping::Anonymous(scratch_bytes + nqps * per_qp);
      EXPECT_TRUE(ctl.ok());
      k.ctl = *ctl;
      const PdId pd = Pd(r);
      RegionSpec data;
      data.pd = pd;
      data.iova = reinterpret_cast<uintptr_t>(k.data->data());
      data.length = kBufBytes;
      data.access = kLocalWrite | kRemoteWrite | kRemoteAtomic;
      data.mapping = k.data;
      auto key = engine.RegisterRegion(data);
      EXPECT_TRUE(key.ok()) << key.status();
      k.data_key = *key;
      RegionSpec scratch;
      scratch.pd = pd;
      scratch.iova = reinterpret_cast<uintptr_t>(k.ctl->data());
      scratch.length = scratch_bytes;
      scratch.access = kLocalWrite;
      scratch.mapping = k.ctl;
      key = engine.RegisterRegion(scratch);
      EXPECT_TRUE(key.ok()) << key.status();
      k.scratch_key = *key;

      k.qps.reset(new IbgdaQpDevCtx[nqps]);
      for (int dst = 0; dst < n; ++dst) {
        if (dst == r && !o.loopback) continue;
        for (int ch = 0; ch < qpr; ++ch) {
          const uint64_t i = static_cast<uint64_t>(dst) * qpr + ch;
          const uint64_t base = scratch_bytes + i * per_qp;
          uint8_t* b = k.ctl->data();
          QpSpec spec;
          spec.pd = pd;
          spec.mapping = k.ctl;
          spec.sq_offset = base;
          spec.sq_wqe_cnt = sq;
          spec.cq_offset = base + uint64_t{sq} * 64;
          spec.cq_cqe_cnt = cq;
          spec.sq_dbrec_offset = spec.cq_offset + uint64_t{cq} * 64;
          spec.cq_dbrec_offset = spec.sq_dbrec_offset + 32;
          std::memset(b + spec.cq_offset, 0xff, uint64_t{cq} * 64);
          auto qpn = engine.CreateQp(spec);
          EXPECT_TRUE(qpn.ok()) << qpn.status();
          IbgdaQpDevCtx& q = k.qps[i];
          q.sq = b + spec.sq_offset;
          q.sq_dbrec = reinterpret_cast<uint32_t*>(b + spec.sq_dbrec_offset);
          q.cq = reinterpret_cast<mlx5::Cqe64*>(b + spec.cq_offset);
          q.cq_dbrec = reinterpret_cast<uint32_t*>(b + spec.cq_dbrec_offset);
          q.fetch_scratch = reinterpret_cast<uint64_t*>(b + i * 64);
          q.local_base = reinterpret_cast<uintptr_t>(k.data->data());
          q.local_size = kBufBytes;
          q.timeout_ns = o.timeout_ns;
          q.qpn = *qpn;
          q.loopback = dst == r ? 1 : 0;
          q.sq_wqe_cnt = sq;
          q.cq_cqe_cnt = cq;
          q.cqe_every = o.cqe_every;
          q.lkey = k.data_key;
          q.scratch_lkey = k.scratch_key;
        }
      }
    }
    for (int r = 0; r < n; ++r) {
      for (int dst = 0; dst < n; ++dst) {
        if (dst == r && !o.loopback) continue;
        for (int ch = 0; ch < qpr; ++ch) {
          EXPECT_TRUE(engine.Connect(Pd(r), qp(r, dst, ch)->qpn, qp(dst, r, ch)->qpn).ok());
        }
      }
    }
    // The tables every rank's CommCtx points at.
    for (int r = 0; r < n; ++r) {
      raddrs_.push_back(reinterpret_cast<uintptr_t>(buf(r)));
      rkeys_.push_back(ranks_[r].data_key);
      peer_ptrs_.push_back(buf(r));
    }
    // Default: nobody is a P2P peer, every route is RDMA.
    auto p2p = [&o](int r) {
      return std::find(o.p2p_ranks.begin(), o.p2p_ranks.end(), r) != o.p2p_ranks.end();
    };
    available_.resize(n);
    for (int r = 0; r < n; ++r) {
      for (int dst = 0; dst < n; ++dst) available_[r].push_back(p2p(r) && p2p(dst) ? 1 : 0);
    }
  }
  ~World() {
    for (int r = 0; r < o_.ranks; ++r) engine_.DestroyPd(Pd(r));
  }

  static PdId Pd(int r) { return 1000 + r; }
  uint8_t* buf(int r) const { return ranks_[r].data->data(); }
  IbgdaQpDevCtx* qp(int r, int dst, int ch = 0) const {
    return &ranks_[r].qps[static_cast<size_t>(dst) * o_.qps_per_rank + ch];
  }
  CommCtx ctx(int r) const {
    CommCtx c;
    c.rank = r;
    c.num_ranks = o_.ranks;
    c.p2p.available = available_[r].data();
    c.p2p.peer_ptrs = peer_ptrs_.data();
    c.p2p.local_base = buf(r);
    c.ibgda.qp_devctxs = ranks_[r].qps.get();
    c.ibgda.raddrs = raddrs_.data();
    c.ibgda.rkeys = rkeys_.data();
    c.ibgda.qps_per_rank = o_.qps_per_rank;
    return c;
  }
  int qps_per_rank() const { return o_.qps_per_rank; }

 private:
  struct Rank {
    std::shared_ptr<SharedMapping> data, ctl;
    uint32_t data_key = 0, scratch_key = 0;
    std::unique_ptr<IbgdaQpDevCtx[]> qps;
  };
  Engine& engine_;
  WorldOptions o_;
  std::vector<Rank> ranks_;
  std::vector<uint64_t> raddrs_;
  std::vector<uint32_t> rkeys_;
  std::vector<void*> peer_ptrs_;
  std::vector<std::vector<int32_t>> available_;  // [rank][dst]
};

template <class T>
T* At(uint8_t* base, uint64_t off) {
  return reinterpret_cast<T*>(base + off);
}

// Bytes of [p, p + n) that are not zero.
size_t NonZero(const uint8_t* p, uint64_t n) {
  size_t bad = 0;
  for (uint64_t i = 0; i < n; ++i) bad += p[i] != 0;
  return bad;
}

void FillSource(uint8_t* buf, uint32_t seed = 0) {
  for (uint64_t i = 0; i < (1 << 20) + 64; ++i) buf[kSrcOff + i] = PatternByte(i, seed);
}

// Parameters: queue pairs per rank, and a CQE every how many WQEs (16 is
// past half of the tiny rings some tests use: the device bounds it there).
class RouteTest : public ::testing::TestWithParam<std::pair<int, uint32_t>> {
 protected:
  void SetUp() override { engine_.Start(); }
  WorldOptions Options(int ranks = 3, uint32_t sq = 64) const {
    WorldOptions o;
    o.ranks = ranks;
    o.qps_per_rank = GetParam().first;
    o.cqe_every = GetParam().second;
    o.sq_wqe_cnt = sq;
    return o;
  }
  Engine engine_;
};

INSTANTIATE_TEST_SUITE_P(QpsPerRankAndCqeInterval, RouteTest,
                         ::testing::Values(std::pair{1, 1u}, std::pair{2, 1u}, std::pair{1, 16u},
                                           std::pair{2, 4u}),
                         [](const auto& param_info) {
                           return "qps" + std::to_string(param_info.param.first) + "_cqe" +
                                  std::to_string(param_info.param.second);
                         });

TEST_P(RouteTest, EveryPeerIsRdma) {
  World w(engine_, Options());
  const CommCtx c = w.ctx(0);
  EXPECT_FALSE(device::mc_peer_is_rdma(device::mc_peer(c, 0)));
  for (int ch = 0; ch < w.qps_per_rank(); ++ch) {
    const device::McPeer p = device::mc_peer(c, 2, ch);
    EXPECT_EQ(p.status, McStatus::kOk);
    EXPECT_EQ(p.qp, w.qp(0, 2, ch));
  }
}

// Put of 1 B .. 1 MiB at odd alignments, then a signal; the receiver waits
// for the signal, checks every byte and the bytes around, and acks (over
// RDMA as well).
TEST_P(RouteTest, PutThenSignalSizesAndAlignments) {
  World w(engine_, Options());
  uint8_t* b0 = w.buf(0);
  uint8_t* b1 = w.buf(1);
  FillSource(b0);
  const uint64_t sizes[] = {1,    2,    3,    7,    8,     15,    16,    17,     27,     28,
                            29,   31,   32,   33,   63,    64,    65,    100,    255,    256,
                            1000, 4095, 4096, 4097, 65535, 65536, 65537, 300000, 1 << 20};
  struct Align {
    uint64_t src, dst;
  };
  const Align aligns[] = {{0, 0}, {3, 5}, {13, 1}, {8, 7}};
  struct Case {
    uint64_t n, src, dst;
  };
  std::vector<Case> cases;
  for (const Align& a : aligns) {
    for (uint64_t n : sizes) cases.push_back({n, a.src, a.dst});
  }

  std::atomic<int> bad{0};
  std::thread receiver([&] {
    const CommCtx c1 = w.ctx(1);
    uint64_t seq = 0;
    for (const Case& k : cases) {
      ++seq;
      uint64_t seen = 0;
      if (!device::mc_wait_until_for(At<const uint64_t>(b1, kSigOff), McCmp::kGe, seq, kLongNs,
                                     &seen)) {
        ADD_FAILURE() << "signal " << seq << " never came";
        bad++;
        return;
      }
      uint8_t* d = b1 + kDstOff + k.dst;
      size_t wrong = 0;
      for (uint64_t i = 0; i < k.n; ++i) wrong += d[i] != PatternByte(k.src + i);
      wrong += d[-1] != 0;
      wrong += d[k.n] != 0;
      if (wrong != 0) {
        ADD_FAILURE() << k.n << " bytes src+" << k.src << " dst+" << k.dst << ": " << wrong
                      << " wrong";
        bad++;
      }
      std::memset(d, 0, k.n);
      if (device::mc_signal(c1, 0, At<uint64_t>(b1, kAckOff), seq) != McStatus::kOk) bad++;
    }
  });
  const CommCtx c0 = w.ctx(0);
  uint64_t seq = 0;
  for (const Case& k : cases) {
    ++seq;
    ASSERT_EQ(device::mc_put_thread(c0, 1, b0 + kDstOff + k.dst, b0 + kSrcOff + k.src, k.n),
              McStatus::kOk);
    ASSERT_EQ(device::mc_signal(c0, 1, At<uint64_t>(b0, kSigOff), seq), McStatus::kOk);
    uint64_t seen = 0;
    ASSERT_TRUE(
        device::mc_wait_until_for(At<const uint64_t>(b0, kAckOff), McCmp::kGe, seq, kLongNs, &seen))
        << "no ack for " << seq;
    if (bad.load() != 0) break;
  }
  receiver.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(device::mc_quiet(c0), McStatus::kOk);
  EXPECT_EQ(device::mc_quiet(w.ctx(1)), McStatus::kOk);
  EXPECT_EQ(NonZero(b1 + kBufBytes, kGuardBytes), 0u);
}

// The cooperative forms post once per warp / block / block of a grid.
TEST_P(RouteTest, WarpBlockAndGridPuts) {
  World w(engine_, Options());
  uint8_t* b0 = w.buf(0);
  uint8_t* b1 = w.buf(1);
  FillSource(b0, 7);
  const uint64_t sizes[] = {1, 29, 4097, 70001, 1 << 20};
  const CommCtx c0 = w.ctx(0);
  auto check = [&](const char* form) {
    ASSERT_EQ(device::mc_quiet(c0), McStatus::kOk) << form;
    uint64_t at = 0;
    for (uint64_t n : sizes) {
      size_t wrong = 0;
      for (uint64_t i = 0; i < n; ++i) wrong += b1[kDstOff + at + 3 + i] != PatternByte(1 + i, 7);
      EXPECT_EQ(wrong, 0u) << form << " put of " << n;
      EXPECT_EQ(b1[kDstOff + at + 2], 0) << form;
      EXPECT_EQ(b1[kDstOff + at + 3 + n], 0) << form;
      at += n + 64;
    }
    std::memset(b1 + kDstOff, 0, at);
  };
  auto dst = [&](uint64_t at) { return b0 + kDstOff + at + 3; };
  const uint8_t* src = b0 + kSrcOff + 1;

  std::atomic<int> bad{0};
  device::host::runWarp(8, [&](unsigned lane) {
    uint64_t at = 0;
    for (uint64_t n : sizes) {
      if (device::mc_put_warp(c0, 1, dst(at), src, n, lane) != McStatus::kOk) bad++;
      at += n + 64;
    }
  });
  check("warp");
  device::host::runBlock(40, [&](unsigned) {
    uint64_t at = 0;
    for (uint64_t n : sizes) {
      if (device::mc_put_block(c0, 1, dst(at), src, n) != McStatus::kOk) bad++;
      at += n + 64;
    }
  });
  check("block");
  constexpr unsigned kBlocks = 3;
  std::vector<std::thread> blocks;
  for (unsigned b = 0; b < kBlocks; ++b) {
    blocks.emplace_back([&, b] {
      device::host::runBlock(8, [&](unsigned) {
        uint64_t at = 0;
        for (uint64_t n : sizes) {
          if (device::mc_put_grid(c0, 1, dst(at), src, n, b, kBlocks) != McStatus::kOk) bad++;
          at += n + 64;
        }
      });
    });
  }
  for (auto& t : blocks) t.join();
  check("grid");
  EXPECT_EQ(bad.load(), 0);
}

// Each thread of `run`'s group puts its own message with `put` (none,
// inline, from the registered buffer, or an unregistered source that only
// that thread hears about); the group's WQEs go out as one batch per call.
// A 16-WQE ring makes batches wait for space now and then, and splits a
// block's batch into chunks of 8.
template <class Run, class Put>
void ScatterOwnPuts(World& w, unsigned threads, Run run, Put put) {
  uint8_t* b0 = w.buf(0);
  uint8_t* b1 = w.buf(1);
  FillSource(b0, 9);
  constexpr uint64_t kSlot = 8192;
  // As many rounds (up to 12) as the buffer holds slots for.
  const int kRounds =
      static_cast<int>(std::min<uint64_t>(12, (kBufBytes - kDstOff) / (threads * kSlot)));
  const uint64_t sizes[] = {0, 1, 8, 28, 29, 300, 5000};
  auto size_of = [&](unsigned t, int r) { return sizes[(t * 3 + r) % 7]; };
  auto slot = [&](uint8_t* b, unsigned t, int r) {
    return b + kDstOff + (uint64_t{t} * kRounds + r) * kSlot;
  };
  std::vector<uint8_t> outside(64, 0x77);
  std::atomic<int> bad{0}, not_registered{0};
  const CommCtx c0 = w.ctx(0);
  run(threads, [&](unsigned t) {
    for (int r = 0; r < kRounds; ++r) {
      // Thread 5 of round 3 sends 64 bytes from outside the registered buffer.
      const bool rogue = t == 5 && r == 3;
      const uint8_t* src = rogue ? outside.data() : b0 + kSrcOff + t + r;
      const uint64_t n = rogue ? 64 : size_of(t, r);
      const McStatus st = put(c0, slot(b0, t, r), src, n);
      if (rogue) {
        if (st == McStatus::kNotRegistered) not_registered++;
      } else if (st != McStatus::kOk) {
        bad++;
      }
    }
  });
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(not_registered.load(), 1);
  ASSERT_EQ(device::mc_quiet(c0), McStatus::kOk);
  for (unsigned t = 0; t < threads; ++t) {
    for (int r = 0; r < kRounds; ++r) {
      const uint8_t* d = slot(b1, t, r);
      const uint64_t n = t == 5 && r == 3 ? 0 : size_of(t, r);
      size_t wrong = NonZero(d + n, kSlot - n);
      for (uint64_t i = 0; i < n; ++i) wrong += d[i] != PatternByte(t + r + i, 9);
      EXPECT_EQ(wrong, 0u) << "thread " << t << " round " << r << " (" << n << " bytes)";
    }
  }
  const IbgdaQpDevCtx* q = w.qp(0, 1, 0);
  EXPECT_EQ(q->cons_tail, q->resv_head);
  EXPECT_EQ(q->error, 0u);
}

// mc_put_lanes: a warp's lanes; one doorbell per warp and call.
TEST_P(RouteTest, LanesScatterTheirOwnPuts) {
  World w(engine_, Options(2, 16));
  ScatterOwnPuts(
      w, 8, [](unsigned n, auto&& fn) { device::host::runWarp(n, fn); },
      [](const CommCtx& c, uint8_t* dst, const uint8_t* src, uint64_t n) {
        return device::mc_put_lanes(c, 1, dst, src, n);
      });
}

// mc_put_lanes_block: a block of 40 threads (a partial second warp); one
// doorbell per chunk of half the ring.
TEST_P(RouteTest, BlockThreadsScatterTheirOwnPuts) {
  World w(engine_, Options(2, 16));
  ScatterOwnPuts(
      w, 40, [](unsigned n, auto&& fn) { device::host::runBlock(n, fn); },
      [](const CommCtx& c, uint8_t* dst, const uint8_t* src, uint64_t n) {
        return device::mc_put_lanes_block(c, 1, dst, src, n);
      });
}

// Remote atomics from many threads of two ranks, over every channel, racing
// the owner's own CPU atomics on the same words: no add is lost.
TEST_P(RouteTest, RedAddFromManyThreadsLosesNothing) {
  World w(engine_, Options());
  constexpr int kThreadsPerRank = 4;
  constexpr int kAdds = 200;
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int r : {0, 2, 1}) {
    for (int t = 0; t < kThreadsPerRank; ++t) {
      threads.emplace_back([&, r, t] {
        const CommCtx c = w.ctx(r);
        // Symmetric addresses: this rank's own copy names the slot.
        auto* c64 = At<uint64_t>(w.buf(r), kCounter64Off);
        auto* c32 = At<uint32_t>(w.buf(r), kCounter32Off);
        const device::McPeer peer = device::mc_peer(c, 1, t);  // rank 1 itself is local
        for (int i = 0; i < kAdds; ++i) {
          if (device::mc_red_add(peer, c64, uint64_t{1}) != McStatus::kOk) bad++;
          if (device::mc_red_add(peer, c32, uint32_t{3}) != McStatus::kOk) bad++;
        }
        if (device::mc_quiet(c) != McStatus::kOk) bad++;
      });
    }
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0);
  constexpr uint64_t kTotal = 3ull * kThreadsPerRank * kAdds;
  EXPECT_EQ(*At<uint64_t>(w.buf(1), kCounter64Off), kTotal);
  EXPECT_EQ(*At<uint32_t>(w.buf(1), kCounter32Off), 3 * kTotal);
  EXPECT_EQ(NonZero(w.buf(0) + kCounter64Off, 16), 0u);
  EXPECT_EQ(NonZero(w.buf(2) + kCounter64Off, 16), 0u);
}

// LL: 8 bytes and a flag in one inline write; ping-pong, both ways RDMA.
TEST_P(RouteTest, LowLatencyPingPong) {
  World w(engine_, Options(2, 16));
  constexpr uint32_t kRounds = 150;
  auto* slot0 = At<McLLSlot>(w.buf(0), kLlOff);
  auto* ack0 = At<McLLSlot>(w.buf(0), kLlAckOff);
  auto* slot1 = At<McLLSlot>(w.buf(1), kLlOff);
  auto* ack1 = At<McLLSlot>(w.buf(1), kLlAckOff);
  std::atomic<int> bad{0};
  std::thread pong([&] {
    const CommCtx c1 = w.ctx(1);
    for (uint32_t flag = 1; flag <= kRounds; ++flag) {
      const uint64_t v = device::mc_wait_ll(slot1, flag);
      if (v != 0x0123456789abcdefull * flag) bad++;
      if (device::mc_put_signal_ll(c1, 0, ack1, ~v, flag) != McStatus::kOk) bad++;
    }
  });
  const CommCtx c0 = w.ctx(0);
  for (uint32_t flag = 1; flag <= kRounds; ++flag) {
    ASSERT_EQ(device::mc_put_signal_ll(c0, 1, slot0, 0x0123456789abcdefull * flag, flag),
              McStatus::kOk);
    EXPECT_EQ(device::mc_wait_ll(ack0, flag), ~(0x0123456789abcdefull * flag));
  }
  pong.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(device::mc_quiet(c0), McStatus::kOk);
}

// Eight posters share one QP (per channel) whose ring holds four WQEs: they
// keep running into a full ring and wait for completions; every write lands.
TEST_P(RouteTest, ManyPostersOnATinyRing) {
  World w(engine_, Options(2, 4));
  uint8_t* b0 = w.buf(0);
  uint8_t* b1 = w.buf(1);
  FillSource(b0, 3);
  constexpr int kThreads = 8;
  constexpr int kPuts = 100;
  constexpr uint64_t kSlot = 320;
  auto size_of = [](int t, int i) { return uint64_t{1} + (t * 131 + i * 17) % 300; };
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const CommCtx c = w.ctx(0);
      const device::McPeer peer = device::mc_peer(c, 1, t);
      for (int i = 0; i < kPuts; ++i) {
        const uint64_t at = kDstOff + (uint64_t{static_cast<uint64_t>(t)} * kPuts + i) * kSlot;
        if (device::mc_put_thread(peer, b0 + at, b0 + kSrcOff + i % 64, size_of(t, i)) !=
            McStatus::kOk) {
          bad++;
        }
      }
      if (device::mc_quiet(c) != McStatus::kOk) bad++;
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_EQ(bad.load(), 0);
  for (int t = 0; t < kThreads; ++t) {
    for (int i = 0; i < kPuts; ++i) {
      const uint8_t* d = b1 + kDstOff + (uint64_t{static_cast<uint64_t>(t)} * kPuts + i) * kSlot;
      const uint64_t n = size_of(t, i);
      size_t wrong = 0;
      for (uint64_t j = 0; j < n; ++j) wrong += d[j] != PatternByte(i % 64 + j, 3);
      wrong += NonZero(d + n, kSlot - n);
      ASSERT_EQ(wrong, 0u) << "thread " << t << " put " << i;
    }
  }
  for (int ch = 0; ch < w.qps_per_rank(); ++ch) {
    const IbgdaQpDevCtx* q = w.qp(0, 1, ch);
    EXPECT_EQ(q->cons_tail, q->resv_head);
    EXPECT_EQ(q->error, 0u);
  }
}

// Every rank puts a block to every other and bumps a counter there; each
// waits for its counter, then checks the blocks (put; red_add is ordered on
// one channel by the WQE fence).
TEST_P(RouteTest, AllToAll) {
  World w(engine_, Options(4));
  constexpr uint64_t kBlock = 5000;
  for (int r = 0; r < 4; ++r) FillSource(w.buf(r), 100 + r);
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int r = 0; r < 4; ++r) {
    threads.emplace_back([&, r] {
      const CommCtx c = w.ctx(r);
      uint8_t* b = w.buf(r);
      for (int k = 1; k < 4; ++k) {
        const int dst = (r + k) % 4;
        const device::McPeer peer = device::mc_peer(c, dst, k);
        if (device::mc_put_thread(peer, b + kDstOff + r * kBlock, b + kSrcOff, kBlock) !=
            McStatus::kOk) {
          bad++;
        }
        if (device::mc_red_add(peer, At<uint64_t>(b, kArrivalsOff), uint64_t{1}) != McStatus::kOk) {
          bad++;
        }
      }
      uint64_t seen = 0;
      if (!device::mc_wait_until_for(At<const uint64_t>(b, kArrivalsOff), McCmp::kEq, uint64_t{3},
                                     kLongNs, &seen)) {
        bad++;
        return;
      }
      for (int src = 0; src < 4; ++src) {
        if (src == r) continue;
        for (uint64_t i = 0; i < kBlock; ++i) {
          if (b[kDstOff + src * kBlock + i] != PatternByte(i, 100 + src)) {
            bad++;
            break;
          }
        }
      }
      if (device::mc_quiet(c) != McStatus::kOk) bad++;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0);
}

TEST_P(RouteTest, LargePutFromOutsideTheBufferIsNotRegistered) {
  World w(engine_, Options(2));
  const CommCtx c0 = w.ctx(0);
  std::vector<uint8_t> outside(64, 0x5c);
  EXPECT_EQ(device::mc_put_thread(c0, 1, w.buf(0) + kDstOff, outside.data(), 29),
            McStatus::kNotRegistered);
  EXPECT_EQ(device::mc_put_thread(c0, 1, w.buf(0) + kDstOff, outside.data(), 64),
            McStatus::kNotRegistered);
  // Straddling the end of the buffer.
  EXPECT_EQ(device::mc_put_thread(c0, 1, w.buf(0) + kDstOff, w.buf(0) + kBufBytes - 32, 64),
            McStatus::kNotRegistered);
  // Inline puts copy the source into the WQE: any source will do.
  EXPECT_EQ(device::mc_put_thread(c0, 1, w.buf(0) + kDstOff, outside.data(), 28), McStatus::kOk);
  EXPECT_EQ(device::mc_quiet(c0), McStatus::kOk);
  EXPECT_EQ(w.buf(1)[kDstOff + 27], 0x5c);
  EXPECT_EQ(w.buf(1)[kDstOff + 28], 0);
  EXPECT_EQ(NonZero(w.buf(1) + kDstOff + 28, 4096), 0u);
}

// A put aimed past the peer's buffer: the engine refuses it with
// REMOTE_ACCESS_ERR, mc_quiet reports kRdmaError and the QP keeps the
// syndrome; the guard after the peer's buffer is untouched and the other
// peers' QPs go on working.
TEST_P(RouteTest, ErrorCompletionReachesQuietAndTheQp) {
  World w(engine_, Options(3));
  uint8_t* b0 = w.buf(0);
  FillSource(b0);
  const CommCtx c0 = w.ctx(0);
  ASSERT_EQ(device::mc_put_thread(c0, 1, b0 + kBufBytes + 64, b0 + kSrcOff, 4096), McStatus::kOk);
  EXPECT_EQ(device::mc_quiet(c0), McStatus::kRdmaError);
  IbgdaQpDevCtx* q = w.qp(0, 1);
  EXPECT_EQ(q->error, device::kQpErrCqe | mlx5::kSyndRemoteAccessErr);
  EXPECT_EQ(NonZero(w.buf(1) + kBufBytes, kGuardBytes), 0u);
  // The QP stays failed: nothing more is posted on it.
  EXPECT_EQ(device::mc_put_thread(c0, 1, b0 + kDstOff, b0 + kSrcOff, 64), McStatus::kRdmaError);
  bool found = false;
  for (const QpInfo& info : engine_.ListQps()) {
    if (info.qpn != q->qpn) continue;
    found = true;
    EXPECT_EQ(info.state, QpState::kError);
    EXPECT_EQ(info.last_syndrome, mlx5::kSyndRemoteAccessErr);
  }
  EXPECT_TRUE(found);
  // Rank 2 is still reachable.
  ASSERT_EQ(device::mc_put_thread(c0, 2, b0 + kDstOff, b0 + kSrcOff, 4096), McStatus::kOk);
  EXPECT_EQ(device::mc_qp_quiet(w.qp(0, 2)), McStatus::kOk);
  EXPECT_EQ(std::memcmp(w.buf(2) + kDstOff, b0 + kSrcOff, 4096), 0);
  // And a signal past the buffer fails the same way, on its own QP.
  EXPECT_EQ(device::mc_signal(w.ctx(2), 1, At<uint64_t>(w.buf(2), kBufBytes + 8), uint64_t{1}),
            McStatus::kOk);
  EXPECT_EQ(device::mc_quiet(w.ctx(2)), McStatus::kRdmaError);
  EXPECT_EQ(w.qp(2, 1)->error, device::kQpErrCqe | mlx5::kSyndRemoteAccessErr);
  EXPECT_EQ(NonZero(w.buf(1) + kBufBytes, kGuardBytes), 0u);
}

// ---- atomics across routes (issue 24 item 2) -------------------------------------
// Rank 0 owns a counter. Rank 1 reaches it by load/store (P2P), rank 2 only
// over RDMA. softnic runs NIC atomics as a ConnectX does ("hca": read, add,
// write), with a window between read and write long enough that the adds
// of ranks 0 and 1 land inside it.
struct MixedCounter {
  uint64_t total = 0;
  McStatus status[3] = {McStatus::kOk, McStatus::kOk, McStatus::kOk};
};
MixedCounter AddFromEveryRoute(Engine& engine, bool loopback) {
  WorldOptions o;
  o.ranks = 3;
  o.p2p_ranks = {0, 1};
  o.loopback = loopback;
  World w(engine, o);
  // Symmetric: each rank names the counter by its own buffer's address.
  auto counter = [&w](int r) { return At<uint64_t>(w.buf(r), kCounter64Off); };
  MixedCounter m;
  m.status[2] = device::mc_red_add(w.ctx(2), 0, counter(2), uint64_t{100});
  // The engine reads the word at once and writes it back a window later.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  m.status[1] = device::mc_red_add(w.ctx(1), 0, counter(1), uint64_t{10});
  m.status[0] = device::mc_red_add(w.ctx(0), 0, counter(0), uint64_t{1});
  for (int r = 0; r < 3; ++r) EXPECT_EQ(device::mc_quiet(w.ctx(r)), McStatus::kOk) << r;
  m.total = std::atomic_ref<uint64_t>(*counter(0)).load();
  return m;
}

EngineOptions Hca(uint32_t window_us) {
  EngineOptions o;
  o.atomics = AtomicsModel::kHca;
  o.hca_atomic_window_us = window_us;
  return o;
}

TEST(AtomicsAcrossRoutes, SmAtomicsInsideANicAtomicsWindowAreLost) {
  Engine engine(Hca(1'000'000));
  engine.Start();
  const MixedCounter m = AddFromEveryRoute(engine, /*loopback=*/false);
  for (McStatus s : m.status) EXPECT_EQ(s, McStatus::kOk);
  // The NIC's write-back of 0 + 100 overwrote the P2P and self adds: what
  // a ConnectX does to such a counter, and why the rule exists.
  EXPECT_EQ(m.total, 100u);
}

TEST(AtomicsAcrossRoutes, EveryAddThroughTheOwnersNicKeepsTheTotal) {
  Engine engine(Hca(1'000'000));
  engine.Start();
  const MixedCounter m = AddFromEveryRoute(engine, /*loopback=*/true);
  for (McStatus s : m.status) EXPECT_EQ(s, McStatus::kOk);
  EXPECT_EQ(m.total, 111u);
}

TEST(AtomicsAcrossRoutes, ManyThreadsOnEveryRouteLoseNothingThroughTheNic) {
  Engine engine(Hca(0));
  engine.Start();
  WorldOptions o;
  o.ranks = 3;
  o.p2p_ranks = {0, 1};
  o.loopback = true;
  o.sq_wqe_cnt = 16;
  World w(engine, o);
  constexpr int kAdds = 400;
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    for (int t = 0; t < 2; ++t) {
      threads.emplace_back([&w, r] {
        const CommCtx c = w.ctx(r);
        uint32_t* counter = At<uint32_t>(w.buf(r), kCounter32Off);
        const device::McPeer owner = device::mc_peer(c, 0);
        EXPECT_EQ(owner.nic_atomics, r != 2) << "self and P2P peers: atomics via the NIC";
        for (int i = 0; i < kAdds; ++i) {
          ASSERT_EQ(device::mc_red_add(owner, counter, uint32_t{1}), McStatus::kOk);
        }
      });
    }
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < 3; ++r) EXPECT_EQ(device::mc_quiet(w.ctx(r)), McStatus::kOk);
  EXPECT_EQ(std::atomic_ref<uint32_t>(*At<uint32_t>(w.buf(0), kCounter32Off)).load(),
            3u * 2u * kAdds);
}

TEST(AtomicsAcrossRoutes, DeviceModelAndNoLoopbackKeepTheOldMeaning) {
  Engine engine;  // AtomicsModel::kDevice: NIC atomics are real CPU atomics
  engine.Start();
  const MixedCounter m = AddFromEveryRoute(engine, /*loopback=*/false);
  EXPECT_EQ(m.total, 111u);
  WorldOptions o;
  o.ranks = 3;
  o.p2p_ranks = {0, 1};
  World w(engine, o);
  EXPECT_FALSE(device::mc_peer(w.ctx(1), 0).nic_atomics);
  EXPECT_FALSE(device::mc_peer(w.ctx(0), 0).nic_atomics);
}

// A fence waits for the answers of the QP's earlier atomics (a round trip
// on a NIC): softnic's "hca" model charges hca_round_trip_us for it, so the
// cost of a fenced signal after an atomic shows in benchmarks. The Device
// API sets no fence (RC ordering orders put -> signal), and pays nothing.
TEST(HcaFence, AFencedWqeWaitsForTheAtomicBeforeItAndOthersDoNot) {
  EngineOptions eo = Hca(0);
  eo.hca_round_trip_us = 200'000;
  Engine engine(eo);
  engine.Start();
  WorldOptions o;
  o.ranks = 2;
  World w(engine, o);
  const CommCtx c = w.ctx(0);
  IbgdaQpDevCtx* qp = w.qp(0, 1);
  const uint64_t counter = c.ibgda.raddrs[1] + kCounter64Off;
  const uint64_t sig = c.ibgda.raddrs[1] + kSigOff;
  const uint64_t one = 1;
  auto atomic_then_write = [&](uint8_t write_flags) {
    mlx5::Wqe64 a, b;
    mlx5::build_atomic_fa64(&a, 0, qp->qpn, mlx5::kCtrlCqUpdate, counter, c.ibgda.rkeys[1], 1,
                            reinterpret_cast<uintptr_t>(qp->fetch_scratch), qp->scratch_lkey);
    mlx5::build_rdma_write_inline(&b, 0, qp->qpn, write_flags, sig, c.ibgda.rkeys[1], &one, 8);
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(device::mc_qp_post(qp, a), McStatus::kOk);
    EXPECT_EQ(device::mc_qp_post(qp, b), McStatus::kOk);
    EXPECT_EQ(device::mc_qp_quiet(qp), McStatus::kOk);
    return std::chrono::steady_clock::now() - t0;
  };
  EXPECT_LT(atomic_then_write(mlx5::kCtrlCqUpdate), std::chrono::milliseconds(150));
  EXPECT_EQ(engine.fence_waits(), 0u);
  EXPECT_GE(atomic_then_write(mlx5::kCtrlCqUpdate | mlx5::kCtrlFence),
            std::chrono::milliseconds(195));
  EXPECT_EQ(engine.fence_waits(), 1u);
  EXPECT_EQ(*At<uint64_t>(w.buf(1), kCounter64Off), 2u);
}

// Nobody serves the rings: the post that finds the ring full gives up after
// timeout_ns, and the QP is marked stalled.
TEST(RouteStalled, PostOnAFullRingTimesOut) {
  Engine stopped;  // never started
  WorldOptions o;
  o.ranks = 2;
  o.sq_wqe_cnt = 4;
  o.timeout_ns = 50'000'000;
  World w(stopped, o);
  const CommCtx c0 = w.ctx(0);
  uint8_t* b0 = w.buf(0);
  for (int i = 0; i < 4; ++i) {
    ASSERT_EQ(device::mc_put_thread(c0, 1, b0 + kDstOff, b0 + kSrcOff, 64), McStatus::kOk);
  }
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(device::mc_put_thread(c0, 1, b0 + kDstOff, b0 + kSrcOff, 64), McStatus::kTimedOut);
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(50));
  EXPECT_EQ(w.qp(0, 1)->error, device::kQpErrStalled);
  EXPECT_EQ(device::mc_quiet(c0), McStatus::kTimedOut);
  EXPECT_EQ(NonZero(w.buf(1), kBufBytes), 0u);
}

// sink: every WQE completes, nothing moves.
TEST(RouteSink, PostsCompleteAndNothingIsWritten) {
  EngineOptions opts;
  opts.sink = true;
  Engine sink(opts);
  sink.Start();
  WorldOptions o;
  o.ranks = 2;
  o.sq_wqe_cnt = 16;
  World w(sink, o);
  uint8_t* b0 = w.buf(0);
  FillSource(b0);
  const CommCtx c0 = w.ctx(0);
  constexpr int kPosts = 1000;
  for (int i = 0; i < kPosts; ++i) {
    const uint64_t n = 1 + (i * 97) % 5000;
    ASSERT_EQ(device::mc_put_thread(c0, 1, b0 + kDstOff + i, b0 + kSrcOff, n), McStatus::kOk);
    ASSERT_EQ(device::mc_signal(c0, 1, At<uint64_t>(b0, kSigOff), uint64_t(i + 1)), McStatus::kOk);
    ASSERT_EQ(device::mc_red_add(c0, 1, At<uint32_t>(b0, kCounter32Off), 1u), McStatus::kOk);
  }
  EXPECT_EQ(device::mc_quiet(c0), McStatus::kOk);
  const IbgdaQpDevCtx* q = w.qp(0, 1);
  EXPECT_EQ(q->cons_tail, 3u * kPosts);
  EXPECT_EQ(NonZero(w.buf(1), kBufBytes + kGuardBytes), 0u);
  bool found = false;
  for (const QpInfo& info : sink.ListQps()) {
    if (info.qpn != q->qpn) continue;
    found = true;
    EXPECT_EQ(info.wqes_done, 3u * kPosts);
  }
  EXPECT_TRUE(found);
}

}  // namespace
}  // namespace mooncake::softnic
