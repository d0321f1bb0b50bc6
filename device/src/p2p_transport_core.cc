#include "p2p_transport_core.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "mooncake/common/log.h"
#include "mooncake/common/status.h"

namespace mooncake {
namespace device {

// Defaults for transports written outside this library (upstream code
// subclasses P2pTransport): the join route is an addition they lack.
absl::StatusOr<ExportedBuffer> BrokeredP2pTransport::exportLocal(void*) {
  return absl::UnimplementedError(
      "exportLocal: this BrokeredP2pTransport has no join route; use "
      "exportIpcHandle/importPeerHandles");
}
absl::Status BrokeredP2pTransport::mapPeers(void*, int, int, std::vector<PeerBuffer>,
                                            const std::vector<int>&) {
  return absl::UnimplementedError(
      "mapPeers: this BrokeredP2pTransport has no join route; use "
      "exportIpcHandle/importPeerHandles");
}

absl::Status BrokeredP2pTransport::markPeerUnavailable(int) {
  return absl::UnimplementedError("markPeerUnavailable: this BrokeredP2pTransport is not elastic");
}
absl::Status BrokeredP2pTransport::remapPeer(int, PeerBuffer) {
  return absl::UnimplementedError("remapPeer: this BrokeredP2pTransport is not elastic");
}

namespace internal {
namespace {

std::string NotOurs(absl::string_view call, const void* ptr) {
  return absl::StrCat(
      call, "(", PtrString(ptr),
      "): not a buffer of this transport (pass the pointer allocateBuffer returned)");
}

}  // namespace

P2pTransportCore::P2pTransportCore(int num_ranks, std::shared_ptr<HandleExchange> exchange,
                                   HandleKind kind, std::string who)
    : num_ranks_(num_ranks),
      exchange_(std::move(exchange)),
      kind_(kind),
      who_(std::move(who)),
      node_key_(NodeKey(exchange_ != nullptr && !exchange_->nodeId().empty()
                            ? exchange_->nodeId()
                            : DefaultNodeIdentity())),
      available_(num_ranks, 0),
      peer_ptrs_(num_ranks, nullptr),
      peers_(num_ranks) {}

// Platform resources are released by the platform's destructor, which runs
// first and calls ReleaseAll(); by now only bookkeeping is left.
P2pTransportCore::~P2pTransportCore() = default;

void P2pTransportCore::Fail(absl::Status s) {
  MC_LOG(kWarning, handleKind(), " P2P transport (", who_, "): ", s.ToString());
  last_error_ = std::move(s);
}

void P2pTransportCore::ReleaseAll() {
  auto on = EnterPlatform();
  UnmapPeers();
  for (auto& b : buffers_) ReleaseMemory(*b);
  buffers_.clear();
}

void* P2pTransportCore::allocateBuffer(size_t bytes) {
  auto on = EnterPlatform();
  absl::StatusOr<void*> r = Allocate(bytes);
  if (!r.ok()) {
    Fail(r.status());
    return nullptr;
  }
  return *r;
}

absl::StatusOr<void*> P2pTransportCore::Allocate(size_t bytes) {
  if (bytes == 0) {
    return absl::InvalidArgumentError("allocateBuffer(0): the buffer size must be > 0");
  }
  auto b = std::make_unique<Buffer>();
  b->map_bytes = RoundUp(RoundUp(bytes, 64) + TailBytes(num_ranks_), Granularity());
  b->id = NewBufferId();
  MC_RETURN_IF_ERROR(AllocateMemory(b->map_bytes, b.get()));
  // The id lets an importer check that its mapping shows this very buffer.
  absl::Status s =
      WriteLocalWord(static_cast<char*>(b->base) + TailOffset(b->map_bytes, num_ranks_), b->id);
  if (!s.ok()) {
    ReleaseMemory(*b);
    return absl::Status(s.code(),
                        absl::StrCat("allocateBuffer: writing the buffer id: ", s.message()));
  }
  void* base = b->base;
  buffers_.push_back(std::move(b));
  return base;
}

void P2pTransportCore::freeBuffer(void* ptr) {
  auto on = EnterPlatform();
  for (auto it = buffers_.begin(); it != buffers_.end(); ++it) {
    if ((*it)->base == ptr) {
      // The peers were imported for this buffer: its tables would point a
      // kernel at freed memory (local_base) and at mappings nobody uses.
      if (ptr == local_base_) {
        UnmapPeers();
        (void)PublishTables();
      }
      ReleaseMemory(**it);
      buffers_.erase(it);
      return;
    }
  }
  Fail(absl::InvalidArgumentError(NotOurs("freeBuffer", ptr)));
}

P2pTransportCore::Buffer* P2pTransportCore::FindBuffer(const void* ptr) {
  for (auto& b : buffers_) {
    if (b->base == ptr) return b.get();
  }
  return nullptr;
}

absl::Status P2pTransportCore::Describe(void* ptr, BufferHandle* h, std::vector<UniqueFd>* fds) {
  Buffer* b = FindBuffer(ptr);
  if (b == nullptr) return absl::InvalidArgumentError(NotOurs("export", ptr));
  h->kind = kind_;
  h->map_bytes = b->map_bytes;
  h->buffer_id = b->id;
  h->node_key = node_key_;
  return ExportMemory(*b, fds, &h->payload);
}

absl::StatusOr<ExportedBuffer> P2pTransportCore::ExportLocal(void* ptr) {
  BufferHandle h;
  ExportedBuffer out;
  MC_RETURN_IF_ERROR(Describe(ptr, &h, &out.fds));
  MC_ASSIGN_OR_RETURN(out.handle, EncodeHandle(h));
  out.map_bytes = h.map_bytes;
  return out;
}

absl::StatusOr<ExportedBuffer> P2pTransportCore::exportLocal(void* ptr) {
  auto on = EnterPlatform();
  absl::StatusOr<ExportedBuffer> r = ExportLocal(ptr);
  if (!r.ok()) Fail(r.status());
  return r;
}

std::vector<int32_t> P2pTransportCore::exportIpcHandle(void* ptr) {
  auto on = EnterPlatform();
  absl::StatusOr<std::vector<int32_t>> r = [&]() -> absl::StatusOr<std::vector<int32_t>> {
    BufferHandle h;
    std::vector<UniqueFd> fds;
    MC_RETURN_IF_ERROR(Describe(ptr, &h, &fds));
    // The handle says it all (legacy IPC, fabric): the fds a fabric buffer
    // also exports for the join route are not sent (the payload has no room
    // for an export name beside the fabric handle) and close here.
    if (fds.empty() || !IsFdKind(h.kind)) return EncodeHandle(h);
    if (exchange_ == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "exportIpcHandle: ", handleKind(),
          " buffers are shared by passing fds, and this transport has no HandleExchange to "
          "publish them (create it with one, or use exportLocal and send the fds yourself)"));
    }
    std::vector<int> raw;
    for (const UniqueFd& fd : fds) raw.push_back(fd.get());
    MC_ASSIGN_OR_RETURN(h.payload, exchange_->exportFds(raw, handleKind(), h.map_bytes));
    if (h.payload.size() > HandleExchange::kMaxExportedBytes) {
      return absl::InternalError(absl::StrCat(
          "exportIpcHandle: the HandleExchange returned ", h.payload.size(),
          " bytes, more than the ", HandleExchange::kMaxExportedBytes, " a handle holds"));
    }
    return EncodeHandle(h);
  }();
  if (!r.ok()) {
    Fail(r.status());
    return {};
  }
  return *std::move(r);
}

void P2pTransportCore::UnmapPeers() {
  for (PeerMapping& p : peers_) {
    if (p.base != nullptr) UnmapMemory(p);
    p = PeerMapping{};
  }
  std::fill(available_.begin(), available_.end(), 0);
  std::fill(peer_ptrs_.begin(), peer_ptrs_.end(), nullptr);
  rank_ = -1;
  local_base_ = nullptr;
  local_map_bytes_ = 0;
  active_.clear();
  off_node_.clear();
}

absl::Status P2pTransportCore::BeginImport(void* local_ptr, int rank, int num_ranks,
                                           size_t peer_count, const std::vector<int>& mask) {
  UnmapPeers();
  MC_RETURN_IF_ERROR(ValidateImportArgs(num_ranks_, rank, num_ranks, peer_count, mask));
  const Buffer* local = FindBuffer(local_ptr);
  if (local == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "importPeerHandles: local_ptr ", PtrString(local_ptr),
        " is not a buffer of this transport (pass the pointer allocateBuffer returned)"));
  }
  rank_ = rank;
  local_base_ = local_ptr;
  local_map_bytes_ = local->map_bytes;
  active_ = ActiveRanks(mask, num_ranks, rank);
  available_[rank] = 1;
  peer_ptrs_[rank] = local_ptr;
  return absl::OkStatus();
}

template <class FetchFds>
absl::Status P2pTransportCore::ImportPeers(const std::vector<std::vector<int32_t>>& handles,
                                           FetchFds fetch) {
  std::vector<int> failed;
  absl::Status first;
  for (int r = 0; r < num_ranks_; ++r) {
    if (r == rank_ || !active_[r]) continue;
    absl::Status s = [&]() -> absl::Status {
      absl::StatusOr<BufferHandle> h = DecodeHandle(handles[r]);
      if (!h.ok()) return h.status();
      // Another node's buffer cannot be loaded from here: that peer needs
      // the RDMA route. Not a failure of this transport.
      if (h->node_key != node_key_ && !MapsOffNode(h->kind)) {
        off_node_.push_back(r);
        active_[r] = 0;
        return absl::OkStatus();
      }
      MC_ASSIGN_OR_RETURN(std::vector<UniqueFd> fds, fetch(r, *h));
      absl::Status mapped = MapPeer(r, *h, std::move(fds));
      if (!mapped.ok() && h->node_key != node_key_) {
        // A fabric handle of another node that this GPU cannot import (not
        // in its NVLink domain, no IMEX channel): the peer is off-node as
        // before fabric handles existed, and takes the RDMA route.
        MC_LOG(kInfo, handleKind(), " P2P transport (", who_, "): rank ", r,
               " is on another node and its fabric handle does not map here (", mapped.message(),
               "); it needs the RDMA route");
        off_node_.push_back(r);
        active_[r] = 0;
        return absl::OkStatus();
      }
      return mapped;
    }();
    if (!s.ok()) {
      failed.push_back(r);
      if (first.ok()) first = absl::Status(s.code(), absl::StrCat("rank ", r, ": ", s.message()));
    }
  }
  if (failed.empty()) return absl::OkStatus();
  return absl::Status(
      first.code(),
      absl::StrCat("importing peers (rank ", rank_, ", ", who_, "): ranks [", RankList(failed),
                   "] unavailable; first failure: ", first.message()));
}

absl::Status P2pTransportCore::MapPeer(int r, const BufferHandle& h, std::vector<UniqueFd> fds) {
  if (!MapsKind(h.kind)) {
    return absl::InvalidArgumentError(
        absl::StrCat("handle kind ", HandleKindName(h.kind), ", this rank uses ", handleKind(),
                     "; every rank of a group must use the same platform and handle kind"));
  }
  if (h.map_bytes < local_map_bytes_) {
    return absl::InvalidArgumentError(
        absl::StrCat("its buffer maps ", h.map_bytes, " bytes, this rank's ", local_map_bytes_,
                     "; every rank must allocateBuffer the same size (symmetric layout)"));
  }
  if (IsFdKind(h.kind) ? fds.size() != 1 : fds.size() > 1) {
    return absl::InvalidArgumentError(absl::StrCat(fds.size(), " fds arrived for a ",
                                                   HandleKindName(h.kind), " buffer, expected ",
                                                   IsFdKind(h.kind) ? "1" : "at most 1"));
  }
  MC_ASSIGN_OR_RETURN(void* base, MapMemory(r, h, std::move(fds)));
  peers_[r] = PeerMapping{base, static_cast<size_t>(h.map_bytes), h.buffer_id};
  peer_ptrs_[r] = base;
  available_[r] = 1;
  return absl::OkStatus();
}

void P2pTransportCore::importPeerHandles(void* local_ptr, int rank, int num_ranks,
                                         const std::vector<std::vector<int32_t>>& handles,
                                         const std::vector<int>& mask) {
  auto on = EnterPlatform();
  absl::Status s = BeginImport(local_ptr, rank, num_ranks, handles.size(), mask);
  if (s.ok()) {
    s = ImportPeers(
        handles, [&](int, const BufferHandle& h) -> absl::StatusOr<std::vector<UniqueFd>> {
          if (!IsFdKind(h.kind)) return std::vector<UniqueFd>{};
          if (h.payload.empty()) {
            return absl::InvalidArgumentError(
                "the handle names no export: it came from exportLocal (the join route), whose fds "
                "travel beside it; pass it to mapPeers with those fds");
          }
          if (exchange_ == nullptr) {
            return absl::FailedPreconditionError(
                "this transport has no HandleExchange to import the peer's fds with");
          }
          absl::StatusOr<std::vector<UniqueFd>> fds = exchange_->importFds(h.payload);
          if (!fds.ok()) {
            return absl::Status(fds.status().code(),
                                absl::StrCat("importFds: ", fds.status().message()));
          }
          return fds;
        });
  }
  absl::Status publish = PublishTables();
  if (!s.ok()) {
    Fail(s);
  } else if (!publish.ok()) {
    Fail(publish);
  }
}

absl::Status P2pTransportCore::mapPeers(void* local_ptr, int rank, int num_ranks,
                                        std::vector<PeerBuffer> peers,
                                        const std::vector<int>& mask) {
  auto on = EnterPlatform();
  absl::Status s = BeginImport(local_ptr, rank, num_ranks, peers.size(), mask);
  if (s.ok()) {
    std::vector<std::vector<int32_t>> handles(peers.size());
    for (size_t i = 0; i < peers.size(); ++i) handles[i] = std::move(peers[i].handle);
    s = ImportPeers(handles,
                    [&](int r, const BufferHandle&) -> absl::StatusOr<std::vector<UniqueFd>> {
                      return std::move(peers[r].fds);
                    });
  }
  absl::Status publish = PublishTables();
  if (s.ok()) s = publish;
  if (!s.ok()) Fail(s);
  return s;
}

bool P2pTransportCore::allPeersAccessible() const {
  if (rank_ < 0) return false;
  if (!off_node_.empty()) return false;
  for (int r = 0; r < num_ranks_; ++r) {
    if (active_[r] && available_[r] == 0) return false;
  }
  return true;
}

absl::Status P2pTransportCore::Verify(int only) {
  if (rank_ < 0) {
    return absl::FailedPreconditionError(
        "verifyPeerAccess: no peers imported yet; call importPeerHandles first");
  }
  std::vector<ProbeTarget> targets;
  for (int r = 0; r < num_ranks_; ++r) {
    if (r == rank_ || !active_[r] || available_[r] == 0 || (only >= 0 && r != only)) continue;
    const PeerMapping& p = peers_[r];
    auto* base = static_cast<char*>(p.base);
    ProbeTarget t;
    t.rank = r;
    t.id_word = reinterpret_cast<const uint64_t*>(base + TailOffset(p.map_bytes, num_ranks_));
    t.probe_slot =
        reinterpret_cast<uint64_t*>(base + ProbeSlotOffset(p.map_bytes, num_ranks_, rank_));
    t.expected_id = p.expected_id;
    t.probe_value = NewProbeValue(rank_);
    targets.push_back(t);
  }
  if (targets.empty()) return absl::OkStatus();
  std::vector<ProbeResult> results;
  std::vector<int> checked;
  for (const ProbeTarget& t : targets) checked.push_back(t.rank);
  if (absl::Status s = Probe(targets, &results); !s.ok()) {
    // A fault inside the probe poisons it: every checked peer is suspect.
    for (int r : checked) available_[r] = 0;
    return absl::Status(
        s.code(), absl::StrCat("verifyPeerAccess (rank ", rank_, ", ", who_, "): probing ranks [",
                               RankList(checked), "]: ", s.message(), "; all marked unavailable"));
  }
  std::vector<int> failed;
  std::string first;
  for (size_t i = 0; i < targets.size(); ++i) {
    const ProbeTarget& t = targets[i];
    const ProbeResult& res = results[i];
    if (res.id_ok && res.probe_ok) continue;
    available_[t.rank] = 0;
    failed.push_back(t.rank);
    if (!first.empty()) continue;
    first = !res.id_ok ? absl::StrCat("rank ", t.rank, ": the mapping shows buffer id 0x",
                                      absl::Hex(res.observed_id), ", the handle named 0x",
                                      absl::Hex(t.expected_id),
                                      "; the handle does not match the exported buffer")
                       : absl::StrCat("rank ", t.rank, ": probe wrote 0x", absl::Hex(t.probe_value),
                                      " and read back 0x", absl::Hex(res.observed_probe));
  }
  if (failed.empty()) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat("verifyPeerAccess (rank ", rank_, ", ", who_,
                                          "): ranks [", RankList(failed),
                                          "] marked unavailable; first failure: ", first));
}

bool P2pTransportCore::verifyPeerAccess() {
  auto on = EnterPlatform();
  absl::Status s = Verify();
  absl::Status publish = PublishTables();
  if (!s.ok()) Fail(s);
  if (!publish.ok()) Fail(publish);
  return s.ok() && publish.ok() && allPeersAccessible();
}

absl::Status P2pTransportCore::markPeerUnavailable(int peer) {
  auto on = EnterPlatform();
  if (rank_ < 0) {
    return absl::FailedPreconditionError("markPeerUnavailable: no peers imported yet");
  }
  if (peer < 0 || peer >= num_ranks_ || peer == rank_) {
    return absl::InvalidArgumentError(absl::StrCat("markPeerUnavailable: rank ", peer,
                                                   " is not a peer of rank ", rank_, " (0..",
                                                   num_ranks_ - 1, ")"));
  }
  available_[peer] = 0;
  return PublishTables();
}

absl::Status P2pTransportCore::remapPeer(int peer, PeerBuffer buffer) {
  auto on = EnterPlatform();
  if (rank_ < 0) return absl::FailedPreconditionError("remapPeer: no peers imported yet");
  if (peer < 0 || peer >= num_ranks_ || peer == rank_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "remapPeer: rank ", peer, " is not a peer of rank ", rank_, " (0..", num_ranks_ - 1, ")"));
  }
  // Kernels stop finding the old mapping before it goes.
  available_[peer] = 0;
  peer_ptrs_[peer] = nullptr;
  MC_RETURN_IF_ERROR(PublishTables());
  if (peers_[peer].base != nullptr) UnmapMemory(peers_[peer]);
  peers_[peer] = PeerMapping{};
  off_node_.erase(std::remove(off_node_.begin(), off_node_.end(), peer), off_node_.end());
  absl::Status s = [&]() -> absl::Status {
    MC_ASSIGN_OR_RETURN(BufferHandle h, DecodeHandle(buffer.handle));
    if (h.node_key != node_key_ && !MapsOffNode(h.kind)) {
      return absl::FailedPreconditionError(
          "the replacement's buffer is on another node: it needs the RDMA route");
    }
    active_[peer] = 1;
    MC_RETURN_IF_ERROR(MapPeer(peer, h, std::move(buffer.fds)));
    MC_RETURN_IF_ERROR(Verify(peer));
    return PublishTables();
  }();
  if (!s.ok()) {
    available_[peer] = 0;
    (void)PublishTables();
    s = absl::Status(s.code(),
                     absl::StrCat("remapPeer(rank ", peer, ", ", who_, "): ", s.message()));
    Fail(s);
  }
  return s;
}

P2PContext P2pTransportCore::p2pContext() {
  if (rank_ < 0) return P2PContext{};
  return P2PContext{TableAvailable(), TablePeerPtrs(), local_base_};
}

}  // namespace internal
}  // namespace device
}  // namespace mooncake
