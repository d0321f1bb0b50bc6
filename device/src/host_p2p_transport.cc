// Host platform P2pTransport: buffers are memfd files mapped MAP_SHARED; a
// peer imports the memfd through the HandleExchange and maps it too, so CPU
// threads of different processes (or of one process, at different
// addresses) share the buffer as GPUs share memory over NVLink.

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "buffer_handle.h"
#include "mooncake/common/log.h"
#include "mooncake/common/status.h"
#include "mooncake/common/unique_fd.h"
#include "mooncake/device/device_transport.h"

namespace mooncake {
namespace device {
namespace {

using internal::BufferHandle;
using internal::HandleKind;

constexpr std::string_view kKindName = "memfd";

std::atomic_ref<uint64_t> Word(void* base, size_t offset) {
  return std::atomic_ref<uint64_t>(
      *reinterpret_cast<uint64_t*>(static_cast<char*>(base) + offset));
}

class HostP2pTransport final : public P2pTransport {
 public:
  HostP2pTransport(int num_ranks, std::shared_ptr<HandleExchange> exchange)
      : num_ranks_(num_ranks),
        exchange_(std::move(exchange)),
        available_(num_ranks, 0),
        peer_ptrs_(num_ranks, nullptr),
        peers_(num_ranks) {}

  ~HostP2pTransport() override {
    UnmapPeers();
    for (auto& b : buffers_) ::munmap(b.base, b.map_bytes);
  }

  void* allocateBuffer(size_t bytes) override {
    auto r = Allocate(bytes);
    if (!r.ok()) {
      Fail(r.status());
      return nullptr;
    }
    return *r;
  }

  void freeBuffer(void* ptr) override {
    for (auto it = buffers_.begin(); it != buffers_.end(); ++it) {
      if (it->base == ptr) {
        ::munmap(it->base, it->map_bytes);
        buffers_.erase(it);
        return;
      }
    }
    Fail(absl::InvalidArgumentError(absl::StrCat(
        "freeBuffer(", internal::PtrString(ptr), "): not a buffer of this transport (pass the pointer allocateBuffer returned)")));
  }

  std::vector<int32_t> exportIpcHandle(void* ptr) override {
    auto r = Export(ptr);
    if (!r.ok()) {
      Fail(r.status());
      return {};
    }
    return *std::move(r);
  }

  void importPeerHandles(void* local_ptr, int rank, int num_ranks,
                         const std::vector<std::vector<int32_t>>& remote_handles,
                         const std::vector<int>& active_ranks_mask) override {
    absl::Status s = Import(local_ptr, rank, num_ranks, remote_handles, active_ranks_mask);
    if (!s.ok()) Fail(s);
  }

  int32_t* availableTablePtr() override { return available_.data(); }
  void** peerPtrsTablePtr() override { return peer_ptrs_.data(); }

  bool allPeersAccessible() const override {
    if (rank_ < 0) return false;
    for (int r = 0; r < num_ranks_; ++r) {
      if (active_[r] && available_[r] == 0) return false;
    }
    return true;
  }

  bool verifyPeerAccess() override {
    if (rank_ < 0) {
      Fail(absl::FailedPreconditionError(
          "verifyPeerAccess: no peers imported yet; call importPeerHandles first"));
      return false;
    }
    std::vector<int> failed;
    absl::Status first;
    for (int r = 0; r < num_ranks_; ++r) {
      if (r == rank_ || !active_[r] || available_[r] == 0) continue;
      absl::Status s = Probe(r);
      if (!s.ok()) {
        available_[r] = 0;
        failed.push_back(r);
        if (first.ok()) first = s;
      }
    }
    if (!failed.empty()) {
      Fail(absl::Status(first.code(),
                        absl::StrCat("verifyPeerAccess (rank ", rank_, "): ranks [",
                                     internal::RankList(failed),
                                     "] marked unavailable; first failure: ", first.message())));
    }
    return allPeersAccessible();
  }

  std::string handleKind() const override { return std::string(kKindName); }
  absl::Status lastError() const override { return last_error_; }
  std::vector<int32_t> availableSnapshot() const override { return available_; }

  P2PContext p2pContext() override {
    if (rank_ < 0) return P2PContext{};
    return P2PContext{available_.data(), peer_ptrs_.data(), local_base_};
  }

 private:
  struct Buffer {
    void* base = nullptr;
    size_t map_bytes = 0;
    uint64_t id = 0;
    UniqueFd fd;
  };
  struct PeerMapping {
    void* base = nullptr;
    size_t map_bytes = 0;
    uint64_t expected_id = 0;
  };

  void Fail(absl::Status s) {
    MC_LOG(kWarning, "host P2P transport: ", s.ToString());
    last_error_ = std::move(s);
  }

  absl::StatusOr<void*> Allocate(size_t bytes) {
    if (bytes == 0) {
      return absl::InvalidArgumentError("allocateBuffer(0): the buffer size must be > 0");
    }
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    const size_t map_bytes =
        internal::RoundUp(internal::RoundUp(bytes, 64) + internal::TailBytes(num_ranks_), page);
    UniqueFd fd(::memfd_create("mooncake-p2p", MFD_CLOEXEC));
    if (!fd) return ErrnoStatus(errno, "allocateBuffer: memfd_create");
    if (::ftruncate(fd.get(), static_cast<off_t>(map_bytes)) != 0) {
      return ErrnoStatus(errno, absl::StrCat("allocateBuffer: ftruncate(memfd, ", map_bytes, ")"));
    }
    void* base = ::mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    if (base == MAP_FAILED) {
      return ErrnoStatus(errno, absl::StrCat("allocateBuffer: mmap(", map_bytes, " bytes)"));
    }
    Buffer b;
    b.base = base;
    b.map_bytes = map_bytes;
    b.id = internal::NewBufferId();
    b.fd = std::move(fd);
    // The id lets an importer check that its mapping shows this very buffer.
    Word(base, internal::TailOffset(map_bytes, num_ranks_)).store(b.id, std::memory_order_release);
    buffers_.push_back(std::move(b));
    return base;
  }

  const Buffer* FindBuffer(const void* ptr) const {
    for (const auto& b : buffers_) {
      if (b.base == ptr) return &b;
    }
    return nullptr;
  }

  absl::StatusOr<std::vector<int32_t>> Export(void* ptr) {
    const Buffer* b = FindBuffer(ptr);
    if (b == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "exportIpcHandle(", internal::PtrString(ptr), "): not a buffer of this transport (pass the pointer allocateBuffer returned)"));
    }
    MC_ASSIGN_OR_RETURN(std::string exported,
                        exchange_->exportFds({b->fd.get()}, kKindName, b->map_bytes));
    if (exported.size() > HandleExchange::kMaxExportedBytes) {
      return absl::InternalError(absl::StrCat("exportIpcHandle: the HandleExchange returned ",
                                              exported.size(), " bytes, more than the ",
                                              HandleExchange::kMaxExportedBytes, " a handle holds"));
    }
    BufferHandle h;
    h.kind = HandleKind::kMemfd;
    h.map_bytes = b->map_bytes;
    h.buffer_id = b->id;
    h.payload = std::move(exported);
    return internal::EncodeHandle(h);
  }

  void UnmapPeers() {
    for (auto& p : peers_) {
      if (p.base != nullptr) ::munmap(p.base, p.map_bytes);
      p = PeerMapping{};
    }
    std::fill(available_.begin(), available_.end(), 0);
    std::fill(peer_ptrs_.begin(), peer_ptrs_.end(), nullptr);
    rank_ = -1;
    local_base_ = nullptr;
    local_map_bytes_ = 0;
    active_.clear();
  }

  absl::Status Import(void* local_ptr, int rank, int num_ranks,
                      const std::vector<std::vector<int32_t>>& handles,
                      const std::vector<int>& mask) {
    UnmapPeers();
    if (absl::Status s = internal::ValidateImportArgs(num_ranks_, rank, num_ranks, handles.size(), mask);
        !s.ok()) {
      return s;
    }
    const Buffer* local = FindBuffer(local_ptr);
    if (local == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "importPeerHandles: local_ptr ", internal::PtrString(local_ptr),
          " is not a buffer of this transport (pass the pointer allocateBuffer returned)"));
    }
    rank_ = rank;
    local_base_ = local_ptr;
    local_map_bytes_ = local->map_bytes;
    active_ = internal::ActiveRanks(mask, num_ranks, rank);
    available_[rank] = 1;
    peer_ptrs_[rank] = local_ptr;

    return internal::ImportActivePeers(rank, active_, absl::StrCat("rank ", rank),
                                       [&](int r) { return ImportOne(r, handles[r]); });
  }

  absl::Status ImportOne(int r, const std::vector<int32_t>& words) {
    auto decoded = internal::DecodeHandle(words);
    if (!decoded.ok()) {
      return absl::Status(decoded.status().code(),
                          absl::StrCat("rank ", r, ": ", decoded.status().message()));
    }
    const BufferHandle& h = *decoded;
    if (h.kind != HandleKind::kMemfd) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", r, ": handle kind ", internal::HandleKindName(h.kind),
          " cannot be imported by the host platform (memfd); all ranks must use the same platform"));
    }
    if (h.map_bytes < local_map_bytes_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", r, ": its buffer maps ", h.map_bytes, " bytes, this rank's ", local_map_bytes_,
          "; every rank must allocateBuffer the same size (symmetric layout)"));
    }
    auto fds = exchange_->importFds(h.payload);
    if (!fds.ok()) {
      return absl::Status(fds.status().code(),
                          absl::StrCat("rank ", r, ": importFds: ", fds.status().message()));
    }
    if (fds->size() != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", r, ": importFds returned ", fds->size(), " fds, expected 1 memfd"));
    }
    const int fd = (*fds)[0].get();
    // A shorter file would turn accesses past its end into SIGBUS.
    struct stat st {};
    if (::fstat(fd, &st) != 0) return ErrnoStatus(errno, absl::StrCat("rank ", r, ": fstat(imported fd)"));
    if (static_cast<uint64_t>(st.st_size) < h.map_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", r, ": imported fd has ", st.st_size,
                                                     " bytes, the handle says ", h.map_bytes));
    }
    void* base = ::mmap(nullptr, h.map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
      return ErrnoStatus(errno, absl::StrCat("rank ", r, ": mmap(imported memfd, ", h.map_bytes, ")"));
    }
    // The fd can go: the mapping keeps the memory alive.
    peers_[r] = PeerMapping{base, static_cast<size_t>(h.map_bytes), h.buffer_id};
    peer_ptrs_[r] = base;
    available_[r] = 1;
    return absl::OkStatus();
  }

  absl::Status Probe(int r) {
    const PeerMapping& p = peers_[r];
    const uint64_t id =
        Word(p.base, internal::TailOffset(p.map_bytes, num_ranks_)).load(std::memory_order_acquire);
    if (id != p.expected_id) {
      return absl::DataLossError(absl::StrCat("rank ", r, ": the mapping shows buffer id 0x",
                                              absl::Hex(id), ", the handle named 0x",
                                              absl::Hex(p.expected_id),
                                              "; the handle does not match the exported buffer"));
    }
    const uint64_t probe = internal::NewProbeValue(rank_);
    auto slot = Word(p.base, internal::ProbeSlotOffset(p.map_bytes, num_ranks_, rank_));
    slot.store(probe, std::memory_order_release);
    const uint64_t back = slot.load(std::memory_order_acquire);
    if (back != probe) {
      return absl::DataLossError(absl::StrCat("rank ", r, ": probe wrote 0x", absl::Hex(probe),
                                              " and read back 0x", absl::Hex(back)));
    }
    return absl::OkStatus();
  }

  const int num_ranks_;
  const std::shared_ptr<HandleExchange> exchange_;
  std::vector<Buffer> buffers_;
  // The tables handed to kernels; sized once so their addresses never move.
  std::vector<int32_t> available_;
  std::vector<void*> peer_ptrs_;
  std::vector<PeerMapping> peers_;
  std::vector<int> active_;
  int rank_ = -1;
  void* local_base_ = nullptr;
  size_t local_map_bytes_ = 0;
  absl::Status last_error_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<P2pTransport>> createHostP2pTransport(
    int num_ranks, std::shared_ptr<HandleExchange> exchange) {
  if (num_ranks < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("createHostP2pTransport: num_ranks ", num_ranks, " (must be >= 1)"));
  }
  if (exchange == nullptr) {
    return absl::InvalidArgumentError(
        "createHostP2pTransport: no HandleExchange; memfd buffers can only be shared by passing fds");
  }
  return std::unique_ptr<P2pTransport>(new HostP2pTransport(num_ranks, std::move(exchange)));
}

}  // namespace device
}  // namespace mooncake
