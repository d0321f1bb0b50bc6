// SealedMemfdMappings: the daemon's mappings of RDMA control memory (rings,
// CQs, doorbell records) and of copy-agent channels (issue 24 item 11, and
// the residual of the ring residency rule in docs/limits.md).
//
// A memfd whose every page holds memory (as the client library makes them)
// and of at most kMaxBytes is mapped whole, once, and then sealed against
// new writable mappings, hole punching and write() (F_SEAL_FUTURE_WRITE;
// shrinking was sealed by the client). From then on every page of it stays
// in memory and the client's: none can be punched out for the daemon to
// fault back in on its own cgroup's account, so softnic touches rings, CQEs
// and the channel with no residency look per access (a mincore each, six
// on a WRITE + quiet: microseconds of every op). The address space this
// takes is memory the client owns and its cgroup pays for.
//
// Any other memfd (sparse, larger, or one that takes no more seals) is
// mapped as before: only the span used, every page of the span holding
// memory, and looked at before each access (SharedMapping::
// FromPopulatedMemfd).
//
// A sealed memfd cannot be mapped writable again, so its mapping is kept
// while anything uses it (queue pairs, a copy agent link, a region
// registered in it) and, for the control memory and the channel a session
// handed over last, until the session ends or hands over another: queue
// pairs destroyed and made again in the same memory (recreateQueuePairs),
// or a call refused after the memfd was sealed and made again, get the
// same mapping. That is at most two mappings per session beyond what
// rdma_budget.h counts. A memfd mapped by another session is shared while
// it is mapped.
//
// Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "softnic/shared_mapping.h"

namespace mooncake::daemon {

class SealedMemfdMappings {
 public:
  // A memfd is mapped whole only up to this size (address space).
  static constexpr uint64_t kMaxBytes = uint64_t{16} << 30;

  // What the memfd is to the session: the last of each is kept.
  enum class Purpose { kControl, kChannel };
  // A mapping of [offset, offset + bytes) of memfd `fd` (borrowed) for
  // `session`, as described above. The errors of SharedMapping::
  // FromSealedMemfd and FromPopulatedMemfd; PermissionDenied for a memfd
  // the daemon sealed and no longer maps.
  absl::StatusOr<std::shared_ptr<softnic::SharedMapping>> Map(uint64_t session, int fd,
                                                              uint64_t offset, uint64_t bytes,
                                                              Purpose purpose);

  // A view of a memfd mapped and sealed now, or null (a region registered
  // in control memory: such a memfd cannot be mapped writable again).
  std::shared_ptr<softnic::SharedMapping> Find(int fd, uint64_t offset, uint64_t bytes);

  // Drops what the session kept mapped after use.
  void SessionEnded(uint64_t session);

  // Memfds mapped and sealed now (tests).
  size_t mapped();

 private:
  using Inode = std::pair<uint64_t, uint64_t>;  // st_dev, st_ino
  std::shared_ptr<softnic::SharedMapping> FindLocked(const Inode& inode, uint64_t offset,
                                                     uint64_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  std::map<Inode, std::weak_ptr<softnic::SharedMapping>> by_inode_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<uint64_t, Purpose>, std::shared_ptr<softnic::SharedMapping>> kept_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace mooncake::daemon
