// Host regions for softnic tests and fuzzers: each registered with an Engine
// inside one anonymous mapping filled with sentinel bytes, with kGuard bytes
// around each, and a snapshot of the whole mapping, so a test can ask which
// bytes changed outside the regions a WQE was allowed to write.
//
//   GuardedRegions regions(64 << 10);
//   GuardedRegion dst = regions.Add(engine, pd, 4096, kRemoteWrite);
//   regions.Snapshot();
//   ... WQEs ...
//   EXPECT_EQ(regions.Changed({dst}), 0u);
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <vector>

#include "softnic/engine.h"
#include "softnic/shared_mapping.h"

namespace mooncake::softnic::test_util {

struct GuardedRegion {
  uint32_t key = 0;
  uint64_t iova = 0;
  uint64_t off = 0;  // in the mapping
  uint64_t len = 0;
};

class GuardedRegions {
 public:
  static constexpr uint64_t kGuard = 128;
  static constexpr uint8_t kSentinel = 0xA5;
  // Regions get iovas unlike their daemon addresses, so translation is tested.
  static constexpr uint64_t kIovaBase = 0x7000'0000'0000ull;

  // Aborts if the mapping cannot be made (a test without it tests nothing).
  explicit GuardedRegions(uint64_t bytes) {
    auto m = SharedMapping::Anonymous(bytes);
    if (!m.ok()) std::abort();
    mapping_ = *std::move(m);
    std::memset(mapping_->data(), kSentinel, mapping_->size());
    next_ = kGuard;
  }

  // A region of `len` bytes of `pd` after the last one (key 0 when the
  // engine refused it: the caller's check fails on that).
  GuardedRegion Add(Engine& engine, PdId pd, uint64_t len, uint32_t access) {
    GuardedRegion r;
    r.off = Reserve(len);
    r.len = len;
    r.iova = kIovaBase + r.off;
    RegionSpec spec;
    spec.pd = pd;
    spec.iova = r.iova;
    spec.length = len;
    spec.access = access;
    spec.mapping = mapping_;
    spec.offset = r.off;
    auto key = engine.RegisterRegion(spec);
    r.key = key.ok() ? *key : 0;
    return r;
  }
  // Skips `len` bytes and a guard; returns where they start.
  uint64_t Reserve(uint64_t len) {
    const uint64_t off = next_;
    next_ += len + kGuard;
    return off;
  }

  uint8_t* Host(const GuardedRegion& r) const { return mapping_->data() + r.off; }
  const std::shared_ptr<SharedMapping>& mapping() const { return mapping_; }

  // What Changed compares against: the mapping as it is now.
  void Snapshot() { snapshot_.assign(mapping_->data(), mapping_->data() + mapping_->size()); }
  const uint8_t* snapshot(const GuardedRegion& r) const { return snapshot_.data() + r.off; }

  // Bytes that differ from the snapshot outside `allowed`.
  size_t Changed(std::initializer_list<GuardedRegion> allowed) const {
    size_t changed = 0;
    for (uint64_t i = 0; i < mapping_->size(); ++i) {
      bool ok = false;
      for (const GuardedRegion& r : allowed) ok |= i >= r.off && i < r.off + r.len;
      if (!ok && mapping_->data()[i] != snapshot_[i]) ++changed;
    }
    return changed;
  }

 private:
  std::shared_ptr<SharedMapping> mapping_;
  std::vector<uint8_t> snapshot_;
  uint64_t next_ = 0;
};

}  // namespace mooncake::softnic::test_util
