// Metrics: mooncaked's Prometheus metrics (issue 11 item 2; docs/metrics.md
// lists every metric and its labels), served over HTTP at /metrics on the
// address of `metrics_listen`. Off unless that key (or --metrics-listen) is
// set: then the daemon makes one Metrics and nothing else changes.
//
// Two kinds of data, neither of which slows the daemon's hot paths:
//  - gauges (sessions, groups by state, fd tickets, exports, RDMA objects,
//    cluster nodes) are read at scrape time through GaugeSources, callbacks
//    the daemon wires to its existing state (each under that state's own
//    lock), so nothing is updated as sessions and groups come and go;
//  - counters and the join latency histogram are EventCounters (atomics)
//    that the RPC interceptor, the broker and the acceptor bump.
// One prometheus::Collectable turns both into metric families per scrape;
// the Metrics' own prometheus::Registry holds the static ones
// (mooncake_build_info). Labels are bounded: no group names, no uids.
//
// The HTTP server (prometheus-cpp-pull's civetweb Exposer, two threads, no
// keep-alive, kMetricsQueue waiting connections, kMetricsRequestTimeoutMs
// per request) is started by Serve and stopped by Stop or the destructor; its threads call the
// GaugeSources, so Stop before the state they read goes away. Without
// prometheus-cpp at build time, Serve fails with FailedPrecondition.
// Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "metrics/event_counters.h"

namespace mooncake::daemon::metrics {

struct RdmaGauges {
  std::string provider;       // "softnic", "mlx5"
  std::string doorbell_mode;  // "doorbell-record", "cpu-uar", ...
  uint64_t qps = 0;
  uint64_t mrs = 0;  // registered memory regions
  uint64_t registered_bytes = 0;
  // Payload bytes the provider moved itself (softnic); nullopt for a NIC.
  std::optional<uint64_t> softnic_bytes;
  // softnic's GPU worker threads and the GPU WQEs waiting for one; nullopt
  // for a NIC.
  std::optional<uint64_t> softnic_gpu_workers;
  std::optional<uint64_t> softnic_gpu_waiting;
};

// What the collector asks at scrape time. Each callback may be empty, and
// then its metric is not exported; they are called from the HTTP threads.
struct GaugeSources {
  std::function<uint64_t()> sessions;
  // Group count per state name ("forming", "formed", "ready", "degraded").
  std::function<std::map<std::string, uint64_t>()> groups_by_state;
  std::function<uint64_t()> fd_tickets;
  std::function<uint64_t()> exports;
  // nullopt: RDMA off (rdma_provider = off).
  std::function<std::optional<RdmaGauges>()> rdma;
  // nullopt: not in a cluster (no etcd_endpoints).
  std::function<std::optional<uint64_t>()> cluster_nodes;
};

// The HTTP server's bounds: connections waiting for its two threads, and
// how long a request may take to arrive (then the connection is closed).
inline constexpr int kMetricsQueue = 16;
inline constexpr int kMetricsRequestTimeoutMs = 3000;

class Metrics {
 public:
  // `methods`: the RPC methods counted by name (EventCounters).
  Metrics(std::vector<std::string> methods, GaugeSources sources, std::string version);
  ~Metrics();  // Stop()
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // Where the daemon's components record events; lives as long as this.
  EventCounters* counters() { return &counters_; }

  // Sets the sources (before Serve; tests, or wiring done after creation).
  void set_sources(GaugeSources sources);

  // Serves /metrics on `address` (HOST:PORT or [IPv6]:PORT; port 0 picks a
  // free one, see port()). Unavailable when the address cannot be bound
  // (in use, not this host's), naming it and the config key;
  // FailedPrecondition when already serving or built without prometheus-cpp.
  absl::Status Serve(const std::string& address);
  // The port served, 0 when not serving.
  int port() const;
  // Stops the HTTP server (idempotent); scrapes in progress finish first.
  void Stop();

  // The text exposition a scrape returns now (tests, diagnostics).
  std::string ScrapeText() const;

 private:
  struct Impl;
  EventCounters counters_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mooncake::daemon::metrics
