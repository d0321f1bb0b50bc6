// HeapTrimmer: trims when the free heap grew past its threshold, at most
// once per gap, and what it trims really leaves the process's RSS.
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

// 32 MiB of small blocks freed between blocks that stay (one after every
// MiB, too large for malloc's per-thread caches, so they come from the top
// of the heap): free heap in the middle of an arena, which free() does not
// return by itself. Returns the blocks that stay.
std::vector<void*> FreeThirtyTwoMiBInTheMiddle() {
  std::vector<void*> blocks, pins;
  for (int i = 0; i < 4096; ++i) {
    void* p = std::malloc(8192);
    std::memset(p, 1, 8192);
    blocks.push_back(p);
    if (i % 128 == 127) pins.push_back(std::malloc(24000));
  }
  for (void* p : blocks) std::free(p);
  return pins;
}

void FreeAll(const std::vector<void*>& pins) {
  for (void* p : pins) std::free(p);
}

TEST(HeapTrimmerTest, GivesFreedHeapBackOncePerWaveOfFrees) {
  HeapTrimmer trimmer(size_t{8} << 20, absl::ZeroDuration());
  trimmer.MaybeTrim();  // whatever the test process held before
  std::vector<void*> pins = FreeThirtyTwoMiBInTheMiddle();
  size_t before = RssBytes();
  EXPECT_TRUE(trimmer.MaybeTrim());
  EXPECT_LT(RssBytes() + (size_t{16} << 20), before) << "RSS did not drop by 16 MiB";
  EXPECT_FALSE(trimmer.MaybeTrim()) << "nothing new was freed";
  FreeAll(pins);
}

TEST(HeapTrimmerTest, AtMostOncePerGap) {
  HeapTrimmer trimmer(size_t{8} << 20, absl::Hours(1));
  std::vector<void*> a = FreeThirtyTwoMiBInTheMiddle();
  EXPECT_TRUE(trimmer.MaybeTrim());
  std::vector<void*> b = FreeThirtyTwoMiBInTheMiddle();
  EXPECT_FALSE(trimmer.MaybeTrim());
  FreeAll(a);
  FreeAll(b);
}

}  // namespace
}  // namespace mooncake::daemon
