// Metrics without prometheus-cpp at build time (deploy/install-deps.sh
// installs prometheus-cpp-dev): events are still counted, nothing is served.
#include "metrics/metrics.h"

namespace mooncake::daemon::metrics {

struct Metrics::Impl {};

Metrics::Metrics(std::vector<std::string> methods, GaugeSources, std::string)
    : counters_(std::move(methods)), impl_(std::make_unique<Impl>()) {}

Metrics::~Metrics() = default;

void Metrics::set_sources(GaugeSources) {}

absl::Status Metrics::Serve(const std::string& address) {
  return absl::FailedPreconditionError(
      "cannot serve metrics on " + address +
      ": mooncaked was built without prometheus-cpp (install prometheus-cpp-dev and rebuild, "
      "or remove metrics_listen)");
}

int Metrics::port() const { return 0; }

void Metrics::Stop() {}

std::string Metrics::ScrapeText() const { return ""; }

}  // namespace mooncake::daemon::metrics
