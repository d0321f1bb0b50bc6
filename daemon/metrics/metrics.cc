#include "metrics/metrics.h"

#include <prometheus/collectable.h>
#include <prometheus/exposer.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/metric_family.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <exception>
#include <limits>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "mooncake/common/log.h"

namespace mooncake::daemon::metrics {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

MetricFamily Family(std::string name, std::string help, MetricType type) {
  MetricFamily f;
  f.name = std::move(name);
  f.help = std::move(help);
  f.type = type;
  return f;
}

void AddGauge(MetricFamily* f, double value, std::vector<ClientMetric::Label> labels = {}) {
  ClientMetric m;
  m.label = std::move(labels);
  m.gauge.value = value;
  f->metric.push_back(std::move(m));
}

void AddCounter(MetricFamily* f, double value, std::vector<ClientMetric::Label> labels = {}) {
  ClientMetric m;
  m.label = std::move(labels);
  m.counter.value = value;
  f->metric.push_back(std::move(m));
}

double D(uint64_t v) { return static_cast<double>(v); }

// Everything but the static info gauges, built at each scrape from the
// event counters and the gauge sources.
class DaemonCollector final : public prometheus::Collectable {
 public:
  explicit DaemonCollector(const EventCounters* counters) : counters_(counters) {}

  void set_sources(GaugeSources sources) {
    absl::MutexLock lock(&mu_);
    sources_ = std::move(sources);
  }

  std::vector<MetricFamily> Collect() const override {
    std::vector<MetricFamily> out;
    absl::MutexLock lock(&mu_);  // scrapes one at a time; sources stay put
    CollectGauges(&out);
    CollectEvents(&out);
    return out;
  }

 private:
  void CollectGauges(std::vector<MetricFamily>* out) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const GaugeSources& s = sources_;
    if (s.sessions) {
      MetricFamily f = Family("mooncake_sessions", "Open client sessions.", MetricType::Gauge);
      AddGauge(&f, D(s.sessions()));
      out->push_back(std::move(f));
    }
    if (s.groups_by_state) {
      MetricFamily f =
          Family("mooncake_groups", "Groups on this node by state.", MetricType::Gauge);
      std::map<std::string, uint64_t> by_state = s.groups_by_state();
      for (const char* state : {"forming", "formed", "ready", "degraded"}) {
        by_state.try_emplace(state, 0);  // every state, so absent ones read 0
      }
      for (const auto& [state, n] : by_state) AddGauge(&f, D(n), {{"state", state}});
      out->push_back(std::move(f));
    }
    if (s.fd_tickets) {
      MetricFamily f = Family("mooncake_fd_tickets",
                              "Live fd tickets (fds in transit between the fd channel and RPCs).",
                              MetricType::Gauge);
      AddGauge(&f, D(s.fd_tickets()));
      out->push_back(std::move(f));
    }
    if (s.exports) {
      MetricFamily f =
          Family("mooncake_exports", "fd exports published by sessions.", MetricType::Gauge);
      AddGauge(&f, D(s.exports()));
      out->push_back(std::move(f));
    }
    if (s.rdma) {
      if (std::optional<RdmaGauges> r = s.rdma()) {
        MetricFamily qps =
            Family("mooncake_rdma_qps", "RDMA queue pairs held for sessions.", MetricType::Gauge);
        AddGauge(&qps, D(r->qps));
        out->push_back(std::move(qps));
        MetricFamily mrs = Family(
            "mooncake_rdma_mrs", "RDMA memory regions registered for sessions.", MetricType::Gauge);
        AddGauge(&mrs, D(r->mrs));
        out->push_back(std::move(mrs));
        MetricFamily bytes = Family(
            "mooncake_rdma_registered_bytes",
            "Bytes of client memory covered by registered RDMA memory regions.", MetricType::Gauge);
        AddGauge(&bytes, D(r->registered_bytes));
        out->push_back(std::move(bytes));
        MetricFamily mode = Family("mooncake_rdma_doorbell_mode",
                                   "The RDMA provider and how its doorbells are rung (always 1).",
                                   MetricType::Gauge);
        AddGauge(&mode, 1, {{"mode", r->doorbell_mode}, {"provider", r->provider}});
        out->push_back(std::move(mode));
        if (r->softnic_bytes) {
          MetricFamily sb = Family("mooncake_softnic_bytes_total",
                                   "Payload bytes the software NIC moved (RDMA WRITE data).",
                                   MetricType::Counter);
          AddCounter(&sb, D(*r->softnic_bytes));
          out->push_back(std::move(sb));
        }
        if (r->softnic_gpu_workers) {
          MetricFamily w =
              Family("mooncake_softnic_gpu_workers",
                     "Threads the software NIC runs GPU-memory WQEs on now.", MetricType::Gauge);
          AddGauge(&w, D(*r->softnic_gpu_workers));
          out->push_back(std::move(w));
        }
        if (r->softnic_gpu_waiting) {
          MetricFamily w =
              Family("mooncake_softnic_gpu_wqes_waiting",
                     "GPU-memory WQEs waiting for a software NIC GPU worker.", MetricType::Gauge);
          AddGauge(&w, D(*r->softnic_gpu_waiting));
          out->push_back(std::move(w));
        }
      }
    }
    if (s.cluster_nodes) {
      if (std::optional<uint64_t> n = s.cluster_nodes()) {
        MetricFamily f = Family("mooncake_cluster_nodes",
                                "Live nodes in the cluster as etcd shows them, this one included.",
                                MetricType::Gauge);
        AddGauge(&f, D(*n));
        out->push_back(std::move(f));
      }
    }
  }

  void CollectEvents(std::vector<MetricFamily>* out) const {
    const EventCounters& c = *counters_;
    MetricFamily joins = Family("mooncake_joins_total", "JoinGroup calls completed, by result.",
                                MetricType::Counter);
    for (JoinResult r : {JoinResult::kFormed, JoinResult::kTimedOut, JoinResult::kFailed}) {
      AddCounter(&joins, D(c.joins(r)), {{"result", JoinResultName(r)}});
    }
    out->push_back(std::move(joins));

    MetricFamily latency =
        Family("mooncake_join_latency_seconds",
               "Time from a JoinGroup call to its group's formation (formed joins only).",
               MetricType::Histogram);
    EventCounters::Histogram h = c.join_latency();
    ClientMetric hm;
    hm.histogram.sample_count = h.count;
    hm.histogram.sample_sum = h.sum_seconds;
    for (size_t i = 0; i < h.cumulative.size(); ++i) {
      hm.histogram.bucket.push_back(
          {h.cumulative[i], i < kJoinLatencyBuckets.size()
                                ? kJoinLatencyBuckets[i]
                                : std::numeric_limits<double>::infinity()});
    }
    latency.metric.push_back(std::move(hm));
    out->push_back(std::move(latency));

    MetricFamily lost =
        Family("mooncake_lost_events_total",
               "Group members reported LOST (their session ended in a formed group).",
               MetricType::Counter);
    AddCounter(&lost, D(c.lost()));
    out->push_back(std::move(lost));

    MetricFamily refused =
        Family("mooncake_connections_refused_total",
               "Connections to the main socket refused at a connection cap (cap) or closed for "
               "starting no RPC within handshake_timeout_ms (handshake).",
               MetricType::Counter);
    for (RefusalReason r : {RefusalReason::kCap, RefusalReason::kHandshake}) {
      AddCounter(&refused, D(c.refused(r)), {{"reason", RefusalReasonName(r)}});
    }
    out->push_back(std::move(refused));

    // Only the (method, code) pairs that happened: every pair would be
    // hundreds of zero series.
    MetricFamily rpcs = Family("mooncake_rpcs_total", "Unary RPCs answered, by method and code.",
                               MetricType::Counter);
    MetricFamily errors =
        Family("mooncake_rpc_errors_total",
               "Unary RPCs answered with a code other than OK, by method.", MetricType::Counter);
    const std::vector<std::string>& methods = c.methods();
    for (size_t m = 0; m < methods.size(); ++m) {
      uint64_t failed = 0, any = 0;
      for (size_t code = 0; code < kGrpcCodes; ++code) {
        const uint64_t n = c.rpcs(m, code);
        if (n == 0) continue;
        any += n;
        if (code != 0) failed += n;
        AddCounter(&rpcs, D(n), {{"code", GrpcCodeName(code)}, {"method", methods[m]}});
      }
      if (any > 0) AddCounter(&errors, D(failed), {{"method", methods[m]}});
    }
    out->push_back(std::move(rpcs));
    out->push_back(std::move(errors));
  }

  const EventCounters* const counters_;
  mutable absl::Mutex mu_;
  GaugeSources sources_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

struct Metrics::Impl {
  std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>();
  std::shared_ptr<DaemonCollector> collector;
  mutable absl::Mutex mu;
  std::unique_ptr<prometheus::Exposer> exposer ABSL_GUARDED_BY(mu);
  int port ABSL_GUARDED_BY(mu) = 0;
};

Metrics::Metrics(std::vector<std::string> methods, GaugeSources sources, std::string version)
    : counters_(std::move(methods)), impl_(std::make_unique<Impl>()) {
  impl_->collector = std::make_shared<DaemonCollector>(&counters_);
  impl_->collector->set_sources(std::move(sources));
  prometheus::BuildGauge()
      .Name("mooncake_build_info")
      .Help("The mooncaked version serving these metrics (always 1).")
      .Register(*impl_->registry)
      .Add({{"version", std::move(version)}})
      .Set(1);
}

Metrics::~Metrics() { Stop(); }

void Metrics::set_sources(GaugeSources sources) {
  impl_->collector->set_sources(std::move(sources));
}

absl::Status Metrics::Serve(const std::string& address) {
  absl::MutexLock lock(&impl_->mu);
  if (impl_->exposer) return absl::FailedPreconditionError("metrics are already served");
  std::unique_ptr<prometheus::Exposer> exposer;
  try {
    // Bounded (issue 23 item 7): two threads serve, at most kMetricsQueue
    // connections wait for them, and a request that has not arrived whole
    // within kMetricsRequestTimeoutMs is dropped, so idle or trickling
    // connections cannot hold the endpoint (or pile up fds in the daemon).
    exposer = std::make_unique<prometheus::Exposer>(std::vector<std::string>{
        "listening_ports", address, "num_threads", "2", "connection_queue",
        absl::StrCat(kMetricsQueue), "request_timeout_ms", absl::StrCat(kMetricsRequestTimeoutMs),
        "enable_keep_alive", "no"});
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", address, ": ", e.what(),
                     " (address in use, or not an address of this host; change metrics_listen)"));
  }
  std::vector<int> ports = exposer->GetListeningPorts();
  exposer->RegisterCollectable(impl_->registry);
  exposer->RegisterCollectable(impl_->collector);
  impl_->port = ports.empty() ? 0 : ports.front();
  impl_->exposer = std::move(exposer);
  // With port 0 the log names the port actually bound.
  MC_LOG(kInfo, "metrics: Prometheus text at http://", address.substr(0, address.rfind(':') + 1),
         impl_->port, "/metrics");
  return absl::OkStatus();
}

int Metrics::port() const {
  absl::MutexLock lock(&impl_->mu);
  return impl_->port;
}

void Metrics::Stop() {
  std::unique_ptr<prometheus::Exposer> exposer;
  {
    absl::MutexLock lock(&impl_->mu);
    exposer = std::move(impl_->exposer);
    impl_->port = 0;
  }
  exposer.reset();  // joins the HTTP threads, outside the lock
}

std::string Metrics::ScrapeText() const {
  std::vector<MetricFamily> families = impl_->registry->Collect();
  std::vector<MetricFamily> more = impl_->collector->Collect();
  families.insert(families.end(), std::make_move_iterator(more.begin()),
                  std::make_move_iterator(more.end()));
  return prometheus::TextSerializer().Serialize(families);
}

}  // namespace mooncake::daemon::metrics
