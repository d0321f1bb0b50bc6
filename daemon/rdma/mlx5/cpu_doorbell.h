// The CPU-assisted doorbell: the fallback for a GPU that cannot map the
// UAR (and, until the UAR hand-off to clients lands, the only mode of the
// mlx5 provider). The client's device code posts WQEs and writes the send
// doorbell record as for any mlx5 QP, with no UAR of its own
// (IbgdaQpDevCtx::bf_reg null); a daemon thread watches the record and,
// when it advances, rings the session's UAR doorbell register with the
// first 8 bytes of the last posted WQE's control segment, as libmlx5's
// post_send and device/mlx5/qp_ops.h ring it.
//
// NextDoorbell is the pure part (tests/daemon/cpu_doorbell_test.cc): which
// WQE to ring for, read from the client's memory. CpuDoorbell is the thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"

namespace mooncake::daemon::mlx5 {

// What to write to the doorbell register for one advance of the send
// counter.
struct DoorbellRing {
  uint16_t counter = 0;  // the send counter rung for (the new last_rung)
  // The 8 bytes for the register, in memory order (store them as they are:
  // the NIC takes the control segment's big-endian words): the control
  // segment of WQE counter - 1, with its QPN field replaced by `qpn`.
  uint64_t doorbell = 0;
};

// The QP's send doorbell record `dbrec` (8 bytes: [1] is the big-endian
// send counter, of which the low 16 bits count), its send queue `sq`
// (sq_wqe_cnt 64-byte basic blocks; every WQE the Device API posts is one
// block) and the counter last rung for. Returns nothing while the counter
// has not moved; else the ring for the WQE just before the counter (the
// 16-bit counter wraps: 0 follows 0xffff, and WQE 0xffff lies at slot
// 0xffff mod sq_wqe_cnt). The record and the ring are client memory read
// once each, with atomic loads (the client writes them concurrently): the
// record with acquire, so the WQE the client wrote before it is seen. The
// QPN is forced to the QP's own so that a client cannot make the daemon
// ring for a QP other than the one whose record moved; everything else is
// the client's (a wrong WQE errors only its own QP, as it would had the
// client rung itself).
std::optional<DoorbellRing> NextDoorbell(const uint8_t* sq, uint32_t sq_wqe_cnt,
                                         const uint8_t* dbrec, uint16_t last_rung, uint32_t qpn);

// Writes `doorbell` to the 8-byte UAR register at `reg`, after a store
// fence (the WQE and record reads above are ordered before it; write
// combining BlueFlame pages need the fence after too).
void RingDoorbell(volatile void* reg, uint64_t doorbell);

// The watcher thread: one for the mlx5 provider. Watch() from Connect (a QP
// in RTS), Unwatch() before the QP, its UAR or its rings go away: Unwatch
// returns once the thread no longer touches them. Thread-safe.
class CpuDoorbell {
 public:
  struct Qp {
    const uint8_t* sq = nullptr;
    uint32_t sq_wqe_cnt = 0;
    const uint8_t* dbrec = nullptr;
    uint32_t qpn = 0;
    volatile void* reg = nullptr;            // the session's UAR doorbell register
    std::shared_ptr<const void> keep_alive;  // the rings' mapping
  };
  // `max_idle_sleep_us`: longest sleep between polls while idle (it spins
  // for spin_us after the last ring, then sleeps, doubling from 1 us). With
  // no QP watched the thread waits until one is (no wakeups at all).
  explicit CpuDoorbell(uint32_t max_idle_sleep_us = 100, uint32_t spin_us = 200);
  ~CpuDoorbell();  // stops the thread
  CpuDoorbell(const CpuDoorbell&) = delete;
  CpuDoorbell& operator=(const CpuDoorbell&) = delete;

  // Key: a provider-wide id for the QP (its session and QPN).
  void Watch(uint64_t key, Qp qp);
  void Unwatch(uint64_t key);
  size_t watched() const;
  uint64_t rings() const { return rings_.load(std::memory_order_relaxed); }

 private:
  struct Entry {
    Qp qp;
    uint16_t last_rung = 0;
  };
  void Run();
  // One pass over every QP; true if it rang any.
  bool PollOnce() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const uint32_t max_idle_sleep_us_;
  const uint32_t spin_us_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, Entry> qps_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> rings_{0};
  std::thread thread_;
};

}  // namespace mooncake::daemon::mlx5
