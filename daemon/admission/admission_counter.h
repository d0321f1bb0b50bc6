// AdmissionCounter: how many of one kind of resource (connections on a
// socket, fds held) each uid holds, with a per-uid cap and a cap on the
// total held by unprivileged uids.
//
// Privileged callers (root, and the daemon's own uid) are counted but never
// refused: the fds between the unprivileged total and the process's fd
// limit are theirs, so `mcctl status` as root still answers while another
// user floods the daemon. A refusal is ResourceExhausted and names the
// limit and the config key that raises it. Thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

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

  // Takes `n` for `uid`, or ResourceExhausted (nothing taken).
  absl::Status TryTake(uint32_t uid, uint64_t n = 1);
  // Gives back what TryTake took.
  void Give(uint32_t uid, uint64_t n = 1);

  uint64_t HeldBy(uint32_t uid) const;
  uint64_t HeldByUnprivileged() const;
  const AdmissionLimits& limits() const { return limits_; }

  static bool Privileged(uint32_t uid);

  // What TryTake took, given back when the last owner lets go: fds held in
  // a bundle shared by tickets, exports and group members are charged once.
  class Charge {
   public:
    Charge(AdmissionCounter* counter, uint32_t uid, uint64_t n)
        : counter_(counter), uid_(uid), n_(n) {}
    ~Charge() { counter_->Give(uid_, n_); }
    Charge(const Charge&) = delete;
    Charge& operator=(const Charge&) = delete;

   private:
    AdmissionCounter* const counter_;
    const uint32_t uid_;
    const uint64_t n_;
  };
  // TryTake as a Charge. The counter must outlive it.
  absl::StatusOr<std::shared_ptr<Charge>> TryCharge(uint32_t uid, uint64_t n);

 private:
  const AdmissionLimits limits_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint32_t, uint64_t> held_ ABSL_GUARDED_BY(mu_);
  uint64_t unprivileged_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace mooncake::daemon
