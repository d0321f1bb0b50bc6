// Host-platform P2pTransport: memfd buffers shared through a HandleExchange,
// mapped by every other rank at its own address, then driven with the Device
// API exactly as kernels would (puts, signals, red_add, LL), every byte
// checked. Ranks are transport objects in threads of one process, and in a
// second test two fork()ed processes that pass the memfds with SCM_RIGHTS.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <barrier>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "fake_handle_exchange.h"
#include "mooncake/device/comm_device.h"
#include "mooncake/device/device_transport.h"
#include "mooncake/device/host_coop.h"

namespace mooncake::device {
namespace {

using testing::InProcessHandleExchange;
using testing::SocketHandleExchange;

constexpr uint64_t kWaitNs = 20'000'000'000ull;  // generous: CI has 2 shared cores

unsigned char PatternByte(int src, int dst, int round, size_t i) {
  uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t(src) << 40) ^ (uint64_t(dst) << 32) ^
               (uint64_t(round) << 20);
  return static_cast<unsigned char>((x >> 29) ^ (x >> 47) ^ i);
}

// Symmetric layout used by the data tests: rank s writes its chunk for rank d
// at chunk s of d's buffer, then signals slot s.
struct Layout {
  int n;
  size_t chunk;
  // Rounded up so the signal words and LL slots after the data stay aligned.
  size_t data_bytes() const { return (chunk * n + 63) / 64 * 64; }
  size_t sig_offset(int s) const { return data_bytes() + 64 * s; }
  size_t counter_offset() const { return data_bytes() + 64 * n; }
  size_t bytes() const { return counter_offset() + 64; }
};

struct RankState {
  std::unique_ptr<BrokeredP2pTransport> t;
  void* buf = nullptr;
  std::vector<int32_t> handle;
};

std::vector<RankState> BringUp(int n, size_t bytes, std::shared_ptr<HandleExchange> ex,
                               const std::vector<int>& mask = {}) {
  std::vector<RankState> ranks(n);
  std::vector<std::vector<int32_t>> handles(n);
  for (int r = 0; r < n; ++r) {
    auto t = createHostP2pTransport(n, ex);
    EXPECT_TRUE(t.ok()) << t.status();
    ranks[r].t = *std::move(t);
    ranks[r].buf = ranks[r].t->allocateBuffer(bytes);
    EXPECT_NE(ranks[r].buf, nullptr) << ranks[r].t->lastError();
    ranks[r].handle = ranks[r].t->exportIpcHandle(ranks[r].buf);
    EXPECT_EQ(ranks[r].handle.size(), 32u) << ranks[r].t->lastError();
    handles[r] = ranks[r].handle;
  }
  for (int r = 0; r < n; ++r) {
    ranks[r].t->importPeerHandles(ranks[r].buf, r, n, handles, mask);
    EXPECT_TRUE(ranks[r].t->lastError().ok()) << ranks[r].t->lastError();
  }
  return ranks;
}

CommCtx ContextOf(RankState& rs, int rank, int n) {
  CommCtx c;
  c.p2p = rs.t->p2pContext();
  c.rank = rank;
  c.num_ranks = n;
  return c;
}

enum class Form { kThread, kWarp, kBlock };
struct AllToAllCase {
  int ranks;
  Form form;
  size_t chunk;
};

class HostP2pAllToAll : public ::testing::TestWithParam<AllToAllCase> {};

// Every rank puts a distinct chunk into every rank (itself included) and
// signals it; every rank waits for all signals and checks every byte. Three
// rounds reuse the same memory.
TEST_P(HostP2pAllToAll, PutSignalWaitEveryByte) {
  const AllToAllCase tc = GetParam();
  const int n = tc.ranks;
  const Layout L{n, tc.chunk};
  auto ex = std::make_shared<InProcessHandleExchange>();
  auto ranks = BringUp(n, L.bytes(), ex);
  ASSERT_FALSE(::testing::Test::HasFailure());
  EXPECT_EQ(ex->export_calls.load(), n);
  EXPECT_EQ(ex->import_calls.load(), n * (n - 1));

  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(ranks[r].t->verifyPeerAccess()) << ranks[r].t->lastError();
    ASSERT_TRUE(ranks[r].t->allPeersAccessible());
    void** ptrs = ranks[r].t->peerPtrsTablePtr();
    const int32_t* avail = ranks[r].t->availableTablePtr();
    for (int d = 0; d < n; ++d) {
      EXPECT_EQ(avail[d], 1);
      // Peers are real second mappings of the memfd, not the owner's pointer.
      if (d == r) {
        EXPECT_EQ(ptrs[d], ranks[r].buf);
      } else {
        EXPECT_NE(ptrs[d], ranks[d].buf);
      }
    }
  }

  constexpr int kRounds = 3;
  std::barrier<> round_barrier(n);
  std::atomic<int> bad_bytes{0}, bad_status{0}, timeouts{0};
  std::vector<unsigned char> src_store(static_cast<size_t>(n) * n * tc.chunk);

  auto rank_main = [&](int r) {
    CommCtx ctx = ContextOf(ranks[r], r, n);
    auto* base = static_cast<unsigned char*>(ranks[r].buf);
    for (int round = 1; round <= kRounds; ++round) {
      for (int dd = 0; dd < n; ++dd) {
        const int d = (r + dd) % n;  // stagger destinations
        unsigned char* src = src_store.data() + (static_cast<size_t>(r) * n + d) * tc.chunk;
        for (size_t i = 0; i < tc.chunk; ++i) src[i] = PatternByte(r, d, round, i);
        void* dst_sym = base + static_cast<size_t>(r) * tc.chunk;
        auto* sig_sym = reinterpret_cast<uint32_t*>(base + L.sig_offset(r));
        McStatus st = McStatus::kOk;
        switch (tc.form) {
          case Form::kThread: st = mc_put_thread(ctx, d, dst_sym, src, tc.chunk); break;
          case Form::kWarp:
            host::runWarp(8, [&](unsigned lane) {
              if (mc_put_warp(ctx, d, dst_sym, src, tc.chunk, lane) != McStatus::kOk) bad_status++;
            });
            break;
          case Form::kBlock:
            host::runBlock(36, [&](unsigned) {
              if (mc_put_block(ctx, d, dst_sym, src, tc.chunk) != McStatus::kOk) bad_status++;
            });
            break;
        }
        if (st != McStatus::kOk) bad_status++;
        if (mc_signal(ctx, d, sig_sym, static_cast<uint32_t>(round)) != McStatus::kOk) bad_status++;
      }
      for (int s = 0; s < n; ++s) {
        const auto* sig = reinterpret_cast<const uint32_t*>(base + L.sig_offset(s));
        if (!mc_wait_until_for(sig, McCmp::kGe, static_cast<uint32_t>(round), kWaitNs,
                               static_cast<uint32_t*>(nullptr))) {
          timeouts++;
          continue;
        }
        const unsigned char* got = base + static_cast<size_t>(s) * tc.chunk;
        for (size_t i = 0; i < tc.chunk; ++i) {
          if (got[i] != PatternByte(s, r, round, i)) bad_bytes++;
        }
      }
      // Nobody overwrites a chunk before its receiver has checked it.
      round_barrier.arrive_and_wait();
    }
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(rank_main, r);
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad_status.load(), 0);
  EXPECT_EQ(timeouts.load(), 0);
  EXPECT_EQ(bad_bytes.load(), 0);
}

INSTANTIATE_TEST_SUITE_P(Ranks, HostP2pAllToAll,
                         ::testing::Values(AllToAllCase{2, Form::kThread, 4099},
                                           AllToAllCase{4, Form::kThread, 65536 + 3},
                                           AllToAllCase{2, Form::kWarp, 12345},
                                           AllToAllCase{4, Form::kWarp, 4097},
                                           AllToAllCase{4, Form::kBlock, 100003}),
                         [](const ::testing::TestParamInfo<AllToAllCase>& info) {
                           const char* form = info.param.form == Form::kThread ? "thread"
                                              : info.param.form == Form::kWarp ? "warp"
                                                                               : "block";
                           return absl::StrCat(info.param.ranks, "ranks_", form, "_",
                                               info.param.chunk);
                         });

// red_add from every rank's threads into rank 0's counter over the shared
// mappings: atomic across mappings, nothing lost.
TEST(HostP2pTransport, RedAddAcrossMappingsLosesNothing) {
  constexpr int kRanks = 4;
  constexpr int kThreadsPerRank = 2;
  constexpr int kAdds = 100000;
  auto ex = std::make_shared<InProcessHandleExchange>();
  auto ranks = BringUp(kRanks, 4096, ex);
  ASSERT_FALSE(::testing::Test::HasFailure());
  std::vector<std::thread> pool;
  for (int r = 0; r < kRanks; ++r) {
    for (int k = 0; k < kThreadsPerRank; ++k) {
      pool.emplace_back([&, r] {
        CommCtx ctx = ContextOf(ranks[r], r, kRanks);
        auto* ctr = reinterpret_cast<uint64_t*>(static_cast<char*>(ranks[r].buf) + 128);
        for (int i = 0; i < kAdds; ++i) {
          if (mc_red_add(ctx, 0, ctr, uint64_t{1}) != McStatus::kOk) ADD_FAILURE();
        }
      });
    }
  }
  for (auto& th : pool) th.join();
  const auto* ctr = reinterpret_cast<const uint64_t*>(static_cast<char*>(ranks[0].buf) + 128);
  EXPECT_EQ(mc_ld_acquire(ctr), uint64_t{kRanks} * kThreadsPerRank * kAdds);
}

TEST(HostP2pTransport, HandleIs128BytesAndKindIsMemfd) {
  auto ex = std::make_shared<InProcessHandleExchange>();
  auto t = createHostP2pTransport(2, ex);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->handleKind(), "memfd");
  void* buf = (*t)->allocateBuffer(1000);
  ASSERT_NE(buf, nullptr);
  // Zero-filled, and the caller owns every byte it asked for.
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(static_cast<unsigned char*>(buf)[i], 0);
  std::memset(buf, 0x5a, 1000);
  auto h = (*t)->exportIpcHandle(buf);
  EXPECT_EQ(h.size(), 32u);
  EXPECT_TRUE((*t)->lastError().ok());
  (*t)->freeBuffer(buf);
  EXPECT_TRUE((*t)->lastError().ok());
}

TEST(HostP2pTransport, MaskLeavesInactiveRanksOut) {
  auto ex = std::make_shared<InProcessHandleExchange>();
  auto ranks = BringUp(3, 4096, ex, {1, 0, 1});
  ASSERT_FALSE(::testing::Test::HasFailure());
  for (int r : {0, 2}) {
    ASSERT_TRUE(ranks[r].t->verifyPeerAccess()) << ranks[r].t->lastError();
    EXPECT_EQ(ranks[r].t->availableSnapshot(), (std::vector<int32_t>{1, 0, 1}));
    EXPECT_EQ(ranks[r].t->peerPtrsTablePtr()[1], nullptr);
    CommCtx ctx = ContextOf(ranks[r], r, 3);
    uint32_t x = 1;
    EXPECT_EQ(mc_put_thread(ctx, 1, ranks[r].buf, &x, 4), McStatus::kNoRoute);
  }
  EXPECT_EQ(ex->import_calls.load(), 2 + 2 * 1);  // rank 1 (inactive in its own mask) imports 0, 2
}

TEST(HostP2pTransport, ProbeDoesNotTouchCallerBytes) {
  auto ex = std::make_shared<InProcessHandleExchange>();
  constexpr size_t kBytes = 4096;  // a page exactly: the probe area lies beyond it
  auto ranks = BringUp(2, kBytes, ex);
  ASSERT_FALSE(::testing::Test::HasFailure());
  for (auto& r : ranks) std::memset(r.buf, 0xc3, kBytes);
  ASSERT_TRUE(ranks[0].t->verifyPeerAccess()) << ranks[0].t->lastError();
  ASSERT_TRUE(ranks[1].t->verifyPeerAccess()) << ranks[1].t->lastError();
  for (auto& r : ranks) {
    for (size_t i = 0; i < kBytes; ++i) ASSERT_EQ(static_cast<unsigned char*>(r.buf)[i], 0xc3) << i;
  }
}

TEST(HostP2pTransport, CorruptHandleMarksOnlyThatPeerUnavailable) {
  auto ex = std::make_shared<InProcessHandleExchange>();
  std::vector<RankState> ranks(3);
  std::vector<std::vector<int32_t>> handles(3);
  for (int r = 0; r < 3; ++r) {
    ranks[r].t = *createHostP2pTransport(3, ex);
    ranks[r].buf = ranks[r].t->allocateBuffer(4096);
    handles[r] = ranks[r].t->exportIpcHandle(ranks[r].buf);
  }
  handles[1][0] ^= 0x1;  // magic
  ranks[0].t->importPeerHandles(ranks[0].buf, 0, 3, handles, {});
  absl::Status s = ranks[0].t->lastError();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("ranks [1]"), std::string::npos) << s;
  EXPECT_NE(s.message().find("magic"), std::string::npos) << s;
  EXPECT_EQ(ranks[0].t->availableSnapshot(), (std::vector<int32_t>{1, 0, 1}));
  EXPECT_FALSE(ranks[0].t->allPeersAccessible());
  EXPECT_FALSE(ranks[0].t->verifyPeerAccess());  // rank 1 stays out; rank 2 verifies
  EXPECT_EQ(ranks[0].t->availableSnapshot(), (std::vector<int32_t>{1, 0, 1}));
}

TEST(HostP2pTransport, WrongBufferIdFailsVerification) {
  auto ex = std::make_shared<InProcessHandleExchange>();
  std::vector<RankState> ranks(2);
  std::vector<std::vector<int32_t>> handles(2);
  for (int r = 0; r < 2; ++r) {
    ranks[r].t = *createHostP2pTransport(2, ex);
    ranks[r].buf = ranks[r].t->allocateBuffer(4096);
    handles[r] = ranks[r].t->exportIpcHandle(ranks[r].buf);
  }
  handles[1][4] ^= 0x40;  // buffer id (bytes 16..23): a handle that names other memory
  ranks[0].t->importPeerHandles(ranks[0].buf, 0, 2, handles, {});
  ASSERT_TRUE(ranks[0].t->lastError().ok()) << ranks[0].t->lastError();
  EXPECT_TRUE(ranks[0].t->allPeersAccessible());
  EXPECT_FALSE(ranks[0].t->verifyPeerAccess());
  EXPECT_EQ(ranks[0].t->lastError().code(), absl::StatusCode::kDataLoss) << ranks[0].t->lastError();
  EXPECT_EQ(ranks[0].t->availableSnapshot(), (std::vector<int32_t>{1, 0}));
}

TEST(HostP2pTransport, SmallerPeerBufferIsRejected) {
  auto ex = std::make_shared<InProcessHandleExchange>();
  auto t0 = *createHostP2pTransport(2, ex);
  auto t1 = *createHostP2pTransport(2, ex);
  void* b0 = t0->allocateBuffer(1 << 20);
  void* b1 = t1->allocateBuffer(4096);
  std::vector<std::vector<int32_t>> handles{t0->exportIpcHandle(b0), t1->exportIpcHandle(b1)};
  t0->importPeerHandles(b0, 0, 2, handles, {});
  EXPECT_EQ(t0->lastError().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(t0->lastError().message().find("same size"), std::string::npos) << t0->lastError();
  EXPECT_EQ(t0->availableSnapshot(), (std::vector<int32_t>{1, 0}));
}

TEST(HostP2pTransport, ReimportReplacesTables) {
  auto ex = std::make_shared<InProcessHandleExchange>();
  auto ranks = BringUp(2, 4096, ex);
  ASSERT_FALSE(::testing::Test::HasFailure());
  void* first = ranks[0].t->peerPtrsTablePtr()[1];
  int32_t* avail_table = ranks[0].t->availableTablePtr();
  ranks[0].t->importPeerHandles(ranks[0].buf, 0, 2, {ranks[0].handle, ranks[1].handle}, {1, 0});
  EXPECT_TRUE(ranks[0].t->lastError().ok()) << ranks[0].t->lastError();
  EXPECT_EQ(ranks[0].t->availableTablePtr(), avail_table);  // table address is stable
  EXPECT_EQ(avail_table[1], 0);
  EXPECT_EQ(ranks[0].t->peerPtrsTablePtr()[1], nullptr);
  ranks[0].t->importPeerHandles(ranks[0].buf, 0, 2, {ranks[0].handle, ranks[1].handle}, {});
  EXPECT_EQ(avail_table[1], 1);
  EXPECT_NE(ranks[0].t->peerPtrsTablePtr()[1], nullptr);
  (void)first;
}

TEST(HostP2pTransport, ErrorsSayWhatFailed) {
  EXPECT_EQ(createHostP2pTransport(0, std::make_shared<InProcessHandleExchange>()).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Without an exchange only the join route works; the upstream export says why.
  {
    auto bare = *createHostP2pTransport(2, nullptr);
    void* b = bare->allocateBuffer(64);
    ASSERT_NE(b, nullptr);
    EXPECT_TRUE(bare->exportIpcHandle(b).empty());
    EXPECT_EQ(bare->lastError().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(bare->lastError().message().find("no HandleExchange"), std::string::npos)
        << bare->lastError();
    EXPECT_TRUE(bare->exportLocal(b).ok());
  }

  auto t = *createHostP2pTransport(2, std::make_shared<InProcessHandleExchange>());
  EXPECT_EQ(t->allocateBuffer(0), nullptr);
  EXPECT_EQ(t->lastError().code(), absl::StatusCode::kInvalidArgument);
  int not_ours = 0;
  t->freeBuffer(&not_ours);
  EXPECT_NE(t->lastError().message().find("not a buffer of this transport"), std::string::npos);
  EXPECT_TRUE(t->exportIpcHandle(&not_ours).empty());
  EXPECT_FALSE(t->verifyPeerAccess());
  EXPECT_EQ(t->lastError().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(t->allPeersAccessible());
  EXPECT_EQ(t->p2pContext().peer_ptrs, nullptr);

  void* b = t->allocateBuffer(64);
  ASSERT_NE(b, nullptr);
  auto h = t->exportIpcHandle(b);
  t->importPeerHandles(b, 2, 2, {h, h}, {});
  EXPECT_NE(t->lastError().message().find("rank 2 outside"), std::string::npos) << t->lastError();
  t->importPeerHandles(b, 0, 3, {h, h, h}, {});
  EXPECT_NE(t->lastError().message().find("num_ranks 3"), std::string::npos) << t->lastError();
  t->importPeerHandles(b, 0, 2, {h}, {});
  EXPECT_NE(t->lastError().message().find("1 handles for 2 ranks"), std::string::npos)
      << t->lastError();
  t->importPeerHandles(b, 0, 2, {h, {}}, {});
  EXPECT_NE(t->lastError().message().find("exportIpcHandle failed"), std::string::npos)
      << t->lastError();
}

// The join route: exportLocal hands out the handle and a duplicate of the
// memfd; mapPeers takes each peer's handle with the fds that travelled
// beside it. No HandleExchange is involved at all.
std::vector<RankState> BringUpJoinRoute(int n, size_t bytes) {
  std::vector<RankState> ranks(n);
  std::vector<ExportedBuffer> exported(n);
  for (int r = 0; r < n; ++r) {
    ranks[r].t = *createHostP2pTransport(n, nullptr);
    ranks[r].buf = ranks[r].t->allocateBuffer(bytes);
    EXPECT_NE(ranks[r].buf, nullptr) << ranks[r].t->lastError();
    absl::StatusOr<ExportedBuffer> e = ranks[r].t->exportLocal(ranks[r].buf);
    EXPECT_TRUE(e.ok()) << e.status();
    EXPECT_EQ(e->handle.size(), 32u);
    EXPECT_EQ(e->fds.size(), 1u);
    exported[r] = *std::move(e);
  }
  for (int r = 0; r < n; ++r) {
    std::vector<PeerBuffer> peers(n);
    for (int p = 0; p < n; ++p) {
      peers[p].handle = exported[p].handle;
      if (p == r) continue;
      peers[p].fds.push_back(*testing::DupFd(exported[p].fds[0].get()));
    }
    absl::Status s = ranks[r].t->mapPeers(ranks[r].buf, r, n, std::move(peers), {});
    EXPECT_TRUE(s.ok()) << s;
  }
  return ranks;
}

TEST(HostP2pTransport, JoinRouteMapsPeersWithoutAnExchange) {
  constexpr int kRanks = 3;
  auto ranks = BringUpJoinRoute(kRanks, 4096);
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_TRUE(ranks[r].t->verifyPeerAccess()) << ranks[r].t->lastError();
    // A store through rank r's mapping of rank p lands in p's own buffer.
    for (int p = 0; p < kRanks; ++p) {
      auto* dst = static_cast<unsigned char*>(ranks[r].t->peerPtrsTablePtr()[p]);
      ASSERT_NE(dst, nullptr);
      dst[r] = static_cast<unsigned char>(0x40 + r);
    }
  }
  for (int p = 0; p < kRanks; ++p) {
    for (int r = 0; r < kRanks; ++r) {
      EXPECT_EQ(static_cast<unsigned char*>(ranks[p].buf)[r], 0x40 + r);
    }
  }
}

TEST(HostP2pTransport, JoinRouteHandleIsRefusedByTheUpstreamImport) {
  auto t = *createHostP2pTransport(2, std::make_shared<InProcessHandleExchange>());
  void* b = t->allocateBuffer(64);
  auto e = t->exportLocal(b);
  ASSERT_TRUE(e.ok()) << e.status();
  t->importPeerHandles(b, 0, 2, {e->handle, e->handle}, {});
  EXPECT_NE(t->lastError().message().find("names no export"), std::string::npos) << t->lastError();
}

TEST(HostP2pTransport, MapPeersFailuresAreReportedAndOthersStayMapped) {
  auto ranks = BringUpJoinRoute(3, 4096);
  auto e1 = ranks[1].t->exportLocal(ranks[1].buf);
  auto e2 = ranks[2].t->exportLocal(ranks[2].buf);
  std::vector<PeerBuffer> peers(3);
  peers[0].handle = ranks[0].t->exportLocal(ranks[0].buf)->handle;
  peers[1].handle = e1->handle;  // no fd arrived for rank 1
  peers[2].handle = e2->handle;
  peers[2].fds = std::move(e2->fds);
  absl::Status s = ranks[0].t->mapPeers(ranks[0].buf, 0, 3, std::move(peers), {});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("ranks [1] unavailable"), std::string::npos) << s;
  EXPECT_NE(s.message().find("0 fds arrived"), std::string::npos) << s;
  EXPECT_EQ(ranks[0].t->availableTablePtr()[1], 0);
  EXPECT_EQ(ranks[0].t->availableTablePtr()[2], 1);
  EXPECT_FALSE(ranks[0].t->allPeersAccessible());
}

// A handle from another node (its node key differs) is recognised from the
// handle alone: that rank is left to the RDMA route, no fd is asked for, and
// no failure is reported.
TEST(HostP2pTransport, OffNodeHandleIsRecognisedWithoutAnyCall) {
  class NodeExchange final : public HandleExchange {
   public:
    explicit NodeExchange(std::string node) : node_(std::move(node)) {}
    absl::StatusOr<std::string> exportFds(const std::vector<int>&, std::string_view,
                                          uint64_t) override {
      return std::string("x");
    }
    absl::StatusOr<std::vector<UniqueFd>> importFds(std::string_view) override {
      ++imports;
      return absl::InternalError("must not be called for an off-node rank");
    }
    std::string nodeId() const override { return node_; }
    int imports = 0;

   private:
    std::string node_;
  };
  auto a = std::make_shared<NodeExchange>("node-a");
  auto b = std::make_shared<NodeExchange>("node-b");
  auto ta = *createHostP2pTransport(2, a);
  auto tb = *createHostP2pTransport(2, b);
  void* ba = ta->allocateBuffer(64);
  void* bb = tb->allocateBuffer(64);
  std::vector<int32_t> ha = ta->exportIpcHandle(ba);
  std::vector<int32_t> hb = tb->exportIpcHandle(bb);
  ASSERT_EQ(ha.size(), 32u) << ta->lastError();
  ASSERT_EQ(hb.size(), 32u) << tb->lastError();
  ta->importPeerHandles(ba, 0, 2, {ha, hb}, {});
  EXPECT_TRUE(ta->lastError().ok()) << ta->lastError();
  EXPECT_EQ(a->imports, 0);
  EXPECT_EQ(ta->availableTablePtr()[1], 0);
  EXPECT_EQ(ta->peerPtrsTablePtr()[1], nullptr);
  EXPECT_FALSE(ta->allPeersAccessible());  // not the all-P2P fast path
  EXPECT_FALSE(ta->verifyPeerAccess());
  EXPECT_TRUE(ta->lastError().ok()) << ta->lastError();
}

#if !MOONCAKE_TEST_HAVE_CUDA
TEST(HostP2pTransport, CudaFactoryExplainsMissingCuda) {
  auto t = createCudaP2pTransport(2, std::make_shared<InProcessHandleExchange>());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(t.status().message().find("MOONCAKE_WITH_CUDA"), std::string::npos);
}
#endif

// ---- two processes ----------------------------------------------------------

std::string Check(bool ok, std::string_view what) { return ok ? "" : std::string(what); }

// One rank of the fork test; returns "" on success or what went wrong.
std::string RunForkedRank(int rank, UniqueFd serve, UniqueFd request, int ctl) {
  constexpr int kN = 2;
  constexpr size_t kChunk = 1 << 20;
  constexpr int kAdds = 50000;
  const Layout L{kN, kChunk};
  const int peer = 1 - rank;
  auto ex = std::make_shared<SocketHandleExchange>(std::move(serve), std::move(request));
  auto t = createHostP2pTransport(kN, ex);
  if (!t.ok()) return t.status().ToString();
  BrokeredP2pTransport& tr = **t;
  void* buf = tr.allocateBuffer(L.bytes() + 256);
  if (buf == nullptr) return tr.lastError().ToString();
  auto* base = static_cast<unsigned char*>(buf);
  std::vector<int32_t> mine = tr.exportIpcHandle(buf);
  if (mine.empty()) return tr.lastError().ToString();

  // Handles travel over the control socket (the daemon's job in production).
  std::string wire(reinterpret_cast<const char*>(mine.data()), mine.size() * 4);
  if (auto s = SendFrame(ctl, wire, {}); !s.ok()) return s.ToString();
  auto got = RecvFrame(ctl);
  if (!got.ok()) return got.status().ToString();
  std::vector<int32_t> theirs(got->payload.size() / 4);
  std::memcpy(theirs.data(), got->payload.data(), theirs.size() * 4);
  std::vector<std::vector<int32_t>> handles(kN);
  handles[rank] = mine;
  handles[peer] = theirs;

  tr.importPeerHandles(buf, rank, kN, handles, {});
  if (!tr.lastError().ok()) return tr.lastError().ToString();
  if (!tr.verifyPeerAccess()) return tr.lastError().ToString();
  CommCtx ctx;
  ctx.p2p = tr.p2pContext();
  ctx.rank = rank;
  ctx.num_ranks = kN;

  // Data + release signal to the peer.
  std::vector<unsigned char> src(kChunk);
  for (size_t i = 0; i < kChunk; ++i) src[i] = PatternByte(rank, peer, 1, i);
  if (mc_put_thread(ctx, peer, base + rank * kChunk, src.data(), kChunk) != McStatus::kOk)
    return "put failed";
  if (mc_signal(ctx, peer, reinterpret_cast<uint32_t*>(base + L.sig_offset(rank)), 1u) !=
      McStatus::kOk)
    return "signal failed";

  // Both processes add into rank 0's counter; rank 0 adds through its own
  // mapping (self route), rank 1 through the peer mapping.
  auto* ctr_sym = reinterpret_cast<uint64_t*>(base + L.counter_offset());
  for (int i = 0; i < kAdds; ++i) {
    if (mc_red_add(ctx, 0, ctr_sym, uint64_t{1}) != McStatus::kOk) return "red_add failed";
  }
  auto* done_sym = reinterpret_cast<uint32_t*>(base + L.counter_offset() + 8 + 4 * rank);
  if (mc_signal(ctx, 0, done_sym, 1u) != McStatus::kOk) return "done signal failed";

  const auto* sig = reinterpret_cast<const uint32_t*>(base + L.sig_offset(peer));
  if (!mc_wait_until_for(sig, McCmp::kEq, 1u, kWaitNs, static_cast<uint32_t*>(nullptr)))
    return "timed out waiting for the peer's signal";
  for (size_t i = 0; i < kChunk; ++i) {
    if (base[peer * kChunk + i] != PatternByte(peer, rank, 1, i))
      return absl::StrCat("byte ", i, " from rank ", peer, " wrong");
  }

  if (rank == 0) {
    for (int r = 0; r < kN; ++r) {
      const auto* done = reinterpret_cast<const uint32_t*>(base + L.counter_offset() + 8 + 4 * r);
      if (!mc_wait_until_for(done, McCmp::kEq, 1u, kWaitNs, static_cast<uint32_t*>(nullptr)))
        return absl::StrCat("timed out waiting for rank ", r, "'s adds");
    }
    const uint64_t total = mc_ld_acquire(reinterpret_cast<const uint64_t*>(ctr_sym));
    if (total != uint64_t{kN} * kAdds)
      return absl::StrCat("counter ", total, ", expected ", kN * kAdds);
  }

  // LL ping-pong across the processes.
  auto* ll_out = reinterpret_cast<McLLSlot*>(base + L.bytes() + 16 * rank);
  const auto* ll_in = reinterpret_cast<const McLLSlot*>(base + L.bytes() + 16 * peer);
  for (uint32_t r = 1; r <= 2000; ++r) {
    const uint64_t v = (uint64_t{r} << 33) ^ (rank ? 0xabcdefull : 0x123456ull);
    if (rank == 0) {
      if (mc_put_signal_ll(ctx, 1, ll_out, v, r) != McStatus::kOk) return "ll put failed";
      const uint64_t back = mc_wait_ll(ll_in, r);
      if (back != ~v) return absl::StrCat("LL round ", r, ": got ", back);
    } else {
      const uint64_t in = mc_wait_ll(ll_in, r);
      if (mc_put_signal_ll(ctx, 0, ll_out, ~in, r) != McStatus::kOk) return "ll put failed";
    }
  }

  // Neither side tears down while the other may still touch its memory.
  if (auto s = SendFrame(ctl, "done", {}); !s.ok()) return s.ToString();
  auto fin = RecvFrame(ctl);
  if (!fin.ok()) return fin.status().ToString();
  return Check(fin->payload == "done", "bad final message");
}

TEST(HostP2pTransportProcesses, TwoForkedRanksShareMemfdBuffers) {
  int a[2], b[2], ctl[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, a), 0);
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, b), 0);
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ctl), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // Rank 1: serves rank 0's imports on a[1], asks on b[1].
    ::close(a[0]);
    ::close(b[0]);
    ::close(ctl[0]);
    std::string err = RunForkedRank(1, UniqueFd(a[1]), UniqueFd(b[1]), ctl[1]);
    if (!err.empty()) {
      std::fprintf(stderr, "rank 1 (child): %s\n", err.c_str());
      ::_exit(1);
    }
    ::_exit(0);
  }
  ::close(a[1]);
  ::close(b[1]);
  ::close(ctl[1]);
  std::string err = RunForkedRank(0, UniqueFd(b[0]), UniqueFd(a[0]), ctl[0]);
  ::close(ctl[0]);  // unblocks the child if we failed early
  EXPECT_EQ(err, "") << "rank 0 (parent)";

  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  pid_t done = 0;
  while ((done = ::waitpid(pid, &status, WNOHANG)) == 0 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (done == 0) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    FAIL() << "child rank did not finish in 60 s";
  }
  ASSERT_TRUE(WIFEXITED(status)) << "child died by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "child rank failed (its error is on stderr)";
}

}  // namespace
}  // namespace mooncake::device
