#include "admission/admission_counter.h"

#include <unistd.h>

#include "absl/strings/str_cat.h"

namespace mooncake::daemon {

AdmissionCounter::AdmissionCounter(AdmissionLimits limits) : limits_(std::move(limits)) {}

bool IsPrivileged(const Principal& p) {
  static const uint32_t self = static_cast<uint32_t>(::geteuid());
  return p.tenant.empty() && (p.uid == 0 || p.uid == self);
}

absl::Status AdmissionCounter::TryTake(const Principal& who, uint64_t n) {
  absl::MutexLock lock(&mu_);
  uint64_t& mine = held_[who];
  if (!Privileged(who)) {
    if (mine + n > limits_.per_uid) {
      uint64_t had = mine;
      if (mine == 0) held_.erase(who);
      return absl::ResourceExhaustedError(
          absl::StrCat(who.Describe(), " holds ", had, " ", limits_.what, "; the limit is ",
                       limits_.per_uid, " per user (", limits_.per_uid_key, " in mooncaked.conf)"));
    }
    if (unprivileged_ + n > limits_.total) {
      if (mine == 0) held_.erase(who);
      return absl::ResourceExhaustedError(absl::StrCat(
          "mooncaked holds ", unprivileged_, " ", limits_.what, " for all users; the limit is ",
          limits_.total, " (", limits_.total_key, " in mooncaked.conf)"));
    }
    unprivileged_ += n;
  }
  mine += n;
  return absl::OkStatus();
}

void AdmissionCounter::Give(const Principal& who, uint64_t n) {
  absl::MutexLock lock(&mu_);
  auto it = held_.find(who);
  if (it == held_.end()) return;
  uint64_t give = std::min(n, it->second);
  it->second -= give;
  if (!Privileged(who)) unprivileged_ -= std::min(give, unprivileged_);
  if (it->second == 0) held_.erase(it);
}

absl::StatusOr<std::shared_ptr<AdmissionCounter::Charge>> AdmissionCounter::TryCharge(
    const Principal& who, uint64_t n) {
  if (absl::Status s = TryTake(who, n); !s.ok()) return s;
  return std::make_shared<Charge>(this, who, n);
}

uint64_t AdmissionCounter::HeldBy(const Principal& who) const {
  absl::MutexLock lock(&mu_);
  auto it = held_.find(who);
  return it == held_.end() ? 0 : it->second;
}

uint64_t AdmissionCounter::HeldByUnprivileged() const {
  absl::MutexLock lock(&mu_);
  return unprivileged_;
}

}  // namespace mooncake::daemon
