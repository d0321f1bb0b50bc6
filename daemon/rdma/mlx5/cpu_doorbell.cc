#include "rdma/mlx5/cpu_doorbell.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

namespace mooncake::daemon::mlx5 {

namespace {

constexpr uint32_t kWqeBasicBlock = 64;
constexpr int kSendCounterWord = 1;  // the doorbell record's [1]: the send counter

uint32_t LoadBe32(const uint8_t* p, int memory_order) {
  uint32_t raw = __atomic_load_n(reinterpret_cast<const uint32_t*>(p), memory_order);
  return __builtin_bswap32(raw);
}

}  // namespace

std::optional<DoorbellRing> NextDoorbell(const uint8_t* sq, uint32_t sq_wqe_cnt,
                                         const uint8_t* dbrec, uint16_t last_rung, uint32_t qpn) {
  // Acquire: the client releases the record after the WQEs it announces.
  const uint16_t counter =
      static_cast<uint16_t>(LoadBe32(dbrec + 4 * kSendCounterWord, __ATOMIC_ACQUIRE) & 0xffffu);
  if (counter == last_rung) return std::nullopt;
  // The WQE before the counter; uint16_t arithmetic wraps 0 to 0xffff.
  const uint16_t last_wqe = static_cast<uint16_t>(counter - 1);
  const uint8_t* ctrl = sq + static_cast<uint64_t>(last_wqe & (sq_wqe_cnt - 1)) * kWqeBasicBlock;
  // Control segment bytes 0..3: opmod | wqe index | opcode; 4..6: QPN; 7: ds.
  uint32_t word0 = __atomic_load_n(reinterpret_cast<const uint32_t*>(ctrl), __ATOMIC_RELAXED);
  const uint32_t word1 =
      __atomic_load_n(reinterpret_cast<const uint32_t*>(ctrl + 4), __ATOMIC_RELAXED);
  uint8_t bytes[8];
  std::memcpy(bytes, &word0, 4);
  std::memcpy(bytes + 4, &word1, 4);
  bytes[4] = static_cast<uint8_t>(qpn >> 16);
  bytes[5] = static_cast<uint8_t>(qpn >> 8);
  bytes[6] = static_cast<uint8_t>(qpn);
  DoorbellRing ring;
  ring.counter = counter;
  std::memcpy(&ring.doorbell, bytes, 8);
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
    : max_idle_sleep_us_(std::max<uint32_t>(max_idle_sleep_us, 1)), spin_us_(spin_us) {
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
    std::optional<DoorbellRing> ring =
        NextDoorbell(e.qp.sq, e.qp.sq_wqe_cnt, e.qp.dbrec, e.last_rung, e.qp.qpn);
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
    if (rang) {
      last_work = Clock::now();
      sleep_us = 1;
      continue;
    }
    if (any && Clock::now() - last_work < std::chrono::microseconds(spin_us_)) continue;
    if (!any) continue;  // stopping
    // Idle: back off to max_idle_sleep_us.
    std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
    sleep_us = std::min(sleep_us * 2, max_idle_sleep_us_);
  }
}

}  // namespace mooncake::daemon::mlx5
