// Status helpers shared by the daemon and the client.
//
// Errors are absl::Status values inside the project and grpc::Status on the
// wire; the canonical codes map one to one. Wrap errno/CUDA/verbs failures
// once, at the boundary, with a message naming the call.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

// Returns from the enclosing function when `expr` is not OK.
#define MC_RETURN_IF_ERROR(expr)             \
  do {                                       \
    ::absl::Status mc_status_ = (expr);      \
    if (!mc_status_.ok()) return mc_status_; \
  } while (0)

#define MC_CONCAT_INNER_(a, b) a##b
#define MC_CONCAT_(a, b) MC_CONCAT_INNER_(a, b)
#define MC_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(*tmp)

// `MC_ASSIGN_OR_RETURN(auto x, f());` assigns the value or returns the error.
#define MC_ASSIGN_OR_RETURN(lhs, expr) \
  MC_ASSIGN_OR_RETURN_IMPL_(MC_CONCAT_(mc_statusor_, __LINE__), lhs, expr)

namespace mooncake {

// "what: strerror(err)" with the canonical code that fits errno `err`.
absl::Status ErrnoStatus(int err, absl::string_view what);

}  // namespace mooncake

namespace mooncake {

// Shortens `text` to at most `max_bytes` without splitting a UTF-8
// character (protobuf rejects string fields holding invalid UTF-8).
void TruncateUtf8(std::string* text, size_t max_bytes);

}  // namespace mooncake
