#include "peering/endpoint_fetcher.h"

#include <algorithm>

#include "absl/time/clock.h"

namespace mooncake::daemon::peering {

EndpointFetcher::EndpointFetcher(Fetch fetch, Done done)
    : fetch_(std::move(fetch)), done_(std::move(done)) {
  thread_ = std::thread([this] { Run(); });
}

EndpointFetcher::~EndpointFetcher() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void EndpointFetcher::Want(const GroupKey& group, const std::string& node, uint32_t world_size,
                           uint32_t rank, absl::Time not_before) {
  absl::MutexLock lock(&mu_);
  Job& job = jobs_[{group, node}];
  job.world_size = world_size;
  auto [it, added] = job.ranks.emplace(rank, not_before);
  if (!added) it->second = std::min(it->second, not_before);
  ++wants_;
}

size_t EndpointFetcher::wanted() const {
  absl::MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& [where, job] : jobs_) n += job.ranks.size();
  return n;
}

void EndpointFetcher::Run() {
  while (true) {
    GroupKey group;
    std::string node;
    uint32_t world_size = 0;
    std::vector<uint32_t> ranks;
    {
      absl::MutexLock lock(&mu_);
      while (true) {
        if (stopping_) return;
        // The job with the earliest due rank; every rank of it due by now
        // goes in one call.
        const absl::Time now = absl::Now();
        absl::Time next = absl::InfiniteFuture();
        auto pick = jobs_.end();
        for (auto it = jobs_.begin(); it != jobs_.end(); ++it) {
          for (const auto& [rank, when] : it->second.ranks) {
            if (when < next) {
              next = when;
              pick = it;
            }
          }
        }
        if (pick != jobs_.end() && next <= now) {
          std::tie(group, node) = pick->first;
          world_size = pick->second.world_size;
          auto& wanted = pick->second.ranks;
          for (auto it = wanted.begin();
               it != wanted.end() &&
               ranks.size() < static_cast<size_t>(kMaxEndpointRanksPerFetch);) {
            if (it->second <= now) {
              ranks.push_back(it->first);
              it = wanted.erase(it);
            } else {
              ++it;
            }
          }
          if (wanted.empty()) jobs_.erase(pick);
          break;
        }
        // New work or stopping re-checks at once; otherwise the next due time.
        auto changed = [this, seen = wants_]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stopping_ || wants_ != seen;
        };
        mu_.AwaitWithDeadline(absl::Condition(&changed),
                              std::min(next, absl::Now() + absl::Milliseconds(100)));
      }
    }
    absl::StatusOr<std::vector<FetchedEndpoint>> answer =
        fetch_(node, std::get<0>(group), std::get<1>(group), std::get<2>(group), world_size, ranks);
    done_(group, node, ranks, std::move(answer));
  }
}

}  // namespace mooncake::daemon::peering
