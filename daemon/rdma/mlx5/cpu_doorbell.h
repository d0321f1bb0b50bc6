// The CPU-assisted doorbell: the fallback for a GPU that cannot map the
// UAR (and, until the UAR hand-off to clients lands, the only mode of the
// mlx5 provider). The client's device code posts WQEs and writes the send
// doorbell record as for any mlx5 QP, with no UAR of its own
// (IbgdaQpDevCtx::bf_reg null); a daemon thread watches the record and,
// when it advances, rings the session's UAR doorbell register from the
// new producer index and the QPN alone, as NVSHMEM's IBGDA rings
// (opmod_idx_opcode = index << 8, qpn_ds = qpn << 8). It never reads the
// client's WQEs (issue 24 item 6): once the NIC has consumed a slot the
// client may already be writing the next WQE there, so a read of "the last
// WQE" races, and it costs a cache miss per ring.
//
// NextDoorbell is the pure part (tests/daemon/cpu_doorbell_test.cc): what
// to ring for one record. CpuDoorbell is the thread.
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
  // The 8 bytes for the register, in memory order (store them as they are):
  // be32(counter << 8) then be32(qpn << 8), a control segment's first two
  // words with opcode, opmod and ds zero.
  uint64_t doorbell = 0;
};

// The QP's send doorbell record `dbrec` (8 bytes: [1] is the big-endian
// send counter, of which the low 16 bits count) and the counter last rung
// for. Returns nothing while the counter has not moved; else the ring for
// the counter (16 bits, wrapping: 0 follows 0xffff). The record is client
// memory, read once with an acquire load (the client writes it
// concurrently, after its WQEs). The QPN is the QP's own, so a client
// cannot make the daemon ring for a QP other than the one whose record
// moved.
std::optional<DoorbellRing> NextDoorbell(const uint8_t* dbrec, uint16_t last_rung, uint32_t qpn);

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
    const uint8_t* dbrec = nullptr;
    uint32_t qpn = 0;
    volatile void* reg = nullptr;            // the session's UAR doorbell register
    std::shared_ptr<const void> keep_alive;  // the rings' mapping
  };
  // While QPs are active it spins: for a window after each ring that
  // adapts to the gaps between rings (four times their running average,
  // at least `spin_us`, at most kMaxSpinWindow), so a steady stream of
  // posts is rung within microseconds however far apart the posts are up
  // to that bound. Past the window it sleeps, doubling from 1 us up to
  // `max_idle_sleep_us` (a `spin_us` past kMaxSpinWindowUs is taken as
  // that). With no QP watched the thread waits until one is
  // (no wakeups at all).
  static constexpr uint32_t kMaxSpinWindowUs = 10000;
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
