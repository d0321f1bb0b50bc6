#include "softnic/gpu_workers.h"

#include <chrono>
#include <utility>

namespace mooncake::softnic {

GpuWorkers::GpuWorkers(size_t threads)
    : max_threads_(threads == 0 ? 1 : threads),
      per_owner_(max_threads_ > 1 ? max_threads_ - 1 : 1) {}

GpuWorkers::~GpuWorkers() { Drain(); }

size_t GpuWorkers::threads() const {
  absl::MutexLock lock(&mu_);
  return threads_.size();
}

size_t GpuWorkers::waiting() const {
  absl::MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& [pd, queue] : queued_) n += queue.size();
  return n;
}

std::deque<PdId>::iterator GpuWorkers::TakeableLocked() {
  for (auto it = ready_.begin(); it != ready_.end(); ++it) {
    auto running = running_of_.find(owner_of_.at(*it));
    if (running == running_of_.end() || running->second < per_owner_) return it;
  }
  return ready_.end();
}

size_t GpuWorkers::TakeableCountLocked() const {
  absl::flat_hash_map<uint64_t, size_t> would_run;
  size_t n = 0;
  for (PdId pd : ready_) {
    const uint64_t owner = owner_of_.at(pd);
    size_t& count = would_run[owner];
    if (count == 0) {
      auto running = running_of_.find(owner);
      count = running == running_of_.end() ? 0 : running->second;
    }
    if (count < per_owner_) {
      ++count;
      ++n;
    }
  }
  return n;
}

void GpuWorkers::StartThreadLocked() {
  ++starting_;
  threads_.emplace_back([this] { Work(); });
}

void GpuWorkers::Submit(PdId pd, uint64_t owner, std::function<void()> job) {
  absl::MutexLock lock(&mu_);
  auto& queue = queued_[pd];
  owner_of_[pd] = owner;
  // A domain is in ready_ while it has queued jobs and none running; one
  // that is running goes back there when its job ends (Work).
  const bool running = busy_.contains(pd);
  if (queue.empty() && !running) {
    ready_.push_back(pd);
    ready_count_.store(ready_.size(), std::memory_order_relaxed);
  }
  queue.push_back(std::move(job));
  // A thread for each ready domain no idle thread will take: with one idle
  // thread and two domains made ready in a row, the second must not wait
  // for the first's job.
  if (!ending_ && threads_.size() < max_threads_ && TakeableCountLocked() > idle_ + starting_) {
    StartThreadLocked();
  }
}

void GpuWorkers::Work() {
  absl::MutexLock lock(&mu_);
  --starting_;
  for (;;) {
    ++idle_;
    if (ready_.empty() && !ending_) {
      // A QP's next GPU WQE usually comes within microseconds (a kernel
      // answering its CQE); waking a sleeping thread costs tens of them.
      mu_.Unlock();
      const auto until = std::chrono::steady_clock::now() + kSpin;
      while (ready_count_.load(std::memory_order_relaxed) == 0 &&
             std::chrono::steady_clock::now() < until) {
        std::this_thread::yield();
      }
      mu_.Lock();
    }
    mu_.Await(absl::Condition(
        +[](GpuWorkers* w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->mu_) {
          return w->TakeableLocked() != w->ready_.end() || (w->ending_ && w->ready_.empty());
        },
        this));
    --idle_;
    const auto taken = TakeableLocked();
    if (taken == ready_.end()) return;  // ending
    const PdId pd = *taken;
    ready_.erase(taken);
    ready_count_.store(ready_.size(), std::memory_order_relaxed);
    auto& queue = queued_[pd];
    std::function<void()> job = std::move(queue.front());
    queue.pop_front();
    const uint64_t owner = owner_of_.at(pd);
    busy_.insert(pd);
    ++running_of_[owner];
    ++running_;
    mu_.Unlock();
    job();
    job = nullptr;  // what it holds goes before the domain's next job runs
    mu_.Lock();
    --running_;
    if (--running_of_[owner] == 0) running_of_.erase(owner);
    busy_.erase(pd);
    auto it = queued_.find(pd);
    if (it->second.empty()) {
      queued_.erase(it);
      owner_of_.erase(pd);
    } else {
      ready_.push_back(pd);  // behind the domains that waited meanwhile
      ready_count_.store(ready_.size(), std::memory_order_relaxed);
    }
  }
}

void GpuWorkers::Drain() {
  absl::MutexLock drain(&drain_mu_);
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](GpuWorkers* w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->mu_) {
          return w->ready_.empty() && w->running_ == 0;
        },
        this));
    ending_ = true;
    threads.swap(threads_);
  }
  for (std::thread& t : threads) t.join();
  absl::MutexLock lock(&mu_);
  ending_ = false;
  // Submitted while the threads were ending: fresh ones take it.
  while (threads_.size() < max_threads_ && TakeableCountLocked() > idle_ + starting_) {
    StartThreadLocked();
  }
}

}  // namespace mooncake::softnic
