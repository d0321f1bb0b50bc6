// LeaseKeeper: keeps one etcd lease alive from a background thread, so the
// keys a daemon publishes with it (its node, its group members) live exactly
// as long as the daemon can reach etcd.
//
//   absl::StatusOr<Lease> lease = etcd->GrantLease(5);
//   LeaseKeeper keeper(etcd.get(), *lease, [](const absl::Status& why) {
//     // The lease is gone or may be: its keys vanished or soon will.
//     // Runs on the keeper's thread; do not destroy the keeper from here.
//   });
//   etcd->Put("/mc/nodes/a", info, lease->id);
//
// How. One LeaseKeepAlive stream (gRPC bidi) to the member that answered
// last; a refresh is sent every TTL/3 and each answer carries the renewed
// TTL. The lease is known alive until (time the refresh was sent + TTL): a
// conservative bound, since the member renewed it later than we sent. When
// the stream breaks, or does not connect or answer a refresh within TTL/3
// (at most request_timeout), it is reopened on the next endpoint (backing
// off 100 ms .. 1 s) and a refresh sent at once.
//
// Lost. on_lost runs once, on the keeper's thread, and the keeper stops:
//   - NotFound: a member answered TTL <= 0: the lease expired or was revoked
//     and its keys are gone;
//   - Unavailable: no refresh got through before the known-alive bound
//     passed: the lease has expired, or will, unless etcd was merely slow.
// Either way the owner must grant a new lease and publish its keys again.
//
// Stop() (and the destructor) stop refreshing and join the thread; they do
// not revoke the lease: the keys stay until its TTL runs out. Revoke with
// EtcdClient::RevokeLease to remove them at once. The EtcdClient is not
// owned and must outlive the keeper. Thread-safe.
#pragma once

#include <grpcpp/alarm.h>
#include <grpcpp/completion_queue.h>

#include <cstdint>
#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "etcd/etcd_client.h"

namespace mooncake::daemon::etcd {

class LeaseKeeper {
 public:
  using LostCallback = std::function<void(const absl::Status& why)>;

  // Starts refreshing `lease` (as GrantLease returned it) at once.
  LeaseKeeper(EtcdClient* client, Lease lease, LostCallback on_lost);
  ~LeaseKeeper();
  LeaseKeeper(const LeaseKeeper&) = delete;
  LeaseKeeper& operator=(const LeaseKeeper&) = delete;

  // Stops refreshing and joins the thread; idempotent. Must not be called
  // from on_lost.
  void Stop();

  int64_t lease_id() const { return lease_.id; }
  // Whether on_lost ran.
  bool lost() const;
  // Local time until which the lease is known to be alive.
  absl::Time known_alive_until() const;
  // How many refreshes the server answered (for tests and status).
  int64_t refreshes() const;

 private:
  struct Stream;
  void Run();

  EtcdClient* const client_;
  const Lease lease_;
  const LostCallback on_lost_;
  // Declared before wake_: the alarm must go before its queue.
  grpc::CompletionQueue cq_;

  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool exiting_ ABSL_GUARDED_BY(mu_) = false;  // cq_ about to shut down: no more alarms
  bool lost_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time alive_until_ ABSL_GUARDED_BY(mu_);
  int64_t refreshes_ ABSL_GUARDED_BY(mu_) = 0;
  grpc::Alarm wake_ ABSL_GUARDED_BY(mu_);
  absl::Mutex join_mu_;  // one Stop() joins at a time
  std::thread thread_;
};

}  // namespace mooncake::daemon::etcd
