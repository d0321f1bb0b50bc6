#include "rdma/mlx5/cpu_doorbell.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

namespace mooncake::daemon::mlx5 {

namespace {

constexpr int kSendCounterWord = 1;  // the doorbell record's [1]: the send counter

uint32_t LoadBe32(const uint8_t* p, int memory_order) {
  uint32_t raw = __atomic_load_n(reinterpret_cast<const uint32_t*>(p), memory_order);
  return __builtin_bswap32(raw);
}

}  // namespace

std::optional<DoorbellRing> NextDoorbell(const uint8_t* dbrec, uint16_t last_rung, uint32_t qpn) {
  // Acquire: the client releases the record after the WQEs it announces.
  const uint16_t counter =
      static_cast<uint16_t>(LoadBe32(dbrec + 4 * kSendCounterWord, __ATOMIC_ACQUIRE) & 0xffffu);
  if (counter == last_rung) return std::nullopt;
  const uint32_t words[2] = {__builtin_bswap32(uint32_t{counter} << 8),
                             __builtin_bswap32((qpn & 0xffffffu) << 8)};
  DoorbellRing ring;
  ring.counter = counter;
  std::memcpy(&ring.doorbell, words, 8);
  return ring;
}

void RingDoorbell(volatile void* reg, uint64_t doorbell) {
  // The NIC fetches the WQEs by DMA once it sees the doorbell: every store
  // and load before it is ordered first (libmlx5: udma_to_device_barrier,
  // then mmio_wc_start), and a write-combining page is flushed after.
  std::atomic_thread_fence(std::memory_order_seq_cst);
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_sfence();
#endif
  *static_cast<volatile uint64_t*>(reg) = doorbell;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_sfence();
#else
  std::atomic_thread_fence(std::memory_order_seq_cst);
#endif
}

CpuDoorbell::CpuDoorbell(uint32_t max_idle_sleep_us, uint32_t spin_us)
    : max_idle_sleep_us_(std::max<uint32_t>(max_idle_sleep_us, 1)),
      spin_us_(std::min(spin_us, kMaxSpinWindowUs)) {
  thread_ = std::thread([this] { Run(); });
}

CpuDoorbell::~CpuDoorbell() {
  {
    // Under mu_: wakes a thread waiting for its first QP.
    absl::MutexLock lock(&mu_);
    stop_.store(true);
  }
  if (thread_.joinable()) thread_.join();
}

void CpuDoorbell::Watch(uint64_t key, Qp qp) {
  absl::MutexLock lock(&mu_);
  // From the counter as it is now: the client posts only once the QP is in
  // RTS, after this call.
  const uint16_t now =
      static_cast<uint16_t>(LoadBe32(qp.dbrec + 4 * kSendCounterWord, __ATOMIC_ACQUIRE) & 0xffffu);
  qps_[key] = Entry{std::move(qp), now};
}

void CpuDoorbell::Unwatch(uint64_t key) {
  // The thread polls under mu_: once this returns it is not inside the QP.
  absl::MutexLock lock(&mu_);
  qps_.erase(key);
}

size_t CpuDoorbell::watched() const {
  absl::MutexLock lock(&mu_);
  return qps_.size();
}

bool CpuDoorbell::PollOnce() {
  bool rang = false;
  for (auto& [key, e] : qps_) {
    std::optional<DoorbellRing> ring = NextDoorbell(e.qp.dbrec, e.last_rung, e.qp.qpn);
    if (!ring) continue;
    RingDoorbell(e.qp.reg, ring->doorbell);
    e.last_rung = ring->counter;
    rings_.fetch_add(1, std::memory_order_relaxed);
    rang = true;
  }
  return rang;
}

void CpuDoorbell::Run() {
  using Clock = std::chrono::steady_clock;
  Clock::time_point last_work = Clock::now();
  // Running average of the gaps between rings (us), and the spin window
  // it gives.
  double gap_avg_us = spin_us_;
  uint32_t sleep_us = 1;
  while (!stop_.load(std::memory_order_relaxed)) {
    bool rang = false;
    bool any = false;
    {
      // Nothing watched: sleep until a QP is (no wakeups on an idle node).
      mu_.LockWhen(absl::Condition(
          +[](CpuDoorbell* self)
               ABSL_NO_THREAD_SAFETY_ANALYSIS { return !self->qps_.empty() || self->stop_.load(); },
          this));
      any = !qps_.empty();
      rang = PollOnce();
      mu_.Unlock();
    }
    const Clock::time_point now = Clock::now();
    if (rang) {
      const double gap = std::chrono::duration<double, std::micro>(now - last_work).count();
      gap_avg_us = 0.875 * gap_avg_us + 0.125 * std::min<double>(gap, kMaxSpinWindowUs);
      last_work = now;
      sleep_us = 1;
      continue;
    }
    if (!any) continue;  // stopping
    const double window_us = std::clamp<double>(4 * gap_avg_us, spin_us_, kMaxSpinWindowUs);
    if (now - last_work < std::chrono::duration<double, std::micro>(window_us)) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
      continue;
    }
    // Idle: back off to max_idle_sleep_us.
    std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
    sleep_us = std::min(sleep_us * 2, max_idle_sleep_us_);
  }
}

}  // namespace mooncake::daemon::mlx5
