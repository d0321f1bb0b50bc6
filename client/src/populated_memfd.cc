#include "populated_memfd.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"
#include "mooncake/common/populate.h"
#include "mooncake/common/status.h"

namespace mooncake {

absl::StatusOr<PopulatedMemfd> CreatePopulatedMemfd(const char* name, uint64_t bytes,
                                                    absl::string_view what) {
  UniqueFd fd(::memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid()) return ErrnoStatus(errno, absl::StrCat("memfd_create (", what, ")"));
  if (::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0 ||
      ::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) {
    return ErrnoStatus(errno, absl::StrCat("sizing and sealing the ", what));
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) return ErrnoStatus(errno, absl::StrCat("mmap (", what, ")"));
  if (const int err = PopulateForWrite(p, bytes); err != 0) {
    ::munmap(p, bytes);
    return ErrnoStatus(err, absl::StrCat("populating the ", what));
  }
  return PopulatedMemfd{std::move(fd), static_cast<uint8_t*>(p)};
}

}  // namespace mooncake
