#include "softnic/engine.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <limits>
#include <random>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "mooncake/common/log.h"
#include "mooncake/common/random.h"
#include "mooncake/common/status.h"
#include "mooncake/device/mlx5/prm.h"
#include "softnic/copy_agent_link.h"
#include "softnic/cuda_atomics_kernel.h"
#include "softnic/cuda_memory.h"

namespace mooncake::softnic {

namespace mlx5 = ::mooncake::device::mlx5;

namespace {

// A local WRITE is copied at most this much per visit of its QP (the
// engine lock is let go between visits).
constexpr uint64_t kLocalPieceBytes = 4u << 20;
// WQEs one visit of a QP executes at most before the engine lets go of its
// lock (and visits the others).
constexpr uint16_t kMaxWqesPerVisit = 1024;
// How often a QP's doorbell records' pages are checked for residency.
constexpr auto kRecordsCheck = std::chrono::milliseconds(1);
// How long the engine thread lets callers waiting for its lock go first,
// in all, per round over the QPs: a flood of API calls delays the rings by
// this much per round at most (not per QP: 64 QPs would make it 64 times
// as much).
constexpr auto kYieldToCallersPerRound = std::chrono::microseconds(50);

// 32 bits from the kernel's CSPRNG.
uint32_t RandomKey() {
  const std::string bytes = RandomBytes(sizeof(uint32_t));
  uint32_t v = 0;
  std::memcpy(&v, bytes.data(), sizeof(v));
  return v;
}

// Compares secrets without an early exit (the time taken says nothing of
// how much of a guess was right).
bool SameSecret(const std::string& a, const std::string& b) {
  if (a.size() != b.size() || a.empty()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

absl::Status CheckSecretSize(const std::string& secret) {
  if (secret.size() == Engine::kSecretBytes) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("a connection secret has ", Engine::kSecretBytes,
                                                 " bytes, not ", secret.size()));
}

constexpr uint32_t kQpnMask = 0xffffffu;

bool IsPow2(uint64_t x) { return x != 0 && (x & (x - 1)) == 0; }

// [off, off + len) inside [0, size), without overflow.
bool Fits(uint64_t off, uint64_t len, uint64_t size) { return len <= size && off <= size - len; }

// Both ranges already Fit one mapping, so the sums cannot overflow.
bool Overlaps(uint64_t a, uint64_t a_len, uint64_t b, uint64_t b_len) {
  return a < b + b_len && b < a + a_len;
}

template <class T>
std::atomic_ref<T> Ref(T* p) {
  static_assert(std::atomic_ref<T>::is_always_lock_free);
  return std::atomic_ref<T>(*p);
}

uint32_t Be32At(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof(v));
  return mlx5::be32(v);
}
uint64_t Be64At(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof(v));
  return mlx5::be64(v);
}

// Host to host. A NIC writes a payload in order, each aligned 8-byte piece
// at once; readers poll signals and both halves of an LL slot with atomic
// loads, and a signal carries release meaning (the payloads of earlier WQEs
// are visible once it is). So small word-aligned payloads are stored as
// release atomics, and bulk data is a plain copy that a later signal's
// release store publishes.
void CopyHostBytes(uint8_t* d, const uint8_t* s, uint64_t n) {
  const auto d_addr = reinterpret_cast<uintptr_t>(d);
  if (n <= mlx5::kSendWqeBb && n % 8 == 0 && d_addr % 8 == 0) {
    for (uint64_t i = 0; i < n; i += 8) {
      uint64_t v;
      std::memcpy(&v, s + i, 8);
      Ref(reinterpret_cast<uint64_t*>(d + i)).store(v, std::memory_order_release);
    }
  } else if (n == 4 && d_addr % 4 == 0) {
    uint32_t v;
    std::memcpy(&v, s, 4);
    Ref(reinterpret_cast<uint32_t*>(d)).store(v, std::memory_order_release);
  } else {
    // memmove: a hostile WQE may name overlapping source and destination.
    std::memmove(d, s, static_cast<size_t>(n));
  }
}

uint8_t* HostPtr(uint64_t addr) { return reinterpret_cast<uint8_t*>(static_cast<uintptr_t>(addr)); }

// GPU memory through the copy agents of the processes that own it
// (copy_agent_link.h): true when they moved the bytes, false when the
// engine must copy itself (no usable agent on a GPU side, an agent on only
// one of two GPU sides, or an agent that failed the copy; the engine's own
// copy then redoes it whole, once the agent called off what it queued).
// GPU to GPU within one process and CUDA context is the destination
// agent's alone: one landing straight from the source per piece when it
// has its kernels, else out and in through its staging area; between two
// processes it goes out through the source's staging area and in through
// the destination's, piece by piece (CopyAgentLink::Between,
// WithinDevice).
bool CopyThroughAgents(const ByteSpan& dst, const ByteSpan& src) {
  const auto usable = [](const ByteSpan& b) {
    return b.kind == MemoryKind::kCuda && b.agent != nullptr && b.agent->usable();
  };
  const uint64_t n = dst.length;
  if (src.kind == MemoryKind::kHost) {
    return usable(dst) && dst.agent->ToDevice(dst.agent_addr, HostPtr(src.addr), n).ok();
  }
  if (!usable(src)) return false;
  if (dst.kind == MemoryKind::kHost) {
    return src.agent
        ->FromDevice(src.agent_addr, n,
                     [&](const uint8_t* piece, uint64_t off, uint64_t len) {
                       CopyHostBytes(HostPtr(dst.addr) + off, piece, len);
                       return true;
                     })
        .ok();
  }
  if (!usable(dst)) return false;
  return CopyAgentLink::Between(*src.agent, src.agent_addr, *dst.agent, dst.agent_addr, n).ok();
}

// Every byte softnic moves goes through here. GPU memory on either side
// goes through the owning processes' copy agents or through
// CudaMemory::Copy; both return only once the bytes are in place, so the
// ordering of the host path holds by completing each copy in turn.
// Returns false when it cannot reach one side or the copy failed.
bool CopyBytes(const ByteSpan& dst, const ByteSpan& src) {
  if (dst.length != src.length) return false;
  if (dst.kind != MemoryKind::kHost || src.kind != MemoryKind::kHost) {
    if (CopyThroughAgents(dst, src)) return true;
    if ((dst.kind == MemoryKind::kCuda && dst.cuda == nullptr) ||
        (src.kind == MemoryKind::kCuda && src.cuda == nullptr)) {
      return false;
    }
    if (dst.kind == MemoryKind::kCuda && dst.agent != nullptr &&
        dst.agent->LateCopyOverlaps(dst.agent_addr, dst.length)) {
      // A copy the owner's agent took and never answered may still land here: it
      // must carry these bytes, so they go to its staging area first.
      std::vector<uint8_t> bytes(dst.length);
      const ByteSpan host{MemoryKind::kHost, reinterpret_cast<uintptr_t>(bytes.data()), dst.length,
                          nullptr};
      if (src.kind == MemoryKind::kHost) {
        std::memcpy(bytes.data(), HostPtr(src.addr), dst.length);
      } else if (!src.cuda->Copy(host, src).ok()) {
        return false;
      }
      // Mirror and write as one step: two writers here could otherwise
      // leave one's bytes in memory and the other's in the late copy.
      return dst.agent->MirrorThenWrite(dst.agent_addr, bytes.data(), dst.length,
                                        [&] { return dst.cuda->Copy(dst, host).ok(); });
    }
    CudaMemory* cuda = dst.kind == MemoryKind::kCuda ? dst.cuda : src.cuda;
    return cuda->Copy(dst, src).ok();
  }
  CopyHostBytes(HostPtr(dst.addr), HostPtr(src.addr), dst.length);
  return true;
}

// An atomic's old value into the requester's memory, as a ConnectX returns
// it: host order for the standard 8-byte atomic (mlx5_core sets the
// host-endian atomic mode), big-endian for extended atomics. A GPU
// destination that fails now loses the value after the atomic ran, as a
// NIC's failed local write would. Returns a syndrome (0: ok).
uint8_t LandFetched(const ByteSpan& dst, bool masked, uint64_t fetched) {
  uint8_t bytes[8];
  if (masked) {
    const uint32_t v = mlx5::be32(static_cast<uint32_t>(fetched));
    std::memcpy(bytes, &v, 4);
  } else {
    std::memcpy(bytes, &fetched, 8);
  }
  const ByteSpan from{MemoryKind::kHost, reinterpret_cast<uintptr_t>(bytes), dst.length};
  return CopyBytes(dst, from) ? 0 : mlx5::kSyndLocalProtErr;
}

}  // namespace

struct Engine::Region {
  uint32_t key = 0;
  PdId pd = 0;
  uint64_t iova = 0;
  uint64_t length = 0;
  uint32_t access = 0;
  MemoryKind kind = MemoryKind::kHost;
  std::shared_ptr<SharedMapping> mapping;  // kHost: keeps the bytes mapped
  std::shared_ptr<CudaBuffer> cuda;        // kCuda: keeps the bytes mapped; null: unreachable
  // kCuda: the copy agent of the process that owns the memory (its PD's).
  std::shared_ptr<CopyAgentLink> agent;
  uint64_t base = 0;  // where byte 0 is for the daemon: host pointer or CUdeviceptr
  // Threads working on it without the engine's lock (Pin); while any do, a
  // deregistration waits. A dying region answers to no key: it is on its
  // way out and only waits for them.
  uint32_t pins = 0;
  bool dying = false;

  // Whether the engine can touch the bytes at all.
  bool Reachable() const { return kind == MemoryKind::kHost || cuda != nullptr; }
  // Whether touching [addr, addr + len) faults in no page of the
  // application's (issue 23 item 5: a page punched out after registration
  // would be charged to the daemon); only after Resolve().
  bool Resident(uint64_t addr, uint64_t len) const {
    return kind != MemoryKind::kHost || mapping == nullptr ||
           mapping->resident(reinterpret_cast<const uint8_t*>(base + (addr - iova)), len);
  }
  // [addr, addr + len) as the daemon reaches it; only after Resolve().
  ByteSpan Span(uint64_t addr, uint64_t len) const {
    ByteSpan span{kind, base + (addr - iova), len, cuda != nullptr ? cuda->memory() : nullptr};
    if (kind == MemoryKind::kCuda && agent != nullptr) {
      span.agent = agent.get();
      span.agent_addr = addr;  // the owner's own address: the region's iova space
    }
    return span;
  }
};

struct Engine::Qp {
  uint32_t qpn = 0;
  PdId pd = 0;
  QpState state = QpState::kReset;
  uint32_t remote_qpn = 0;
  std::shared_ptr<SharedMapping> mapping;  // keeps the rings mapped
  uint8_t* sq = nullptr;
  uint32_t sq_wqe_cnt = 0;
  uint32_t* sq_dbrec = nullptr;
  uint8_t* cq = nullptr;
  uint32_t cq_cqe_cnt = 0;
  uint32_t* cq_dbrec = nullptr;
  uint16_t sq_ci = 0;  // next WQE to execute (the doorbell counts in 16 bits)
  uint64_t cq_pi = 0;  // CQEs written; its pass parity is the owner bit
  uint64_t wqes_done = 0;
  uint8_t last_syndrome = 0;
  // Connected to another node's QP (ConnectRemote): where, whether a batch
  // is out, and which incarnation this is (answers for a destroyed QP whose
  // number came back are dropped).
  std::string remote_node;
  bool remote_busy = false;
  uint64_t serial = 0;
  // Connected to a QP of this node (Connect): that QP's serial, so that a
  // QPN destroyed and reused meanwhile (perhaps by another user, whose
  // protection domain its rkeys would then be looked up in) is not it.
  uint64_t remote_serial = 0;
  // Connection secrets (ConnectRemote, AcceptConnectionSecret): what
  // batches from the peer must carry, and what the peer's node offered for
  // this QP's batches to (send_secret_node, send_secret_qpn).
  std::string expect_secret;
  std::string send_secret;
  std::string send_secret_node;
  uint32_t send_secret_qpn = 0;
  // While in RESET: the offers so far, one per (node, QPN), at most
  // kOffersPerNode of each node; ConnectRemote takes the one of its peer.
  // Kept apart so that no offer, however late, displaces another's.
  struct Offer {
    std::string node;
    uint32_t qpn = 0;
    std::string secret;
  };
  std::vector<Offer> offers;
  // When this QP's first WQE found no secret to send with (zero: not waiting).
  std::chrono::steady_clock::time_point offer_wait_since{};
  // kHca: when the responses of this QP's atomics so far are back (a WQE
  // with the fence bit waits for it).
  std::chrono::steady_clock::time_point atomics_answered_at{};
  bool fence_held = false;  // the WQE at sq_ci is waiting for a fence
  // Bytes of the WRITE at sq_ci done so far: a long WRITE goes in pieces
  // (issue 23 item 6), locally so the engine lock is let go between them,
  // to another node so no more than one batch of it is ever in the heap.
  uint64_t wqe_offset = 0;
  // The WQE at sq_ci is on a GPU worker (Offload): the QP waits for it.
  bool offloaded = false;
  // A page of its rings or doorbell records was punched out of the
  // client's memfd: the QP is in error and its memory is touched no more
  // (RingsResident). When its doorbell records' pages were last looked at.
  bool rings_lost = false;
  std::chrono::steady_clock::time_point records_checked_at{};
  bool HasSendSecret() const {
    return !send_secret.empty() && send_secret_node == remote_node && send_secret_qpn == remote_qpn;
  }
};

// One WQE of a batch sent to another node: what its CQE needs, and where a
// fetched value goes.
struct Engine::RemoteWqe {
  uint16_t index = 0;
  uint8_t opcode = 0;
  bool signaled = false;
  uint32_t byte_count = 0;  // writes: the payload
  // Writes: the piece of the payload this batch carries, [from, end); a
  // WQE with end < byte_count continues in the next batch (no CQE yet).
  uint64_t from = 0, end = 0;
  bool partial() const { return end < byte_count; }
  size_t op_count = 0;  // its operations in the batch (a large write is several)
  bool atomic = false;
  bool masked = false;
  uint32_t lkey = 0;
  uint64_t laddr = 0;
};

// A WQE that touches GPU memory, as ExecuteWqe found it, for a GPU worker:
// everything it needs without the engine's lock. Its regions are pinned
// until RunOffloaded is done with them.
struct Engine::Offload {
  bool set = false;
  uint32_t qpn = 0;
  uint64_t serial = 0;  // the QP's incarnation: a QPN reused meanwhile is not it
  PdId pd = 0;
  uint16_t index = 0;
  uint8_t opcode = 0;  // as its CQE reports it
  bool signaled = false;
  uint32_t byte_count = 0;  // a WRITE's, for its CQE
  ResponderOp op;
  const Region* target = nullptr;  // the responder's region, and the bytes in it
  ByteSpan target_span;
  const Region* source = nullptr;  // a WRITE's source region; null: inline
  std::array<uint8_t, mlx5::kSendWqeBb> inline_bytes{};
  const Region* fetch = nullptr;  // an atomic's: where the old value lands
  ByteSpan fetch_span;
};

Engine::Engine(EngineOptions options) : options_(options), workers_(options.gpu_workers) {
  std::random_device rd;
  CallerLock lock(this);
  next_qpn_ = rd() & kQpnMask;
}

Engine::~Engine() { Stop(); }

void Engine::Start() {
  absl::MutexLock lock(&thread_mu_);
  if (thread_.joinable()) return;
  stop_.store(false, std::memory_order_relaxed);
  thread_ = std::thread([this] { Run(); });
}

void Engine::Stop() {
  absl::MutexLock lock(&thread_mu_);
  if (!thread_.joinable()) return;
  stop_.store(true, std::memory_order_relaxed);
  Kick();  // out of its sleep now
  thread_.join();
  // WQEs already on a GPU worker complete; their QPs go no further.
  workers_.Drain();
}

void Engine::SetRemoteLink(std::shared_ptr<RemoteLink> link) {
  CallerLock lock(this);
  link_ = std::move(link);
}

// ---- regions ------------------------------------------------------------------

absl::StatusOr<uint32_t> Engine::RegisterRegion(RegionSpec spec) {
  if (spec.length == 0) return absl::InvalidArgumentError("region of 0 bytes");
  if (spec.length > std::numeric_limits<uint64_t>::max() - spec.iova) {
    return absl::InvalidArgumentError(absl::StrCat("region iova 0x", absl::Hex(spec.iova), " + ",
                                                   spec.length, " bytes passes 2^64"));
  }
  constexpr uint32_t kKnown = kLocalWrite | kRemoteWrite | kRemoteRead | kRemoteAtomic;
  if ((spec.access & ~kKnown) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("region access 0x", absl::Hex(spec.access), " has unknown bits"));
  }
  uint64_t base = 0;
  if (spec.kind == MemoryKind::kHost) {
    if (spec.mapping == nullptr) return absl::InvalidArgumentError("host region without a mapping");
    if (!Fits(spec.offset, spec.length, spec.mapping->size())) {
      return absl::InvalidArgumentError(absl::StrCat("host region [", spec.offset, ", +",
                                                     spec.length, ") is outside its mapping of ",
                                                     spec.mapping->size(), " bytes"));
    }
    base = reinterpret_cast<uintptr_t>(spec.mapping->data()) + spec.offset;
  } else if (spec.cuda != nullptr) {
    if (!Fits(spec.offset, spec.length, spec.cuda->size())) {
      return absl::InvalidArgumentError(absl::StrCat("CUDA region [", spec.offset, ", +",
                                                     spec.length, ") is outside its buffer of ",
                                                     spec.cuda->size(), " bytes"));
    }
    spec.mapping.reset();
    base = spec.cuda->base() + spec.offset;
  } else {
    // Unreachable (see RegionSpec): registered, never touched.
    if (spec.length > std::numeric_limits<uint64_t>::max() - spec.offset) {
      return absl::InvalidArgumentError("CUDA region address + length passes 2^64");
    }
    spec.mapping.reset();
    base = spec.offset;
  }

  CallerLock lock(this);
  // Random keys: a peer that learned one key (or a region's address) learns
  // nothing of the others. Live regions are far fewer than 2^32, so a
  // repeat is rare and drawn again.
  uint32_t key = 0;
  while (key == 0 || regions_.contains(key) || retired_.contains(key)) key = RandomKey();
  auto region = std::make_unique<Region>();
  region->key = key;
  region->pd = spec.pd;
  region->iova = spec.iova;
  region->length = spec.length;
  region->access = spec.access;
  region->kind = spec.kind;
  region->mapping = std::move(spec.mapping);
  region->cuda = std::move(spec.cuda);
  region->base = base;
  if (region->kind == MemoryKind::kCuda) {
    if (auto a = agents_.find(region->pd); a != agents_.end()) region->agent = a->second;
  }
  regions_[key] = std::move(region);
  return key;
}

absl::Status Engine::AttachCopyAgent(PdId pd, std::shared_ptr<CopyAgentLink> agent) {
  if (agent == nullptr) return absl::InvalidArgumentError("no copy agent");
  CallerLock lock(this);
  if (agents_.contains(pd)) {
    return absl::AlreadyExistsError(
        absl::StrCat("pd ", pd, " already has a copy agent (one per session)"));
  }
  for (auto& [key, region] : regions_) {
    if (region->pd == pd && region->kind == MemoryKind::kCuda) region->agent = agent;
  }
  agents_[pd] = std::move(agent);
  return absl::OkStatus();
}

bool Engine::HasCopyAgent(PdId pd) const {
  CallerLock lock(this);
  auto it = agents_.find(pd);
  return it != agents_.end() && it->second->usable();
}

absl::Status Engine::DeregisterRegion(PdId pd, uint32_t key) {
  CallerLock lock(this);
  auto it = regions_.find(key);
  if (it == regions_.end() || it->second->pd != pd || it->second->dying) {
    return absl::NotFoundError(
        absl::StrCat("no region with key 0x", absl::Hex(key), " in pd ", pd));
  }
  Region* region = it->second.get();
  region->dying = true;  // no new WQE reaches it; wait for those that did
  // Looked up afresh on each evaluation: a DestroyPd of the same domain,
  // waiting too, may have erased (freed) the region by then.
  struct Unpinned {
    Engine* engine;
    uint32_t key;
    const Region* region;
    bool operator()() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(engine->mu_) {
      auto found = engine->regions_.find(key);
      return found == engine->regions_.end() || found->second.get() != region || region->pins == 0;
    }
  };
  Unpinned unpinned{this, key, region};
  mu_.Await(absl::Condition(&unpinned));
  it = regions_.find(key);
  if (it != regions_.end() && it->second.get() == region) {  // DestroyPd did not take it meanwhile
    RetireKeyLocked(key);
    regions_.erase(it);
  }
  return absl::OkStatus();
}

void Engine::Pin(const Region* r) {
  if (r != nullptr) ++const_cast<Region*>(r)->pins;
}

void Engine::Unpin(const Region* r) {
  if (r != nullptr) --const_cast<Region*>(r)->pins;
}

void Engine::RetireKeyLocked(uint32_t key) {
  // A peer may still hold the rkey of a region just deregistered: the next
  // regions must not answer to it (a NIC's key variant byte does the same
  // for 256 generations).
  if (retired_order_.size() == kRetiredKeys) {
    retired_.erase(retired_order_.front());
    retired_order_.pop_front();
  }
  retired_order_.push_back(key);
  retired_.insert(key);
}

const Engine::Region* Engine::Resolve(PdId pd, uint32_t key, uint64_t addr, uint64_t len,
                                      uint32_t need) const {
  auto it = regions_.find(key);
  if (it == regions_.end()) return nullptr;
  const Region& r = *it->second;
  if (r.dying || r.pd != pd || (r.access & need) != need) return nullptr;
  if (len == 0 || addr < r.iova || !Fits(addr - r.iova, len, r.length)) return nullptr;
  return &r;
}

// ---- queue pairs ----------------------------------------------------------------

absl::StatusOr<uint32_t> Engine::CreateQp(QpSpec spec) {
  if (spec.mapping == nullptr) return absl::InvalidArgumentError("QP without a ring mapping");
  if (!IsPow2(spec.sq_wqe_cnt) || spec.sq_wqe_cnt > kMaxSqWqeCnt) {
    return absl::InvalidArgumentError(absl::StrCat("sq_wqe_cnt ", spec.sq_wqe_cnt,
                                                   " is not a power of two in 1..", kMaxSqWqeCnt));
  }
  if (!IsPow2(spec.cq_cqe_cnt) || spec.cq_cqe_cnt < spec.sq_wqe_cnt ||
      spec.cq_cqe_cnt > kMaxCqCqeCnt) {
    return absl::InvalidArgumentError(absl::StrCat("cq_cqe_cnt ", spec.cq_cqe_cnt,
                                                   " is not a power of two in sq_wqe_cnt (",
                                                   spec.sq_wqe_cnt, ")..", kMaxCqCqeCnt));
  }
  const uint64_t size = spec.mapping->size();
  const uint64_t sq_bytes = uint64_t{spec.sq_wqe_cnt} * mlx5::kSendWqeBb;
  const uint64_t cq_bytes = uint64_t{spec.cq_cqe_cnt} * mlx5::kCqeBytes;
  struct Ring {
    const char* name;
    uint64_t offset, bytes, align;
  };
  const Ring rings[] = {{"sq", spec.sq_offset, sq_bytes, 64},
                        {"sq doorbell record", spec.sq_dbrec_offset, 8, 4},
                        {"cq", spec.cq_offset, cq_bytes, 64},
                        {"cq doorbell record", spec.cq_dbrec_offset, 8, 4}};
  for (const Ring& r : rings) {
    if (r.offset % r.align != 0 || !Fits(r.offset, r.bytes, size)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "QP ", r.name, " at offset ", r.offset, " (", r.bytes, " bytes) is misaligned (needs ",
          r.align, ") or outside the ", size, "-byte mapping"));
    }
  }
  for (size_t i = 0; i < std::size(rings); ++i) {
    for (size_t j = i + 1; j < std::size(rings); ++j) {
      if (Overlaps(rings[i].offset, rings[i].bytes, rings[j].offset, rings[j].bytes)) {
        return absl::InvalidArgumentError(
            absl::StrCat("QP ", rings[i].name, " overlaps the ", rings[j].name));
      }
    }
  }

  auto qp = std::make_unique<Qp>();
  qp->pd = spec.pd;
  uint8_t* base = spec.mapping->data();
  qp->sq = base + spec.sq_offset;
  qp->sq_wqe_cnt = spec.sq_wqe_cnt;
  qp->sq_dbrec = reinterpret_cast<uint32_t*>(base + spec.sq_dbrec_offset);
  qp->cq = base + spec.cq_offset;
  qp->cq_cqe_cnt = spec.cq_cqe_cnt;
  qp->cq_dbrec = reinterpret_cast<uint32_t*>(base + spec.cq_dbrec_offset);
  qp->mapping = std::move(spec.mapping);

  CallerLock lock(this);
  if (qps_.size() >= kQpnMask - 1) return absl::ResourceExhaustedError("every QPN is in use");
  uint32_t qpn;
  do {
    qpn = next_qpn_;
    next_qpn_ = (next_qpn_ + 1) & kQpnMask;
  } while (qpn == 0 || qps_.contains(qpn));
  qp->qpn = qpn;
  qp->serial = next_serial_++;
  qps_[qpn] = std::move(qp);
  return qpn;
}

absl::Status Engine::Connect(PdId pd, uint32_t qpn, uint32_t remote_qpn, PdId remote_pd) {
  CallerLock lock(this);
  auto it = qps_.find(qpn);
  if (it == qps_.end() || it->second->pd != pd) {
    return absl::NotFoundError(absl::StrCat("no QP ", qpn, " in pd ", pd));
  }
  // The daemon decides who connects to whom before it gets here; with
  // `remote_pd` it also pins the responder's owner, so a QPN freed and
  // reused in between is not mistaken for the one it checked.
  auto remote = qps_.find(remote_qpn);
  if (remote == qps_.end() || (remote_pd != 0 && remote->second->pd != remote_pd)) {
    return absl::NotFoundError(absl::StrCat("no remote QP ", remote_qpn));
  }
  Qp& qp = *it->second;
  if (qp.state != QpState::kReset) {
    return absl::FailedPreconditionError(
        absl::StrCat("QP ", qpn, " is ", QpStateName(qp.state), ", not RESET: connect it once"));
  }
  qp.remote_qpn = remote_qpn;
  qp.remote_serial = remote->second->serial;
  qp.state = QpState::kRts;
  return absl::OkStatus();
}

absl::Status Engine::ConnectRemote(PdId pd, uint32_t qpn, const std::string& node,
                                   uint32_t remote_qpn, std::string expect_secret) {
  MC_RETURN_IF_ERROR(CheckSecretSize(expect_secret));
  CallerLock lock(this);
  auto it = qps_.find(qpn);
  if (it == qps_.end() || it->second->pd != pd) {
    return absl::NotFoundError(absl::StrCat("no QP ", qpn, " in pd ", pd));
  }
  if (link_ == nullptr) {
    return absl::FailedPreconditionError(
        "this daemon has no link to other nodes: queue pairs to another node need the cluster "
        "(etcd_endpoints and peer_listen in mooncaked.conf)");
  }
  if (node.empty() || remote_qpn == 0 || remote_qpn > kQpnMask) {
    return absl::InvalidArgumentError("a remote QP needs a node and a QPN of 1..2^24-1");
  }
  Qp& qp = *it->second;
  if (qp.state != QpState::kReset) {
    return absl::FailedPreconditionError(
        absl::StrCat("QP ", qpn, " is ", QpStateName(qp.state), ", not RESET: connect it once"));
  }
  qp.remote_node = node;
  qp.remote_qpn = remote_qpn;
  qp.expect_secret = std::move(expect_secret);
  for (Qp::Offer& o : qp.offers) {
    if (o.node == node && o.qpn == remote_qpn) {
      qp.send_secret = std::move(o.secret);
      qp.send_secret_node = node;
      qp.send_secret_qpn = remote_qpn;
    }
  }
  qp.offers = {};
  qp.state = QpState::kRts;
  return absl::OkStatus();
}

absl::Status Engine::AcceptConnectionSecret(const std::string& node, uint32_t peer_qpn,
                                            uint32_t qpn, std::string secret) {
  MC_RETURN_IF_ERROR(CheckSecretSize(secret));
  CallerLock lock(this);
  auto it = qps_.find(qpn);
  const bool open = it != qps_.end() && it->second->state == QpState::kReset;
  const bool ours = it != qps_.end() && it->second->state != QpState::kReset &&
                    it->second->remote_node == node && it->second->remote_qpn == peer_qpn;
  if (!open && !ours) {
    // The same answer for a QP that does not exist and one connected
    // elsewhere: no oracle for another node's connections.
    return absl::NotFoundError(
        absl::StrCat("no queue pair ", qpn, " waits for node ", node, "'s queue pair ", peer_qpn));
  }
  Qp& qp = *it->second;
  if (ours && qp.HasSendSecret()) {
    // The same secret again: the offering node retries a connect whose
    // reply it lost (it makes one secret per QP). Another one would
    // redirect a live connection's traffic: refused.
    if (SameSecret(qp.send_secret, secret)) return absl::OkStatus();
    return absl::AlreadyExistsError(
        absl::StrCat("queue pair ", qpn, " already holds another secret for its connection"));
  }
  if (ours) {
    qp.send_secret = std::move(secret);
    qp.send_secret_node = node;
    qp.send_secret_qpn = peer_qpn;
    return absl::OkStatus();
  }
  // In RESET: kept beside the others (a node's newest offer for the same
  // QP replaces its older one; a node's oldest goes when it has too many).
  auto& offers = qp.offers;
  size_t of_node = 0;
  for (auto o = offers.begin(); o != offers.end(); ++o) {
    if (o->node == node && o->qpn == peer_qpn) {
      o->secret = std::move(secret);
      return absl::OkStatus();
    }
    of_node += o->node == node;
  }
  if (of_node >= kOffersPerNode) {
    offers.erase(std::find_if(offers.begin(), offers.end(),
                              [&](const Qp::Offer& o) { return o.node == node; }));
  } else if (offers.size() >= kMaxOffers) {
    return absl::ResourceExhaustedError(
        absl::StrCat("queue pair ", qpn, " holds offers from ", offers.size(),
                     " peers already: connect it, or destroy it and create another"));
  }
  offers.push_back(Qp::Offer{node, peer_qpn, std::move(secret)});
  return absl::OkStatus();
}

absl::Status Engine::DestroyQp(PdId pd, uint32_t qpn) {
  CallerLock lock(this);
  auto it = qps_.find(qpn);
  if (it == qps_.end() || it->second->pd != pd) {
    return absl::NotFoundError(absl::StrCat("no QP ", qpn, " in pd ", pd));
  }
  qps_.erase(it);
  return absl::OkStatus();
}

void Engine::SetPdOwner(PdId pd, uint64_t owner) {
  CallerLock lock(this);
  owners_[pd] = owner;
}

uint64_t Engine::OwnerLocked(PdId pd) const {
  auto it = owners_.find(pd);
  // Unnamed domains: their own owner, in a range no daemon owner takes.
  return it != owners_.end() ? it->second : (uint64_t{1} << 63) | pd;
}

void Engine::DestroyPd(PdId pd) {
  CallerLock lock(this);
  agents_.erase(pd);
  owners_.erase(pd);
  for (auto it = qps_.begin(); it != qps_.end();) {
    if (it->second->pd == pd) {
      qps_.erase(it++);  // a WQE of it on a GPU worker finds it gone
    } else {
      ++it;
    }
  }
  // GPU WQEs may still be at work in its regions (its own, or another
  // session's writing into them): no new one starts, and those finish.
  struct Unpinned {
    Engine* engine;
    PdId pd;
    bool operator()() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(engine->mu_) {
      for (const auto& [key, region] : engine->regions_) {
        if (region->pd == pd && region->pins != 0) return false;
      }
      return true;
    }
  };
  for (auto& [key, region] : regions_) {
    if (region->pd == pd) region->dying = true;
  }
  Unpinned unpinned{this, pd};
  mu_.Await(absl::Condition(&unpinned));
  for (auto it = regions_.begin(); it != regions_.end();) {
    if (it->second->pd == pd) {
      RetireKeyLocked(it->first);
      regions_.erase(it++);
    } else {
      ++it;
    }
  }
}

std::vector<QpInfo> Engine::ListQps() const {
  std::vector<QpInfo> out;
  CallerLock lock(this);
  out.reserve(qps_.size());
  for (const auto& [qpn, qp] : qps_) {
    out.push_back(QpInfo{qpn, qp->pd, qp->state, qp->remote_qpn, qp->remote_node, qp->sq_wqe_cnt,
                         qp->wqes_done, qp->last_syndrome});
  }
  std::sort(out.begin(), out.end(), [](const QpInfo& a, const QpInfo& b) { return a.qpn < b.qpn; });
  return out;
}

std::vector<RegionInfo> Engine::ListRegions() const {
  std::vector<RegionInfo> out;
  CallerLock lock(this);
  out.reserve(regions_.size());
  for (const auto& [key, r] : regions_) {
    out.push_back(RegionInfo{key, r->pd, r->iova, r->length, r->access, r->kind});
  }
  std::sort(out.begin(), out.end(),
            [](const RegionInfo& a, const RegionInfo& b) { return a.key < b.key; });
  return out;
}

// ---- the responder --------------------------------------------------------------

ResponderResult Engine::ExecuteAsResponder(const ResponderOp& op) {
  CallerLock lock(this);
  return ExecuteAsResponderLocked(op);
}

ResponderResult Engine::ExecuteForPeer(const std::string& requester_node, uint32_t requester_qpn,
                                       const std::string& secret, const ResponderOp& op) {
  CallerLock lock(this);
  auto it = qps_.find(op.remote_qpn);
  if (it == qps_.end() || it->second->state != QpState::kRts ||
      it->second->remote_node != requester_node || it->second->remote_qpn != requester_qpn) {
    ResponderResult r;
    r.syndrome = mlx5::kSyndTransportRetryExcErr;
    r.not_ready = it != qps_.end() && it->second->state == QpState::kReset;
    return r;
  }
  if (!SameSecret(secret, it->second->expect_secret)) {
    ResponderResult r;
    r.syndrome = mlx5::kSyndTransportRetryExcErr;
    r.refused = true;
    return r;
  }
  return ExecuteAsResponderLocked(op);
}

ResponderResult Engine::ExecuteAsResponderLocked(const ResponderOp& op) {
  ResponderResult result;
  const Region* target = nullptr;
  ByteSpan span;
  result.syndrome = ResolveResponder(op, &target, &span);
  if (result.syndrome != 0) return result;
  if (!Offloads(span, op.source, op.kind != ResponderOp::Kind::kWrite)) {
    return RunResponder(span, op);
  }
  // GPU memory: CUDA or a copy agent may take milliseconds, which must not
  // be every session's. The region stays registered meanwhile.
  Pin(target);
  mu_.Unlock();
  result = RunResponder(span, op);
  mu_.Lock();
  Unpin(target);
  return result;
}

uint8_t Engine::ResolveResponder(const ResponderOp& op, const Region** target,
                                 ByteSpan* span) const {
  auto it = qps_.find(op.remote_qpn);
  // Nobody answers: a ConnectX retries, then reports this. So for a peer
  // destroyed since the connect whose number another QP has now.
  if (it == qps_.end() || (op.remote_serial != 0 && it->second->serial != op.remote_serial)) {
    return mlx5::kSyndTransportRetryExcErr;
  }
  const PdId pd = it->second->pd;
  if (op.kind == ResponderOp::Kind::kWrite) {
    const Region* r = Resolve(pd, op.rkey, op.raddr, op.source.length, kRemoteWrite);
    if (r == nullptr || !r->Reachable() || !r->Resident(op.raddr, op.source.length)) {
      return mlx5::kSyndRemoteAccessErr;
    }
    *target = r;
    *span = r->Span(op.raddr, op.source.length);
    return 0;
  }
  const uint64_t width = op.kind == ResponderOp::Kind::kFetchAdd64 ? 8 : 4;
  if (op.raddr % width != 0) return mlx5::kSyndRemoteInvalReqErr;
  const Region* r = Resolve(pd, op.rkey, op.raddr, width, kRemoteAtomic);
  if (r == nullptr || !r->Reachable() || !r->Resident(op.raddr, width)) {
    return mlx5::kSyndRemoteAccessErr;
  }
  *target = r;
  *span = r->Span(op.raddr, width);
  // The iova is aligned; the mapping offset might not be.
  if (span->addr % width != 0) return mlx5::kSyndRemoteInvalReqErr;
  return 0;
}

bool Engine::Offloads(const ByteSpan& target, const ByteSpan& source, bool atomic) const {
  if (atomic && options_.atomics == AtomicsModel::kHca) return false;
  return target.kind == MemoryKind::kCuda || source.kind == MemoryKind::kCuda;
}

ResponderResult Engine::RunResponder(const ByteSpan& target, const ResponderOp& op) {
  ResponderResult result;
  if (op.kind == ResponderOp::Kind::kWrite) {
    if (!CopyBytes(target, op.source)) {
      // A failed GPU copy: blamed on the source when only it is GPU memory
      // (reading the local side failed), else on the responder's memory.
      result.syndrome = target.kind == MemoryKind::kHost && op.source.kind == MemoryKind::kCuda
                            ? mlx5::kSyndLocalProtErr
                            : mlx5::kSyndRemoteAccessErr;
    }
    return result;
  }
  const uint64_t width = op.kind == ResponderOp::Kind::kFetchAdd64 ? 8 : 4;
  if (options_.atomics == AtomicsModel::kHca) {
    if (!HcaAtomic(target, op, &result.fetched)) result.syndrome = mlx5::kSyndRemoteAccessErr;
    return result;
  }
  const uint64_t where = target.addr;
  if (target.kind == MemoryKind::kCuda) {
    // On the GPU's atomic units: the client's kernels (and peers over
    // NVLink) update the same words. First by the owner's copy agent, in
    // its own context beside its kernels (microseconds); the daemon's
    // context waits for a time slice while a kernel spins (milliseconds).
    if (target.agent != nullptr && target.agent->usable()) {
      const CopyAgentLink::AtomicOutcome a =
          target.agent->FetchAdd(target.agent_addr, width == 4, op.add, op.field_boundary);
      using Kind = CopyAgentLink::AtomicOutcome::Kind;
      if (a.kind == Kind::kApplied) {
        result.fetched = a.old;
        return result;
      }
      if (a.kind == Kind::kUnknown) {
        // It may still add: adding here too could count it twice. The
        // responder could not finish the operation, as a NIC reports it.
        MC_LOG(kWarning, "softnic: a ", width,
               "-byte atomic on GPU memory failed: its copy agent may still run it (",
               a.why.message(), ")");
        result.syndrome = mlx5::kSyndRemoteOpErr;
        return result;
      }
      // It did not run and will not: the daemon's context runs it.
    }
    if (target.cuda == nullptr) {
      result.syndrome = mlx5::kSyndRemoteAccessErr;
      return result;
    }
    CudaMemory& cuda = *target.cuda;
    if (width == 8) {
      absl::StatusOr<uint64_t> old = cuda.FetchAdd64(where, op.add);
      if (!old.ok()) result.syndrome = mlx5::kSyndRemoteAccessErr;
      result.fetched = old.value_or(0);
    } else {
      absl::StatusOr<uint32_t> old =
          cuda.MaskedFetchAdd32(where, static_cast<uint32_t>(op.add), op.field_boundary);
      if (!old.ok()) result.syndrome = mlx5::kSyndRemoteAccessErr;
      result.fetched = old.value_or(0);
    }
    return result;
  }
  // Real atomics: the client's own threads update the same words.
  if (width == 8) {
    result.fetched = Ref(reinterpret_cast<uint64_t*>(static_cast<uintptr_t>(where)))
                         .fetch_add(op.add, std::memory_order_acq_rel);
  } else {
    auto word = Ref(reinterpret_cast<uint32_t*>(static_cast<uintptr_t>(where)));
    const auto add = static_cast<uint32_t>(op.add);
    uint32_t old = word.load(std::memory_order_relaxed);
    while (!word.compare_exchange_weak(old, MaskedAdd(old, add, op.field_boundary),
                                       std::memory_order_acq_rel, std::memory_order_relaxed)) {
    }
    result.fetched = old;
  }
  return result;
}

bool Engine::HcaAtomic(const ByteSpan& word, const ResponderOp& op, uint64_t* old) {
  const uint64_t width = op.kind == ResponderOp::Kind::kFetchAdd64 ? 8 : 4;
  const auto next = [&](uint64_t v) {
    return width == 8 ? v + op.add
                      : MaskedAdd(static_cast<uint32_t>(v), static_cast<uint32_t>(op.add),
                                  op.field_boundary);
  };
  const auto window = [this] {
    if (options_.hca_atomic_window_us != 0) {
      std::this_thread::sleep_for(std::chrono::microseconds(options_.hca_atomic_window_us));
    }
  };
  if (word.kind == MemoryKind::kCuda) {
    // Two PCIe transactions, as a NIC's: a read of the word, a write back.
    uint64_t v = 0;
    const ByteSpan host{MemoryKind::kHost, reinterpret_cast<uintptr_t>(&v), width, nullptr};
    if (!CopyBytes(host, word)) return false;
    *old = v;
    window();
    v = next(v);
    return CopyBytes(word, host);
  }
  // Host memory: a load and a store, not one atomic, so CPU atomics of the
  // client's threads on the word can fall between them as on a NIC.
  const auto read_add_write = [&](auto* p) {
    using T = std::remove_pointer_t<decltype(p)>;
    auto w = Ref(p);
    *old = w.load(std::memory_order_acquire);
    window();
    w.store(static_cast<T>(next(*old)), std::memory_order_release);
  };
  const auto at = static_cast<uintptr_t>(word.addr);
  if (width == 8) {
    read_add_write(reinterpret_cast<uint64_t*>(at));
  } else {
    read_add_write(reinterpret_cast<uint32_t*>(at));
  }
  return true;
}

// ---- the requester ---------------------------------------------------------------

// WQE layout (one 64-byte basic block, see device/.../mlx5/wqe.h):
//   [0, 16) ctrl   [16, 32) raddr   [32, 48) data | inline | atomic   [48, 64) data (atomics)
uint8_t Engine::ExecuteWqe(Qp& qp, const uint8_t (&wqe)[64], uint16_t index, uint8_t* cqe_opcode,
                           uint32_t* byte_count, bool* more, Offload* offload) {
  *more = false;
  const uint32_t opmod_idx_opcode = Be32At(&wqe[0]);
  const uint32_t qpn_ds = Be32At(&wqe[4]);
  const auto opcode = static_cast<uint8_t>(opmod_idx_opcode);
  const auto opmod = static_cast<uint8_t>(opmod_idx_opcode >> 24);
  const auto wqe_index = static_cast<uint16_t>(opmod_idx_opcode >> 8);
  const uint32_t ds = qpn_ds & 0x3fu;
  *cqe_opcode = opcode;
  *byte_count = 0;
  if (wqe_index != index || (qpn_ds >> 8) != qp.qpn) return mlx5::kSyndLocalQpOpErr;

  const bool is_write = opcode == mlx5::kOpRdmaWrite || opcode == mlx5::kOpRdmaWriteImm;
  if (options_.sink) {
    if (is_write) *byte_count = Be32At(&wqe[32]) & ~mlx5::kInlineSeg;
    return 0;
  }

  ResponderOp op;
  op.remote_qpn = qp.remote_qpn;
  op.remote_serial = qp.remote_serial;
  op.raddr = Be64At(&wqe[16]);
  op.rkey = Be32At(&wqe[24]);

  if (is_write) {
    // WRITE_IMM: the data is written and the immediate dropped. This design
    // has no receive queues (the Device API signals with writes and
    // atomics), so there is no receive CQE to deliver it in.
    const uint32_t count = Be32At(&wqe[32]);
    const Region* source_region = nullptr;  // null: inline
    uint64_t source_iova = 0;
    if ((count & mlx5::kInlineSeg) != 0) {
      if (ds != 3 && ds != 4) return mlx5::kSyndLocalQpOpErr;
      const uint32_t len = count & ~mlx5::kInlineSeg;
      // Room in the declared segments after ctrl, raddr and the inline header.
      const uint32_t room = ds * mlx5::kDsBytes - 36;
      if (len == 0 || len > room) return mlx5::kSyndLocalLengthErr;
      op.source = ByteSpan{MemoryKind::kHost, reinterpret_cast<uintptr_t>(&wqe[36]), len};
    } else {
      if (ds != 3) return mlx5::kSyndLocalQpOpErr;
      if (count == 0) return mlx5::kSyndLocalLengthErr;
      const uint32_t lkey = Be32At(&wqe[36]);
      const uint64_t laddr = Be64At(&wqe[40]);
      const Region* src = Resolve(qp.pd, lkey, laddr, count, 0);
      if (src == nullptr || !src->Reachable()) return mlx5::kSyndLocalProtErr;
      op.source = src->Span(laddr, count);
      source_region = src;
      source_iova = laddr;
    }
    op.kind = ResponderOp::Kind::kWrite;
    // One piece per visit: the engine thread lets go of the lock between
    // pieces, so a long copy does not hold up every other QP, the peer
    // port and the API (issue 23 item 6).
    const uint64_t total = op.source.length;
    const uint64_t from = qp.wqe_offset < total ? qp.wqe_offset : 0;
    // Only host-to-host copies go in pieces: the CPU does those. A copy
    // with GPU memory on either side is the copy engine's (256 MiB in well
    // under a millisecond), and each piece into GPU memory would wait for
    // its own GPU time slice (~2.4 ms on a GPU whose client kernel spins).
    const uint64_t n =
        HostToHostLocked(op) ? std::min(kLocalPieceBytes, total - from) : total - from;
    if (source_region != nullptr && !source_region->Resident(source_iova + from, n)) {
      return mlx5::kSyndLocalProtErr;
    }
    op.source.addr += from;
    op.source.length = n;
    op.raddr += from;
    const Region* target = nullptr;
    ByteSpan span;
    if (const uint8_t bad = ResolveResponder(op, &target, &span); bad != 0) return bad;
    if (offload != nullptr && Offloads(span, op.source, false)) {
      // GPU memory: a worker copies it whole (`from` is 0: only host copies
      // go in pieces).
      offload->set = true;
      offload->byte_count = static_cast<uint32_t>(total);
      offload->op = op;
      offload->target = target;
      offload->target_span = span;
      offload->source = source_region;
      if (source_region == nullptr) {
        std::memcpy(offload->inline_bytes.data(), &wqe[36], n);
        offload->op.source.addr = 0;  // RunOffloaded points it at inline_bytes
      }
      Pin(target);
      Pin(source_region);
      return 0;
    }
    const ResponderResult r = RunResponder(span, op);
    if (r.syndrome != 0) return r.syndrome;
    bytes_written_.fetch_add(n, std::memory_order_relaxed);
    if (from + n < total) {
      qp.wqe_offset = from + n;
      *more = true;
      return 0;
    }
    *byte_count = static_cast<uint32_t>(total);
    return 0;
  }

  switch (opcode) {
    case mlx5::kOpNop: return ds == 1 ? 0 : mlx5::kSyndLocalQpOpErr;

    case mlx5::kOpAtomicFa:
    case mlx5::kOpAtomicMaskedFa: {
      const bool masked = opcode == mlx5::kOpAtomicMaskedFa;
      if (ds != 4 || (masked && opmod != mlx5::kOpmodExtAtomic32)) return mlx5::kSyndLocalQpOpErr;
      const uint32_t width = masked ? 4 : 8;
      if (masked) {
        op.kind = ResponderOp::Kind::kMaskedFetchAdd32;
        op.add = Be32At(&wqe[32]);
        op.field_boundary = Be32At(&wqe[36]);
      } else {
        op.kind = ResponderOp::Kind::kFetchAdd64;
        op.add = Be64At(&wqe[32]);
      }
      // The fetched value's destination is checked before the atomic runs:
      // an atomic cannot be undone.
      const uint32_t count = Be32At(&wqe[48]);
      const uint32_t lkey = Be32At(&wqe[52]);
      const uint64_t laddr = Be64At(&wqe[56]);
      if (count != width) return mlx5::kSyndLocalLengthErr;
      const Region* dst = Resolve(qp.pd, lkey, laddr, width, kLocalWrite);
      if (dst == nullptr || !dst->Reachable()) return mlx5::kSyndLocalProtErr;
      const Region* target = nullptr;
      ByteSpan span;
      if (const uint8_t bad = ResolveResponder(op, &target, &span); bad != 0) return bad;
      // A destination page the client took away fails the WQE before the
      // atomic runs, not after.
      if (!dst->Resident(laddr, width)) return mlx5::kSyndLocalProtErr;
      const ByteSpan fetch_span = dst->Span(laddr, width);
      if (offload != nullptr && Offloads(span, fetch_span, true)) {
        offload->set = true;
        offload->op = op;
        offload->target = target;
        offload->target_span = span;
        offload->fetch = dst;
        offload->fetch_span = fetch_span;
        Pin(target);
        Pin(dst);
        return 0;
      }
      const ResponderResult r = RunResponder(span, op);
      if (r.syndrome != 0) return r.syndrome;
      return LandFetched(fetch_span, masked, r.fetched);
    }

    default: return mlx5::kSyndLocalQpOpErr;
  }
}

bool Engine::HostToHostLocked(const ResponderOp& op) const {
  if (op.source.kind != MemoryKind::kHost) return false;
  auto responder = qps_.find(op.remote_qpn);
  if (responder == qps_.end() ||
      (op.remote_serial != 0 && responder->second->serial != op.remote_serial)) {
    return true;  // fails in the executor anyway
  }
  const Region* dst =
      Resolve(responder->second->pd, op.rkey, op.raddr, op.source.length, kRemoteWrite);
  return dst == nullptr || dst->kind == MemoryKind::kHost;
}

// ---- completion queue -------------------------------------------------------------

bool Engine::CqHasRoom(const Qp& qp) const {
  // Acquire: the client has finished reading the CQEs it says it consumed.
  const uint32_t ci =
      mlx5::be32(Ref(&qp.cq_dbrec[mlx5::kCqSetCi]).load(std::memory_order_acquire)) &
      mlx5::kCqCiMask;
  const uint32_t used = (static_cast<uint32_t>(qp.cq_pi) - ci) & mlx5::kCqCiMask;
  return used < qp.cq_cqe_cnt;
}

void Engine::WriteCqe(Qp& qp, uint16_t wqe_counter, uint8_t wqe_opcode, uint8_t syndrome,
                      uint32_t byte_count) {
  if (qp.rings_lost) return;
  uint8_t* const at = qp.cq + (qp.cq_pi & (qp.cq_cqe_cnt - 1)) * mlx5::kCqeBytes;
  if (!qp.mapping->resident(at, mlx5::kCqeBytes)) {
    LoseRings(qp, "its completion queue");
    return;
  }
  uint8_t cqe[mlx5::kCqeBytes] = {};
  const uint8_t owner = mlx5::cqe_expected_owner(qp.cq_pi, qp.cq_cqe_cnt);
  const uint32_t sop_drop_qpn =
      mlx5::be32((static_cast<uint32_t>(wqe_opcode) << 24) | (qp.qpn & kQpnMask));
  const uint16_t counter = mlx5::be16(wqe_counter);
  std::memcpy(&cqe[offsetof(mlx5::Cqe64, sop_drop_qpn_be)], &sop_drop_qpn, 4);
  std::memcpy(&cqe[offsetof(mlx5::Cqe64, wqe_counter_be)], &counter, 2);
  uint8_t opcode;
  if (syndrome == 0) {
    opcode = mlx5::kCqeReq;
    const uint32_t bytes = mlx5::be32(byte_count);
    std::memcpy(&cqe[offsetof(mlx5::Cqe64, byte_cnt_be)], &bytes, 4);
  } else {
    opcode = mlx5::kCqeReqErr;
    cqe[mlx5::kCqeVendorSyndromeByte] = 0;
    cqe[mlx5::kCqeSyndromeByte] = syndrome;
  }
  cqe[offsetof(mlx5::Cqe64, op_own)] = static_cast<uint8_t>((opcode << 4) | owner);

  uint8_t* slot = qp.cq + (qp.cq_pi & (qp.cq_cqe_cnt - 1)) * mlx5::kCqeBytes;
  // The body first; then wqe_counter, signature and op_own in one release
  // store: a poller that sees the new owner bit sees the whole CQE.
  std::memcpy(slot, cqe, mlx5::kCqeBytes - 4);
  uint32_t tail;
  std::memcpy(&tail, &cqe[mlx5::kCqeBytes - 4], 4);
  Ref(reinterpret_cast<uint32_t*>(slot + mlx5::kCqeBytes - 4))
      .store(tail, std::memory_order_release);
  ++qp.cq_pi;
}

// ---- the engine thread -------------------------------------------------------------

void Engine::LoseRings(Qp& qp, const char* what) {
  if (qp.rings_lost) return;
  qp.rings_lost = true;
  if (qp.state != QpState::kError) {
    qp.state = QpState::kError;
    qp.last_syndrome = mlx5::kSyndLocalProtErr;
  }
  if ((++rings_lost_ & (rings_lost_ - 1)) == 0) {
    MC_LOG(kWarning, "softnic: queue pair ", qp.qpn, " (pd ", qp.pd, "): a page of ", what,
           " is no longer in memory (punched out of its memfd): the queue pair is failed and "
           "its memory touched no more, rather than faulted back in on mooncaked's account (",
           rings_lost_, " such queue pairs so far)");
  }
}

bool Engine::RingsResident(Qp& qp, uint32_t wqes, uint32_t cqes) {
  // The slots this visit may read and write, [first, first + n) of a ring
  // of `cnt` 64-byte entries at `base`: one or two ranges (wrapping).
  const auto resident = [&](uint8_t* base, uint32_t cnt, uint64_t first, uint32_t n) {
    if (n == 0) return true;
    n = std::min(n, cnt);
    const uint32_t at = static_cast<uint32_t>(first & (cnt - 1));
    const uint32_t head = std::min(n, cnt - at);
    return qp.mapping->resident(base + uint64_t{at} * 64, uint64_t{head} * 64) &&
           (head == n || qp.mapping->resident(base, uint64_t{n - head} * 64));
  };
  if (!resident(qp.sq, qp.sq_wqe_cnt, qp.sq_ci, wqes)) {
    LoseRings(qp, "its send queue");
    return false;
  }
  if (!resident(qp.cq, qp.cq_cqe_cnt, qp.cq_pi, cqes)) {
    LoseRings(qp, "its completion queue");
    return false;
  }
  return true;
}

bool Engine::Poll(Qp& qp) {
  // A GPU worker has the WQE at sq_ci, or a batch from sq_ci is out to
  // another node: nothing of the ring moves until it is back (not even a
  // garbage doorbell's error CQE, which would take the batch's CQ room).
  if (qp.offloaded || qp.remote_busy || qp.rings_lost) return false;
  // The doorbell records are read on every poll: their pages are looked at
  // every kRecordsCheck (a page punched out just after a look is faulted
  // in once, one page per QP, until the next).
  const auto now = std::chrono::steady_clock::now();
  if (now - qp.records_checked_at >= kRecordsCheck) {
    qp.records_checked_at = now;
    if (!qp.mapping->resident(reinterpret_cast<const uint8_t*>(qp.sq_dbrec), 8) ||
        !qp.mapping->resident(reinterpret_cast<const uint8_t*>(qp.cq_dbrec), 8)) {
      LoseRings(qp, "its doorbell records");
      return true;
    }
  }
  const auto pi = static_cast<uint16_t>(
      mlx5::be32(Ref(&qp.sq_dbrec[mlx5::kSndDbr]).load(std::memory_order_acquire)));
  const auto pending = static_cast<uint16_t>(pi - qp.sq_ci);
  if (pending == 0) return false;
  // What this visit reads and writes of the rings, looked at first (one
  // mincore or two each): never a page faulted in on the daemon's account.
  {
    const uint32_t wqes =
        pending > qp.sq_wqe_cnt ? 0u : std::min<uint32_t>(pending, kMaxWqesPerVisit);
    if (!RingsResident(qp, wqes, std::max<uint32_t>(wqes, 1))) return true;
  }

  auto fail = [&qp](uint8_t syndrome) {
    if (qp.state != QpState::kError) {
      qp.state = QpState::kError;
      qp.last_syndrome = syndrome;
    }
  };

  if (pending > qp.sq_wqe_cnt) {
    // More WQEs than the ring holds: the doorbell is garbage. Report it once;
    // a QP already in error ignores it (nothing sane is left to flush).
    if (qp.state == QpState::kError || !CqHasRoom(qp)) return false;
    WriteCqe(qp, qp.sq_ci, 0, mlx5::kSyndLocalQpOpErr, 0);
    fail(mlx5::kSyndLocalQpOpErr);
    ++qp.sq_ci;
    ++qp.wqes_done;
    return true;
  }

  if (!qp.remote_node.empty() && qp.state == QpState::kRts) return PollRemote(qp, pending);

  bool did = false;
  uint64_t moved = 0;  // bytes this visit copied under the lock
  for (uint16_t n = 0; n < pending; ++n) {
    // One visit holds the engine lock for at most about kLocalPieceBytes
    // of copying, or kMaxWqesPerVisit WQEs: a ring full of 4 MiB WRITEs
    // (each one piece) held it for 128 GiB of memcpy before, stalling
    // every user's QPs, the peer port and the API.
    if (moved >= kLocalPieceBytes || n >= kMaxWqesPerVisit) {
      did = true;
      break;
    }
    // A WQE is taken only when its CQE (if it gets one) has a slot: it may
    // fail, and an error always completes with a CQE.
    if (!CqHasRoom(qp)) break;
    const uint16_t index = qp.sq_ci;
    // Copied out first: the client may rewrite the slot while we parse.
    alignas(8) uint8_t wqe[mlx5::kSendWqeBb];
    const uint8_t* slot = qp.sq + (index & (qp.sq_wqe_cnt - 1)) * mlx5::kSendWqeBb;
    for (uint32_t i = 0; i < mlx5::kSendWqeBb; i += 8) {
      const uint64_t v = Ref(reinterpret_cast<uint64_t*>(const_cast<uint8_t*>(slot + i)))
                             .load(std::memory_order_relaxed);
      std::memcpy(&wqe[i], &v, 8);
    }
    uint8_t opcode = wqe[3];  // low byte of the big-endian opmod_idx_opcode
    const uint8_t fm_ce_se = wqe[offsetof(mlx5::WqeCtrlSeg, fm_ce_se)];
    if (options_.atomics == AtomicsModel::kHca && qp.state != QpState::kError &&
        (fm_ce_se & mlx5::kCtrlFence) != 0 &&
        std::chrono::steady_clock::now() < qp.atomics_answered_at) {
      // A fence: the WQE waits in the ring for the earlier atomics' answers.
      if (!qp.fence_held) fence_waits_.fetch_add(1, std::memory_order_relaxed);
      qp.fence_held = true;
      break;
    }
    qp.fence_held = false;
    uint32_t bytes = 0;
    bool more = false;
    Offload offload;
    const uint8_t syndrome = qp.state == QpState::kError
                                 ? mlx5::kSyndWrFlushErr
                                 : ExecuteWqe(qp, wqe, index, &opcode, &bytes, &more, &offload);
    if (offload.set) {
      // The QP waits for its worker, which completes this WQE (RunOffloaded).
      offload.qpn = qp.qpn;
      offload.serial = qp.serial;
      offload.pd = qp.pd;
      offload.index = index;
      offload.opcode = opcode;
      offload.signaled = (fm_ce_se & mlx5::kCtrlCqUpdate) != 0;
      qp.offloaded = true;
      workers_.Submit(qp.pd, OwnerLocked(qp.pd),
                      [this, offload]() mutable { RunOffloaded(offload); });
      return true;
    }
    if (options_.atomics == AtomicsModel::kHca && syndrome == 0 &&
        (opcode == mlx5::kOpAtomicFa || opcode == mlx5::kOpAtomicMaskedFa)) {
      qp.atomics_answered_at =
          std::chrono::steady_clock::now() + std::chrono::microseconds(options_.hca_round_trip_us);
    }
    if (syndrome == 0 && more) {
      did = true;  // the rest of this WRITE on the next visit
      break;
    }
    FinishWqe(qp, index, opcode, syndrome, (fm_ce_se & mlx5::kCtrlCqUpdate) != 0, bytes);
    moved += bytes;
    did = true;
  }
  return did;
}

void Engine::FinishWqe(Qp& qp, uint16_t index, uint8_t opcode, uint8_t syndrome, bool signaled,
                       uint32_t byte_count) {
  qp.wqe_offset = 0;
  if (syndrome != 0) {
    WriteCqe(qp, index, opcode, syndrome, 0);
    if (qp.state != QpState::kError) {
      qp.state = QpState::kError;
      qp.last_syndrome = syndrome;
    }
  } else if (signaled) {
    WriteCqe(qp, index, opcode, 0, byte_count);
  }
  ++qp.sq_ci;
  ++qp.wqes_done;
}

void Engine::RunOffloaded(Offload& o) {
  {
    // A QP destroyed while its WQE waited for a worker runs it no more, as
    // a NIC executes nothing of a destroyed QP.
    CallerLock lock(this);
    if (!QpAliveLocked(o.qpn, o.serial)) {
      Unpin(o.target);
      Unpin(o.source);
      Unpin(o.fetch);
      return;
    }
  }
  // Without the lock: the regions are pinned, the spans were taken under it.
  if (o.op.kind == ResponderOp::Kind::kWrite && o.source == nullptr) {
    o.op.source.addr = reinterpret_cast<uintptr_t>(o.inline_bytes.data());
  }
  const ResponderResult r = RunResponder(o.target_span, o.op);
  uint8_t syndrome = r.syndrome;
  if (syndrome == 0 && o.fetch != nullptr) {
    syndrome =
        LandFetched(o.fetch_span, o.op.kind == ResponderOp::Kind::kMaskedFetchAdd32, r.fetched);
  }
  CallerLock lock(this);
  Unpin(o.target);
  Unpin(o.source);
  Unpin(o.fetch);
  auto it = qps_.find(o.qpn);
  if (it == qps_.end() || it->second->serial != o.serial || !it->second->offloaded) return;
  Qp& qp = *it->second;
  qp.offloaded = false;
  const bool write = o.op.kind == ResponderOp::Kind::kWrite;
  if (syndrome == 0 && write)
    bytes_written_.fetch_add(o.op.source.length, std::memory_order_relaxed);
  FinishWqe(qp, o.index, o.opcode, syndrome, o.signaled, o.byte_count);
  // The QP's next WQEs now, not when the engine thread comes round; a
  // stopped engine leaves them in the ring.
  if (!stop_.load(std::memory_order_relaxed)) Poll(qp);
  // The client answers this CQE with its next doorbell within microseconds:
  // the engine thread spins again instead of sleeping through it.
  Kick();
}

bool Engine::QpAliveLocked(uint32_t qpn, uint64_t serial) const {
  auto it = qps_.find(qpn);
  return it != qps_.end() && it->second->serial == serial;
}

// ---- queue pairs connected to another node -------------------------------------

namespace {
// A large WRITE travels as operations of at most this many bytes (a NIC
// segments it too); the responder applies them in order.
constexpr uint64_t kRemoteChunkBytes = 1u << 20;
}  // namespace

// A piece of a WRITE's payload in GPU memory, read by a GPU worker into
// the data of batch op `op` (its region pinned until then).
struct Engine::RemoteFill {
  const Region* region = nullptr;
  ByteSpan piece;
  size_t op = 0;
};

uint8_t Engine::PrepareRemote(Qp& qp, const uint8_t (&wqe)[64], uint16_t index, uint64_t from,
                              uint64_t budget, RemoteWqe* out, std::vector<RemoteOp>* ops,
                              std::vector<RemoteFill>* fills) {
  const uint32_t opmod_idx_opcode = Be32At(&wqe[0]);
  const uint32_t qpn_ds = Be32At(&wqe[4]);
  const auto opcode = static_cast<uint8_t>(opmod_idx_opcode);
  const auto opmod = static_cast<uint8_t>(opmod_idx_opcode >> 24);
  const auto wqe_index = static_cast<uint16_t>(opmod_idx_opcode >> 8);
  const uint32_t ds = qpn_ds & 0x3fu;
  out->index = index;
  out->opcode = opcode;
  out->signaled = (wqe[offsetof(mlx5::WqeCtrlSeg, fm_ce_se)] & mlx5::kCtrlCqUpdate) != 0;
  if (wqe_index != index || (qpn_ds >> 8) != qp.qpn) return mlx5::kSyndLocalQpOpErr;

  RemoteOp op;
  op.responder_qpn = qp.remote_qpn;
  op.raddr = Be64At(&wqe[16]);
  op.rkey = Be32At(&wqe[24]);
  const bool is_write = opcode == mlx5::kOpRdmaWrite || opcode == mlx5::kOpRdmaWriteImm;
  if (is_write) {
    const uint32_t count = Be32At(&wqe[32]);
    ByteSpan source;
    const Region* source_region = nullptr;  // null: inline
    uint64_t source_iova = 0;
    if ((count & mlx5::kInlineSeg) != 0) {
      if (ds != 3 && ds != 4) return mlx5::kSyndLocalQpOpErr;
      const uint32_t len = count & ~mlx5::kInlineSeg;
      const uint32_t room = ds * mlx5::kDsBytes - 36;
      if (len == 0 || len > room) return mlx5::kSyndLocalLengthErr;
      source = ByteSpan{MemoryKind::kHost, reinterpret_cast<uintptr_t>(&wqe[36]), len};
    } else {
      if (ds != 3) return mlx5::kSyndLocalQpOpErr;
      if (count == 0) return mlx5::kSyndLocalLengthErr;
      const uint32_t lkey = Be32At(&wqe[36]);
      const uint64_t laddr = Be64At(&wqe[40]);
      const Region* src = Resolve(qp.pd, lkey, laddr, count, 0);
      if (src == nullptr || !src->Reachable()) return mlx5::kSyndLocalProtErr;
      source = src->Span(laddr, count);
      source_region = src;
      source_iova = laddr;
    }
    // The payload is read now, in WQE order, as a NIC reads it when it
    // takes the WQE; a long one a batch's worth at a time (`budget` bytes
    // from `from`), so no more than one batch of it is ever in the heap.
    out->byte_count = static_cast<uint32_t>(source.length);
    out->from = from < source.length ? from : 0;
    out->end = out->from + std::min(std::max<uint64_t>(budget, 1), source.length - out->from);
    for (uint64_t off = out->from; off < out->end; off += kRemoteChunkBytes) {
      const uint64_t n = std::min(kRemoteChunkBytes, out->end - off);
      if (source_region != nullptr && !source_region->Resident(source_iova + off, n)) {
        return mlx5::kSyndLocalProtErr;
      }
      RemoteOp chunk = op;
      chunk.kind = ResponderOp::Kind::kWrite;
      chunk.raddr = op.raddr + off;
      chunk.data.resize(static_cast<size_t>(n));
      ByteSpan piece = source;
      piece.addr += off;
      piece.length = n;
      const ByteSpan to{MemoryKind::kHost, reinterpret_cast<uintptr_t>(chunk.data.data()), n};
      if (piece.kind == MemoryKind::kCuda) {
        fills->push_back(RemoteFill{source_region, piece, ops->size()});
      } else if (!CopyBytes(to, piece)) {
        return mlx5::kSyndLocalProtErr;
      }
      ops->push_back(std::move(chunk));
      ++out->op_count;
    }
    return 0;
  }
  if (opcode != mlx5::kOpAtomicFa && opcode != mlx5::kOpAtomicMaskedFa) {
    return opcode == mlx5::kOpNop && ds == 1 ? 0 : mlx5::kSyndLocalQpOpErr;
  }
  const bool masked = opcode == mlx5::kOpAtomicMaskedFa;
  if (ds != 4 || (masked && opmod != mlx5::kOpmodExtAtomic32)) return mlx5::kSyndLocalQpOpErr;
  const uint32_t width = masked ? 4 : 8;
  if (masked) {
    op.kind = ResponderOp::Kind::kMaskedFetchAdd32;
    op.add = Be32At(&wqe[32]);
    op.field_boundary = Be32At(&wqe[36]);
  } else {
    op.kind = ResponderOp::Kind::kFetchAdd64;
    op.add = Be64At(&wqe[32]);
  }
  const uint32_t count = Be32At(&wqe[48]);
  out->lkey = Be32At(&wqe[52]);
  out->laddr = Be64At(&wqe[56]);
  if (count != width) return mlx5::kSyndLocalLengthErr;
  // Checked before the atomic runs there: it cannot be undone. (A page the
  // client punches out while the batch is out still fails the landing.)
  const Region* dst = Resolve(qp.pd, out->lkey, out->laddr, width, kLocalWrite);
  if (dst == nullptr || !dst->Reachable() || !dst->Resident(out->laddr, width)) {
    return mlx5::kSyndLocalProtErr;
  }
  out->atomic = true;
  out->masked = masked;
  ops->push_back(std::move(op));
  out->op_count = 1;
  return 0;
}

bool Engine::PollRemote(Qp& qp, uint16_t pending) {
  if (qp.remote_busy) return false;
  // No secret offered yet (the peer's owner has not connected its QP):
  // the WQEs wait in the ring, as a NIC retries, then fail below.
  const bool secret = qp.HasSendSecret();
  if (!secret && !options_.sink) {
    const auto now = std::chrono::steady_clock::now();
    if (qp.offer_wait_since == std::chrono::steady_clock::time_point{}) qp.offer_wait_since = now;
    if (now - qp.offer_wait_since < absl::ToChronoNanoseconds(kOfferWait)) return false;
  }
  // Every WQE of the batch may end with a CQE: take only as many as the CQ
  // has slots for.
  const uint32_t ci =
      mlx5::be32(Ref(&qp.cq_dbrec[mlx5::kCqSetCi]).load(std::memory_order_acquire)) &
      mlx5::kCqCiMask;
  const uint32_t used = (static_cast<uint32_t>(qp.cq_pi) - ci) & mlx5::kCqCiMask;
  const uint32_t room = used < qp.cq_cqe_cnt ? qp.cq_cqe_cnt - used : 0;
  std::vector<RemoteWqe> wqes;
  RemoteBatch batch;
  std::vector<RemoteFill> fills;
  uint64_t bytes = 0;
  for (uint16_t n = 0;
       n < pending && n < room && n < kMaxRemoteBatch && bytes < kMaxRemoteBatchBytes; ++n) {
    const uint16_t index = static_cast<uint16_t>(qp.sq_ci + n);
    alignas(8) uint8_t wqe[mlx5::kSendWqeBb];
    const uint8_t* slot = qp.sq + (index & (qp.sq_wqe_cnt - 1)) * mlx5::kSendWqeBb;
    for (uint32_t i = 0; i < mlx5::kSendWqeBb; i += 8) {
      const uint64_t v = Ref(reinterpret_cast<uint64_t*>(const_cast<uint8_t*>(slot + i)))
                             .load(std::memory_order_relaxed);
      std::memcpy(&wqe[i], &v, 8);
    }
    RemoteWqe w;
    const size_t ops_before = batch.ops.size();
    const size_t fills_before = fills.size();
    const uint8_t syndrome = PrepareRemote(qp, wqe, index, n == 0 ? qp.wqe_offset : 0,
                                           kMaxRemoteBatchBytes - bytes, &w, &batch.ops, &fills);
    if (syndrome != 0) {
      batch.ops.resize(ops_before);
      fills.resize(fills_before);
      if (!wqes.empty()) break;  // after the batch's answers
      // A local error with nothing in flight: complete it now, as locally.
      qp.wqe_offset = 0;
      WriteCqe(qp, index, w.opcode, syndrome, 0);
      qp.state = QpState::kError;
      qp.last_syndrome = syndrome;
      ++qp.sq_ci;
      ++qp.wqes_done;
      return true;
    }
    bytes += w.atomic ? 8 : w.end - w.from;
    wqes.push_back(w);
    if (w.partial()) break;  // its next piece goes in the next batch
  }
  if (wqes.empty()) return false;
  if (options_.sink) {
    // Benchmarks of the posting path: complete without sending.
    FinishRemote(qp.qpn, qp.serial, wqes,
                 std::vector<ResponderResult>(batch.ops.size(), ResponderResult{}));
    return true;
  }
  if (link_ == nullptr) {  // the daemon is shutting down
    FinishRemote(qp.qpn, qp.serial, wqes, absl::UnavailableError("no link to other nodes"));
    return true;
  }
  if (!secret) {
    FinishRemote(qp.qpn, qp.serial, wqes,
                 absl::UnavailableError("the peer's node never offered the connection's secret"));
    return true;
  }
  batch.node = qp.remote_node;
  batch.requester_qpn = qp.qpn;
  batch.secret = qp.send_secret;
  if (!fills.empty()) {
    // GPU payloads: a worker reads them, then sends; the QP waits.
    qp.remote_busy = true;
    for (const RemoteFill& f : fills) Pin(f.region);
    workers_.Submit(qp.pd, OwnerLocked(qp.pd),
                    [this, qpn = qp.qpn, serial = qp.serial, wqes = std::move(wqes),
                     batch = std::move(batch), fills = std::move(fills)]() mutable {
                      SendAfterFills(qpn, serial, std::move(wqes), std::move(batch), fills);
                    });
    return true;
  }
  SendRemote(qp, std::move(wqes), std::move(batch));
  return true;
}

void Engine::SendRemote(Qp& qp, std::vector<RemoteWqe> wqes, RemoteBatch batch) {
  if (link_ == nullptr) {  // the daemon is shutting down
    qp.remote_busy = true;
    FinishRemote(qp.qpn, qp.serial, wqes, absl::UnavailableError("no link to other nodes"));
    return;
  }
  qp.remote_busy = true;
  link_->Send(std::move(batch), [this, qpn = qp.qpn, serial = qp.serial, wqes = std::move(wqes)](
                                    absl::StatusOr<std::vector<ResponderResult>> results) {
    CallerLock lock(this);
    FinishRemote(qpn, serial, wqes, results);
    Kick();
  });
}

void Engine::SendAfterFills(uint32_t qpn, uint64_t serial, std::vector<RemoteWqe> wqes,
                            RemoteBatch batch, const std::vector<RemoteFill>& fills) {
  {
    CallerLock lock(this);
    if (!QpAliveLocked(qpn, serial)) {  // destroyed while the job waited
      for (const RemoteFill& f : fills) Unpin(f.region);
      return;
    }
  }
  // Without the lock: the source regions are pinned, the spans were taken
  // under it.
  size_t failed_op = batch.ops.size();
  for (const RemoteFill& f : fills) {
    std::string& data = batch.ops[f.op].data;
    const ByteSpan to{MemoryKind::kHost, reinterpret_cast<uintptr_t>(data.data()), data.size()};
    if (!CopyBytes(to, f.piece)) {
      failed_op = f.op;
      break;
    }
  }
  CallerLock lock(this);
  for (const RemoteFill& f : fills) Unpin(f.region);
  auto it = qps_.find(qpn);
  if (it == qps_.end() || it->second->serial != serial) return;  // destroyed meanwhile
  Qp& qp = *it->second;
  if (failed_op < batch.ops.size()) {
    // Send what comes before the WQE whose payload could not be read; it
    // fails on its own, as a WQE whose local side fails does.
    size_t first_op = 0, m = 0;
    while (first_op + wqes[m].op_count <= failed_op) first_op += wqes[m++].op_count;
    wqes.resize(m + 1);
    if (m == 0) {
      FinishRemote(qpn, serial, wqes,
                   std::vector<ResponderResult>(
                       wqes[0].op_count, ResponderResult{.syndrome = mlx5::kSyndLocalProtErr}));
      Kick();
      return;
    }
    wqes.resize(m);
    batch.ops.resize(first_op);
  }
  SendRemote(qp, std::move(wqes), std::move(batch));
}

void Engine::FinishRemote(uint32_t qpn, uint64_t serial, const std::vector<RemoteWqe>& wqes,
                          const absl::StatusOr<std::vector<ResponderResult>>& results,
                          const std::vector<uint8_t>* landed) {
  mu_.AssertHeld();
  auto it = qps_.find(qpn);
  if (it == qps_.end() || it->second->serial != serial) return;  // destroyed meanwhile
  Qp& qp = *it->second;
  if (landed == nullptr && results.ok() && !options_.sink) {
    // Old values for GPU memory, up to the first failed WQE: a copy into
    // GPU memory can wait for a time slice, so a GPU worker lands them and
    // then finishes the batch here. The QP waits (remote_busy).
    struct Landing {
      const Region* region;
      ByteSpan span;
      size_t wqe;
      bool masked;
      uint64_t fetched;
    };
    std::vector<Landing> landings;
    size_t at = 0;
    for (size_t i = 0; i < wqes.size(); ++i) {
      const RemoteWqe& w = wqes[i];
      bool ok = at + w.op_count <= results->size();
      for (size_t k = 0; ok && k < w.op_count; ++k) ok = (*results)[at + k].syndrome == 0;
      if (!ok) break;
      if (w.atomic) {
        const uint32_t width = w.masked ? 4 : 8;
        const Region* dst = Resolve(qp.pd, w.lkey, w.laddr, width, kLocalWrite);
        // One that will fail below flushes the WQEs after it: nothing of
        // theirs is landed.
        if (dst == nullptr || !dst->Reachable() || !dst->Resident(w.laddr, width)) break;
        if (dst->kind == MemoryKind::kCuda) {
          landings.push_back(
              Landing{dst, dst->Span(w.laddr, width), i, w.masked, (*results)[at].fetched});
        }
      }
      at += w.op_count;
    }
    if (!landings.empty()) {
      for (const Landing& l : landings) Pin(l.region);
      workers_.Submit(qp.pd, OwnerLocked(qp.pd),
                      [this, qpn, serial, wqes, results = *results, landings] {
                        std::vector<uint8_t> done(wqes.size(), kNotLanded);
                        for (const Landing& l : landings) {
                          done[l.wqe] = LandFetched(l.span, l.masked, l.fetched);
                          if (done[l.wqe] != 0) break;  // the WQEs after it are flushed
                        }
                        CallerLock lock(this);
                        for (const Landing& l : landings) Unpin(l.region);
                        FinishRemote(qpn, serial, wqes, results, &done);
                        Kick();
                      });
      return;
    }
  }
  size_t op = 0;
  bool failed = false;
  for (size_t i = 0; i < wqes.size(); ++i) {
    const RemoteWqe& w = wqes[i];
    uint8_t syndrome = 0;
    uint64_t fetched = 0;
    if (failed) {
      syndrome = mlx5::kSyndWrFlushErr;
    } else if (!results.ok()) {
      // Nobody answered: a ConnectX retries, then reports this.
      syndrome = mlx5::kSyndTransportRetryExcErr;
    } else {
      for (size_t k = 0; k < w.op_count && syndrome == 0; ++k) {
        if (op + k >= results->size()) {
          // The responder stopped without saying why: a broken peer.
          syndrome = mlx5::kSyndTransportRetryExcErr;
          break;
        }
        syndrome = (*results)[op + k].syndrome;
        fetched = (*results)[op + k].fetched;
      }
    }
    op += w.op_count;
    if (syndrome == 0 && w.atomic && landed != nullptr && (*landed)[i] != kNotLanded) {
      syndrome = (*landed)[i];  // a GPU worker landed it
    } else if (syndrome == 0 && w.atomic) {
      const uint32_t width = w.masked ? 4 : 8;
      const Region* dst = Resolve(qp.pd, w.lkey, w.laddr, width, kLocalWrite);
      syndrome = dst == nullptr || !dst->Reachable() || !dst->Resident(w.laddr, width)
                     ? mlx5::kSyndLocalProtErr
                     : LandFetched(dst->Span(w.laddr, width), w.masked, fetched);
    }
    if (syndrome == 0 && !w.atomic && w.end > w.from && !options_.sink) {
      bytes_written_.fetch_add(w.end - w.from, std::memory_order_relaxed);
    }
    if (syndrome == 0 && w.partial()) {
      qp.wqe_offset = w.end;  // the WQE continues: no CQE yet
      break;
    }
    qp.wqe_offset = 0;
    if (syndrome != 0) {
      WriteCqe(qp, w.index, w.opcode, syndrome, 0);
      if (qp.state != QpState::kError) {
        qp.state = QpState::kError;
        qp.last_syndrome = syndrome;
      }
      failed = true;
    } else if (w.signaled) {
      WriteCqe(qp, w.index, w.opcode, 0, w.byte_count);
    }
    ++qp.sq_ci;
    ++qp.wqes_done;
  }
  qp.remote_busy = false;
}

void Engine::Kick() {
  kicked_.store(true, std::memory_order_relaxed);
  absl::MutexLock lock(&kick_mu_);
  kicked_flag_ = true;
}

void Engine::Run() {
  using Clock = std::chrono::steady_clock;
  const uint32_t max_sleep_us = std::max<uint32_t>(1, options_.max_idle_sleep_us);
  Clock::time_point last_work = Clock::now();
  // Running average of the gaps between rounds that found work (us): the
  // spin window after work is four times it, at least spin_us, at most
  // kMaxSpinWindowUs, as the CPU-assisted doorbell does. A kernel that
  // posts one WQE at a time with gaps of a millisecond is then served
  // within microseconds, not after the idle sleep it would otherwise fall
  // into (up to max_idle_sleep_us: a GPU doorbell cannot wake the thread);
  // an engine whose traffic stopped sleeps again after the window.
  double gap_avg_us = static_cast<double>(options_.spin_us);
  const double min_window_us = std::min<double>(options_.spin_us, kMaxSpinWindowUs);
  uint32_t sleep_us = 1;
  std::vector<uint32_t> round;  // the QPs to visit this round
  while (!stop_.load(std::memory_order_relaxed)) {
    bool did = false;
    {
      absl::MutexLock lock(&mu_);
      // Nothing connected: sleep until a QP is (Connect releases mu_, which
      // re-evaluates the condition), so an idle daemon costs no wakeups.
      // The timeout only bounds how late Stop() is noticed.
      auto active = [](Engine* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(e->mu_) {
        if (e->stop_.load(std::memory_order_relaxed)) return true;
        for (const auto& kv : e->qps_) {
          if (kv.second->state != QpState::kReset) return true;
        }
        return false;
      };
      if (!active(this)) {
        mu_.AwaitWithTimeout(absl::Condition(+active, this), absl::Milliseconds(100));
        continue;
      }
      round.clear();
      for (const auto& [qpn, qp] : qps_) {
        if (qp->state != QpState::kReset) round.push_back(qpn);
      }
    }
    // The lock is taken per QP, not per round: a long WRITE's piece holds
    // up the others by one piece at most (issue 23 item 6). Callers
    // waiting for it go first (CallerLock), for kYieldToCallersPerRound in
    // all.
    const Clock::time_point yield_until = Clock::now() + kYieldToCallersPerRound;
    for (uint32_t qpn : round) {
      while (waiting_.load(std::memory_order_relaxed) > 0 && Clock::now() < yield_until) {
        std::this_thread::yield();
      }
      absl::MutexLock lock(&mu_);
      auto it = qps_.find(qpn);
      if (it != qps_.end() && it->second->state != QpState::kReset) did |= Poll(*it->second);
    }
    if (did || kicked_.exchange(false, std::memory_order_relaxed)) {
      const Clock::time_point now = Clock::now();
      if (did) {
        const double gap = std::chrono::duration<double, std::micro>(now - last_work).count();
        gap_avg_us = 0.875 * gap_avg_us + 0.125 * std::min<double>(gap, kMaxSpinWindowUs);
      }
      last_work = now;
      sleep_us = 1;
      continue;
    }
    const double window_us = std::clamp<double>(4 * gap_avg_us, min_window_us, kMaxSpinWindowUs);
    if (Clock::now() - last_work < std::chrono::duration<double, std::micro>(window_us)) {
      // Posters may share our cores (CI has two): let them run.
      std::this_thread::yield();
      continue;
    }
    {
      // A kick ends the sleep early (Kick).
      absl::MutexLock lock(&kick_mu_);
      kick_mu_.AwaitWithTimeout(absl::Condition(&kicked_flag_), absl::Microseconds(sleep_us));
      kicked_flag_ = false;
    }
    sleep_us = std::min(sleep_us * 2, max_sleep_us);
  }
}

}  // namespace mooncake::softnic
