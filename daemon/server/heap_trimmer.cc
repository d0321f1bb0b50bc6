#include "server/heap_trimmer.h"

#include <malloc.h>

#include <algorithm>

#include "absl/time/clock.h"
#include "mooncake/common/log.h"

namespace mooncake::daemon {

HeapTrimmer::HeapTrimmer(size_t threshold, int quiet_ticks, absl::Duration period)
    : threshold_(threshold), quiet_ticks_(quiet_ticks) {
  peak_ = last_ = InUseHeapBytes();
  if (period > absl::ZeroDuration()) thread_ = std::thread([this, period] { Loop(period); });
}

HeapTrimmer::~HeapTrimmer() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

size_t HeapTrimmer::InUseHeapBytes() {
  struct mallinfo2 mi = ::mallinfo2();
  return mi.uordblks;
}

bool HeapTrimmer::Tick() {
  size_t in_use = InUseHeapBytes();
  peak_ = std::max(peak_, in_use);
  size_t step = in_use > last_ ? in_use - last_ : last_ - in_use;
  last_ = in_use;
  bool shrunk = peak_ - in_use > threshold_;
  quiet_ = (shrunk && step <= threshold_ / 4) ? quiet_ + 1 : 0;
  if (quiet_ < quiet_ticks_) return false;
  ::malloc_trim(0);
  MC_LOG(kDebug, "returned freed heap to the kernel (in use ", in_use >> 20, " MiB, peak ",
         peak_ >> 20, " MiB)");
  peak_ = in_use;
  quiet_ = 0;
  return true;
}

void HeapTrimmer::Loop(absl::Duration period) {
  absl::MutexLock lock(&mu_);
  auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; };
  while (!mu_.AwaitWithTimeout(absl::Condition(&stopping), period)) {
    mu_.Unlock();
    Tick();
    mu_.Lock();
  }
}

}  // namespace mooncake::daemon
