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

  // A registered region's memfd (issue 23 item 5): every page of
  // [offset, offset + bytes) must hold data (FailedPrecondition naming the
  // first hole otherwise), and the mapping is marked so the engine never
  // faults in a page the application punched out later (resident()). Pages
  // the daemon faulted in would be charged to the daemon's cgroup, not the
  // application's: one tenant could make it OOM for every tenant.
  static absl::StatusOr<std::shared_ptr<SharedMapping>> FromPopulatedMemfd(int fd, uint64_t offset,
                                                                           uint64_t bytes);

  // Seals `fd`, the memfd this maps, with F_SEAL_FUTURE_WRITE
  // (rdma/sealed_memfd_mappings.h): from then on no page of it can be
  // punched out (fallocate, MADV_REMOVE), written with write(), or mapped
  // writable again, while mappings made before, the client's and this one,
  // keep writing. Its pages stay in memory for as long as it is mapped, so
  // resident() is true without a look. InvalidArgument when the memfd
  // takes no more seals (F_SEAL_SEAL).
  absl::Status SealAgainstHoles(int fd);

  // [offset, offset + bytes) of `whole` (within it), sharing its memory
  // and keeping it mapped; resident() as whole's.
  static absl::StatusOr<std::shared_ptr<SharedMapping>> View(std::shared_ptr<SharedMapping> whole,
                                                             uint64_t offset, uint64_t bytes);

  // The offset of the first page of [p, p + len) that holds no memory
  // (mincore), or len when every page does.
  static uint64_t FirstAbsent(const uint8_t* p, uint64_t len);

  // Anonymous memory of the daemon's own (tests, sink buffers).
  static absl::StatusOr<std::shared_ptr<SharedMapping>> Anonymous(uint64_t bytes);

  ~SharedMapping();
  SharedMapping(const SharedMapping&) = delete;
  SharedMapping& operator=(const SharedMapping&) = delete;

  uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  // Whether the engine may touch [p, p + len) of this mapping: always for
  // the daemon's own memory and sealed memfds (SealAgainstHoles); for an
  // application's region (FromPopulatedMemfd) only when every page of it is
  // in memory (mincore), so that touching it faults nothing in.
  bool resident(const uint8_t* p, uint64_t len) const;

 private:
  SharedMapping(uint8_t* data, uint64_t size) : data_(data), size_(size) {}
  uint8_t* data_;
  uint64_t size_;
  bool client_pages_ = false;             // FromPopulatedMemfd
  bool sealed_ = false;                   // SealAgainstHoles, or a view of such
  std::shared_ptr<SharedMapping> whole_;  // a View's: what is mapped (unmapped by it)
};

}  // namespace mooncake::softnic
