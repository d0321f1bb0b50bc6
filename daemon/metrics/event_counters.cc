#include "metrics/event_counters.h"

#include <algorithm>

#include "absl/strings/strip.h"

namespace mooncake::daemon::metrics {

const char* JoinResultName(JoinResult r) {
  switch (r) {
    case JoinResult::kFormed: return "formed";
    case JoinResult::kTimedOut: return "timed_out";
    case JoinResult::kFailed: return "failed";
  }
  return "failed";
}

const char* RefusalReasonName(RefusalReason r) {
  switch (r) {
    case RefusalReason::kCap: return "cap";
    case RefusalReason::kHandshake: return "handshake";
  }
  return "cap";
}

const char* GrpcCodeName(size_t code) {
  static constexpr const char* kNames[kGrpcCodes] = {
      "OK",
      "CANCELLED",
      "UNKNOWN",
      "INVALID_ARGUMENT",
      "DEADLINE_EXCEEDED",
      "NOT_FOUND",
      "ALREADY_EXISTS",
      "PERMISSION_DENIED",
      "RESOURCE_EXHAUSTED",
      "FAILED_PRECONDITION",
      "ABORTED",
      "OUT_OF_RANGE",
      "UNIMPLEMENTED",
      "INTERNAL",
      "UNAVAILABLE",
      "DATA_LOSS",
      "UNAUTHENTICATED",
  };
  return code < kGrpcCodes ? kNames[code] : "UNKNOWN";
}

EventCounters::EventCounters(std::vector<std::string> methods) {
  methods.erase(std::remove(methods.begin(), methods.end(), "other"), methods.end());
  for (std::string& m : methods) {
    if (method_index_.emplace(m, methods_.size()).second) methods_.push_back(std::move(m));
  }
  methods_.push_back("other");
  const size_t n = methods_.size() * kGrpcCodes;
  rpcs_ = std::make_unique<std::atomic<uint64_t>[]>(n);
  for (size_t i = 0; i < n; ++i) rpcs_[i].store(0, std::memory_order_relaxed);
}

size_t EventCounters::MethodIndex(absl::string_view path) const {
  absl::ConsumePrefix(&path, "/");
  auto it = method_index_.find(path);
  return it == method_index_.end() ? methods_.size() - 1 : it->second;
}

void EventCounters::RecordRpc(size_t method, int code) {
  if (method >= methods_.size()) method = methods_.size() - 1;
  const size_t c = code >= 0 && static_cast<size_t>(code) < kGrpcCodes ? code : 2;  // UNKNOWN
  rpcs_[method * kGrpcCodes + c].fetch_add(1, std::memory_order_relaxed);
}

void EventCounters::RecordJoin(JoinResult result, absl::Duration latency) {
  joins_[static_cast<size_t>(result)].fetch_add(1, std::memory_order_relaxed);
  if (result != JoinResult::kFormed) return;
  const double seconds = absl::ToDoubleSeconds(latency);
  const size_t bucket = static_cast<size_t>(
      std::lower_bound(kJoinLatencyBuckets.begin(), kJoinLatencyBuckets.end(), seconds) -
      kJoinLatencyBuckets.begin());
  join_buckets_[bucket].fetch_add(1, std::memory_order_relaxed);
  join_latency_ns_.fetch_add(
      static_cast<uint64_t>(std::max<int64_t>(0, absl::ToInt64Nanoseconds(latency))),
      std::memory_order_relaxed);
}

EventCounters::Histogram EventCounters::join_latency() const {
  Histogram h;
  uint64_t running = 0;
  for (const std::atomic<uint64_t>& b : join_buckets_) {
    running += b.load(std::memory_order_relaxed);
    h.cumulative.push_back(running);
  }
  h.count = running;
  h.sum_seconds = static_cast<double>(join_latency_ns_.load(std::memory_order_relaxed)) * 1e-9;
  return h;
}

}  // namespace mooncake::daemon::metrics
