// Test side of the softnic contract at the byte level: a client that owns a
// QP's rings (send queue, doorbell records, CQ) in a SharedMapping, writes
// raw 64-byte WQEs, rings the doorbell and reads CQEs itself, so a test can
// post anything, including what the Device API never would.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>

#include "mooncake/device/mlx5/prm.h"
#include "mooncake/device/mlx5/wqe.h"
#include "softnic/engine.h"
#include "softnic/shared_mapping.h"

namespace mooncake::softnic::test_util {

namespace mlx5 = ::mooncake::device::mlx5;

// A QP's rings as a client lays them out: [sq][cq][sq dbrec][cq dbrec].
class RawQp {
 public:
  // `rings`: the memory to lay the rings out in (SQ, CQ, then the two
  // doorbell records; at least sq_cnt * 64 + cq_cnt * 64 + 64 bytes), or
  // anonymous memory of the test's own.
  static std::unique_ptr<RawQp> Create(Engine& engine, PdId pd, uint32_t sq_cnt, uint32_t cq_cnt,
                                       std::shared_ptr<SharedMapping> rings = nullptr) {
    auto qp = std::unique_ptr<RawQp>(new RawQp());
    qp->pd_ = pd;
    qp->sq_cnt_ = sq_cnt;
    qp->cq_cnt_ = cq_cnt;
    const uint64_t sq_bytes = uint64_t{sq_cnt} * 64, cq_bytes = uint64_t{cq_cnt} * 64;
    if (rings == nullptr) {
      auto mapping = SharedMapping::Anonymous(sq_bytes + cq_bytes + 64);
      if (!mapping.ok()) return nullptr;
      rings = *mapping;
    }
    if (rings->size() < sq_bytes + cq_bytes + 64) return nullptr;
    qp->ctl_ = std::move(rings);
    uint8_t* base = qp->ctl_->data();
    qp->sq_ = base;
    qp->cq_ = base + sq_bytes;
    qp->sq_dbrec_ = reinterpret_cast<uint32_t*>(base + sq_bytes + cq_bytes);
    qp->cq_dbrec_ = reinterpret_cast<uint32_t*>(base + sq_bytes + cq_bytes + 32);
    std::memset(qp->cq_, 0xff, cq_bytes);
    QpSpec spec;
    spec.pd = pd;
    spec.mapping = qp->ctl_;
    spec.sq_offset = 0;
    spec.sq_wqe_cnt = sq_cnt;
    spec.cq_offset = sq_bytes;
    spec.cq_cqe_cnt = cq_cnt;
    spec.sq_dbrec_offset = sq_bytes + cq_bytes;
    spec.cq_dbrec_offset = sq_bytes + cq_bytes + 32;
    auto qpn = engine.CreateQp(spec);
    if (!qpn.ok()) return nullptr;
    qp->qpn_ = *qpn;
    return qp;
  }

  uint32_t qpn() const { return qpn_; }
  PdId pd() const { return pd_; }
  // Index of the next WQE to write.
  uint32_t pi() const { return pi_; }
  uint64_t cqes_seen() const { return ci_; }
  uint8_t* sq() const { return sq_; }
  mlx5::Cqe64* cq() const { return reinterpret_cast<mlx5::Cqe64*>(cq_); }
  // The CQ doorbell record (its kCqSetCi word is the consumer index the
  // engine reads; Consume writes it).
  uint32_t* cq_dbrec() const { return cq_dbrec_; }

  // Writes `w` at the next index (w's index/qpn are used as they are).
  void Write(const mlx5::Wqe64& w) {
    std::memcpy(sq_ + (pi_ & (sq_cnt_ - 1)) * 64, &w, 64);
    ++pi_;
  }
  void Ring() { RingRaw(pi_ & 0xffffu); }
  void RingRaw(uint32_t counter) {
    std::atomic_ref<uint32_t>(sq_dbrec_[mlx5::kSndDbr])
        .store(mlx5::be32(counter), std::memory_order_release);
  }

  // The CQE at consumer index ci_ if the engine has written it.
  bool Peek(mlx5::Cqe64* out) const { return PeekAt(ci_, out); }
  bool PeekAt(uint64_t ci, mlx5::Cqe64* out) const {
    const uint8_t* slot = cq_ + (ci & (cq_cnt_ - 1)) * 64;
    const uint32_t tail =
        std::atomic_ref<uint32_t>(*reinterpret_cast<uint32_t*>(const_cast<uint8_t*>(slot) + 60))
            .load(std::memory_order_acquire);
    const auto op_own = static_cast<uint8_t>(tail >> 24);
    if (mlx5::cqe_opcode(op_own) == mlx5::kCqeInvalid ||
        mlx5::cqe_owner(op_own) != mlx5::cqe_expected_owner(ci, cq_cnt_)) {
      return false;
    }
    std::memcpy(out, slot, 64);
    return true;
  }

  // Waits (polling, up to `timeout`) for the next CQE; reads it without
  // telling the engine (see Consume).
  bool WaitNext(mlx5::Cqe64* out, std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!Peek(out)) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::yield();
    }
    ++ci_;
    return true;
  }
  // Tells the engine every CQE read so far is consumed.
  void Consume() {
    std::atomic_ref<uint32_t>(cq_dbrec_[mlx5::kCqSetCi])
        .store(mlx5::be32(static_cast<uint32_t>(ci_) & mlx5::kCqCiMask), std::memory_order_release);
  }
  // WaitNext + Consume.
  bool Next(mlx5::Cqe64* out, std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    if (!WaitNext(out, timeout)) return false;
    Consume();
    return true;
  }

 private:
  RawQp() = default;
  std::shared_ptr<SharedMapping> ctl_;
  PdId pd_ = 0;
  uint32_t qpn_ = 0, sq_cnt_ = 0, cq_cnt_ = 0;
  uint8_t* sq_ = nullptr;
  uint8_t* cq_ = nullptr;
  uint32_t* sq_dbrec_ = nullptr;
  uint32_t* cq_dbrec_ = nullptr;
  uint32_t pi_ = 0;
  uint64_t ci_ = 0;
};

// CQE fields.
inline uint8_t CqeOpcode(const mlx5::Cqe64& c) { return mlx5::cqe_opcode(c.op_own); }
inline uint8_t CqeSyndrome(const mlx5::Cqe64& c) {
  return reinterpret_cast<const uint8_t*>(&c)[mlx5::kCqeSyndromeByte];
}
inline uint16_t CqeCounter(const mlx5::Cqe64& c) { return mlx5::be16(c.wqe_counter_be); }
inline uint32_t CqeQpn(const mlx5::Cqe64& c) { return mlx5::be32(c.sop_drop_qpn_be) & 0xffffffu; }
inline uint32_t CqeBytes(const mlx5::Cqe64& c) { return mlx5::be32(c.byte_cnt_be); }

inline QpInfo FindQp(const Engine& engine, uint32_t qpn) {
  for (const QpInfo& q : engine.ListQps()) {
    if (q.qpn == qpn) return q;
  }
  return QpInfo{};
}

}  // namespace mooncake::softnic::test_util
