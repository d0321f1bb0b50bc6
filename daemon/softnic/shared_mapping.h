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
  // Maps [offset, offset + bytes) of `fd` read-write, shared; data() is the
  // byte at `offset`. Fails with InvalidArgument unless `fd` is a memfd on
  // tmpfs (not MFD_HUGETLB: hugetlbfs can SIGBUS on a fault) carrying
  // F_SEAL_SHRINK whose size is at least offset + bytes, bytes > 0
  // and `offset` is a multiple of the page size (PageSize()). `fd` is
  // borrowed (the mapping outlives it). Callers map only the part they use:
  // what is mapped is charged to the client (rdma/rdma_budget.h).
  static absl::StatusOr<std::shared_ptr<SharedMapping>> FromSealedMemfd(int fd, uint64_t bytes) {
    return FromSealedMemfd(fd, 0, bytes);
  }
  static absl::StatusOr<std::shared_ptr<SharedMapping>> FromSealedMemfd(int fd, uint64_t offset,
                                                                        uint64_t bytes);
  static uint64_t PageSize();

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
