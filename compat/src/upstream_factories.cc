// Upstream's factories (createP2pDeviceTransport, createIbgdaDeviceTransport)
// over this project's transports: each returned object owns its own session
// with mooncaked and forwards upstream's calls to the real transport.
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "mooncake/client/client.h"
#include "mooncake/client/daemon_handle_exchange.h"
#include "mooncake/client/daemon_rdma_transport.h"
#include "mooncake/common/log.h"
#include "mooncake/device/device_transport.h"
#include "transport/device/device_transport.h"
#include "unavailable_transports.h"
#include "upstream_handle_kind.h"

namespace mooncake {
namespace device {
namespace {

enum class Platform { kHost, kCuda };

// Buffers allocated by the P2P transports made here, so that
// createIbgdaDeviceTransport's registerMemory can send the daemon their fd
// (upstream registers a pointer; the daemon needs the memory's fd).
struct BufferRecord {
  BrokeredP2pTransport* owner;
  size_t bytes;
};
struct BufferRegistry {
  std::mutex mu;
  std::map<uintptr_t, BufferRecord> buffers;  // by base address
  // The platform the last P2P transport was made for: what the RDMA
  // transport uses when $MOONCAKE_DEVICE_PLATFORM does not say.
  Platform last_platform = Platform::kHost;
};
BufferRegistry& Registry() {
  static BufferRegistry* r = new BufferRegistry;  // never destroyed: used at exit
  return *r;
}

// $MOONCAKE_DEVICE_PLATFORM: "cuda", "host", or unset/"" (auto). Anything
// else is refused by name.
absl::Status RequestedPlatform(std::string* out) {
  const char* env = std::getenv("MOONCAKE_DEVICE_PLATFORM");
  *out = env != nullptr ? env : "";
  if (out->empty() || *out == "cuda" || *out == "host") return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("MOONCAKE_DEVICE_PLATFORM=", *out, " is neither \"cuda\" nor \"host\""));
}

}  // namespace

CudaHandleKind UpstreamCudaHandleKind(const char* mc_use_nvlink_ipc) {
  return mc_use_nvlink_ipc != nullptr && std::string(mc_use_nvlink_ipc) == "0"
             ? CudaHandleKind::kFabric
             : CudaHandleKind::kSameNode;
}

namespace {

std::unique_ptr<Client> ConnectToDaemon(const char* factory) {
  absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect();
  if (!c.ok()) {
    MC_LOG(kError, factory, ": no mooncaked to use: ", c.status().ToString(),
           " (start one, or point $MOONCAKE_SOCKET at its socket)");
    return nullptr;
  }
  return std::move(*c);
}

// The P2P transport createP2pDeviceTransport returns: the session, the
// daemon-backed handle exchange and the real transport, in the order they
// must be torn down (members are destroyed bottom-up).
class DaemonP2pTransport final : public BrokeredP2pTransport {
 public:
  DaemonP2pTransport(std::unique_ptr<Client> client, std::shared_ptr<DaemonHandleExchange> exchange,
                     std::unique_ptr<BrokeredP2pTransport> inner)
      : client_(std::move(client)), exchange_(std::move(exchange)), inner_(std::move(inner)) {}
  ~DaemonP2pTransport() override {
    BufferRegistry& r = Registry();
    std::lock_guard<std::mutex> lock(r.mu);
    for (auto it = r.buffers.begin(); it != r.buffers.end();) {
      it = it->second.owner == this ? r.buffers.erase(it) : std::next(it);
    }
  }

  void* allocateBuffer(size_t bytes) override {
    void* p = inner_->allocateBuffer(bytes);
    if (p != nullptr) {
      BufferRegistry& r = Registry();
      std::lock_guard<std::mutex> lock(r.mu);
      r.buffers[reinterpret_cast<uintptr_t>(p)] = BufferRecord{this, bytes};
    }
    return p;
  }
  void freeBuffer(void* ptr) override {
    {
      BufferRegistry& r = Registry();
      std::lock_guard<std::mutex> lock(r.mu);
      r.buffers.erase(reinterpret_cast<uintptr_t>(ptr));
    }
    inner_->freeBuffer(ptr);
  }
  std::vector<int32_t> exportIpcHandle(void* ptr) override { return inner_->exportIpcHandle(ptr); }
  void importPeerHandles(void* local_ptr, int rank, int num_ranks,
                         const std::vector<std::vector<int32_t>>& remote_handles,
                         const std::vector<int>& active_ranks_mask) override {
    inner_->importPeerHandles(local_ptr, rank, num_ranks, remote_handles, active_ranks_mask);
  }
  int32_t* availableTablePtr() override { return inner_->availableTablePtr(); }
  void** peerPtrsTablePtr() override { return inner_->peerPtrsTablePtr(); }
  bool allPeersAccessible() const override { return inner_->allPeersAccessible(); }
  bool verifyPeerAccess() override { return inner_->verifyPeerAccess(); }

  std::string handleKind() const override { return inner_->handleKind(); }
  absl::Status lastError() const override { return inner_->lastError(); }
  std::vector<int32_t> availableSnapshot() const override { return inner_->availableSnapshot(); }
  P2PContext p2pContext() override { return inner_->p2pContext(); }
  absl::StatusOr<ExportedBuffer> exportLocal(void* ptr) override {
    return inner_->exportLocal(ptr);
  }
  absl::Status mapPeers(void* local_ptr, int rank, int num_ranks, std::vector<PeerBuffer> peers,
                        const std::vector<int>& active_ranks_mask) override {
    return inner_->mapPeers(local_ptr, rank, num_ranks, std::move(peers), active_ranks_mask);
  }

 private:
  std::unique_ptr<Client> client_;
  std::shared_ptr<DaemonHandleExchange> exchange_;
  std::unique_ptr<BrokeredP2pTransport> inner_;
};

// The RDMA transport createIbgdaDeviceTransport returns: its session and
// the real transport; registerMemory finds the buffer's fd.
class DaemonIbgdaTransport final : public RdmaTransport {
 public:
  DaemonIbgdaTransport(std::unique_ptr<Client> client, std::unique_ptr<DaemonRdmaTransport> inner,
                       Platform platform)
      : client_(std::move(client)), inner_(std::move(inner)), platform_(platform) {}

  int initialize(const std::string& device_name, int num_ranks, int num_qps) override {
    return Said("initialize", inner_->initialize(device_name, num_ranks, num_qps));
  }
  int registerMemory(void* ptr, size_t bytes) override {
    absl::Status s = RegisterFromRegistry(ptr, bytes);
    if (!s.ok()) {
      MC_LOG(kError, "RdmaTransport::registerMemory(0x",
             absl::Hex(reinterpret_cast<uintptr_t>(ptr)), ", ", bytes, "): ", s.ToString());
      return -1;
    }
    return 0;
  }
  int allocateControlBuffer() override {
    return Said("allocateControlBuffer", inner_->allocateControlBuffer());
  }
  int createQueuePairs(void* stream) override {
    return Said("createQueuePairs", inner_->createQueuePairs(stream));
  }
  int recreateQueuePairs(void* stream) override {
    return Said("recreateQueuePairs", inner_->recreateQueuePairs(stream));
  }
  int connectPeers(int local_rank, bool is_roce, const std::vector<int64_t>& remote_addrs,
                   const std::vector<int32_t>& remote_keys, const std::vector<int32_t>& remote_qpns,
                   const std::vector<int32_t>& remote_lids,
                   const std::vector<int64_t>& subnet_prefixes,
                   const std::vector<int64_t>& interface_ids,
                   const std::vector<int>& active_ranks_mask) override {
    return Said("connectPeers", inner_->connectPeers(local_rank, is_roce, remote_addrs, remote_keys,
                                                     remote_qpns, remote_lids, subnet_prefixes,
                                                     interface_ids, active_ranks_mask));
  }
  RdmaLocalMetadata localMetadata() const override { return inner_->localMetadata(); }
  void* raddrsPtr() override { return inner_->raddrsPtr(); }
  void* rkeysPtr() override { return inner_->rkeysPtr(); }
  void* qpDevCtxsPtr() override { return inner_->qpDevCtxsPtr(); }
  bool isRoce() const override { return inner_->isRoce(); }
  int gidIndex() const override { return inner_->gidIndex(); }

 private:
  // Upstream's callers see only a return code (EP then logs "IBGDA
  // unavailable"): the reason goes to the log, once per failed call.
  int Said(const char* call, int rc) {
    if (rc != 0) MC_LOG(kError, "RdmaTransport::", call, ": ", inner_->lastError().ToString());
    return rc;
  }

  absl::Status RegisterFromRegistry(void* ptr, size_t bytes) {
    BrokeredP2pTransport* owner = nullptr;
    uintptr_t base = 0;
    size_t base_bytes = 0;
    {
      BufferRegistry& r = Registry();
      std::lock_guard<std::mutex> lock(r.mu);
      const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
      auto it = r.buffers.upper_bound(p);
      if (it != r.buffers.begin()) {
        --it;
        if (p - it->first <= it->second.bytes && bytes <= it->second.bytes - (p - it->first)) {
          owner = it->second.owner;
          base = it->first;
          base_bytes = it->second.bytes;
        }
      }
    }
    if (owner == nullptr) {
      return absl::InvalidArgumentError(
          "the range is not inside a buffer that a transport from createP2pDeviceTransport "
          "allocated in this process: allocate the RDMA buffer with its allocateBuffer");
    }
    absl::StatusOr<ExportedBuffer> mine = owner->exportLocal(reinterpret_cast<void*>(base));
    if (!mine.ok()) return mine.status();
    if (mine->fds.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the buffer's ", owner->handleKind(),
          " handle has no fd for the daemon to register: the RDMA route needs cuMem VMM "
          "buffers on CUDA"));
    }
    (void)base_bytes;
    const std::string kind = platform_ == Platform::kCuda ? "cuda-vmm-fd" : "memfd";
    // registerMemoryFd registers [ptr, ptr + bytes) at its offset in the fd.
    return inner_->registerMemoryFd(ptr, bytes, mine->fds[0].get(),
                                    static_cast<uint64_t>(reinterpret_cast<uintptr_t>(ptr) - base),
                                    kind, mine->map_bytes);
  }

  std::unique_ptr<Client> client_;
  std::unique_ptr<DaemonRdmaTransport> inner_;
  Platform platform_;
};

}  // namespace

namespace {

// The factories' work; nullptr with the reason logged.
std::unique_ptr<P2pTransport> TryCreateP2p(int num_ranks) {
  constexpr const char* kName = "createP2pDeviceTransport";
  if (num_ranks < 1) {
    MC_LOG(kError, kName, ": num_ranks ", num_ranks, " (must be >= 1)");
    return nullptr;
  }
  std::string want;
  if (absl::Status s = RequestedPlatform(&want); !s.ok()) {
    MC_LOG(kError, kName, ": ", s.message());
    return nullptr;
  }
  std::unique_ptr<Client> client = ConnectToDaemon(kName);
  if (client == nullptr) return nullptr;
  auto exchange = std::make_shared<DaemonHandleExchange>(client.get());

  std::unique_ptr<BrokeredP2pTransport> inner;
  Platform platform = Platform::kHost;
  if (want != "host") {
    const CudaHandleKind kind = UpstreamCudaHandleKind(std::getenv("MC_USE_NVLINK_IPC"));
    absl::StatusOr<std::unique_ptr<BrokeredP2pTransport>> cuda =
        createCudaP2pTransport(num_ranks, exchange, kind);
    if (!cuda.ok() && kind == CudaHandleKind::kFabric) {
      // Upstream's opt-in does not fall back either.
      MC_LOG(kError, kName,
             ": MC_USE_NVLINK_IPC=0 asks for fabric handles: ", cuda.status().ToString());
      return nullptr;
    }
    if (cuda.ok()) {
      inner = std::move(*cuda);
      platform = Platform::kCuda;
    } else if (want == "cuda") {
      MC_LOG(kError, kName, ": MOONCAKE_DEVICE_PLATFORM=cuda: ", cuda.status().ToString());
      return nullptr;
    } else {
      static std::once_flag logged;
      std::call_once(logged, [&] {
        MC_LOG(kWarning, kName, ": no CUDA (", cuda.status().message(),
               "); using the host platform (shared memory). Set MOONCAKE_DEVICE_PLATFORM=cuda "
               "to require a GPU");
      });
    }
  }
  if (inner == nullptr) {
    absl::StatusOr<std::unique_ptr<BrokeredP2pTransport>> host =
        createHostP2pTransport(num_ranks, exchange);
    if (!host.ok()) {
      MC_LOG(kError, kName, ": ", host.status().ToString());
      return nullptr;
    }
    inner = std::move(*host);
  }
  {
    BufferRegistry& r = Registry();
    std::lock_guard<std::mutex> lock(r.mu);
    r.last_platform = platform;
  }
  return std::make_unique<DaemonP2pTransport>(std::move(client), std::move(exchange),
                                              std::move(inner));
}

std::unique_ptr<RdmaTransport> TryCreateIbgda(const std::vector<std::string>& device_filter) {
  constexpr const char* kName = "createIbgdaDeviceTransport";
  std::string want;
  if (absl::Status s = RequestedPlatform(&want); !s.ok()) {
    MC_LOG(kError, kName, ": ", s.message());
    return nullptr;
  }
  Platform platform;
  if (want.empty()) {
    BufferRegistry& r = Registry();
    std::lock_guard<std::mutex> lock(r.mu);
    platform = r.last_platform;
  } else {
    platform = want == "cuda" ? Platform::kCuda : Platform::kHost;
  }
  std::unique_ptr<Client> client = ConnectToDaemon(kName);
  if (client == nullptr) return nullptr;
  DaemonRdmaOptions options;
  options.cuda = platform == Platform::kCuda;
  options.nics = device_filter;
  absl::StatusOr<std::unique_ptr<DaemonRdmaTransport>> t =
      DaemonRdmaTransport::Create(client.get(), options);
  if (!t.ok()) {
    MC_LOG(kError, kName, ": ", t.status().ToString());
    return nullptr;
  }
  return std::make_unique<DaemonIbgdaTransport>(std::move(client), std::move(*t), platform);
}

}  // namespace

// Never nullptr, as upstream's (unavailable_transports.h).
std::unique_ptr<P2pTransport> createP2pDeviceTransport(int num_ranks) {
  if (std::unique_ptr<P2pTransport> t = TryCreateP2p(num_ranks)) return t;
  return std::make_unique<UnavailableP2pTransport>("createP2pDeviceTransport failed, as logged");
}

std::unique_ptr<RdmaTransport> createIbgdaDeviceTransport(
    const std::vector<std::string>& device_filter) {
  if (std::unique_ptr<RdmaTransport> t = TryCreateIbgda(device_filter)) return t;
  return std::make_unique<UnavailableRdmaTransport>("createIbgdaDeviceTransport failed, as logged");
}

}  // namespace device
}  // namespace mooncake
