#include "rdma/sealed_memfd_mappings.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace mooncake::daemon {

namespace {

struct Stat {
  uint64_t dev = 0, ino = 0, size = 0;
};

std::optional<Stat> StatOf(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return std::nullopt;
  return Stat{static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino),
              st.st_size > 0 ? static_cast<uint64_t>(st.st_size) : 0};
}

}  // namespace

std::shared_ptr<softnic::SharedMapping> SealedMemfdMappings::FindLocked(const Inode& inode,
                                                                        uint64_t offset,
                                                                        uint64_t bytes) {
  auto it = by_inode_.find(inode);
  if (it == by_inode_.end()) return nullptr;
  std::shared_ptr<softnic::SharedMapping> whole = it->second.lock();
  if (!whole) {
    by_inode_.erase(it);
    return nullptr;
  }
  absl::StatusOr<std::shared_ptr<softnic::SharedMapping>> view =
      softnic::SharedMapping::View(std::move(whole), offset, bytes);
  return view.ok() ? *std::move(view) : nullptr;
}

std::shared_ptr<softnic::SharedMapping> SealedMemfdMappings::Find(int fd, uint64_t offset,
                                                                  uint64_t bytes) {
  const std::optional<Stat> st = StatOf(fd);
  if (!st) return nullptr;
  absl::MutexLock lock(&mu_);
  return FindLocked(Inode{st->dev, st->ino}, offset, bytes);
}

absl::StatusOr<std::shared_ptr<softnic::SharedMapping>> SealedMemfdMappings::Map(
    uint64_t session, int fd, uint64_t offset, uint64_t bytes, Purpose purpose) {
  const std::optional<Stat> st = StatOf(fd);
  if (!st) {
    const int err = errno;
    return absl::ErrnoToStatus(err, absl::StrCat("fstat(memfd fd ", fd, ")"));
  }
  const Inode inode{st->dev, st->ino};
  absl::MutexLock lock(&mu_);
  std::erase_if(by_inode_, [](const auto& kv) { return kv.second.expired(); });
  if (std::shared_ptr<softnic::SharedMapping> view = FindLocked(inode, offset, bytes)) {
    kept_[{session, purpose}] = by_inode_[inode].lock();
    return view;
  }
  std::shared_ptr<softnic::SharedMapping> whole;
  if (st->size > 0 && st->size <= kMaxBytes && offset <= st->size && bytes <= st->size - offset) {
    absl::StatusOr<std::shared_ptr<softnic::SharedMapping>> m =
        softnic::SharedMapping::FromSealedMemfd(fd, 0, st->size);
    if (!m.ok()) {
      if (absl::IsPermissionDenied(m.status())) {
        return absl::PermissionDeniedError(absl::StrCat(
            "memfd (fd ", fd,
            ") can no longer be mapped writable: mooncaked sealed it (F_SEAL_FUTURE_WRITE) when "
            "it first mapped it and has given that mapping up since (its queue pairs are gone and "
            "the session handed over other control memory after it); make a new memfd"));
      }
      return m.status();
    }
    // Populated whole, then sealed, then looked at again: a page punched
    // out between the first look and the seal is caught by the second.
    const auto populated = [&] {
      return softnic::SharedMapping::FirstAbsent((*m)->data(), st->size) == st->size;
    };
    if (populated() && (*m)->SealAgainstHoles(fd).ok()) {
      if (!populated()) {
        return absl::FailedPreconditionError(
            absl::StrCat("memfd (fd ", fd,
                         ") lost a page while mooncaked sealed it: write or fallocate() every "
                         "page, and punch none out, before handing it over"));
      }
      whole = *std::move(m);
    }
  }
  if (!whole) {
    // Sparse, larger, or taking no more seals: the span only, looked at
    // before each access.
    return softnic::SharedMapping::FromPopulatedMemfd(fd, offset, bytes);
  }
  by_inode_[inode] = whole;
  kept_[{session, purpose}] = whole;
  return softnic::SharedMapping::View(std::move(whole), offset, bytes);
}

void SealedMemfdMappings::SessionEnded(uint64_t session) {
  absl::MutexLock lock(&mu_);
  kept_.erase({session, Purpose::kControl});
  kept_.erase({session, Purpose::kChannel});
}

size_t SealedMemfdMappings::mapped() {
  absl::MutexLock lock(&mu_);
  return static_cast<size_t>(std::count_if(by_inode_.begin(), by_inode_.end(),
                                           [](const auto& kv) { return !kv.second.expired(); }));
}

}  // namespace mooncake::daemon
