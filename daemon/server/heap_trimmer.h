// HeapTrimmer: gives freed heap back to the kernel.
//
// glibc keeps what the daemon frees in its arenas (gRPC serves calls from
// many threads, so there are many arenas), and only a trim returns it. A
// daemon that once held 1000 sessions, or a 2048-rank group, would keep that
// RSS until restarted: 58 MB instead of 18 after the soak benchmark's
// sessions closed. Once a second this thread asks malloc how much it holds
// free and trims when that grew by more than `threshold` since the lowest
// point after the last trim (a trim returns pages but malloc still counts
// them free, so "more than the threshold free" alone would trim forever),
// at most once per `min_gap`.
#pragma once

#include <cstddef>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace mooncake::daemon {

class HeapTrimmer {
 public:
  explicit HeapTrimmer(size_t threshold = size_t{4} << 20,
                       absl::Duration min_gap = absl::Seconds(1));
  ~HeapTrimmer();

  // Bytes malloc holds free (all arenas); what a trim could return.
  static size_t FreeHeapBytes();
  // Trims when the free heap grew by more than the threshold since the
  // last trim; returns whether it trimmed. Called by the thread; tests call
  // it directly.
  bool MaybeTrim();

 private:
  void Loop();

  const size_t threshold_;
  const absl::Duration min_gap_;
  absl::Time last_trim_ = absl::InfinitePast();
  size_t baseline_;  // free bytes just after the last trim, or lower since
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace mooncake::daemon
