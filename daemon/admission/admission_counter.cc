#include "admission/admission_counter.h"

#include <unistd.h>

#include "absl/strings/str_cat.h"

namespace mooncake::daemon {

AdmissionCounter::AdmissionCounter(AdmissionLimits limits) : limits_(std::move(limits)) {}

bool AdmissionCounter::Privileged(uint32_t uid) {
  static const uint32_t self = static_cast<uint32_t>(::geteuid());
  return uid == 0 || uid == self;
}

absl::Status AdmissionCounter::TryTake(uint32_t uid, uint64_t n) {
  absl::MutexLock lock(&mu_);
  uint64_t& mine = held_[uid];
  if (!Privileged(uid)) {
    if (mine + n > limits_.per_uid) {
      uint64_t had = mine;
      if (mine == 0) held_.erase(uid);
      return absl::ResourceExhaustedError(
          absl::StrCat("uid ", uid, " holds ", had, " ", limits_.what, "; the limit is ",
                       limits_.per_uid, " per user (", limits_.per_uid_key, " in mooncaked.conf)"));
    }
    if (unprivileged_ + n > limits_.total) {
      if (mine == 0) held_.erase(uid);
      return absl::ResourceExhaustedError(absl::StrCat(
          "mooncaked holds ", unprivileged_, " ", limits_.what, " for all users; the limit is ",
          limits_.total, " (", limits_.total_key, " in mooncaked.conf)"));
    }
    unprivileged_ += n;
  }
  mine += n;
  return absl::OkStatus();
}

void AdmissionCounter::Give(uint32_t uid, uint64_t n) {
  absl::MutexLock lock(&mu_);
  auto it = held_.find(uid);
  if (it == held_.end()) return;
  uint64_t give = std::min(n, it->second);
  it->second -= give;
  if (!Privileged(uid)) unprivileged_ -= std::min(give, unprivileged_);
  if (it->second == 0) held_.erase(it);
}

absl::StatusOr<std::shared_ptr<AdmissionCounter::Charge>> AdmissionCounter::TryCharge(uint32_t uid,
                                                                                      uint64_t n) {
  if (absl::Status s = TryTake(uid, n); !s.ok()) return s;
  return std::make_shared<Charge>(this, uid, n);
}

uint64_t AdmissionCounter::HeldBy(uint32_t uid) const {
  absl::MutexLock lock(&mu_);
  auto it = held_.find(uid);
  return it == held_.end() ? 0 : it->second;
}

uint64_t AdmissionCounter::HeldByUnprivileged() const {
  absl::MutexLock lock(&mu_);
  return unprivileged_;
}

}  // namespace mooncake::daemon
