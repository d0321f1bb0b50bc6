// softnic's send queues (daemon/softnic/engine.cc): the bytes a client writes
// into its rings are the widest input mooncaked takes from a user. Every WQE,
// doorbell record and CQ consumer index here comes from the fuzz input, and
// the engine runs them on its own thread, as in the daemon, against
// registered regions with guard bytes around each.
//
// Input:
//   u8 flags: bit 0 atomics as a ConnectX runs them (AtomicsModel::kHca),
//             bit 1 with a 50 us round trip behind fences, bit 2 a second
//             requester QP, bits 3-4 the ring depth (1, 4, 16 or 64 WQEs),
//             bit 5 a CQ four times deeper than the ring
//   then up to kMaxSteps steps, [u8 op] and op % 4:
//     0 a WQE: [u8 fix][u8 picks][64 bytes] at the QP's next index. The bytes
//       go in as they are, except where `fix` says (so inputs get past the
//       checks that random keys and a random QPN never pass):
//         bit 0: the ctrl segment's index and QPN are this WQE's
//         bit 1: it asks for a CQE (and so gets exactly one)
//         bit 2: bytes 16-31 are a remote address segment: the rkey of
//                remote region picks % 8, an address in or near it (Near)
//         bit 3/4: bytes 32-47 / 48-63 are a data segment: the lkey of local
//                region (picks >> 3) % 8, an address in or near it, and a
//                small byte count where the input's has its top bit set
//         bit 5: on the second requester QP (when there is one)
//         bit 6/7: the fence bit cleared / set
//     1 a doorbell: [u8 how][u16 v]: how % 3: 0 every WQE written, 1 the raw
//       counter v, 2 the written count plus (int8)v
//     2 the CQ consumer index: [u16 k] k + 1 behind what the client read (a
//       client that says it consumed less; an index ahead of what it read
//       only lets the engine overwrite that client's own CQEs, which the
//       reader here does not follow)
//     3 drain: read CQEs and wait until the engine has done what was rung
//   At the end every QP is drained.
//
// Invariants:
// - the engine finishes what a doorbell announces (every WQE up to it, or the
//   QP in error with a doorbell past the ring) within kDrainBound;
// - every CQE names its QP, is a success or an error with a syndrome the
//   engine's table lists, and no success follows an error on a QP;
// - no byte outside the regions a WQE may write changes: guards, regions
//   without the right, regions of the other protection domain;
// - another QP is still served afterwards (its WRITE lands and completes).
// After each input the process has exactly the fds it had before.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "fuzz_support.h"
#include "guarded_regions.h"
#include "mooncake/device/mlx5/prm.h"
#include "mooncake/device/mlx5/wqe.h"
#include "raw_qp.h"
#include "softnic/engine.h"
#include "softnic/shared_mapping.h"

namespace mooncake::softnic {
namespace {

using fuzz::ByteReader;
using test_util::CqeOpcode;
using test_util::CqeQpn;
using test_util::CqeSyndrome;
using test_util::FindQp;
using test_util::RawQp;
namespace mlx5 = test_util::mlx5;

constexpr PdId kPdA = 11;  // the requesters'
constexpr PdId kPdB = 22;  // the responder's
constexpr size_t kMaxSteps = 96;
// What a drain may take: at most 96 WQEs of at most 4 KiB, fences of 50 us,
// on a sanitized build sharing 2 cores with the engine thread.
constexpr auto kDrainBound = std::chrono::seconds(2);

// MC_FUZZ_VERBOSE=1 prints each CQE read (to see what a seed reaches).
bool verbose = false;

using Reg = test_util::GuardedRegion;

// A requester QP and what the client knows of it.
struct Requester {
  std::unique_ptr<RawQp> qp;
  uint32_t sq_cnt = 0;
  uint16_t rung = 0;    // the last doorbell counter written
  bool failed = false;  // an error CQE was read
};

class Harness {
 public:
  explicit Harness(uint8_t flags) : engine_(Options(flags)), regions_(64 << 10) {
    // As wqe_test.cc lays them out: what each WQE kind may and may not reach.
    src_ = Add(kPdA, 4096, kLocalWrite);
    src_ro_ = Add(kPdA, 256, 0);
    fetch_ = Add(kPdA, 64, kLocalWrite);
    a_remote_ = Add(kPdA, 256, kRemoteWrite | kRemoteAtomic);  // the requester's pd
    b_local_ = Add(kPdB, 256, kLocalWrite);                    // the responder's pd
    dst_ = Add(kPdB, 4096, kRemoteWrite | kRemoteAtomic);
    dst_nowrite_ = Add(kPdB, 256, kRemoteRead | kRemoteAtomic);
    dst_noatomic_ = Add(kPdB, 256, kRemoteWrite);
    healthy_dst_ = Add(kPdB, 4096, kRemoteWrite);
    for (uint64_t i = 0; i < src_.len; ++i) Host(src_)[i] = static_cast<uint8_t>(i * 131 + 7);
    regions_.Snapshot();

    responder_ = RawQp::Create(engine_, kPdB, 1, 1);
    FUZZ_CHECK(responder_ != nullptr, "responder QP");
    const uint32_t depth = 1u << (2 * ((flags >> 3) & 3));
    const uint32_t cq = (flags & 32) != 0 ? 4 * depth : depth;
    requesters_.push_back(NewRequester(depth, cq));
    if ((flags & 4) != 0) requesters_.push_back(NewRequester(depth, cq));
    healthy_ = NewRequester(16, 16);
    engine_.Start();
  }
  ~Harness() { engine_.Stop(); }

  void Step(ByteReader& in) {
    const uint8_t op = in.U8();
    switch (op % 4) {
      case 0: {
        const uint8_t fix = in.U8();
        const uint8_t picks = in.U8();
        uint8_t bytes[64] = {};
        const auto raw = in.Bytes(64);
        std::memcpy(bytes, raw.data(), raw.size());
        Requester& r = requesters_[(fix & 32) != 0 ? requesters_.size() - 1 : 0];
        PostWqe(r, fix, picks, bytes);
        break;
      }
      case 1: {
        const uint8_t how = in.U8();
        const uint16_t v = in.U16();
        Requester& r = requesters_[how / 3 % requesters_.size()];
        const auto written = static_cast<uint16_t>(r.qp->pi());
        r.rung = how % 3 == 0   ? written
                 : how % 3 == 1 ? v
                                : static_cast<uint16_t>(written + static_cast<int8_t>(v));
        r.qp->RingRaw(r.rung);
        break;
      }
      case 2: {
        const uint16_t k = in.U16();
        Requester& r = requesters_[k % requesters_.size()];
        const auto ci = static_cast<uint32_t>(r.qp->cqes_seen() - (uint64_t{k} + 1));
        std::atomic_ref<uint32_t>(r.qp->cq_dbrec()[mlx5::kCqSetCi])
            .store(mlx5::be32(ci & mlx5::kCqCiMask), std::memory_order_release);
        break;
      }
      default:
        for (Requester& r : requesters_) Drain(r);
        break;
    }
  }

  void Finish() {
    for (Requester& r : requesters_) Drain(r);
    // Nothing changed outside what a WQE may write: a fetched value lands in
    // a local region with local write (src, fetch), WRITEs and atomics in
    // the responder's regions with the right (dst, dst_noatomic for WRITEs,
    // dst_nowrite for atomics, healthy_dst).
    const size_t changed =
        regions_.Changed({src_, fetch_, dst_, dst_nowrite_, dst_noatomic_, healthy_dst_});
    FUZZ_CHECK(changed == 0, changed, " bytes changed outside the regions WQEs may write");
    for (const Reg& r : {src_ro_, a_remote_, b_local_}) {
      FUZZ_CHECK(std::memcmp(Host(r), regions_.snapshot(r), r.len) == 0,
                 "a region no WQE may write changed (key ", r.key, ")");
    }
    ExpectHealthyQpServed();
  }

 private:
  static EngineOptions Options(uint8_t flags) {
    EngineOptions o;
    o.atomics = (flags & 1) != 0 ? AtomicsModel::kHca : AtomicsModel::kDevice;
    o.hca_round_trip_us = (flags & 2) != 0 ? 50 : 0;
    o.spin_us = 50;
    o.max_idle_sleep_us = 50;
    return o;
  }

  Reg Add(PdId pd, uint64_t len, uint32_t access) {
    const Reg r = regions_.Add(engine_, pd, len, access);
    FUZZ_CHECK(r.key != 0, "region of ", len, " bytes refused");
    return r;
  }
  uint8_t* Host(const Reg& r) const { return regions_.Host(r); }

  Requester NewRequester(uint32_t sq, uint32_t cq) {
    Requester r;
    r.qp = RawQp::Create(engine_, kPdA, sq, cq);
    FUZZ_CHECK(r.qp != nullptr, "requester QP");
    r.sq_cnt = sq;
    const absl::Status s = engine_.Connect(kPdA, r.qp->qpn(), responder_->qpn());
    FUZZ_CHECK(s.ok(), s);
    return r;
  }

  // An address in or near `r`, by raw's low two bits: inside, up to 95
  // bytes before its end, up to 95 bytes before its start, or anywhere
  // within 80 bytes of it: where an off-by-some check lets bytes through.
  static uint64_t Near(const Reg& r, uint64_t raw) {
    const uint64_t v = raw >> 2;
    switch (raw & 3) {
      case 0: return r.iova + v % r.len;
      case 1: return r.iova + r.len - v % 96;
      case 2: return r.iova - v % 96;
      default: return r.iova - 80 + v % (r.len + 160);
    }
  }
  // A data segment's byte count: with the top bit set in the input, a small
  // one (1..128), so that lengths meet the addresses above.
  static uint32_t Length(uint32_t raw) { return (raw & 0x80000000u) != 0 ? 1 + raw % 128 : raw; }

  void PostWqe(Requester& r, uint8_t fix, uint8_t picks, uint8_t (&bytes)[64]) {
    const Reg locals[8] = {src_, src_ro_, fetch_, b_local_, dst_, a_remote_, healthy_dst_, fetch_};
    const Reg remotes[8] = {dst_,         dst_nowrite_, dst_noatomic_, a_remote_,
                            healthy_dst_, src_,         b_local_,      dst_};
    auto* ctrl = reinterpret_cast<mlx5::WqeCtrlSeg*>(bytes);
    if ((fix & 1) != 0) {
      const uint32_t w0 = mlx5::be32(ctrl->opmod_idx_opcode_be);
      ctrl->opmod_idx_opcode_be = mlx5::be32((w0 & 0xff0000ffu) | ((r.qp->pi() & 0xffffu) << 8));
      ctrl->qpn_ds_be = mlx5::be32((r.qp->qpn() << 8) | (mlx5::be32(ctrl->qpn_ds_be) & 0xffu));
    }
    if ((fix & 2) != 0) ctrl->fm_ce_se |= mlx5::kCtrlCqUpdate;
    if ((fix & 64) != 0) ctrl->fm_ce_se &= static_cast<uint8_t>(~mlx5::kCtrlFence);
    if ((fix & 128) != 0) ctrl->fm_ce_se |= mlx5::kCtrlFence;
    if ((fix & 4) != 0) {
      auto* raddr = reinterpret_cast<mlx5::WqeRaddrSeg*>(bytes + 16);
      const Reg& reg = remotes[picks % 8];
      raddr->raddr_be = mlx5::be64(Near(reg, mlx5::be64(raddr->raddr_be)));
      raddr->rkey_be = mlx5::be32(reg.key);
    }
    for (int seg = 0; seg < 2; ++seg) {
      if ((fix & (8 << seg)) == 0) continue;
      auto* data = reinterpret_cast<mlx5::WqeDataSeg*>(bytes + 32 + 16 * seg);
      const Reg& reg = locals[(picks >> 3) % 8];
      data->addr_be = mlx5::be64(Near(reg, mlx5::be64(data->addr_be)));
      data->lkey_be = mlx5::be32(reg.key);
      data->byte_count_be = mlx5::be32(Length(mlx5::be32(data->byte_count_be)));
    }
    mlx5::Wqe64 w;
    std::memcpy(&w, bytes, 64);
    r.qp->Write(w);
  }

  // Reads r's new CQEs, checking each, and says it consumed them.
  void ReadCqes(Requester& r) {
    mlx5::Cqe64 c;
    while (r.qp->WaitNext(&c, std::chrono::milliseconds(0))) {
      FUZZ_CHECK(CqeQpn(c) == r.qp->qpn(), "a CQE names QP ", CqeQpn(c), ", not ", r.qp->qpn());
      const uint8_t opcode = CqeOpcode(c);
      if (verbose) {
        std::fprintf(stderr, "wqe_ring_fuzzer: QP %u CQE %u opcode %u syndrome 0x%02x\n",
                     r.qp->qpn(), unsigned{test_util::CqeCounter(c)}, unsigned{opcode},
                     unsigned{CqeSyndrome(c)});
      }
      FUZZ_CHECK(opcode == mlx5::kCqeReq || opcode == mlx5::kCqeReqErr, "CQE opcode ", int{opcode});
      if (opcode == mlx5::kCqeReq) {
        FUZZ_CHECK(!r.failed, "a success after an error on QP ", r.qp->qpn());
        continue;
      }
      r.failed = true;
      switch (CqeSyndrome(c)) {
        case mlx5::kSyndLocalLengthErr:
        case mlx5::kSyndLocalQpOpErr:
        case mlx5::kSyndLocalProtErr:
        case mlx5::kSyndWrFlushErr:
        case mlx5::kSyndRemoteInvalReqErr:
        case mlx5::kSyndRemoteAccessErr:
        case mlx5::kSyndTransportRetryExcErr: break;
        default: FUZZ_CHECK(false, "error CQE with syndrome ", int{CqeSyndrome(c)});
      }
    }
    r.qp->Consume();
  }

  // Until the engine has done every WQE up to r's doorbell, or r is in error
  // with a doorbell past its ring (which a QP in error ignores for good).
  void Drain(Requester& r) {
    const auto deadline = std::chrono::steady_clock::now() + kDrainBound;
    for (;;) {
      ReadCqes(r);
      const QpInfo info = FindQp(engine_, r.qp->qpn());
      const auto done = static_cast<uint16_t>(info.wqes_done);
      if (done == r.rung) return;
      if (info.state == QpState::kError && static_cast<uint16_t>(r.rung - done) > r.sq_cnt) return;
      FUZZ_CHECK(std::chrono::steady_clock::now() < deadline, "QP ", r.qp->qpn(), " did ", done,
                 " WQEs of the ", r.rung, " its doorbell announced in ",
                 std::chrono::duration_cast<std::chrono::milliseconds>(kDrainBound).count(),
                 " ms (state ", static_cast<int>(info.state), ")");
      std::this_thread::yield();
    }
  }

  // The bystander: one WRITE on a QP the input never touched lands.
  void ExpectHealthyQpServed() {
    mlx5::Wqe64 w;
    mlx5::build_rdma_write(&w, static_cast<uint16_t>(healthy_.qp->pi()), healthy_.qp->qpn(),
                           mlx5::kCtrlCqUpdate, healthy_dst_.iova, healthy_dst_.key, src_.iova,
                           src_.key, 64);
    healthy_.qp->Write(w);
    healthy_.qp->Ring();
    mlx5::Cqe64 c;
    FUZZ_CHECK(healthy_.qp->Next(&c, std::chrono::milliseconds(2000)),
               "the bystander QP got no CQE");
    FUZZ_CHECK(CqeOpcode(c) == mlx5::kCqeReq, "the bystander's WRITE failed, syndrome ",
               int{CqeSyndrome(c)});
    FUZZ_CHECK(std::memcmp(Host(healthy_dst_), Host(src_), 64) == 0,
               "the bystander's WRITE did not land");
  }

  Engine engine_;
  test_util::GuardedRegions regions_;
  Reg src_, src_ro_, fetch_, a_remote_, b_local_, dst_, dst_nowrite_, dst_noatomic_, healthy_dst_;
  std::unique_ptr<RawQp> responder_;
  std::vector<Requester> requesters_;
  Requester healthy_;
};

}  // namespace
}  // namespace mooncake::softnic

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  mooncake::fuzz::QuietLogs();
  mooncake::softnic::verbose = std::getenv("MC_FUZZ_VERBOSE") != nullptr;
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  mooncake::fuzz::ExpectFdsKept([&] {
    mooncake::fuzz::ByteReader in(data, size);
    mooncake::softnic::Harness h(in.U8());
    for (size_t i = 0; i < mooncake::softnic::kMaxSteps && !in.empty(); ++i) h.Step(in);
    h.Finish();
  });
  return 0;
}
