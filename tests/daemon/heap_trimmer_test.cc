// HeapTrimmer: trims once the heap in use has fallen well below its peak
// and held steady, not while it churns, and what it trims really leaves the
// process's RSS.
#include "server/heap_trimmer.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"

namespace mooncake::daemon {
namespace {

size_t RssBytes() {
  long pages = 0, resident = 0;
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
  std::fclose(f);
  return static_cast<size_t>(resident) * static_cast<size_t>(::sysconf(_SC_PAGESIZE));
}

// 32 MiB of small blocks, with a larger block after every MiB (too large
// for malloc's per-thread caches, so it comes from the top of the heap and
// stays when the small ones are freed: free heap in the middle of an arena,
// which free() does not return by itself).
struct Heap {
  std::vector<void*> blocks, pins;
  void Grow() {
    for (int i = 0; i < 4096; ++i) {
      void* p = std::malloc(8192);
      std::memset(p, 1, 8192);
      blocks.push_back(p);
      if (i % 128 == 127) pins.push_back(std::malloc(24000));
    }
  }
  void Shrink() {
    for (void* p : blocks) std::free(p);
    blocks.clear();
  }
  ~Heap() {
    Shrink();
    for (void* p : pins) std::free(p);
  }
};

TEST(HeapTrimmerTest, TrimsOnceTheHeapShrankAndWentQuiet) {
  HeapTrimmer trimmer(size_t{8} << 20, /*quiet_ticks=*/2, absl::ZeroDuration());
  Heap heap;
  heap.Grow();
  EXPECT_FALSE(trimmer.Tick());  // the peak
  heap.Shrink();
  size_t before = RssBytes();
  EXPECT_FALSE(trimmer.Tick()) << "shrank this tick: not quiet yet";
  EXPECT_FALSE(trimmer.Tick()) << "one quiet tick";
  EXPECT_TRUE(trimmer.Tick()) << "two quiet ticks";
  EXPECT_LT(RssBytes() + (size_t{16} << 20), before) << "RSS did not drop by 16 MiB";
  EXPECT_FALSE(trimmer.Tick()) << "nothing new was freed";
  EXPECT_FALSE(trimmer.Tick());
}

TEST(HeapTrimmerTest, NeverTrimsWhileTheHeapChurns) {
  HeapTrimmer trimmer(size_t{8} << 20, /*quiet_ticks=*/2, absl::ZeroDuration());
  Heap heap;
  for (int round = 0; round < 6; ++round) {
    heap.Grow();
    EXPECT_FALSE(trimmer.Tick());
    heap.Shrink();
    EXPECT_FALSE(trimmer.Tick()) << "round " << round;
  }
}

}  // namespace
}  // namespace mooncake::daemon
