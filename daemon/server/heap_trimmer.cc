#include "server/heap_trimmer.h"

#include <malloc.h>

#include <algorithm>

#include "absl/time/clock.h"
#include "mooncake/common/log.h"

namespace mooncake::daemon {

HeapTrimmer::HeapTrimmer(size_t threshold, absl::Duration min_gap)
    : threshold_(threshold),
      min_gap_(min_gap),
      baseline_(FreeHeapBytes()),
      thread_([this] { Loop(); }) {}

HeapTrimmer::~HeapTrimmer() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

size_t HeapTrimmer::FreeHeapBytes() {
  struct mallinfo2 mi = ::mallinfo2();
  return mi.fordblks;
}

bool HeapTrimmer::MaybeTrim() {
  absl::Time now = absl::Now();
  size_t free_bytes = FreeHeapBytes();
  baseline_ = std::min(baseline_, free_bytes);
  if (now - last_trim_ < min_gap_ || free_bytes - baseline_ <= threshold_) return false;
  last_trim_ = now;
  ::malloc_trim(0);
  baseline_ = FreeHeapBytes();
  MC_LOG(kDebug, "returned freed heap to the kernel (", free_bytes >> 20, " MiB were free)");
  return true;
}

void HeapTrimmer::Loop() {
  absl::MutexLock lock(&mu_);
  auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; };
  while (!mu_.AwaitWithTimeout(absl::Condition(&stopping), absl::Seconds(1))) {
    mu_.Unlock();
    MaybeTrim();
    mu_.Lock();
  }
}

}  // namespace mooncake::daemon
