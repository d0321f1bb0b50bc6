#include "softnic/gpu_workers.h"

#include <chrono>
#include <utility>

namespace mooncake::softnic {

GpuWorkers::GpuWorkers(size_t threads) : max_threads_(threads == 0 ? 1 : threads) {}

GpuWorkers::~GpuWorkers() { Drain(); }

size_t GpuWorkers::threads() const {
  absl::MutexLock lock(&mu_);
  return threads_.size();
}

void GpuWorkers::Submit(PdId pd, std::function<void()> job) {
  absl::MutexLock lock(&mu_);
  auto& queue = queued_[pd];
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
  if (ready_.size() > idle_ + starting_ && !ending_ && threads_.size() < max_threads_) {
    ++starting_;
    threads_.emplace_back([this] { Work(); });
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
        +[](GpuWorkers* w)
             ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->mu_) { return !w->ready_.empty() || w->ending_; },
        this));
    --idle_;
    if (ready_.empty()) return;  // ending
    const PdId pd = ready_.front();
    ready_.pop_front();
    ready_count_.store(ready_.size(), std::memory_order_relaxed);
    auto& queue = queued_[pd];
    std::function<void()> job = std::move(queue.front());
    queue.pop_front();
    busy_.insert(pd);
    ++running_;
    mu_.Unlock();
    job();
    job = nullptr;  // what it holds goes before the domain's next job runs
    mu_.Lock();
    --running_;
    busy_.erase(pd);
    auto it = queued_.find(pd);
    if (it->second.empty()) {
      queued_.erase(it);
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
  // Submitted while the threads were ending: a fresh one takes it.
  if (!ready_.empty()) threads_.emplace_back([this] { Work(); });
}

}  // namespace mooncake::softnic
