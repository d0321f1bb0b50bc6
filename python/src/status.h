// Failed absl::Status values on their way to Python. Binding code throws a
// StatusError; the translator registered by RegisterStatus turns it into an
// instance of mooncake_client.MooncakeError (the subclass for its code
// family, chosen by mooncake_client/errors.py through the factory the
// package installs with _set_error_factory) carrying the canonical code name
// (`.code`, e.g. "INVALID_ARGUMENT") and the message. Without a factory (the
// extension imported on its own) it raises RuntimeError("CODE: message").
#pragma once

#include <exception>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace mooncake::python {

class StatusError : public std::exception {
 public:
  StatusError(absl::StatusCode code, std::string message);
  absl::StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  const char* what() const noexcept override { return what_.c_str(); }

 private:
  absl::StatusCode code_;
  std::string message_;
  std::string what_;  // "CODE: message"
};

// The canonical name of a code ("INVALID_ARGUMENT"), as grpc and absl spell it.
const char* StatusCodeName(absl::StatusCode code);

[[noreturn]] void ThrowError(absl::StatusCode code, std::string message);
inline void ThrowIfError(const absl::Status& s) {
  if (!s.ok()) ThrowError(s.code(), std::string(s.message()));
}
template <class T>
T ValueOrThrow(absl::StatusOr<T> s) {
  ThrowIfError(s.status());
  return *std::move(s);
}

}  // namespace mooncake::python
