#include "mooncake/common/status.h"

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace mooncake {

absl::Status ErrnoStatus(int err, absl::string_view what) {
  std::string msg = absl::StrCat(what, ": ", std::strerror(err));
  switch (err) {
    case ENOENT:
    case ENODEV:
    case ENXIO: return absl::NotFoundError(msg);
    case EACCES:
    case EPERM: return absl::PermissionDeniedError(msg);
    case EEXIST:
    case EADDRINUSE: return absl::AlreadyExistsError(msg);
    case EINVAL:
    case EBADF: return absl::InvalidArgumentError(msg);
    case ENOMEM:
    case EMFILE:
    case ENFILE:
    case ENOSPC: return absl::ResourceExhaustedError(msg);
    case ETIMEDOUT:
    case EAGAIN: return absl::DeadlineExceededError(msg);
    case ECONNREFUSED:
    case ECONNRESET:
    case EPIPE:
    case ENOTCONN: return absl::UnavailableError(msg);
    default: return absl::InternalError(msg);
  }
}

}  // namespace mooncake

namespace mooncake {

void TruncateUtf8(std::string* text, size_t max_bytes) {
  if (text->size() <= max_bytes) return;
  size_t n = max_bytes;
  // Back off continuation bytes (10xxxxxx) to the start of a character.
  while (n > 0 && (static_cast<unsigned char>((*text)[n]) & 0xC0) == 0x80) --n;
  text->resize(n);
}

}  // namespace mooncake
