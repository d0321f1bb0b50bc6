// softnic against raw WQEs: every operation's effect and CQE, every bad WQE's
// syndrome (the table in softnic/engine.h), flush errors after the first
// error, owner bits over CQ wraps, CQ back-pressure, and thousands of random
// WQEs. After each case: nothing changed outside the bytes the case may
// write (guard bytes around every region), and another QP is still served.
#include "mooncake/device/mlx5/wqe.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "guarded_regions.h"
#include "mooncake/device/mlx5/prm.h"
#include "raw_qp.h"
#include "softnic/engine.h"

namespace mooncake::softnic {
namespace {

using test_util::CqeBytes;
using test_util::CqeCounter;
using test_util::CqeOpcode;
using test_util::CqeQpn;
using test_util::CqeSyndrome;
using test_util::FindQp;
using test_util::RawQp;
namespace mlx5 = test_util::mlx5;
using mlx5::Cqe64;
using mlx5::Wqe64;

constexpr PdId kPdA = 11;  // the requesters' pd
constexpr PdId kPdB = 22;  // the responder's pd
constexpr uint8_t kSentinel = test_util::GuardedRegions::kSentinel;
constexpr uint8_t kUpd = mlx5::kCtrlCqUpdate;

uint8_t PatternByte(uint64_t i) { return static_cast<uint8_t>((i * 131 + 7) ^ (i >> 8)); }

using Reg = test_util::GuardedRegion;

class WqeTest : public ::testing::Test {
 protected:
  explicit WqeTest(EngineOptions options = {}) : engine_(options) {}
  void SetUp() override {
    src_ = Add(kPdA, 4096, kLocalWrite);
    src_ro_ = Add(kPdA, 256, 0);
    fetch_ = Add(kPdA, 64, kLocalWrite);
    a_remote_ = Add(kPdA, 256, kRemoteWrite | kRemoteAtomic);
    b_local_ = Add(kPdB, 256, kLocalWrite);
    dst_ = Add(kPdB, 4096, kRemoteWrite | kRemoteAtomic);
    dst_nowrite_ = Add(kPdB, 256, kRemoteRead | kRemoteAtomic);
    dst_noatomic_ = Add(kPdB, 256, kRemoteWrite);
    healthy_dst_ = Add(kPdB, 4096, kRemoteWrite);
    cuda_src_ = AddCuda(kPdA, kLocalWrite);
    cuda_dst_ = AddCuda(kPdB, kRemoteWrite | kRemoteAtomic);
    for (uint64_t i = 0; i < src_.len; ++i) Host(src_)[i] = PatternByte(i);
    regions_.Snapshot();

    responder_ = RawQp::Create(engine_, kPdB, 1, 1);
    ASSERT_NE(responder_, nullptr);
    healthy_ = NewQp();
    ASSERT_NE(healthy_, nullptr);
    engine_.Start();
  }
  void TearDown() override { engine_.Stop(); }

  Reg Add(PdId pd, uint64_t len, uint32_t access) {
    const Reg r = regions_.Add(engine_, pd, len, access);
    EXPECT_NE(r.key, 0u) << "region of " << len << " bytes refused";
    return r;
  }
  Reg AddCuda(PdId pd, uint32_t access) {
    Reg r;
    r.len = 4096;
    r.iova = 0x5000'0000'0000ull + regions_.Reserve(0);
    RegionSpec spec;
    spec.pd = pd;
    spec.kind = MemoryKind::kCuda;
    spec.iova = r.iova;
    spec.length = r.len;
    spec.access = access;
    spec.offset = 0x7f00'0000'0000ull;
    auto key = engine_.RegisterRegion(spec);
    EXPECT_TRUE(key.ok()) << key.status();
    r.key = key.ok() ? *key : 0;
    return r;
  }
  uint8_t* Host(const Reg& r) { return regions_.Host(r); }

  // A requester QP of kPdA connected to the responder (kPdB).
  std::unique_ptr<RawQp> NewQp(uint32_t sq = 16, uint32_t cq = 16) {
    auto qp = RawQp::Create(engine_, kPdA, sq, cq);
    if (qp == nullptr) return nullptr;
    EXPECT_TRUE(engine_.Connect(kPdA, qp->qpn(), responder_->qpn()).ok());
    return qp;
  }

  // A key no region has.
  uint32_t UnknownKey() const {
    uint32_t k = 0x1234567;
    for (bool taken = true; taken;) {
      ++k;
      taken = false;
      for (const RegionInfo& r : engine_.ListRegions()) taken |= r.key == k;
    }
    return k;
  }

  // Bytes of the data mapping that differ from the snapshot outside `allowed`.
  size_t Changed(std::initializer_list<Reg> allowed) const { return regions_.Changed(allowed); }

  // The bystander: one write on the healthy QP completes and lands.
  void ExpectHealthyQpServed(uint32_t seed) {
    const uint64_t src_off = seed % 64, dst_off = (uint64_t{seed} * 64) % (healthy_dst_.len - 64);
    Wqe64 w;
    mlx5::build_rdma_write(&w, static_cast<uint16_t>(healthy_->pi()), healthy_->qpn(), kUpd,
                           healthy_dst_.iova + dst_off, healthy_dst_.key, src_.iova + src_off,
                           src_.key, 64);
    healthy_->Write(w);
    healthy_->Ring();
    Cqe64 c;
    ASSERT_TRUE(healthy_->Next(&c));
    EXPECT_EQ(CqeOpcode(c), mlx5::kCqeReq);
    EXPECT_EQ(std::memcmp(Host(healthy_dst_) + dst_off, Host(src_) + src_off, 64), 0);
  }

  // 12000 WQEs in QPs of 16, a quarter hostile (random words, keys,
  // addresses, lengths), the rest valid; `fences`: the fence bit at random.
  void RandomWqes(uint64_t seed, bool fences);

  // A WQE that must succeed: in range, right keys, aligned atomics.
  void BuildValidWqe(std::mt19937_64& rng, const RawQp& qp, uint16_t idx, Wqe64* w) {
    auto pick = [&rng](uint64_t n) { return static_cast<uint64_t>(rng() % n); };
    const uint32_t n = static_cast<uint32_t>(1 + pick(2000));
    const uint64_t laddr = src_.iova + pick(src_.len - n + 1);
    const uint64_t raddr = dst_.iova + pick(dst_.len - n + 1);
    switch (pick(6)) {
      case 0:
        mlx5::build_rdma_write(w, idx, qp.qpn(), kUpd, raddr, dst_.key, laddr, src_.key, n);
        break;
      case 1:
        mlx5::build_rdma_write_imm(w, idx, qp.qpn(), kUpd, raddr, dst_.key, laddr, src_.key, n,
                                   static_cast<uint32_t>(rng()));
        break;
      case 2: {
        const uint64_t v[4] = {rng(), rng(), rng(), rng()};
        const auto bytes = static_cast<uint32_t>(1 + pick(mlx5::kMaxInlineBytes));
        mlx5::build_rdma_write_inline(w, idx, qp.qpn(), kUpd, dst_.iova + pick(dst_.len - 28),
                                      dst_.key, v, bytes);
        break;
      }
      case 3:
        mlx5::build_atomic_fa64(w, idx, qp.qpn(), kUpd, dst_.iova + 8 * pick(dst_.len / 8),
                                dst_.key, rng(), fetch_.iova + 8 * pick(fetch_.len / 8),
                                fetch_.key);
        break;
      case 4:
        mlx5::build_masked_fa32(w, idx, qp.qpn(), kUpd, dst_.iova + 4 * pick(dst_.len / 4),
                                dst_.key, static_cast<uint32_t>(rng()),
                                fetch_.iova + 4 * pick(fetch_.len / 4), fetch_.key);
        w->word[9] = static_cast<uint32_t>(rng());
        break;
      default: mlx5::build_nop(w, idx, qp.qpn(), kUpd); break;
    }
  }

  Engine engine_;
  test_util::GuardedRegions regions_{1 << 20};
  Reg src_, src_ro_, fetch_, a_remote_, b_local_, dst_, dst_nowrite_, dst_noatomic_, healthy_dst_;
  Reg cuda_src_, cuda_dst_;
  std::unique_ptr<RawQp> responder_;
  std::unique_ptr<RawQp> healthy_;
};

// ---- what works --------------------------------------------------------------

TEST_F(WqeTest, WriteFromADataSegment) {
  auto qp = NewQp();
  Wqe64 w;
  mlx5::build_rdma_write(&w, 0, qp->qpn(), kUpd, dst_.iova + 5, dst_.key, src_.iova + 3, src_.key,
                         1000);
  qp->Write(w);
  qp->Ring();
  Cqe64 c;
  ASSERT_TRUE(qp->Next(&c));
  EXPECT_EQ(CqeOpcode(c), mlx5::kCqeReq);
  EXPECT_EQ(CqeBytes(c), 1000u);
  EXPECT_EQ(CqeCounter(c), 0);
  EXPECT_EQ(CqeQpn(c), qp->qpn());
  EXPECT_EQ(mlx5::be32(c.sop_drop_qpn_be) >> 24, mlx5::kOpRdmaWrite);
  EXPECT_EQ(std::memcmp(Host(dst_) + 5, Host(src_) + 3, 1000), 0);
  EXPECT_EQ(Changed({dst_}), 0u);
  EXPECT_EQ(Host(dst_)[4], kSentinel);
  EXPECT_EQ(Host(dst_)[1005], kSentinel);
  const QpInfo info = FindQp(engine_, qp->qpn());
  EXPECT_EQ(info.state, QpState::kRts);
  EXPECT_EQ(info.wqes_done, 1u);
}

TEST_F(WqeTest, WriteImmWritesAndDropsTheImmediate) {
  auto qp = NewQp();
  Wqe64 w;
  mlx5::build_rdma_write_imm(&w, 0, qp->qpn(), kUpd, dst_.iova, dst_.key, src_.iova, src_.key, 64,
                             0xdeadbeef);
  qp->Write(w);
  qp->Ring();
  Cqe64 c;
  ASSERT_TRUE(qp->Next(&c));
  EXPECT_EQ(CqeOpcode(c), mlx5::kCqeReq);
  EXPECT_EQ(CqeBytes(c), 64u);
  EXPECT_EQ(std::memcmp(Host(dst_), Host(src_), 64), 0);
  EXPECT_EQ(Changed({dst_}), 0u);
}

TEST_F(WqeTest, InlineWritesOfEverySize) {
  auto qp = NewQp(32, 32);
  uint8_t payload[mlx5::kMaxInlineBytes];
  for (uint32_t i = 0; i < sizeof(payload); ++i) payload[i] = static_cast<uint8_t>(0x40 + i);
  for (uint32_t n = 1; n <= mlx5::kMaxInlineBytes; ++n) {
    Wqe64 w;
    mlx5::build_rdma_write_inline(&w, static_cast<uint16_t>(qp->pi()), qp->qpn(), kUpd,
                                  dst_.iova + 64 * n + (n % 7), dst_.key, payload, n);
    qp->Write(w);
  }
  qp->Ring();
  for (uint32_t n = 1; n <= mlx5::kMaxInlineBytes; ++n) {
    Cqe64 c;
    ASSERT_TRUE(qp->Next(&c));
    EXPECT_EQ(CqeOpcode(c), mlx5::kCqeReq) << n;
    EXPECT_EQ(CqeBytes(c), n);
    EXPECT_EQ(CqeCounter(c), n - 1);
    const uint8_t* at = Host(dst_) + 64 * n + (n % 7);
    EXPECT_EQ(std::memcmp(at, payload, n), 0) << n;
    EXPECT_EQ(at[-1], kSentinel);
    EXPECT_EQ(at[n], kSentinel);
  }
  EXPECT_EQ(Changed({dst_}), 0u);
}

TEST_F(WqeTest, FetchAdd64) {
  auto qp = NewQp();
  uint64_t start = 40;
  std::memcpy(Host(dst_) + 128, &start, 8);
  regions_.Snapshot();
  Wqe64 w;
  mlx5::build_atomic_fa64(&w, 0, qp->qpn(), kUpd | mlx5::kCtrlFence, dst_.iova + 128, dst_.key,
                          0x100000002ull, fetch_.iova + 8, fetch_.key);
  qp->Write(w);
  qp->Ring();
  Cqe64 c;
  ASSERT_TRUE(qp->Next(&c));
  EXPECT_EQ(CqeOpcode(c), mlx5::kCqeReq);
  uint64_t now, fetched;
  std::memcpy(&now, Host(dst_) + 128, 8);
  std::memcpy(&fetched, Host(fetch_) + 8, 8);
  EXPECT_EQ(now, 0x100000002ull + 40);
  EXPECT_EQ(fetched, 40u) << "the standard atomic returns host order";
  EXPECT_EQ(Changed({dst_, fetch_}), 0u);
  EXPECT_EQ(Host(fetch_)[7], kSentinel);
  EXPECT_EQ(Host(fetch_)[16], kSentinel);
}

TEST_F(WqeTest, MaskedFetchAdd32WithAndWithoutFieldBoundary) {
  auto qp = NewQp();
  const uint32_t start = 0x01FF7F10;
  std::memcpy(Host(dst_) + 4, &start, 4);
  std::memcpy(Host(dst_) + 8, &start, 4);
  Wqe64 w;
  mlx5::build_masked_fa32(&w, 0, qp->qpn(), kUpd, dst_.iova + 4, dst_.key, 0x01010101, fetch_.iova,
                          fetch_.key);
  qp->Write(w);
  mlx5::build_masked_fa32(&w, 1, qp->qpn(), kUpd, dst_.iova + 8, dst_.key, 0x01010101,
                          fetch_.iova + 4, fetch_.key);
  w.word[9] = mlx5::be32(0x80808080u);  // four 8-bit fields
  qp->Write(w);
  qp->Ring();
  for (int i = 0; i < 2; ++i) {
    Cqe64 c;
    ASSERT_TRUE(qp->Next(&c));
    EXPECT_EQ(CqeOpcode(c), mlx5::kCqeReq);
  }
  uint32_t plain, fields, fetched0, fetched1;
  std::memcpy(&plain, Host(dst_) + 4, 4);
  std::memcpy(&fields, Host(dst_) + 8, 4);
  std::memcpy(&fetched0, Host(fetch_), 4);
  std::memcpy(&fetched1, Host(fetch_) + 4, 4);
  EXPECT_EQ(plain, 0x03008011u);
  // 0x10+1=0x11, 0x7f+1=0x80, 0xff+1 wraps in its field, 0x01+1=0x02.
  EXPECT_EQ(fields, 0x02008011u);
  EXPECT_EQ(mlx5::be32(fetched0), start) << "extended atomics return big-endian";
  EXPECT_EQ(mlx5::be32(fetched1), start);
}

TEST_F(WqeTest, NopAndUnsignaledWqes) {
  auto qp = NewQp();
  Wqe64 w;
  mlx5::build_nop(&w, 0, qp->qpn(), 0);  // no CQE
  qp->Write(w);
  mlx5::build_rdma_write(&w, 1, qp->qpn(), 0, dst_.iova, dst_.key, src_.iova, src_.key, 32);
  qp->Write(w);
  mlx5::build_nop(&w, 2, qp->qpn(), kUpd);
  qp->Write(w);
  qp->Ring();
  Cqe64 c;
  ASSERT_TRUE(qp->Next(&c));
  EXPECT_EQ(CqeOpcode(c), mlx5::kCqeReq);
  EXPECT_EQ(CqeCounter(c), 2) << "one CQE, for the signaled WQE";
  EXPECT_EQ(std::memcmp(Host(dst_), Host(src_), 32), 0);
  EXPECT_FALSE(qp->Peek(&c));
  EXPECT_EQ(FindQp(engine_, qp->qpn()).wqes_done, 3u);
}

// ---- what fails ------------------------------------------------------------------

struct BadCase {
  std::string name;
  uint8_t syndrome;
  // Fills the WQE at index `idx` of `qp`.
  std::function<void(const RawQp& qp, uint16_t idx, Wqe64* w)> build;
};

TEST_F(WqeTest, BadWqesFailTheirQpAloneWithTheRightSyndrome) {
  const uint32_t unknown = UnknownKey();
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  auto write = [this](const RawQp& qp, uint16_t idx, Wqe64* w, uint64_t raddr, uint32_t rkey,
                      uint64_t laddr, uint32_t lkey, uint32_t n) {
    mlx5::build_rdma_write(w, idx, qp.qpn(), kUpd, raddr, rkey, laddr, lkey, n);
  };
  auto good_write = [this, write](const RawQp& qp, uint16_t idx, Wqe64* w) {
    write(qp, idx, w, dst_.iova, dst_.key, src_.iova, src_.key, 64);
  };
  const uint8_t kOpErr = mlx5::kSyndLocalQpOpErr, kProt = mlx5::kSyndLocalProtErr,
                kLen = mlx5::kSyndLocalLengthErr, kRemote = mlx5::kSyndRemoteAccessErr,
                kInval = mlx5::kSyndRemoteInvalReqErr;
  const std::vector<BadCase> cases = {
      {"unknown opcode", kOpErr,
       [&](const RawQp& qp, uint16_t idx, Wqe64* w) {
         good_write(qp, idx, w);
         w->word[0] = mlx5::ctrl_opmod_idx_opcode(0, idx, 0x33);
       }},
      {"rdma read (not served)", kOpErr,
       [&](const RawQp& qp, uint16_t idx, Wqe64* w) {
         good_write(qp, idx, w);
         w->word[0] = mlx5::ctrl_opmod_idx_opcode(0, idx, mlx5::kOpRdmaRead);
       }},
      {"write with ds 5", kOpErr,
       [&](const RawQp& qp, uint16_t idx, Wqe64* w) {
         good_write(qp, idx, w);
         w->word[1] = mlx5::ctrl_qpn_ds(qp.qpn(), 5);
       }},
      {"write with ds 2", kOpErr,
       [&](const RawQp& qp, uint16_t idx, Wqe64* w) {
         good_write(qp, idx, w);
         w->word[1] = mlx5::ctrl_qpn_ds(qp.qpn(), 2);
       }},
      {"data-segment write with ds 4", kOpErr,
       [&](const RawQp& qp, uint16_t idx, Wqe64* w) {
         good_write(qp, idx, w);
         w->word[1] = mlx5::ctrl_qpn_ds(qp.qpn(), 4);
       }},
      {"nop with ds 2", kOpErr,
       [&](const RawQp& qp, uint16_t idx, Wqe64* w) {
         mlx5::build_nop(w, idx, qp.qpn(), kUpd);
         w->word[1] = mlx5::ctrl_qpn_ds(qp.qpn(), 2);
       }},
      {"fetch-add with ds 3", kOpErr,
       [&](const RawQp& qp, uint16_t idx, Wqe64* w) {
         mlx5::build_atomic_fa64(w, idx, qp.qpn(), kUpd, dst_.iova, dst_.key, 1, fetch_.iova,
                                 fetch_.key);
         w->word[1] = mlx5::ctrl_qpn_ds(qp.qpn(), 3);
       }},
      {"masked fetch-add with opmod 0", kOpErr,
       [&](const RawQp& qp, uint16_t idx, Wqe64* w) {
         mlx5::build_masked_fa32(w, idx, qp.qpn(), kUpd, dst_.iova, dst_.key, 1, fetch_.iova,
                                 fetch_.key);
         w->word[0] = mlx5::ctrl_opmod_idx_opcode(0, idx, mlx5::kOpAtomicMaskedFa);
       }},
      {"wrong wqe index", kOpErr,
       [&](const RawQp& qp, uint16_t idx, Wqe64* w) {
         good_write(qp, static_cast<uint16_t>(idx + 1), w);
       }},
      {"wrong qpn", kOpErr,
       [&](const RawQp& qp, uint16_t idx, Wqe64* w) {
         good_write(qp, idx, w);
         w->word[1] = mlx5::ctrl_qpn_ds(qp.qpn() ^ 1, 3);
       }},
      {"unknown lkey", kProt,
       [&](const RawQp& qp, uint16_t idx, Wqe64* w) {
         write(qp, idx, w, dst_.iova, dst_.key, src_.iova, unknown, 64);
       }},
      {"lkey of another pd", kProt,
       [&](const RawQp& qp, uint16_t idx, Wqe64* w) {
         write(qp, idx, w, dst_.iova, dst_.key, b_local_.iova, b_local_.key, 64);
       }},
      {"source past the region", kProt,
       [&](const RawQp& qp, uint16_t idx, Wqe64* w) {
         write(qp, idx, w, dst_.iova, dst_.key, src_.iova + src_.len - 32, src_.key, 64);
       }},
      {"source before the region", kProt,
       [&](const RawQp& qp, uint16_t idx, Wqe64* w) {
         write(qp, idx, w, dst_.iova, dst_.key, src_.iova - 1, src_.key, 64);
       }},
      {"source range wraps 2^64", kProt,
       [&](const RawQp& qp, uint16_t idx, Wqe64* w) {
         write(qp, idx, w, dst_.iova, dst_.key, kMax - 63, src_.key, 128);
       }},
      {"source of a CUDA region", kProt,
       [&](const RawQp& qp, uint16_t idx, Wqe64* w) {
         write(qp, idx, w, dst_.iova, dst_.key, cuda_src_.iova, cuda_src_.key, 64);
       }},
      {"unknown rkey", kRemote,
       [&](const RawQp& qp, uint16_t idx, Wqe64* w) {
         write(qp, idx, w, dst_.iova, unknown, src_.iova, src_.key, 64);
       }},
      {"rkey of another pd", kRemote,
       [&](const RawQp& qp, uint16_t idx, Wqe64* w) {
         write(qp, idx, w, a_remote_.iova, a_remote_.key, src_.iova, src_.key, 64);
       }},
      {"remote range past the region", kRemote,
       [&](const RawQp& qp, uint16_t idx, Wqe64* w) {
         write(qp, idx, w, dst_.iova + dst_.len - 8, dst_.key, src_.iova, src_.key, 64);
       }},
      {"remote range before the region", kRemote,
       [&](const RawQp& qp, uint16_t idx, Wqe64* w) {
         write(qp, idx, w, dst_.iova - 8, dst_.key, src_.iova, src_.key, 64);
       }},
      {"remote addr + len wraps 2^64", kRemote,
       [&](const RawQp& qp, uint16_t idx, Wqe64* w) {
         write(qp, idx, w, kMax - 31, dst_.key, src_.iova, src_.key, 64);
       }},
      {"inline write past the region", kRemote,
       [&](const RawQp& qp, uint16_t idx, Wqe64* w) {
         const uint64_t v = 7;
         mlx5::build_rdma_write_inline(w, idx, qp.qpn(), kUpd, dst_.iova + dst_.len - 4, dst_.key,
                                       &v, 8);
       }},
      {"write without kRemoteWrite", kRemote,
       [&](const RawQp& qp, uint16_t idx, Wqe64* w) {
         write(qp, idx, w, dst_nowrite_.iova, dst_nowrite_.key, src_.iova, src_.key, 64);
       }},
      {"inline write without kRemoteWrite", kRemote,
       [&](const RawQp& qp, uint16_t idx, Wqe64* w) {
         const uint32_t v = 7;
         mlx5::build_rdma_write_inline(w, idx, qp.qpn(), kUpd, dst_nowrite_.iova, dst_nowrite_.key,
                                       &v, 4);
       }},
      {"write into a CUDA region", kRemote,
       [&](const RawQp& qp, uint16_t idx, Wqe64* w) {
         write(qp, idx, w, cuda_dst_.iova, cuda_dst_.key, src_.iova, src_.key, 64);
       }},
      {"fetch-add without kRemoteAtomic", kRemote,
       [&](const RawQp& qp, uint16_t idx, Wqe64* w) {
         mlx5::build_atomic_fa64(w, idx, qp.qpn(), kUpd, dst_noatomic_.iova, dst_noatomic_.key, 1,
                                 fetch_.iova, fetch_.key);
       }},
      {"misaligned fetch-add", kInval,
       [&](const RawQp& qp, uint16_t idx, Wqe64* w) {
         mlx5::build_atomic_fa64(w, idx, qp.qpn(), kUpd, dst_.iova + 4, dst_.key, 1, fetch_.iova,
                                 fetch_.key);
       }},
      {"misaligned masked fetch-add", kInval,
       [&](const RawQp& qp, uint16_t idx, Wqe64* w) {
         mlx5::build_masked_fa32(w, idx, qp.qpn(), kUpd, dst_.iova + 2, dst_.key, 1, fetch_.iova,
                                 fetch_.key);
       }},
      {"fetch into a region without kLocalWrite", kProt,
       [&](const RawQp& qp, uint16_t idx, Wqe64* w) {
         mlx5::build_atomic_fa64(w, idx, qp.qpn(), kUpd, dst_.iova, dst_.key, 1, src_ro_.iova,
                                 src_ro_.key);
       }},
      {"fetch into another pd's region", kProt,
       [&](const RawQp& qp, uint16_t idx, Wqe64* w) {
         mlx5::build_masked_fa32(w, idx, qp.qpn(), kUpd, dst_.iova, dst_.key, 1, b_local_.iova,
                                 b_local_.key);
       }},
      {"fetch past its region", kProt,
       [&](const RawQp& qp, uint16_t idx, Wqe64* w) {
         mlx5::build_atomic_fa64(w, idx, qp.qpn(), kUpd, dst_.iova, dst_.key, 1,
                                 fetch_.iova + fetch_.len - 4, fetch_.key);
       }},
      {"fetch byte count not 8", kLen,
       [&](const RawQp& qp, uint16_t idx, Wqe64* w) {
         mlx5::build_atomic_fa64(w, idx, qp.qpn(), kUpd, dst_.iova, dst_.key, 1, fetch_.iova,
                                 fetch_.key);
         w->word[12] = mlx5::be32(16);
       }},
      {"zero-length write", kLen,
       [&](const RawQp& qp, uint16_t idx, Wqe64* w) {
         write(qp, idx, w, dst_.iova, dst_.key, src_.iova, src_.key, 0);
       }},
      {"zero-length inline write", kLen,
       [&](const RawQp& qp, uint16_t idx, Wqe64* w) {
         const uint32_t v = 7;
         mlx5::build_rdma_write_inline(w, idx, qp.qpn(), kUpd, dst_.iova, dst_.key, &v, 4);
         w->word[8] = mlx5::be32(mlx5::kInlineSeg);
       }},
      {"inline 20 bytes declared in ds 3", kLen,
       [&](const RawQp& qp, uint16_t idx, Wqe64* w) {
         const uint8_t v[20] = {};
         mlx5::build_rdma_write_inline(w, idx, qp.qpn(), kUpd, dst_.iova, dst_.key, v, 20);
         w->word[1] = mlx5::ctrl_qpn_ds(qp.qpn(), 3);
       }},
      {"inline 29 bytes", kLen,
       [&](const RawQp& qp, uint16_t idx, Wqe64* w) {
         const uint8_t v[28] = {};
         mlx5::build_rdma_write_inline(w, idx, qp.qpn(), kUpd, dst_.iova, dst_.key, v, 28);
         w->word[8] = mlx5::be32(mlx5::kInlineSeg | 29);
       }},
      {"inline 2^31 - 1 bytes", kLen,
       [&](const RawQp& qp, uint16_t idx, Wqe64* w) {
         const uint8_t v[28] = {};
         mlx5::build_rdma_write_inline(w, idx, qp.qpn(), kUpd, dst_.iova, dst_.key, v, 28);
         w->word[8] = mlx5::be32(0xffffffffu);
       }},
  };

  uint32_t seed = 0;
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.name);
    auto qp = NewQp();
    ASSERT_NE(qp, nullptr);
    Wqe64 w;
    c.build(*qp, 0, &w);
    qp->Write(w);
    // Good WQEs after the bad one are flushed, not executed.
    good_write(*qp, 1, &w);
    qp->Write(w);
    mlx5::build_nop(&w, 2, qp->qpn(), kUpd);
    qp->Write(w);
    qp->Ring();
    Cqe64 cqe;
    ASSERT_TRUE(qp->Next(&cqe));
    EXPECT_EQ(CqeOpcode(cqe), mlx5::kCqeReqErr);
    EXPECT_EQ(CqeSyndrome(cqe), c.syndrome);
    EXPECT_EQ(reinterpret_cast<const uint8_t*>(&cqe)[mlx5::kCqeVendorSyndromeByte], 0);
    EXPECT_EQ(CqeCounter(cqe), 0);
    EXPECT_EQ(CqeQpn(cqe), qp->qpn());
    for (uint16_t i = 1; i <= 2; ++i) {
      ASSERT_TRUE(qp->Next(&cqe));
      EXPECT_EQ(CqeOpcode(cqe), mlx5::kCqeReqErr);
      EXPECT_EQ(CqeSyndrome(cqe), mlx5::kSyndWrFlushErr);
      EXPECT_EQ(CqeCounter(cqe), i);
    }
    const QpInfo info = FindQp(engine_, qp->qpn());
    EXPECT_EQ(info.state, QpState::kError);
    EXPECT_EQ(info.last_syndrome, c.syndrome);
    EXPECT_EQ(info.wqes_done, 3u);
    EXPECT_EQ(Changed({healthy_dst_}), 0u);
    ExpectHealthyQpServed(++seed);
    // Later posts keep flushing.
    mlx5::build_nop(&w, 3, qp->qpn(), kUpd);
    qp->Write(w);
    qp->Ring();
    ASSERT_TRUE(qp->Next(&cqe));
    EXPECT_EQ(CqeSyndrome(cqe), mlx5::kSyndWrFlushErr);
    EXPECT_EQ(CqeCounter(cqe), 3);
    ASSERT_TRUE(engine_.DestroyQp(kPdA, qp->qpn()).ok());
  }
  EXPECT_EQ(FindQp(engine_, healthy_->qpn()).state, QpState::kRts);
}

TEST_F(WqeTest, BogusDoorbellFailsTheQp) {
  auto qp = NewQp();
  Wqe64 w;
  mlx5::build_rdma_write(&w, 0, qp->qpn(), kUpd, dst_.iova, dst_.key, src_.iova, src_.key, 64);
  qp->Write(w);
  qp->RingRaw(0x8001);  // 32769 WQEs on a 16-entry ring
  Cqe64 c;
  ASSERT_TRUE(qp->Next(&c));
  EXPECT_EQ(CqeOpcode(c), mlx5::kCqeReqErr);
  EXPECT_EQ(CqeSyndrome(c), mlx5::kSyndLocalQpOpErr);
  EXPECT_EQ(CqeCounter(c), 0);
  EXPECT_EQ(FindQp(engine_, qp->qpn()).state, QpState::kError);
  EXPECT_EQ(Changed({healthy_dst_}), 0u) << "the WQE under the bogus doorbell did not run";
  ExpectHealthyQpServed(1);
  // Exactly one more than the ring holds is already bogus.
  auto qp2 = NewQp(4, 4);
  qp2->RingRaw(5);
  ASSERT_TRUE(qp2->Next(&c));
  EXPECT_EQ(CqeSyndrome(c), mlx5::kSyndLocalQpOpErr);
  EXPECT_EQ(Changed({healthy_dst_}), 0u);
}

TEST_F(WqeTest, GoneResponderIsATransportError) {
  auto qp = NewQp();
  auto other = RawQp::Create(engine_, kPdB, 1, 1);
  auto orphan = RawQp::Create(engine_, kPdA, 4, 4);
  ASSERT_TRUE(other && orphan);
  ASSERT_TRUE(engine_.Connect(kPdA, orphan->qpn(), other->qpn()).ok());
  ASSERT_TRUE(engine_.DestroyQp(kPdB, other->qpn()).ok());
  Wqe64 w;
  mlx5::build_rdma_write(&w, 0, orphan->qpn(), kUpd, dst_.iova, dst_.key, src_.iova, src_.key, 64);
  orphan->Write(w);
  orphan->Ring();
  Cqe64 c;
  ASSERT_TRUE(orphan->Next(&c));
  EXPECT_EQ(CqeSyndrome(c), mlx5::kSyndTransportRetryExcErr);
  EXPECT_EQ(Changed({healthy_dst_}), 0u);
  ExpectHealthyQpServed(2);
}

// ---- the CQ ----------------------------------------------------------------------

TEST_F(WqeTest, OwnerBitsOverManyWraps) {
  auto qp = NewQp(4, 4);
  uint16_t idx = 0;
  for (int round = 0; round < 40; ++round) {
    const int batch = 1 + round % 4;
    for (int i = 0; i < batch; ++i) {
      Wqe64 w;
      mlx5::build_nop(&w, idx++, qp->qpn(), kUpd);
      qp->Write(w);
    }
    qp->Ring();
    for (int i = 0; i < batch; ++i) {
      const uint64_t ci = qp->cqes_seen();
      Cqe64 c;
      ASSERT_TRUE(qp->Next(&c)) << "round " << round;
      EXPECT_EQ(CqeOpcode(c), mlx5::kCqeReq);
      EXPECT_EQ(mlx5::cqe_owner(c.op_own), (ci / 4) & 1) << "ci " << ci;
      EXPECT_EQ(CqeCounter(c), static_cast<uint16_t>(ci));
    }
  }
  EXPECT_GE(qp->cqes_seen(), 90u);  // > 20 passes over the 4-entry CQ
}

TEST_F(WqeTest, NeverOverrunsAFullCq) {
  auto qp = NewQp(8, 8);
  auto post_nops = [&](int n) {
    for (int i = 0; i < n; ++i) {
      Wqe64 w;
      mlx5::build_nop(&w, static_cast<uint16_t>(qp->pi()), qp->qpn(), kUpd);
      qp->Write(w);
    }
    qp->Ring();
  };
  post_nops(8);
  Cqe64 c;
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(qp->WaitNext(&c));  // read, not consumed
  // Their slots may be reused: the engine took those WQEs. The CQ is full.
  post_nops(8);
  // Give the engine every chance to overrun (it polls every few us).
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(30);
  while (std::chrono::steady_clock::now() < until) {
    ASSERT_EQ(FindQp(engine_, qp->qpn()).wqes_done, 8u);
    std::this_thread::yield();
  }
  // Slot 0 still holds the first pass's CQE.
  const auto* slot0 = qp->cq();
  EXPECT_EQ(mlx5::cqe_owner(slot0->op_own), 0);
  EXPECT_EQ(CqeCounter(*slot0), 0);
  qp->Consume();  // now it may go on
  for (int i = 0; i < 8; ++i) {
    ASSERT_TRUE(qp->Next(&c));
    EXPECT_EQ(CqeCounter(c), 8 + i);
    EXPECT_EQ(mlx5::cqe_owner(c.op_own), 1);
  }
  EXPECT_EQ(FindQp(engine_, qp->qpn()).wqes_done, 16u);
  EXPECT_EQ(FindQp(engine_, qp->qpn()).state, QpState::kRts);
}

TEST_F(WqeTest, CqBackPressureAlsoHoldsErrors) {
  auto qp = NewQp(4, 4);
  Wqe64 w;
  for (uint16_t i = 0; i < 4; ++i) {
    mlx5::build_nop(&w, i, qp->qpn(), kUpd);
    qp->Write(w);
  }
  qp->Ring();
  Cqe64 c;
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(qp->WaitNext(&c));
  // A bad WQE while the CQ is full: not taken until there is room.
  mlx5::build_nop(&w, 99, qp->qpn(), kUpd);
  qp->Write(w);
  qp->Ring();
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(20);
  while (std::chrono::steady_clock::now() < until) {
    ASSERT_EQ(FindQp(engine_, qp->qpn()).state, QpState::kRts);
    std::this_thread::yield();
  }
  qp->Consume();
  ASSERT_TRUE(qp->Next(&c));
  EXPECT_EQ(CqeSyndrome(c), mlx5::kSyndLocalQpOpErr);
  EXPECT_EQ(CqeCounter(c), 4);
}

// ---- random WQEs ------------------------------------------------------------------

TEST_F(WqeTest, RandomWqesNeverEscapeTheirRegions) { RandomWqes(20261201, /*fences=*/false); }

// The same hostile rings against the "hca" model (atomics as read, add,
// write; a fenced WQE held in the ring for a round trip after an atomic),
// with the fence bit set at random: every WQE still ends in exactly one
// CQE, nothing outside the regions changes, and the other QPs are served.
class WqeHcaTest : public WqeTest {
 protected:
  WqeHcaTest() : WqeTest(HcaOptions()) {}
  static EngineOptions HcaOptions() {
    EngineOptions o;
    o.atomics = AtomicsModel::kHca;
    o.hca_round_trip_us = 50;
    return o;
  }
};

TEST_F(WqeHcaTest, RandomWqesAndFencesNeverEscapeTheirRegions) {
  RandomWqes(20261204, /*fences=*/true);
  EXPECT_GT(engine_.fence_waits(), 0u) << "no fence was ever held: the model went untested";
}

void WqeTest::RandomWqes(uint64_t seed, bool fences) {
  std::mt19937_64 rng(seed);
  auto pick = [&rng](uint64_t n) { return static_cast<uint64_t>(rng() % n); };
  const Reg locals[] = {src_, src_ro_, fetch_, b_local_, cuda_src_, dst_};
  const Reg remotes[] = {dst_, dst_nowrite_, dst_noatomic_, a_remote_, cuda_dst_, healthy_dst_};
  auto address_in = [&](const Reg& r) -> uint64_t {
    switch (pick(4)) {
      case 0: return r.iova + pick(r.len);
      case 1: return r.iova + r.len - pick(80);
      case 2: return r.iova - pick(80);
      default: return rng();
    }
  };
  auto length = [&]() -> uint32_t {
    switch (pick(5)) {
      case 0: return static_cast<uint32_t>(pick(4) * 4);
      case 1: return static_cast<uint32_t>(pick(300));
      case 2: return static_cast<uint32_t>(pick(5000));
      case 3: return static_cast<uint32_t>(rng());
      default: return 8;
    }
  };
  constexpr int kWqes = 12000;
  constexpr uint32_t kBatch = 16;
  int posted = 0, errors = 0, successes = 0;
  while (posted < kWqes) {
    auto qp = NewQp(kBatch, kBatch);
    ASSERT_NE(qp, nullptr);
    for (uint32_t i = 0; i < kBatch; ++i) {
      const auto idx = static_cast<uint16_t>(i);
      Wqe64 w;
      if (pick(4) != 0) {
        BuildValidWqe(rng, *qp, idx, &w);
        if (fences && pick(3) == 0) w.word[2] |= uint32_t{mlx5::kCtrlFence} << 24;
        qp->Write(w);
        continue;
      }
      for (uint32_t& word : w.word) word = static_cast<uint32_t>(rng());
      const Reg& l = locals[pick(std::size(locals))];
      const Reg& r = remotes[pick(std::size(remotes))];
      const uint32_t lkey = pick(8) == 0 ? static_cast<uint32_t>(rng()) : l.key;
      const uint32_t rkey = pick(8) == 0 ? static_cast<uint32_t>(rng()) : r.key;
      switch (pick(8)) {
        case 0: break;  // noise with a valid index and qpn
        case 1:
          mlx5::build_rdma_write(&w, idx, qp->qpn(), kUpd, address_in(r), rkey, address_in(l), lkey,
                                 length());
          break;
        case 2: {
          uint8_t payload[mlx5::kMaxInlineBytes];
          for (uint8_t& b : payload) b = static_cast<uint8_t>(rng());
          mlx5::build_rdma_write_inline(&w, idx, qp->qpn(), kUpd, address_in(r), rkey, payload,
                                        static_cast<uint32_t>(1 + pick(mlx5::kMaxInlineBytes)));
          if (pick(4) == 0) w.word[8] = mlx5::be32(mlx5::kInlineSeg | length());
          break;
        }
        case 3:
          mlx5::build_atomic_fa64(&w, idx, qp->qpn(), kUpd, address_in(r) & ~uint64_t{pick(2) * 7},
                                  rkey, rng(), address_in(l), lkey);
          break;
        case 4:
          mlx5::build_masked_fa32(&w, idx, qp->qpn(), kUpd, address_in(r) & ~uint64_t{pick(2) * 3},
                                  rkey, static_cast<uint32_t>(rng()), address_in(l), lkey);
          w.word[9] = static_cast<uint32_t>(rng());
          break;
        case 5: mlx5::build_nop(&w, idx, qp->qpn(), kUpd); break;
        case 6:
          mlx5::build_rdma_write_imm(&w, idx, qp->qpn(), kUpd, address_in(r), rkey, address_in(l),
                                     lkey, length(), static_cast<uint32_t>(rng()));
          break;
        default:
          // One word of a valid write replaced.
          mlx5::build_rdma_write(&w, idx, qp->qpn(), kUpd, r.iova, r.key, l.iova, l.key, 16);
          w.word[pick(16)] = static_cast<uint32_t>(rng());
          break;
      }
      if (pick(40) != 0) {
        // Mostly keep index and qpn, so the WQE gets past the ctrl checks.
        const uint32_t w0 = mlx5::be32(w.word[0]);
        w.word[0] = mlx5::be32((w0 & 0xff0000ffu) | (uint32_t{idx} << 8));
        w.word[1] = mlx5::be32((qp->qpn() << 8) | (mlx5::be32(w.word[1]) & 0xffu));
      }
      // Every WQE asks for a CQE, so each must get exactly one.
      w.word[2] |= uint32_t{kUpd} << 24;
      if (fences && pick(3) == 0) w.word[2] |= uint32_t{mlx5::kCtrlFence} << 24;
      qp->Write(w);
    }
    qp->Ring();
    bool failed = false;
    for (uint32_t i = 0; i < kBatch; ++i) {
      Cqe64 c;
      ASSERT_TRUE(qp->Next(&c)) << "WQE " << posted + i << " got no CQE";
      EXPECT_EQ(CqeCounter(c), i);
      EXPECT_EQ(CqeQpn(c), qp->qpn());
      if (CqeOpcode(c) == mlx5::kCqeReqErr) {
        if (failed) {
          EXPECT_EQ(CqeSyndrome(c), mlx5::kSyndWrFlushErr);
        } else {
          ++errors;
        }
        failed = true;
      } else {
        EXPECT_FALSE(failed) << "a success after an error";
        EXPECT_EQ(CqeOpcode(c), mlx5::kCqeReq);
        ++successes;
      }
    }
    Cqe64 extra;
    EXPECT_FALSE(qp->Peek(&extra)) << "more CQEs than WQEs";
    EXPECT_EQ(FindQp(engine_, qp->qpn()).wqes_done, kBatch);
    ASSERT_TRUE(engine_.DestroyQp(kPdA, qp->qpn()).ok());
    posted += kBatch;
  }
  EXPECT_EQ(Changed({src_, fetch_, dst_, dst_nowrite_, dst_noatomic_, healthy_dst_}), 0u);
  ExpectHealthyQpServed(3);
  // Both outcomes were exercised.
  EXPECT_GT(errors, 100);
  EXPECT_GT(successes, 100);
  std::printf("random WQEs: %d posted, %d QPs failed, %d succeeded\n", posted, errors, successes);
}

}  // namespace
}  // namespace mooncake::softnic
