// EndpointFetcher: the thread on which EtcdGroupDirectory fetches other
// nodes' rank endpoints (rank_endpoints.h), off etcd's watch thread.
//
// The directory says which ranks it wants, from which node, and from when
// (Want); the fetcher gathers what is due per (group, node) into one call of
// at most kMaxEndpointRanksPerFetch ranks and hands the answer back (Done,
// on its thread, with no lock of its own held). Retries are the
// directory's: it wants a rank again, later, for as long as the rank's
// record still waits for its endpoint. Wanting a rank twice keeps the
// earlier time. Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "peering/rank_endpoints.h"

namespace mooncake::daemon::peering {

class EndpointFetcher {
 public:
  using GroupKey = std::tuple<uint32_t, std::string, std::string>;  // (uid, tenant, group)
  using Fetch = std::function<absl::StatusOr<std::vector<FetchedEndpoint>>(
      const std::string& node, uint32_t uid, const std::string& tenant, const std::string& group,
      uint32_t world_size, const std::vector<uint32_t>& ranks)>;
  using Done = std::function<void(const GroupKey& group, const std::string& node,
                                  const std::vector<uint32_t>& asked,
                                  absl::StatusOr<std::vector<FetchedEndpoint>> answer)>;

  EndpointFetcher(Fetch fetch, Done done);
  ~EndpointFetcher();  // waits for a call in flight (bounded by its timeout)
  EndpointFetcher(const EndpointFetcher&) = delete;
  EndpointFetcher& operator=(const EndpointFetcher&) = delete;

  void Want(const GroupKey& group, const std::string& node, uint32_t world_size, uint32_t rank,
            absl::Time not_before);
  // Ranks wanted and not yet asked for (tests, mcctl).
  size_t wanted() const;

 private:
  struct Job {
    uint32_t world_size = 0;
    std::map<uint32_t, absl::Time> ranks;  // rank -> not before
  };
  void Run();

  const Fetch fetch_;
  const Done done_;
  mutable absl::Mutex mu_;
  std::map<std::pair<GroupKey, std::string>, Job> jobs_ ABSL_GUARDED_BY(mu_);
  uint64_t wants_ ABSL_GUARDED_BY(mu_) = 0;  // Want calls so far (wakes Run)
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace mooncake::daemon::peering
