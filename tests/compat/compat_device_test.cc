// Upstream-named device calls (<transport/device/comm_device.cuh>) on the
// host platform, each checked against the way Mooncake EP uses it, and
// every place where its meaning differs from upstream's (docs/compat.md).
// Ranks are threads of this process over plain buffers; RDMA peers are
// queue pairs in plain memory that nobody serves, so what a call posted is
// read straight from the ring.
//
// Built twice: with MOONCAKE_DEVICE_CHECKS=1 (compat_device_test: a context
// without num_ranks traps) and with nothing defined, NDEBUG included
// (compat_device_default_test: the default, as a debug build of upstream's
// code gets it: it routes by the tables and native calls return
// kIncompleteContext).
#include <gtest/gtest.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "mooncake/device/host_coop.h"
#include "mooncake/device/mlx5/prm.h"
#include "transport/device/comm_device.cuh"

namespace mooncake::device {
namespace {

constexpr int kRanks = 4;
constexpr size_t kBytes = 1 << 16;

// Every rank's buffer in one process. Ranks 0..2 reach each other by
// load/store; rank 3 is reachable only through an RDMA queue pair.
struct World {
  World() {
    for (int r = 0; r < kRanks; ++r) {
      buf[r] = static_cast<uint8_t*>(std::aligned_alloc(64, kBytes));
      std::memset(buf[r], 0, kBytes);
      ptrs[r] = buf[r];
      available[r] = r < 3 ? 1 : 0;
    }
    ptrs[3] = nullptr;
    for (int r = 0; r < kRanks; ++r) raddrs[r] = 0x100000000ull * (r + 1);
    for (int r = 0; r < kRanks; ++r) rkeys[r] = 0x50 + r;
    for (int i = 0; i < kRanks; ++i) {
      PlainQp& p = qps[i];
      IbgdaQpDevCtx& q = devctx[i];
      q.sq = p.sq.data();
      q.sq_dbrec = p.dbrec;
      q.cq = p.cq.data();
      q.cq_dbrec = p.cq_dbrec;
      q.fetch_scratch = &p.scratch;
      q.qpn = 0x100 + i;
      q.sq_wqe_cnt = kDepth;
      q.cq_cqe_cnt = kDepth;
      q.timeout_ns = 200'000'000;
      for (mlx5::Cqe64& c : p.cq) {
        std::memset(&c, 0, sizeof(c));
        reinterpret_cast<uint8_t*>(&c)[63] = static_cast<uint8_t>(mlx5::kCqeInvalid << 4) | 1u;
      }
    }
  }
  ~World() {
    for (uint8_t* b : buf) std::free(b);
  }
  // Rank r's context as EP's kernels build it (one QP per peer).
  CommCtx ctx(int r) {
    devctx_for(r);
    return make_comm_ctx(buf[r], available, ptrs, raddrs, rkeys, devctx, buf[r], buf[r], r, kRanks,
                         kRanks);
  }
  // The same, field by field as EP's elastic kernels do (num_ranks left 0).
  CommCtx fieldwise_ctx(int r) {
    devctx_for(r);
    CommCtx c{};
    c.rank = r;
    c.p2p.available = available;
    c.p2p.peer_ptrs = ptrs;
    c.p2p.local_base = buf[r];
    c.ibgda.qp_devctxs = reinterpret_cast<mlx5gda_qp_devctx*>(devctx);
    c.ibgda.raddrs = raddrs;
    c.ibgda.rkeys = rkeys;
    return c;
  }
  // Only rank 3's QP (seen from rank r) is connected: sq == null elsewhere.
  void devctx_for(int r) {
    (void)r;
    for (int i = 0; i < kRanks; ++i) devctx[i].sq = i == 3 ? qps[i].sq.data() : nullptr;
    for (int i = 0; i < kRanks; ++i) devctx[i].local_base = reinterpret_cast<uintptr_t>(buf[r]);
    for (int i = 0; i < kRanks; ++i) devctx[i].local_size = kBytes;
  }
  template <class T>
  T* at(int r, size_t off) {
    return reinterpret_cast<T*>(buf[r] + off);
  }

  static constexpr uint32_t kDepth = 64;
  struct PlainQp {
    alignas(64) std::vector<uint8_t> sq = std::vector<uint8_t>(kDepth * mlx5::kSendWqeBb);
    std::vector<mlx5::Cqe64> cq = std::vector<mlx5::Cqe64>(kDepth);
    alignas(8) uint32_t dbrec[2] = {};
    alignas(8) uint32_t cq_dbrec[2] = {};
    uint64_t scratch = 0;
  };
  uint8_t* buf[kRanks];
  void* ptrs[kRanks];
  int32_t available[kRanks];
  uint64_t raddrs[kRanks];
  uint32_t rkeys[kRanks];
  PlainQp qps[kRanks];
  IbgdaQpDevCtx devctx[kRanks];
};

// What WQE number `i` of rank 3's queue pair is.
struct Posted {
  uint8_t opcode;
  uint8_t opmod;
  uint64_t raddr;
  uint32_t rkey;
};
Posted PostedAt(World& w, int i) {
  const uint8_t* s = w.qps[3].sq.data() + i * mlx5::kSendWqeBb;
  Posted p;
  p.opmod = s[0];
  p.opcode = s[3];
  uint64_t raddr;
  uint32_t rkey;
  std::memcpy(&raddr, s + 16, 8);
  std::memcpy(&rkey, s + 24, 4);
  p.raddr = mlx5::be64(raddr);
  p.rkey = mlx5::be32(rkey);
  return p;
}
uint32_t Doorbell(World& w) { return mlx5::be32(w.qps[3].dbrec[mlx5::kSndDbr]); }

TEST(CompatContext, MakeCommCtxFillsWhatTheProjectNeeds) {
  World w;
  const CommCtx c = w.ctx(1);
  EXPECT_EQ(c.rank, 1);
  EXPECT_EQ(c.num_ranks, kRanks);  // upstream ignored it; here it bounds every rank
  EXPECT_EQ(c.ibgda.qps_per_rank, 1);
  EXPECT_EQ(c.p2p.local_base, w.buf[1]);
  EXPECT_EQ(c.ibgda.rkeys, w.rkeys);
  const CommCtx several = make_comm_ctx(w.buf[0], w.available, w.ptrs, nullptr, nullptr, nullptr,
                                        nullptr, nullptr, 0, kRanks, 8 * kRanks);
  EXPECT_EQ(several.ibgda.qps_per_rank, 8);
  EXPECT_EQ(several.ibgda.qp_devctxs, nullptr);
}

// Upstream's field order (issue 25): code that fills the contexts by
// position, as upstream's does, fills the same fields here. Ours come after
// upstream's.
static_assert(offsetof(IbgdaContext, qp_devctxs) == 0);
static_assert(offsetof(IbgdaContext, raddrs) == sizeof(void*));
static_assert(offsetof(IbgdaContext, rkeys) == 2 * sizeof(void*));
static_assert(offsetof(IbgdaContext, local_atomic_base) == 3 * sizeof(void*));
static_assert(offsetof(IbgdaContext, remote_atomic_base) == 4 * sizeof(void*));
static_assert(offsetof(IbgdaContext, qps_per_rank) == 5 * sizeof(void*));
static_assert(offsetof(CommCtx, p2p) == 0);
static_assert(offsetof(CommCtx, ibgda) == sizeof(P2PContext));
static_assert(offsetof(CommCtx, rank) == sizeof(P2PContext) + sizeof(IbgdaContext));
static_assert(offsetof(P2PContext, available) == 0);
static_assert(offsetof(P2PContext, peer_ptrs) == sizeof(void*));
static_assert(offsetof(P2PContext, local_base) == 2 * sizeof(void*));
// MAX_QP_COUNT reaches EP through comm_device.cuh (upstream's mlx5gda.h).
static_assert(MAX_QP_COUNT == 256);
static_assert(std::is_same_v<mlx5gda_qp_devctx, IbgdaQpDevCtx>);

TEST(CompatContexts, PositionalInitialisationFillsUpstreamsFields) {
  World w;
  const int32_t scratch = 0, signals = 0;
  // Upstream's five fields, by position, as upstream code writes them.
  const IbgdaContext ib{w.devctx, w.raddrs, w.rkeys, &scratch, &signals};
  EXPECT_EQ(ib.qp_devctxs, w.devctx);
  EXPECT_EQ(ib.raddrs, w.raddrs);
  EXPECT_EQ(ib.rkeys, w.rkeys);
  EXPECT_EQ(ib.local_atomic_base, &scratch);
  EXPECT_EQ(ib.remote_atomic_base, &signals);
  EXPECT_EQ(ib.qps_per_rank, 0);
  const CommCtx c{P2PContext{w.available, w.ptrs, w.buf[1]}, ib, 1};
  EXPECT_EQ(c.p2p.local_base, w.buf[1]);
  EXPECT_EQ(c.ibgda.remote_atomic_base, &signals);
  EXPECT_EQ(c.rank, 1);
  EXPECT_EQ(c.num_ranks, 0);
}

// Upstream's exact shape (issue 25): void* in, void* out, so EP's
// static_cast of the result to a counter of another type compiles.
static_assert(
    std::is_same_v<decltype(mc_route_put(std::declval<const CommCtx&>(), 0, std::declval<void*>())),
                   void*>);
static_assert(std::is_same_v<decltype(&mc_route_put), void* (*)(const CommCtx&, int, void*)>);

// EP's mark_phase_ack_kernel: self -> own slot, P2P -> routed pointer,
// nullptr -> "use RDMA".
TEST(CompatRouting, RoutePutAsUpstream) {
  World w;
  const CommCtx c = w.ctx(0);
  int* ack = w.at<int>(0, 256);
  EXPECT_EQ(mc_route_put(c, 0, ack), ack);
  // As EP writes it: a 64-bit slot's route taken as a 32-bit counter.
  EXPECT_EQ(static_cast<uint32_t*>(mc_route_put(c, 2, w.at<uint64_t>(0, 256))),
            reinterpret_cast<uint32_t*>(w.buf[2] + 256));
  EXPECT_EQ(mc_route_put(c, 2, static_cast<void*>(ack)), w.buf[2] + 256);
  EXPECT_EQ(mc_route_put(c, 3, ack), nullptr);
  EXPECT_TRUE(mc_comm_p2p_available(c, 1));
  EXPECT_FALSE(mc_comm_p2p_available(c, 3));
  EXPECT_EQ(mc_comm_peer_ptr(c, 1, ack), w.buf[1] + 256);
  EXPECT_TRUE(mc_p2p_available(c.p2p, 2));
  EXPECT_FALSE(mc_p2p_available(c.p2p, 3));
  EXPECT_EQ(mc_p2p_peer_ptr(c.p2p, 1, ack), w.buf[1] + 256);
  // Out of the group: no pointer (upstream read past its tables).
  EXPECT_EQ(mc_route_put(c, kRanks, ack), nullptr);
}

// EP dispatch's count signal: each sender red_adds -(n+1) into its own
// zeroed slot at the receiver. A store (upstream) and an add (here) both
// leave -(n+1) there.
TEST(CompatMeaning, RedAddOnAZeroedSlotLeavesTheValue) {
  World w;
  const CommCtx c = w.ctx(1);
  int* slot = w.at<int>(1, 512 + 4 * 1);
  mc_red_add(c, 2, 0, 1, slot, -7 - 1);
  EXPECT_EQ(*w.at<int>(2, 512 + 4 * 1), -8);
  mc_red_add(c, 1, 0, 1, slot, -3 - 1);  // self
  EXPECT_EQ(*slot, -4);
}

// Where upstream's P2P store loses updates: many senders adding to one
// counter at one peer. Every contribution arrives here.
TEST(CompatMeaning, RedAddIsAnAddSoConcurrentSendersLoseNothing) {
  World w;
  constexpr int kPerSender = 20000;
  std::vector<std::thread> senders;
  for (int s = 0; s < 3; ++s) {
    senders.emplace_back([&, s] {
      const CommCtx c = w.ctx(s);
      int* counter = w.at<int>(s, 1024);
      for (int i = 0; i < kPerSender; ++i) mc_red_add(c, 2, 0, 1, counter, 1);
    });
  }
  for (std::thread& t : senders) t.join();
  EXPECT_EQ(*w.at<int>(2, 1024), 3 * kPerSender);
}

// EP combine's finishing flag: mc_signal(..., 1) on a zeroed flag, then
// the receiver acquires it and reads the data put before it. Over P2P it
// stays a release store (upstream's meaning): a second signal of 1 leaves 1.
TEST(CompatMeaning, SignalOverP2pIsAReleaseStoreThatPublishesEarlierPuts) {
  World w;
  constexpr int kRounds = 2000;
  int* ack = w.at<int>(0, 3072);
  std::thread receiver([&] {
    const CommCtx rc = w.ctx(2);
    int* flag = w.at<int>(2, 2048);
    for (int round = 1; round <= kRounds; ++round) {
      while (mc_ld_acquire(flag) != round) {
      }
      // The payload written before the signal is visible now.
      EXPECT_EQ(*w.at<int>(2, 4096), round * 3);
      mc_signal(rc, 0, 0, 1, w.at<int>(2, 3072), round);
    }
  });
  const CommCtx c = w.ctx(0);
  for (int round = 1; round <= kRounds; ++round) {
    *static_cast<int*>(mc_route_put(c, 2, w.at<int>(0, 4096))) = round * 3;
    mc_signal(c, 2, 0, 1, w.at<int>(0, 2048), round);
    while (mc_ld_acquire(ack) != round) {
    }
  }
  receiver.join();
  mc_signal(c, 2, 0, 1, w.at<int>(0, 2048), 1);
  mc_signal(c, 2, 0, 1, w.at<int>(0, 2048), 1);
  EXPECT_EQ(*w.at<int>(2, 2048), 1);  // a store, not an add
  mc_signal(c, 0, 0, 1, w.at<int>(0, 2048), 5);
  EXPECT_EQ(*w.at<int>(0, 2048), 5);
}

// Over RDMA: mc_rdma_put posts a WRITE to raddrs[dst] + offset with the
// peer's rkey (lane 0 only); mc_signal and mc_red_add post a 32-bit masked
// fetch-add (upstream's RDMA meaning of both).
TEST(CompatRdma, PutSignalAndRedAddPostWhatUpstreamPosts) {
  World w;
  const CommCtx c = w.ctx(0);
  void* recv = w.at<void>(0, 8192);
  const void* send = w.at<void>(0, 16384);
  for (int lane = 31; lane >= 0; --lane) mc_rdma_put(c, 0, 3, 1, send, recv, 4096, lane);
  ASSERT_EQ(Doorbell(w), 1u) << "one WQE for the warp";
  Posted p = PostedAt(w, 0);
  EXPECT_EQ(p.opcode, mlx5::kOpRdmaWrite);
  EXPECT_EQ(p.raddr, w.raddrs[3] + 8192);
  EXPECT_EQ(p.rkey, w.rkeys[3]);

  mc_signal(c, 3, 0, 1, w.at<int>(0, 64), 1);
  p = PostedAt(w, 1);
  EXPECT_EQ(p.opcode, mlx5::kOpAtomicMaskedFa);
  EXPECT_EQ(p.raddr, w.raddrs[3] + 64);
  mc_red_add(c, 3, 0, 1, w.at<int>(0, 68), -5);
  p = PostedAt(w, 2);
  EXPECT_EQ(p.opcode, mlx5::kOpAtomicMaskedFa);
  EXPECT_EQ(p.raddr, w.raddrs[3] + 68);
  EXPECT_EQ(Doorbell(w), 3u);

  // The lower-level upstream calls take the remote address whole.
  EXPECT_EQ(mc_ibgda_put(c.ibgda, 0, 3, 0, 1, send, 0xabc000, 64), McStatus::kOk);
  EXPECT_EQ(PostedAt(w, 3).raddr, 0xabc000u);
  mc_ibgda_red_add(c.ibgda, 0, 3, 0, 1, 0, 0xabd000, 1);
  EXPECT_EQ(PostedAt(w, 4).opcode, mlx5::kOpAtomicMaskedFa);
  EXPECT_EQ(mc_ibgda_channel(c.ibgda, 5, 1, 2), &w.devctx[1 * 2 + 1]);

  // A source outside the registered buffer, too long to go inline: nothing
  // is posted, and the calls say so instead of dropping the data unseen.
  static char elsewhere[64];
  EXPECT_EQ(mc_ibgda_put(c.ibgda, 0, 3, 0, 1, elsewhere, 0xabc000, sizeof(elsewhere)),
            McStatus::kNotRegistered);
  EXPECT_EQ(mc_rdma_put(c, 0, 3, 1, elsewhere, recv, sizeof(elsewhere), 0),
            McStatus::kNotRegistered);
  EXPECT_EQ(mc_rdma_put(c, 0, 3, 1, elsewhere, recv, sizeof(elsewhere), 1), McStatus::kOk);
  EXPECT_EQ(Doorbell(w), 5u) << "nothing more posted";
  // At most 28 bytes travel inline from anywhere.
  EXPECT_EQ(mc_ibgda_put(c.ibgda, 0, 3, 0, 1, elsewhere, 0xabc000, 28), McStatus::kOk);
  EXPECT_EQ(Doorbell(w), 6u);
}

// fm_ce_se (byte 11 of the ctrl segment) of every operation that posts,
// native and upstream-named: each asks for a CQE and none sets a fence. A
// fence would make a signal or atomic wait a network round trip behind any
// atomic before it; put -> signal order comes from RC ordering instead
// (comm_device.h, issue 24 item 3).
TEST(CompatRdma, EveryPostedWqeAsksForACqeAndNoneIsFenced) {
  World w;
  const CommCtx c = w.ctx(0);
  void* recv = w.at<void>(0, 8192);
  const void* send = w.at<void>(0, 16384);
  struct Op {
    const char* name;
    std::function<void()> post;
  };
  const std::vector<Op> ops = {
      {"mc_put_thread (WRITE)", [&] { (void)mc_put_thread(c, 3, recv, send, 4096); }},
      {"mc_put_thread (inline)", [&] { (void)mc_put_thread(c, 3, recv, send, 16); }},
      {"mc_signal 8 B", [&] { (void)mc_signal(c, 3, w.at<uint64_t>(0, 64), uint64_t{1}); }},
      {"mc_signal_relaxed 4 B",
       [&] { (void)mc_signal_relaxed(c, 3, w.at<uint32_t>(0, 72), uint32_t{1}); }},
      {"mc_red_add 8 B", [&] { (void)mc_red_add(c, 3, w.at<uint64_t>(0, 80), uint64_t{2}); }},
      {"mc_red_add 4 B", [&] { (void)mc_red_add(c, 3, w.at<int32_t>(0, 88), int32_t{2}); }},
      {"mc_put_signal_ll", [&] { (void)mc_put_signal_ll(c, 3, w.at<McLLSlot>(0, 128), 7, 1); }},
      {"upstream mc_rdma_put", [&] { (void)mc_rdma_put(c, 0, 3, 1, send, recv, 4096, 0); }},
      {"upstream mc_signal", [&] { mc_signal(c, 3, 0, 1, w.at<int>(0, 96), 1); }},
      {"upstream mc_red_add", [&] { mc_red_add(c, 3, 0, 1, w.at<int>(0, 100), 1); }},
      {"upstream mc_ibgda_put",
       [&] { (void)mc_ibgda_put(c.ibgda, 0, 3, 0, 1, send, 0xabc000, 64); }},
      {"upstream mc_ibgda_red_add", [&] { mc_ibgda_red_add(c.ibgda, 0, 3, 0, 1, 0, 0xabd000, 1); }},
  };
  for (size_t i = 0; i < ops.size(); ++i) {
    ops[i].post();
    ASSERT_EQ(Doorbell(w), i + 1) << ops[i].name << " posted one WQE";
    const uint8_t fm_ce_se = w.qps[3].sq[i * mlx5::kSendWqeBb + 11];
    EXPECT_EQ(fm_ce_se, mlx5::kCtrlCqUpdate) << ops[i].name;
    EXPECT_EQ(fm_ce_se & mlx5::kCtrlFence, 0) << ops[i].name << " is fenced";
  }
}

// NIC atomics (docs/rdma.md "Atomics across routes") are on only where the
// own rank's queue pair is a marked loopback: upstream's createQueuePairs
// also makes a queue pair toward the own rank, never connected, and such a
// context keeps SM atomics toward P2P peers.
TEST(CompatRdma, RedAddTakesTheNicOnlyWithAMarkedLoopback) {
  World w;
  CommCtx c = w.ctx(0);
  w.devctx[0].sq = w.qps[0].sq.data();  // a queue pair toward rank 0 itself
  w.devctx[1].sq = w.qps[1].sq.data();  // and toward P2P peer 1
  mc_red_add(c, 1, 0, 1, w.at<int>(0, 200), 5);
  EXPECT_EQ(*w.at<int>(1, 200), 5) << "an SM atomic: the self queue pair is no loopback";
  EXPECT_EQ(mlx5::be32(w.qps[1].dbrec[mlx5::kSndDbr]), 0u);
  EXPECT_FALSE(mc_peer(c, 1).nic_atomics);

  w.devctx[0].loopback = 1;
  mc_red_add(c, 1, 0, 1, w.at<int>(0, 200), 5);
  EXPECT_EQ(*w.at<int>(1, 200), 5) << "posted, not executed (nobody serves these rings)";
  ASSERT_EQ(mlx5::be32(w.qps[1].dbrec[mlx5::kSndDbr]), 1u) << "through the queue pair to rank 1";
  EXPECT_EQ(w.qps[1].sq[3], mlx5::kOpAtomicMaskedFa);
  const McPeer p = mc_peer(c, 1);
  EXPECT_TRUE(p.nic_atomics);
  EXPECT_EQ(p.atomic_qp, &w.devctx[1]);
  EXPECT_EQ(mc_red_add(p, w.at<uint64_t>(0, 208), uint64_t{1}), McStatus::kOk);
  EXPECT_EQ(mlx5::be32(w.qps[1].dbrec[mlx5::kSndDbr]), 2u);
  // The own word too, through the loopback.
  EXPECT_EQ(mc_red_add(mc_peer(c, 0), w.at<uint64_t>(0, 216), uint64_t{1}), McStatus::kOk);
  EXPECT_EQ(mlx5::be32(w.qps[0].dbrec[mlx5::kSndDbr]), 1u);
  EXPECT_EQ(*w.at<uint64_t>(0, 216), 0u);
  w.devctx[0].loopback = 0;
}

// Upstream would write through a null queue pair; with no status to return,
// the call stops the kernel with a message instead of dropping the data.
TEST(CompatRdmaDeathTest, PostWithoutAQueuePairTraps) {
  World w;
  CommCtx c = w.ctx(0);
  c.ibgda.qp_devctxs = nullptr;
  EXPECT_DEATH(mc_rdma_put(c, 0, 3, 1, w.buf[0], w.buf[0], 64, 0), "no RDMA queue pair to rank 3");
  EXPECT_DEATH(mc_signal(c, 3, 0, 1, w.at<int>(0, 64), 1), "mc_signal: no RDMA queue pair");
  EXPECT_DEATH(mc_rdma_put(c, 0, kRanks, 1, w.buf[0], w.buf[0], 64, 0), "no RDMA queue pair");
}

// A context built field by field never routes every peer to RDMA.
#if MOONCAKE_DEVICE_CHECKS
TEST(CompatFieldwiseDeathTest, DebugBuildsTrapOnTheFirstRoutingCall) {
  World w;
  const CommCtx c = w.fieldwise_ctx(0);
  EXPECT_EQ(mc_route_put(c, 0, w.buf[0]), w.buf[0]);  // self needs no bound
  EXPECT_DEATH(mc_route_put(c, 1, w.buf[0]), "CommCtx.num_ranks is 0 .*make_comm_ctx");
  EXPECT_DEATH(mc_comm_p2p_available(c, 2), "CommCtx.num_ranks is 0");
  EXPECT_DEATH(mc_rdma_put(c, 0, 3, 1, w.buf[0], w.buf[0], 64, 0), "CommCtx.num_ranks is 0");
  EXPECT_DEATH((void)mc_peer(c, 1), "CommCtx.num_ranks is 0");
  EXPECT_DEATH((void)mc_quiet(c), "CommCtx.num_ranks is 0");
}
#else
TEST(CompatFieldwise, ReleaseBuildsRouteByTheTablesAndNativeCallsReturnAStatus) {
  World w;
  const CommCtx c = w.fieldwise_ctx(0);
  int* flag = w.at<int>(0, 128);
  EXPECT_EQ(mc_route_put(c, 1, flag), w.at<int>(1, 128));  // P2P, not "use RDMA"
  EXPECT_EQ(mc_route_put(c, 3, flag), nullptr);            // really RDMA
  EXPECT_TRUE(mc_comm_p2p_available(c, 2));
  mc_red_add(c, 2, 0, 1, flag, 9);
  EXPECT_EQ(*w.at<int>(2, 128), 9);
  mc_rdma_put(c, 0, 3, 1, w.buf[0], flag, 64, 0);  // the caller's qps_per_rank
  EXPECT_EQ(Doorbell(w), 1u);
  EXPECT_EQ(PostedAt(w, 0).raddr, w.raddrs[3] + 128);
  EXPECT_EQ(mc_peer(c, 1).status, McStatus::kIncompleteContext);
  EXPECT_EQ(mc_put_thread(c, 1, flag, flag, 4), McStatus::kIncompleteContext);
  EXPECT_EQ(mc_quiet(c), McStatus::kIncompleteContext);
}
#endif

// The platform ops EP's kernels use, with upstream's argument types.
TEST(CompatOps, UpstreamSignaturesAndMeanings) {
  alignas(64) int words[4] = {0, 0, 0, 0};
  const int* cw = words;
  mc_st_release(cw, 7);  // upstream passes const int*
  EXPECT_EQ(mc_ld_acquire(cw), 7);
  EXPECT_EQ(mc_atomic_add_release(cw, 5), 7);  // returns the old value
  EXPECT_EQ(words[0], 12);
  int* w = words;
  mc_st_release(w + 1, 3);
  EXPECT_EQ(mc_atomic_add_release(w + 1, -1), 3);
  alignas(8) uint64_t u64 = 0;
  mc_st_release_u64(&u64, 1ull << 40);
  EXPECT_EQ(mc_ld_acquire_u64(&u64), 1ull << 40);
  EXPECT_EQ(mc_ld_volatile_u64(&u64), 1ull << 40);
  alignas(4) uint32_t u32 = 0;
  mc_st_release_u32(&u32, 9u);
  EXPECT_EQ(u32, 9u);
  const float f = 2.5f;
  const int64_t s64 = -3;
  EXPECT_EQ(mc_ld_nc_f32(&f), 2.5f);
  EXPECT_EQ(mc_ld_nc_s32(cw), 12);
  EXPECT_EQ(mc_ld_nc_s64(&s64), -3);
  EXPECT_EQ(mc_bswap32(0x11223344u), 0x44332211u);
  EXPECT_EQ(mc_bswap16(0x1122), 0x2211);
  EXPECT_EQ(mc_bswap64(0x1122334455667788ull), 0x8877665544332211ull);
}

// UNROLLED_WARP_COPY's shape (int4 through mc_ld_nc / mc_st_na) and the
// barriers EP's kernels take, run by a block of host threads.
TEST(CompatOps, WarpCopyAndBarriersInABlock) {
  World w;
  constexpr unsigned kThreads = 64;
  constexpr int kInt4 = 256;
  int4* src = w.at<int4>(0, 0);
  for (int i = 0; i < kInt4; ++i) src[i] = int4{i, -i, 2 * i, 7};
  const CommCtx c = w.ctx(0);
  std::atomic<int> after_barrier{0};
  host::runBlock(kThreads, [&](unsigned t) {
    mc_bar_init();
    const unsigned lane = mc_lane_id();
    const unsigned warp = t / 32;
    auto* dst = static_cast<int4*>(mc_route_put(c, 1 + static_cast<int>(warp), src));
    mc_fence();
    for (int i = static_cast<int>(lane); i < kInt4; i += 32) mc_st_na(dst + i, mc_ld_nc(src + i));
    mc_fence();
    mc_bar_sync(1, static_cast<int>(kThreads));
    mc_fence_barrier_fence();
    mc_grid_sync();
    after_barrier.fetch_add(1);
  });
  EXPECT_EQ(after_barrier.load(), static_cast<int>(kThreads));
  for (int peer = 1; peer <= 2; ++peer) {
    const int4* got = w.at<int4>(peer, 0);
    for (int i = 0; i < kInt4; ++i) {
      ASSERT_EQ(got[i].x, i);
      ASSERT_EQ(got[i].y, -i);
      ASSERT_EQ(got[i].z, 2 * i);
      ASSERT_EQ(got[i].w, 7);
    }
  }
}

TEST(CompatOpsDeathTest, SubBlockNamedBarrierIsRefusedOnTheHost) {
  EXPECT_DEATH(host::runBlock(64, [](unsigned) { mc_bar_sync(2, 32); }),
               "block-wide barriers only");
}

}  // namespace
}  // namespace mooncake::device
