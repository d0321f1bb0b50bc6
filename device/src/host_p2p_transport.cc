// Host platform P2pTransport: buffers are memfd files mapped MAP_SHARED; a
// peer receives the memfd (with its group join, or through the
// HandleExchange) and maps it too, so CPU threads of different processes
// (or of one process, at different addresses) share the buffer as GPUs
// share memory over NVLink. Everything but memory itself is the shared core
// (p2p_transport_core.h).

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "mooncake/common/populate.h"
#include "mooncake/common/status.h"
#include "p2p_transport_core.h"

namespace mooncake {
namespace device {
namespace {

using internal::BufferHandle;
using internal::HandleKind;

std::atomic_ref<uint64_t> Word(void* addr) {
  return std::atomic_ref<uint64_t>(*static_cast<uint64_t*>(addr));
}

class HostP2pTransport final : public internal::P2pTransportCore {
 public:
  HostP2pTransport(int num_ranks, std::shared_ptr<HandleExchange> exchange)
      : P2pTransportCore(num_ranks, std::move(exchange), HandleKind::kMemfd, "host") {}
  ~HostP2pTransport() override { ReleaseAll(); }

 private:
  size_t Granularity() const override { return static_cast<size_t>(::sysconf(_SC_PAGESIZE)); }

  absl::Status AllocateMemory(size_t map_bytes, Buffer* b) override {
    UniqueFd fd(::memfd_create("mooncake-p2p", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    if (!fd) return ErrnoStatus(errno, "allocateBuffer: memfd_create");
    if (::ftruncate(fd.get(), static_cast<off_t>(map_bytes)) != 0) {
      return ErrnoStatus(errno, absl::StrCat("allocateBuffer: ftruncate(memfd, ", map_bytes, ")"));
    }
    // Sealed at its size: whoever maps it (peers, and mooncaked's softnic
    // when the buffer is registered for RDMA) can rely on it not shrinking
    // under them, which would turn their next access into SIGBUS.
    if (::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) {
      return ErrnoStatus(errno, "allocateBuffer: sealing the memfd");
    }
    void* base = ::mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    if (base == MAP_FAILED) {
      return ErrnoStatus(errno, absl::StrCat("allocateBuffer: mmap(", map_bytes, " bytes)"));
    }
    // Every page allocated now, by this process: its memory is charged to
    // the application's cgroup, and mooncaked registers only memfds whose
    // pages are all in memory (mooncake/common/populate.h).
    if (const int err = PopulateForWrite(base, map_bytes); err != 0) {
      ::munmap(base, map_bytes);
      return ErrnoStatus(err, absl::StrCat("allocateBuffer: populating ", map_bytes, " bytes"));
    }
    b->base = base;
    b->fd = std::move(fd);
    return absl::OkStatus();
  }

  void ReleaseMemory(Buffer& b) override { ::munmap(b.base, b.map_bytes); }

  absl::Status WriteLocalWord(void* addr, uint64_t value) override {
    Word(addr).store(value, std::memory_order_release);
    return absl::OkStatus();
  }

  absl::Status ExportMemory(Buffer& b, std::vector<UniqueFd>* fds, std::string*) override {
    UniqueFd dup(::fcntl(b.fd.get(), F_DUPFD_CLOEXEC, 0));
    if (!dup) return ErrnoStatus(errno, "export: dup(memfd)");
    fds->push_back(std::move(dup));
    return absl::OkStatus();
  }

  absl::StatusOr<void*> MapMemory(int, const BufferHandle& h, std::vector<UniqueFd> fds) override {
    const int fd = fds[0].get();
    // A shorter file would turn accesses past its end into SIGBUS.
    struct stat st {};
    if (::fstat(fd, &st) != 0) return ErrnoStatus(errno, "fstat(received memfd)");
    if (static_cast<uint64_t>(st.st_size) < h.map_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("the received fd has ", st.st_size,
                                                     " bytes, the handle says ", h.map_bytes));
    }
    void* base = ::mmap(nullptr, h.map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
      return ErrnoStatus(errno, absl::StrCat("mmap(received memfd, ", h.map_bytes, ")"));
    }
    // The fd can go: the mapping keeps the memory alive.
    return base;
  }

  void UnmapMemory(const PeerMapping& p) override { ::munmap(p.base, p.map_bytes); }

  absl::Status Probe(std::vector<ProbeTarget>& targets,
                     std::vector<ProbeResult>* results) override {
    for (const ProbeTarget& t : targets) {
      ProbeResult r;
      r.observed_id = Word(const_cast<uint64_t*>(t.id_word)).load(std::memory_order_acquire);
      r.id_ok = r.observed_id == t.expected_id;
      if (r.id_ok) {
        Word(t.probe_slot).store(t.probe_value, std::memory_order_release);
        r.observed_probe = Word(t.probe_slot).load(std::memory_order_acquire);
        r.probe_ok = r.observed_probe == t.probe_value;
      }
      results->push_back(r);
    }
    return absl::OkStatus();
  }

  // Host memory is what host-platform kernels (CPU threads) read.
  int32_t* TableAvailable() override { return const_cast<int32_t*>(hostAvailable().data()); }
  void** TablePeerPtrs() override { return const_cast<void**>(hostPeerPtrs()); }
  absl::Status PublishTables() override { return absl::OkStatus(); }
};

}  // namespace

absl::StatusOr<std::unique_ptr<BrokeredP2pTransport>> createHostP2pTransport(
    int num_ranks, std::shared_ptr<HandleExchange> exchange) {
  if (num_ranks < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("createHostP2pTransport: num_ranks ", num_ranks, " (must be >= 1)"));
  }
  return std::unique_ptr<BrokeredP2pTransport>(
      new HostP2pTransport(num_ranks, std::move(exchange)));
}

}  // namespace device
}  // namespace mooncake
