#include "softnic/shared_mapping.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <limits>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace mooncake::softnic {
namespace {

absl::StatusOr<uint8_t*> MapShared(int fd, uint64_t offset, uint64_t bytes, const char* what) {
  const int flags = fd < 0 ? MAP_SHARED | MAP_ANONYMOUS : MAP_SHARED;
  void* p = ::mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, flags, fd,
                   static_cast<off_t>(offset));
  if (p == MAP_FAILED) {
    const int err = errno;
    return absl::ErrnoToStatus(err, absl::StrCat("mmap(", what, ", ", bytes, " bytes)"));
  }
  return static_cast<uint8_t*>(p);
}

absl::Status CheckBytes(uint64_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("shared mapping of 0 bytes");
  if (bytes > std::numeric_limits<size_t>::max() / 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared mapping of ", bytes, " bytes is too large"));
  }
  return absl::OkStatus();
}

}  // namespace

uint64_t SharedMapping::PageSize() {
  static const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  return page;
}

absl::StatusOr<std::shared_ptr<SharedMapping>> SharedMapping::FromSealedMemfd(int fd,
                                                                              uint64_t offset,
                                                                              uint64_t bytes) {
  if (absl::Status s = CheckBytes(bytes); !s.ok()) return s;
  if (offset % PageSize() != 0 || offset > static_cast<uint64_t>(INT64_MAX) - bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shared mapping at offset ", offset, " (", bytes,
        " bytes): the offset must be a multiple of the page size and the end fit in an off_t"));
  }
  // Only a memfd answers F_GET_SEALS; anything else (a file, a socket, a
  // closed fd) fails here, which is what we want: a plain file could be
  // truncated by anyone who can open it.
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0) {
    const int err = errno;
    return absl::InvalidArgumentError(absl::StrCat(
        absl::ErrnoToStatus(err, absl::StrCat("fcntl(fd ", fd, ", F_GET_SEALS)")).message(),
        "; softnic maps only memfds sealed with F_SEAL_SHRINK"));
  }
  if ((seals & F_SEAL_SHRINK) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("memfd (fd ", fd, ") lacks F_SEAL_SHRINK (seals 0x", absl::Hex(seals),
                     "): seal it with fcntl(F_ADD_SEALS, F_SEAL_SHRINK) before handing it over"));
  }
  // tmpfs only: a memfd made with MFD_HUGETLB lives on hugetlbfs, which
  // passes the seal check but can fail a fault later (no free huge page)
  // with SIGBUS in the daemon.
  struct statfs fs {};
  if (::fstatfs(fd, &fs) != 0) {
    const int err = errno;
    return absl::ErrnoToStatus(err, absl::StrCat("fstatfs(memfd fd ", fd, ")"));
  }
  if (static_cast<uint64_t>(fs.f_type) != TMPFS_MAGIC) {
    return absl::InvalidArgumentError(
        absl::StrCat("memfd (fd ", fd, ") is not on tmpfs (filesystem 0x", absl::Hex(fs.f_type),
                     (static_cast<uint64_t>(fs.f_type) == HUGETLBFS_MAGIC ? ", hugetlbfs" : ""),
                     "): make it with memfd_create without MFD_HUGETLB"));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    return absl::ErrnoToStatus(err, absl::StrCat("fstat(memfd fd ", fd, ")"));
  }
  if (st.st_size < 0 || static_cast<uint64_t>(st.st_size) < offset + bytes) {
    return absl::InvalidArgumentError(absl::StrCat("memfd (fd ", fd, ") holds ", st.st_size,
                                                   " bytes, fewer than the ", offset + bytes,
                                                   " to map"));
  }
  absl::StatusOr<uint8_t*> p = MapShared(fd, offset, bytes, "memfd");
  if (!p.ok()) return p.status();
  return std::shared_ptr<SharedMapping>(new SharedMapping(*p, bytes));
}

// mincore: for a tmpfs mapping, a page never written nor fallocated, or
// punched out, is not in memory.
uint64_t SharedMapping::FirstAbsent(const uint8_t* p, uint64_t len) {
  const uint64_t page = SharedMapping::PageSize();
  const auto start = reinterpret_cast<uintptr_t>(p) & ~(page - 1);
  const uint64_t span = reinterpret_cast<uintptr_t>(p) + len - start;
  const uint64_t pages = (span + page - 1) / page;
  thread_local std::vector<unsigned char> vec;
  vec.resize(pages);
  if (::mincore(reinterpret_cast<void*>(start), pages * page, vec.data()) != 0) return 0;
  for (uint64_t i = 0; i < pages; ++i) {
    if ((vec[i] & 1) == 0) {
      const uint64_t at = start + i * page;
      return at <= reinterpret_cast<uintptr_t>(p) ? 0 : at - reinterpret_cast<uintptr_t>(p);
    }
  }
  return len;
}

absl::Status SharedMapping::SealAgainstHoles(int fd) {
  if (::fcntl(fd, F_ADD_SEALS, F_SEAL_FUTURE_WRITE) != 0) {
    const int err = errno;
    return absl::InvalidArgumentError(absl::StrCat(
        absl::ErrnoToStatus(err, absl::StrCat("fcntl(memfd fd ", fd, ", F_ADD_SEALS)")).message(),
        ": the memfd takes no more seals"));
  }
  sealed_ = true;
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<SharedMapping>> SharedMapping::View(
    std::shared_ptr<SharedMapping> whole, uint64_t offset, uint64_t bytes) {
  if (absl::Status s = CheckBytes(bytes); !s.ok()) return s;
  if (offset > whole->size_ || bytes > whole->size_ - offset) {
    return absl::InvalidArgumentError(absl::StrCat("bytes [", offset, ", ", offset + bytes,
                                                   ") lie outside the ", whole->size_, " mapped"));
  }
  std::shared_ptr<SharedMapping> v(new SharedMapping(whole->data_ + offset, bytes));
  v->client_pages_ = whole->client_pages_;
  v->sealed_ = whole->sealed_;
  v->whole_ = std::move(whole);
  return v;
}

absl::StatusOr<std::shared_ptr<SharedMapping>> SharedMapping::FromPopulatedMemfd(int fd,
                                                                                 uint64_t offset,
                                                                                 uint64_t bytes) {
  absl::StatusOr<std::shared_ptr<SharedMapping>> m = FromSealedMemfd(fd, offset, bytes);
  if (!m.ok()) return m;
  if (const uint64_t absent = FirstAbsent((*m)->data(), bytes); absent < bytes) {
    return absl::FailedPreconditionError(absl::StrCat(
        "memfd (fd ", fd, ") has pages that hold no memory yet (the first at byte ",
        offset + absent, " of ", offset + bytes,
        "): write or fallocate() every page before registering it (pages mooncaked faulted in "
        "would be charged to the daemon, not to you)"));
  }
  (*m)->client_pages_ = true;
  return m;
}

bool SharedMapping::resident(const uint8_t* p, uint64_t len) const {
  return sealed_ || !client_pages_ || len == 0 || FirstAbsent(p, len) == len;
}

absl::StatusOr<std::shared_ptr<SharedMapping>> SharedMapping::Anonymous(uint64_t bytes) {
  if (absl::Status s = CheckBytes(bytes); !s.ok()) return s;
  absl::StatusOr<uint8_t*> p = MapShared(-1, 0, bytes, "anonymous");
  if (!p.ok()) return p.status();
  return std::shared_ptr<SharedMapping>(new SharedMapping(*p, bytes));
}

SharedMapping::~SharedMapping() {
  if (!whole_) ::munmap(data_, static_cast<size_t>(size_));
}

}  // namespace mooncake::softnic
