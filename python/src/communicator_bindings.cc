// Communicator: "rank r of n in group G" -> a ready CommCtx and a symmetric
// buffer (mooncake::Communicator), plus, for tests on the host platform, the
// Device API called from the Python thread.
//
// Ownership: the Communicator lives in a shared_ptr. The Python object, and
// every Buffer, CommCtx handle, borrowed Client and DLPack capsule made from
// it, hold a reference, and so does each call while it runs without the
// GIL; close() drops the Python object's own one (after leaving the group),
// and the buffer is unmapped and freed when the last view goes.
//
// Host-platform testing aids (put / signal / red_add / quiet / wait_signal):
// on the host platform the Device API (comm_device.h) is plain C++ over
// shared memory (or softnic-executed WQEs for RDMA peers), so the Python
// thread can call it as a CPU "kernel" would. They exist to test the
// package and the daemon end to end without a GPU; real code on CUDA passes
// comm.ctx to a kernel. On the CUDA platform they raise FAILED_PRECONDITION
// (the context's tables are device memory there).
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "bindings.h"
#include "mooncake/client/communicator.h"
#include "mooncake/device/comm_device.h"
#include "status.h"

namespace mooncake::python {
namespace {

using device::McStatus;

// How long one uninterrupted wait slice lasts before Python gets a chance to
// deliver a signal (Ctrl-C) to a blocked wait_signal.
constexpr uint64_t kWaitSliceNs = 50'000'000;

absl::Status McStatusToStatus(McStatus s, const std::string& what) {
  switch (s) {
    case McStatus::kOk: return absl::OkStatus();
    case McStatus::kInvalidRank: return absl::InvalidArgumentError(what + ": rank out of range");
    case McStatus::kNoRoute:
      return absl::FailedPreconditionError(
          what + ": no route to that rank (neither P2P nor an RDMA queue pair)");
    case McStatus::kRdmaError:
      return absl::InternalError(what + ": RDMA error completion (mcctl qps shows the syndrome)");
    case McStatus::kTimedOut:
      return absl::DeadlineExceededError(what + ": the RDMA queue pair made no progress");
    case McStatus::kNotRegistered:
      return absl::InvalidArgumentError(what + ": source outside the registered buffer");
    case McStatus::kIncompleteContext:
      return absl::FailedPreconditionError(
          what + ": the CommCtx has no rank count (num_ranks 0): build it with make_comm_ctx");
  }
  return absl::InternalError(what + ": unknown McStatus " + std::to_string(static_cast<int>(s)));
}

// Handle to the CommCtx a kernel launcher passes by value: `address` points
// at the struct the Communicator owns (valid while this handle lives).
struct CtxHandle {
  std::shared_ptr<Communicator> owner;
  const device::CommCtx* ctx;
};

class PyCommunicator {
 public:
  static std::unique_ptr<PyCommunicator> Create(CommunicatorOptions o, int cuda_device) {
    const Platform platform = o.platform;
    absl::StatusOr<std::unique_ptr<Communicator>> c;
    {
      py::gil_scoped_release unlocked;
      c = Communicator::Create(std::move(o));
    }
    std::unique_ptr<PyCommunicator> p(new PyCommunicator());
    p->comm_ = ValueOrThrow(std::move(c));
    p->platform_ = platform;
    if (platform == Platform::kCuda && cuda_device < 0) {
      // Not told: the daemon's index of this rank's GPU, which is the CUDA
      // ordinal unless CUDA_VISIBLE_DEVICES renumbers the devices.
      const GroupView& v = p->comm_->view();
      cuda_device = 0;
      if (v.rank < v.members.size() && v.members[v.rank].gpu_index >= 0) {
        cuda_device = v.members[v.rank].gpu_index;
      }
    }
    p->cuda_device_ = platform == Platform::kCuda ? cuda_device : 0;
    return p;
  }

  Communicator& get() const {
    if (!comm_) {
      ThrowError(absl::StatusCode::kFailedPrecondition,
                 "this mooncake_client.Communicator is closed");
    }
    return *comm_;
  }
  const std::shared_ptr<Communicator>& shared() const {
    get();
    return comm_;
  }
  bool closed() const { return comm_ == nullptr; }
  bool isHost() const { return platform_ == Platform::kHost; }
  std::string platformName() const { return isHost() ? "host" : "cuda"; }

  BufferSpan Span(void* ptr) const {
    BufferSpan s;
    s.owner = shared();
    s.address = reinterpret_cast<uintptr_t>(ptr);
    s.nbytes = get().bufferBytes();
    s.device_type = isHost() ? kDlCpu : kDlCuda;
    s.device_id = isHost() ? 0 : cuda_device_;
    return s;
  }

  py::object PeerBuffer(int64_t rank) const {
    const Communicator& c = get();
    RequireHost("peer_buffer");
    if (rank < 0 || rank >= c.worldSize()) {
      ThrowError(absl::StatusCode::kInvalidArgument, "peer_buffer: rank " + std::to_string(rank) +
                                                         " is outside world size " +
                                                         std::to_string(c.worldSize()));
    }
    if (rank == c.rank()) return MakeBuffer(Span(c.buffer()));
    const device::P2PContext& p2p = c.ctx().p2p;
    if (p2p.available == nullptr || p2p.peer_ptrs == nullptr || p2p.available[rank] == 0) {
      ThrowError(absl::StatusCode::kFailedPrecondition,
                 "peer_buffer: rank " + std::to_string(rank) +
                     " is not mapped into this process (reached over RDMA, or unreachable)");
    }
    return MakeBuffer(Span(p2p.peer_ptrs[rank]));
  }

  void Leave() const {
    std::shared_ptr<Communicator> keep = shared();  // a close() elsewhere cannot free it
    Communicator& c = *keep;
    absl::Status s;
    {
      py::gil_scoped_release unlocked;
      s = c.leave();
    }
    ThrowIfError(s);
  }

  // `read`: the event as the session delivered it (null for one made in
  // Python), whose member entry (the replacement's handle, fd ticket and
  // RDMA endpoint) a JOINED needs; the other fields are the Python Event's.
  void HandleEvent(const std::string& kind, const std::string& group, uint32_t rank, int pid,
                   uint64_t epoch, const std::shared_ptr<SessionEvent>& read) const {
    std::shared_ptr<Communicator> keep = shared();
    SessionEvent event;
    if (read) event = *read;
    std::optional<SessionEvent::Kind> known;
    for (auto k :
         {SessionEvent::Kind::kJoined, SessionEvent::Kind::kLeft, SessionEvent::Kind::kLost,
          SessionEvent::Kind::kReady, SessionEvent::Kind::kFailed,
          SessionEvent::Kind::kDaemonShutdown, SessionEvent::Kind::kDisconnected}) {
      if (kind == SessionEventKindName(k)) known = k;
    }
    if (!known) return;  // a kind this library does not know: nothing to do
    event.kind = *known;
    event.group = group;
    event.rank = rank;
    event.pid = pid;
    event.epoch = epoch;
    absl::Status s;
    {
      // Admitting a replacement maps and verifies its buffer, or connects
      // queue pairs: daemon round trips.
      py::gil_scoped_release unlocked;
      s = keep->handleEvent(event);
    }
    ThrowIfError(s);
  }

  void Close() {
    if (!comm_) return;
    std::shared_ptr<Communicator> c = std::move(comm_);
    py::gil_scoped_release unlocked;
    // Leave now even if views keep the memory (and so the Communicator)
    // alive: peers learn at once that this rank is gone.
    (void)c->leave();
    c.reset();
  }

  // ---- host-platform testing aids --------------------------------------------

  void Put(int peer, uint64_t dst_offset, uint64_t src_offset, uint64_t nbytes) const {
    std::shared_ptr<Communicator> keep = shared();
    const Communicator& c = *keep;
    RequireHost("put");
    CheckRange("put: destination", dst_offset, nbytes);
    CheckRange("put: source", src_offset, nbytes);
    auto* base = static_cast<uint8_t*>(c.buffer());
    McStatus s;
    {
      py::gil_scoped_release unlocked;
      s = device::mc_put_thread(c.ctx(), peer, base + dst_offset, base + src_offset, nbytes);
    }
    ThrowIfError(McStatusToStatus(s, "put to rank " + std::to_string(peer)));
  }

  void Signal(int peer, uint64_t offset, uint64_t value) const {
    std::shared_ptr<Communicator> keep = shared();
    const Communicator& c = *keep;
    RequireHost("signal");
    uint64_t* word = Word("signal", offset);
    McStatus s;
    {
      // Over RDMA a full send queue makes the post wait for the NIC.
      py::gil_scoped_release unlocked;
      s = device::mc_signal(c.ctx(), peer, word, value);
    }
    ThrowIfError(McStatusToStatus(s, "signal to rank " + std::to_string(peer)));
  }

  void RedAdd(int peer, uint64_t offset, uint64_t value) const {
    std::shared_ptr<Communicator> keep = shared();
    const Communicator& c = *keep;
    RequireHost("red_add");
    uint64_t* word = Word("red_add", offset);
    McStatus s;
    {
      py::gil_scoped_release unlocked;
      s = device::mc_red_add(c.ctx(), peer, word, value);
    }
    ThrowIfError(McStatusToStatus(s, "red_add to rank " + std::to_string(peer)));
  }

  void Quiet() const {
    std::shared_ptr<Communicator> keep = shared();
    const Communicator& c = *keep;
    RequireHost("quiet");
    McStatus s;
    {
      py::gil_scoped_release unlocked;
      s = device::mc_quiet(c.ctx());
    }
    ThrowIfError(McStatusToStatus(s, "quiet"));
  }

  uint64_t WaitSignal(uint64_t offset, uint64_t value, double timeout) const {
    std::shared_ptr<Communicator> keep = shared();
    RequireHost("wait_signal");
    const uint64_t* word = Word("wait_signal", offset);
    const bool forever = !(timeout >= 0);
    const uint64_t limit_ns = forever ? 0 : static_cast<uint64_t>(timeout * 1e9);
    const uint64_t start = device::mc_time_ns();
    for (;;) {
      uint64_t seen = 0;
      bool ok;
      {
        py::gil_scoped_release unlocked;
        ok = device::mc_wait_until_for(word, device::McCmp::kGe, value, kWaitSliceNs, &seen);
      }
      if (ok) return seen;
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
      if (!forever && device::mc_time_ns() - start >= limit_ns) {
        ThrowError(absl::StatusCode::kDeadlineExceeded,
                   "wait_signal: the word at offset " + std::to_string(offset) + " is " +
                       std::to_string(seen) + ", still below " + std::to_string(value) + " after " +
                       std::to_string(timeout) + " s");
      }
    }
  }

 private:
  PyCommunicator() = default;

  void RequireHost(const char* what) const {
    if (!isHost()) {
      ThrowError(absl::StatusCode::kFailedPrecondition,
                 std::string(what) +
                     " is a host-platform testing aid; on the CUDA platform pass comm.ctx to "
                     "a kernel that calls the Device API (tests/gpu/python_check.sh has one)");
    }
  }

  void CheckRange(const std::string& what, uint64_t offset, uint64_t nbytes) const {
    const uint64_t size = get().bufferBytes();
    if (offset > size || nbytes > size - offset) {
      ThrowError(absl::StatusCode::kOutOfRange, what + " [" + std::to_string(offset) + ", +" +
                                                    std::to_string(nbytes) + ") is outside the " +
                                                    std::to_string(size) + "-byte buffer");
    }
  }

  uint64_t* Word(const char* what, uint64_t offset) const {
    CheckRange(std::string(what) + ": word", offset, sizeof(uint64_t));
    if (offset % alignof(uint64_t) != 0) {
      ThrowError(absl::StatusCode::kInvalidArgument,
                 std::string(what) + ": offset " + std::to_string(offset) +
                     " is not 8-byte aligned (signals are aligned uint64 words)");
    }
    return reinterpret_cast<uint64_t*>(static_cast<uint8_t*>(get().buffer()) + offset);
  }

  std::shared_ptr<Communicator> comm_;
  Platform platform_ = Platform::kHost;
  int cuda_device_ = 0;
};

uint32_t CheckedU32(const char* name, int64_t v) {
  if (v < 0 || v > std::numeric_limits<uint32_t>::max()) {
    ThrowError(absl::StatusCode::kInvalidArgument,
               std::string(name) + " " + std::to_string(v) + " is out of range (0..2^32-1)");
  }
  return static_cast<uint32_t>(v);
}

std::unique_ptr<PyCommunicator> Create(
    const std::string& group, int64_t rank, int64_t world_size, int64_t buffer_bytes,
    const std::string& platform, const std::string& route, const std::optional<std::string>& socket,
    double timeout, const std::vector<int64_t>& rdma_peers, int64_t qps_per_peer,
    bool wait_all_ready, const std::string& client_name, const std::string& gpu_uuid,
    const std::string& cuda_handle, int cuda_device, const std::vector<std::string>& rdma_nics,
    const std::string& rdma_ring_memory, const std::string& atomics_route) {
  CommunicatorOptions o;
  o.socket_path = socket.value_or("");
  if (group.empty()) ThrowError(absl::StatusCode::kInvalidArgument, "group name is empty");
  o.group = group;
  o.rank = CheckedU32("rank", rank);
  o.world_size = CheckedU32("world_size", world_size);
  if (buffer_bytes <= 0) {
    ThrowError(absl::StatusCode::kInvalidArgument,
               "buffer_bytes must be positive, not " + std::to_string(buffer_bytes));
  }
  o.buffer_bytes = static_cast<size_t>(buffer_bytes);
  o.platform = ValueOrThrow(ParsePlatform(platform));
  o.route = ValueOrThrow(ParseRoute(route));
  o.atomics_route = ValueOrThrow(ParseAtomicsRoute(atomics_route));
  for (int64_t p : rdma_peers) o.rdma_peers.push_back(CheckedU32("rdma_peers entry", p));
  o.qps_per_peer = CheckedU32("qps_per_peer", qps_per_peer);
  o.rdma_nics = rdma_nics;
  if (rdma_ring_memory == "gpu") {
    o.rdma_ring_memory = DaemonRdmaOptions::RingMemory::kGpu;
  } else if (rdma_ring_memory == "host") {
    o.rdma_ring_memory = DaemonRdmaOptions::RingMemory::kHost;
  } else if (rdma_ring_memory != "auto") {
    ThrowError(absl::StatusCode::kInvalidArgument,
               "unknown rdma_ring_memory '" + rdma_ring_memory + "': expected auto, host or gpu");
  }
  if (timeout > 0) o.timeout = absl::Microseconds(static_cast<int64_t>(timeout * 1e6));
  o.wait_all_ready = wait_all_ready;
  o.client_name = client_name;
  o.gpu_uuid = gpu_uuid;
  if (cuda_handle == "vmm") {
    o.cuda_handle = device::CudaHandleKind::kVmmPosixFd;
  } else if (cuda_handle == "ipc") {
    o.cuda_handle = device::CudaHandleKind::kLegacyIpc;
  } else if (cuda_handle == "fabric") {
    o.cuda_handle = device::CudaHandleKind::kFabric;
  } else if (cuda_handle != "auto") {
    ThrowError(absl::StatusCode::kInvalidArgument,
               "unknown cuda_handle '" + cuda_handle + "': expected auto, vmm, ipc or fabric");
  }
  return PyCommunicator::Create(std::move(o), cuda_device);
}

}  // namespace

void RegisterCommunicator(py::module_& m) {
  py::class_<CtxHandle>(m, "CommCtx", R"doc(
The device::CommCtx a kernel receives by value. `address` points at the struct
the Communicator owns (valid while this object lives); `nbytes` is its size.
A launcher copies `nbytes` bytes from `address` into the kernel's parameter
(C++: `CommCtx ctx; memcpy(&ctx, (void*)address, sizeof ctx)`).)doc")
      .def_property_readonly("address",
                             [](const CtxHandle& h) { return reinterpret_cast<uintptr_t>(h.ctx); })
      .def_property_readonly("nbytes", [](const CtxHandle&) { return sizeof(device::CommCtx); })
      .def_property_readonly("rank", [](const CtxHandle& h) { return h.ctx->rank; })
      .def_property_readonly("num_ranks", [](const CtxHandle& h) { return h.ctx->num_ranks; })
      .def("to_bytes",
           [](const CtxHandle& h) {
             return py::bytes(reinterpret_cast<const char*>(h.ctx), sizeof(device::CommCtx));
           })
      .def("__int__", [](const CtxHandle& h) { return reinterpret_cast<uintptr_t>(h.ctx); });

  py::class_<PyCommunicator>(m, "Communicator",
                             "A ready communicator (low level; use mooncake_client.Communicator).")
      .def_static("create", &Create, py::kw_only(), py::arg("group"), py::arg("rank"),
                  py::arg("world_size"), py::arg("buffer_bytes"), py::arg("platform") = "host",
                  py::arg("route") = "auto", py::arg("socket") = py::none(),
                  py::arg("timeout") = 30.0, py::arg("rdma_peers") = std::vector<int64_t>{},
                  py::arg("qps_per_peer") = 1, py::arg("wait_all_ready") = true,
                  py::arg("client_name") = "", py::arg("gpu_uuid") = "",
                  py::arg("cuda_handle") = "auto", py::arg("cuda_device") = -1,
                  py::arg("rdma_nics") = std::vector<std::string>{},
                  py::arg("rdma_ring_memory") = "auto", py::arg("atomics_route") = "auto")
      .def_property_readonly("closed", &PyCommunicator::closed)
      .def_property_readonly("rank", [](const PyCommunicator& p) { return p.get().rank(); })
      .def_property_readonly("world_size",
                             [](const PyCommunicator& p) { return p.get().worldSize(); })
      .def_property_readonly("platform", &PyCommunicator::platformName)
      .def_property_readonly("epoch", [](const PyCommunicator& p) { return p.get().epoch(); })
      .def_property_readonly("handle_kind",
                             [](const PyCommunicator& p) { return p.get().handleKind(); })
      .def_property_readonly("nic_atomics",
                             [](const PyCommunicator& p) { return p.get().nicAtomics(); })
      .def_property_readonly("rdma_ring_memory",
                             [](const PyCommunicator& p) -> std::optional<std::string> {
                               DaemonRdmaTransport* r = p.get().rdmaTransport();
                               if (r == nullptr) return std::nullopt;
                               return std::string(r->ringMemory());
                             })
      .def_property_readonly(
          "setup_time",
          [](const PyCommunicator& p) { return absl::ToDoubleSeconds(p.get().setupTime()); })
      .def_property_readonly(
          "buffer", [](const PyCommunicator& p) { return MakeBuffer(p.Span(p.get().buffer())); })
      .def_property_readonly("ctx",
                             [](const PyCommunicator& p) {
                               return CtxHandle{p.shared(), &p.get().ctx()};
                             })
      .def_property_readonly(
          "view", [](const PyCommunicator& p) { return GroupViewToDict(p.get().view()); })
      .def_property_readonly("client",
                             [](const PyCommunicator& p) {
                               return std::make_shared<ClientHandle>(p.shared(), &p.get().client());
                             })
      .def("rdma_peer", [](const PyCommunicator& p, int r) { return p.get().rdmaPeer(r); })
      .def("peer_buffer", &PyCommunicator::PeerBuffer, py::arg("rank"))
      .def("peer_active", [](const PyCommunicator& p, int r) { return p.get().peerActive(r); })
      .def(
          "handle_event",
          [](const PyCommunicator& p, const std::string& kind, const std::string& group,
             int64_t rank, int pid, uint64_t epoch, std::shared_ptr<SessionEvent> read) {
            p.HandleEvent(kind, group, CheckedU32("rank", rank), pid, epoch, read);
          },
          py::arg("kind"), py::arg("group"), py::arg("rank"), py::arg("pid"), py::arg("epoch"),
          py::arg("read").none(true))
      .def("leave", &PyCommunicator::Leave)
      .def("close", &PyCommunicator::Close)
      .def("put", &PyCommunicator::Put, py::arg("peer"), py::arg("dst_offset"),
           py::arg("src_offset"), py::arg("nbytes"))
      .def("signal", &PyCommunicator::Signal, py::arg("peer"), py::arg("offset"), py::arg("value"))
      .def("red_add", &PyCommunicator::RedAdd, py::arg("peer"), py::arg("offset"), py::arg("value"))
      .def("quiet", &PyCommunicator::Quiet)
      .def("wait_signal", &PyCommunicator::WaitSignal, py::arg("offset"), py::arg("value"),
           py::arg("timeout") = -1.0);
}

}  // namespace mooncake::python
