// HeapTrimmer: gives freed heap back to the kernel once the daemon has
// shrunk and gone quiet.
//
// glibc keeps what the daemon frees in its arenas (gRPC serves calls from
// many threads, so there are many arenas), and only a trim returns it. A
// daemon that once held 1000 sessions, or a 2048-rank group, would keep that
// RSS until restarted: 58 MB instead of 18 after the soak benchmark's
// sessions closed. But a trim in a busy daemon is worse than none: the pages
// it returns are faulted back in at once (trimming every second while
// 256-rank groups formed cost a third more daemon CPU). So once a second
// this thread samples the heap in use, and trims only when it has fallen by
// more than `threshold` below its peak since the last trim AND has held
// steady (within a quarter of the threshold) for `quiet_ticks` samples.
#pragma once

#include <cstddef>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace mooncake::daemon {

class HeapTrimmer {
 public:
  // `period` 0: no thread (tests call Tick themselves).
  explicit HeapTrimmer(size_t threshold = size_t{4} << 20, int quiet_ticks = 2,
                       absl::Duration period = absl::Seconds(1));
  ~HeapTrimmer();

  // Heap bytes in use (all arenas).
  static size_t InUseHeapBytes();
  // One sample; trims when the rule above says so. Returns whether it did.
  bool Tick();

 private:
  void Loop(absl::Duration period);

  const size_t threshold_;
  const int quiet_ticks_;
  size_t peak_ = 0;  // in use, highest since the last trim
  size_t last_ = 0;  // in use at the previous tick
  int quiet_ = 0;    // consecutive steady ticks below the peak
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace mooncake::daemon
