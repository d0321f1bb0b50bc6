// AdmissionCounter: how many of one kind of resource (connections on a
// socket, fds held) each principal (a uid on one tenant's socket,
// principal.h) holds, with a per-principal cap ("per user" in the config
// keys) and a cap on the total held by unprivileged principals.
//
// Privileged callers (root, and the daemon's own uid, on the main socket)
// are counted but never refused: the fds between the unprivileged total and
// the process's fd limit are theirs, so `mcctl status` as root still
// answers while another user floods the daemon. Root on a tenant socket is
// refused like anyone. A refusal is ResourceExhausted and names the limit
// and the config key that raises it. Thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "admission/principal.h"

namespace mooncake::daemon {

struct AdmissionLimits {
  // What is counted, for messages ("connections to mooncaked.sock").
  std::string what;
  uint64_t per_uid = 0;
  std::string per_uid_key;  // config key of per_uid
  uint64_t total = 0;       // all unprivileged uids together
  std::string total_key;
};

class AdmissionCounter {
 public:
  explicit AdmissionCounter(AdmissionLimits limits);

  // Takes `n` for `who`, or ResourceExhausted (nothing taken).
  absl::Status TryTake(const Principal& who, uint64_t n = 1);
  // Gives back what TryTake took.
  void Give(const Principal& who, uint64_t n = 1);

  uint64_t HeldBy(const Principal& who) const;
  uint64_t HeldByUnprivileged() const;
  const AdmissionLimits& limits() const { return limits_; }

  static bool Privileged(const Principal& who) { return IsPrivileged(who); }

  // What TryTake took, given back when the last owner lets go: fds held in
  // a bundle shared by tickets, exports and group members are charged once.
  class Charge {
   public:
    Charge(AdmissionCounter* counter, Principal who, uint64_t n)
        : counter_(counter), who_(std::move(who)), n_(n) {}
    ~Charge() { counter_->Give(who_, n_); }
    Charge(const Charge&) = delete;
    Charge& operator=(const Charge&) = delete;

   private:
    AdmissionCounter* const counter_;
    const Principal who_;
    const uint64_t n_;
  };
  // TryTake as a Charge. The counter must outlive it.
  absl::StatusOr<std::shared_ptr<Charge>> TryCharge(const Principal& who, uint64_t n);

 private:
  const AdmissionLimits limits_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<Principal, uint64_t> held_ ABSL_GUARDED_BY(mu_);
  uint64_t unprivileged_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace mooncake::daemon
