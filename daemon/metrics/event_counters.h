// EventCounters: what mooncaked counts as things happen (RPCs, joins, lost
// members, refused connections), for the Prometheus metrics (metrics.h).
//
// Plain relaxed atomics, so the hot paths that record (the RPC interceptor,
// the group broker, the acceptor) pay one atomic add and never a lock, and
// none of them depends on prometheus-cpp: the metrics' Collectable reads
// these at scrape time. Every label set is fixed when the counters are
// made (bounded cardinality): RPCs are counted per method of a list given at
// construction (anything else is "other") and per gRPC status code.
//
// Owned by the daemon (inside Metrics) and outliving every component that
// records into it; the components hold a nullable pointer (null: metrics
// off, nothing counted). Thread-safe.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace mooncake::daemon::metrics {

// How a join ended, for mooncake_joins_total{result}.
enum class JoinResult { kFormed, kTimedOut, kFailed };
inline constexpr size_t kJoinResults = 3;
const char* JoinResultName(JoinResult r);

// Why a connection was refused or closed, for
// mooncake_connections_refused_total{reason}.
enum class RefusalReason { kCap, kHandshake };
inline constexpr size_t kRefusalReasons = 2;
const char* RefusalReasonName(RefusalReason r);

// The join latency histogram's upper bounds, in seconds (1 ms .. 60 s; the
// +Inf bucket is implied).
inline constexpr std::array<double, 15> kJoinLatencyBuckets = {
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};

// gRPC status codes (grpc::StatusCode values 0..16) and their names.
inline constexpr size_t kGrpcCodes = 17;
const char* GrpcCodeName(size_t code);

class EventCounters {
 public:
  // `methods`: the RPC methods counted by name, as gRPC names them without
  // the leading '/' ("mooncake.v1.Local/JoinGroup"); any other is "other".
  explicit EventCounters(std::vector<std::string> methods);
  EventCounters(const EventCounters&) = delete;
  EventCounters& operator=(const EventCounters&) = delete;

  // The index of a method path as gRPC gives it ("/pkg.Service/Method", or
  // without the '/'); the index of "other" when it is not one of ours.
  size_t MethodIndex(absl::string_view path) const;
  // One RPC of method `method` (a MethodIndex) answered with `code`
  // (grpc::StatusCode; out of range counts as UNKNOWN).
  void RecordRpc(size_t method, int code);

  void RecordJoin(JoinResult result, absl::Duration latency);
  void RecordLost(uint64_t members = 1) { lost_.fetch_add(members, std::memory_order_relaxed); }
  void RecordRefused(RefusalReason reason, uint64_t n = 1) {
    refused_[static_cast<size_t>(reason)].fetch_add(n, std::memory_order_relaxed);
  }

  // Reads (for the collector and tests). Each value is read on its own:
  // a scrape is not one atomic snapshot, as with any Prometheus counter.
  const std::vector<std::string>& methods() const { return methods_; }  // "other" last
  uint64_t rpcs(size_t method, size_t code) const {
    return rpcs_[method * kGrpcCodes + code].load(std::memory_order_relaxed);
  }
  uint64_t joins(JoinResult r) const {
    return joins_[static_cast<size_t>(r)].load(std::memory_order_relaxed);
  }
  uint64_t lost() const { return lost_.load(std::memory_order_relaxed); }
  uint64_t refused(RefusalReason r) const {
    return refused_[static_cast<size_t>(r)].load(std::memory_order_relaxed);
  }
  struct Histogram {
    std::vector<uint64_t> cumulative;  // one per kJoinLatencyBuckets bound, then +Inf
    uint64_t count = 0;
    double sum_seconds = 0;
  };
  // Formed joins only: the time from JoinGroup's arrival to the group's
  // formation.
  Histogram join_latency() const;

 private:
  std::vector<std::string> methods_;
  absl::flat_hash_map<std::string, size_t> method_index_;
  std::unique_ptr<std::atomic<uint64_t>[]> rpcs_;  // methods_.size() x kGrpcCodes
  std::array<std::atomic<uint64_t>, kJoinResults> joins_{};
  std::array<std::atomic<uint64_t>, kJoinLatencyBuckets.size() + 1> join_buckets_{};
  std::atomic<uint64_t> join_latency_ns_{0};
  std::atomic<uint64_t> lost_{0};
  std::array<std::atomic<uint64_t>, kRefusalReasons> refused_{};
};

}  // namespace mooncake::daemon::metrics
