// SharedMapping: client memory the daemon maps to act on it (softnic rings
// and registered host regions). Made only from a memfd the client sealed
// against shrinking, so the client cannot truncate it under the daemon
// (which would turn the next access into SIGBUS in the daemon).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"

namespace mooncake::softnic {

class SharedMapping {
 public:
  // Maps [0, bytes) of `fd` read-write, shared. Fails with InvalidArgument
  // unless `fd` is a memfd carrying F_SEAL_SHRINK whose size is at least
  // `bytes`, and bytes > 0. `fd` is borrowed (the mapping outlives it).
  static absl::StatusOr<std::shared_ptr<SharedMapping>> FromSealedMemfd(int fd, uint64_t bytes);

  // Anonymous memory of the daemon's own (tests, sink buffers).
  static absl::StatusOr<std::shared_ptr<SharedMapping>> Anonymous(uint64_t bytes);

  ~SharedMapping();
  SharedMapping(const SharedMapping&) = delete;
  SharedMapping& operator=(const SharedMapping&) = delete;

  uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }

 private:
  SharedMapping(uint8_t* data, uint64_t size) : data_(data), size_(size) {}
  uint8_t* data_;
  uint64_t size_;
};

}  // namespace mooncake::softnic
