#include "mooncake/client/communicator.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "mooncake/client/daemon_handle_exchange.h"
#include "mooncake/common/status.h"
#include "mooncake/drivers/cuda_driver.h"

namespace mooncake {
namespace {

// The UUID ("GPU-...") of the current CUDA device, the one the transport
// works on, so the daemon places this rank on its real GPU (P2P
// reachability comes from that, not from ranks).
absl::StatusOr<std::string> CurrentGpuUuid() {
  MC_ASSIGN_OR_RETURN(std::shared_ptr<drivers::CudaDriver> drv, drivers::LoadCudaDriver());
  absl::StatusOr<int> ordinal = drivers::CurrentDeviceOrdinal(*drv);
  if (!ordinal.ok()) {
    return absl::Status(ordinal.status().code(), absl::StrCat("finding the current CUDA device: ",
                                                              ordinal.status().message()));
  }
  drivers::CuDevice dev = 0;
  drivers::CuUuid uuid{};
  MC_RETURN_IF_ERROR(drivers::CuStatus(*drv, drv->deviceGet(&dev, *ordinal), "cuDeviceGet"));
  MC_RETURN_IF_ERROR(
      drivers::CuStatus(*drv, drv->deviceGetUuid(&uuid, dev), "cuDeviceGetUuid (current GPU)"));
  const unsigned char* b = uuid.bytes;
  return absl::StrFormat("GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
                         b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11],
                         b[12], b[13], b[14], b[15]);
}

}  // namespace

absl::StatusOr<Platform> ParsePlatform(const std::string& name) {
  if (name == "host") return Platform::kHost;
  if (name == "cuda") return Platform::kCuda;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown platform '", name, "': expected host or cuda"));
}

absl::StatusOr<Route> ParseRoute(const std::string& name) {
  if (name == "auto") return Route::kAuto;
  if (name == "p2p") return Route::kP2p;
  if (name == "rdma") return Route::kRdma;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown route '", name, "': expected auto, p2p or rdma"));
}

absl::StatusOr<AtomicsRoute> ParseAtomicsRoute(const std::string& name) {
  if (name == "auto") return AtomicsRoute::kAuto;
  if (name == "device") return AtomicsRoute::kDevice;
  if (name == "nic") return AtomicsRoute::kNic;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown atomics route '", name, "': expected auto, device or nic"));
}

absl::StatusOr<std::unique_ptr<Communicator>> Communicator::Create(CommunicatorOptions options) {
  if (options.world_size == 0 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", options.rank, " of world size ",
                                                   options.world_size, " is out of range"));
  }
  if (options.buffer_bytes == 0) return absl::InvalidArgumentError("buffer_bytes is 0");
  if (options.route == Route::kP2p && !options.rdma_peers.empty()) {
    return absl::InvalidArgumentError("rdma_peers given with the p2p route");
  }
  for (uint32_t p : options.rdma_peers) {
    if (p >= options.world_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("rdma_peers: rank ", p, " is outside world size ", options.world_size));
    }
  }
  if (options.qps_per_peer == 0 || options.qps_per_peer > 64) {
    return absl::InvalidArgumentError("qps_per_peer must be in 1..64");
  }
  std::unique_ptr<Communicator> c(new Communicator(std::move(options)));
  absl::Time start = absl::Now();
  MC_RETURN_IF_ERROR(c->Setup());
  c->setup_time_ = absl::Now() - start;
  return c;
}

absl::Status Communicator::Setup() {
  const CommunicatorOptions& o = options_;
  ClientOptions co;
  co.socket_path = o.socket_path;
  co.client_name = o.client_name.empty() ? absl::StrCat(o.group, "/", o.rank) : o.client_name;
  MC_ASSIGN_OR_RETURN(client_, Client::Connect(co));
  exchange_ = std::make_shared<DaemonHandleExchange>(client_.get());

  if (o.platform == Platform::kHost) {
    MC_ASSIGN_OR_RETURN(transport_, device::createHostP2pTransport(o.world_size, exchange_));
  } else {
    MC_ASSIGN_OR_RETURN(transport_,
                        device::createCudaP2pTransport(o.world_size, exchange_, o.cuda_handle));
  }
  buffer_ = transport_->allocateBuffer(o.buffer_bytes);
  if (buffer_ == nullptr) {
    return absl::Status(transport_->lastError().code(),
                        absl::StrCat("allocating the ", o.buffer_bytes,
                                     "-byte buffer: ", transport_->lastError().message()));
  }
  MC_RETURN_IF_ERROR(PrepareRdma());
  MC_ASSIGN_OR_RETURN(view_,
                      o.handle_route == HandleRoute::kJoin ? JoinWithFds() : JoinWithExport());
  MC_RETURN_IF_ERROR(ConnectRdma(view_));
  bool all_ok = transport_->verifyPeerAccess();
  std::vector<int32_t> avail = transport_->availableSnapshot();
  std::vector<uint32_t> unreachable;
  for (uint32_t r = 0; r < avail.size(); ++r) {
    if (avail[r] == 0 && !rdmaPeer(static_cast<int>(r))) unreachable.push_back(r);
  }
  std::string detail = all_ok ? ""
                              : absl::StrCat("unreachable ranks ", absl::StrJoin(unreachable, ","),
                                             ": ", transport_->lastError().message());
  MC_RETURN_IF_ERROR(client_->reportReady(o.group, o.rank, all_ok, detail, unreachable));

  ctx_ = device::CommCtx{};
  ctx_.p2p = transport_->p2pContext();
  if (rdma_) ctx_.ibgda = rdma_->ibgdaContext();
  ctx_.rank = static_cast<int>(o.rank);
  ctx_.num_ranks = static_cast<int>(o.world_size);
  active_.assign(o.world_size, 1);

  if (o.wait_all_ready) {
    absl::Time deadline = absl::Now() + o.timeout;
    for (;;) {
      absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) {
        return absl::DeadlineExceededError(absl::StrCat(
            "group '", o.group, "' formed but not every rank reported ready within ",
            absl::FormatDuration(o.timeout), " (`mcctl groups` shows who is missing)"));
      }
      std::optional<SessionEvent> ev = client_->nextEvent(left);
      if (!ev) continue;
      if (ev->kind == SessionEvent::Kind::kReady && ev->group == o.group) break;
      if (ev->group == o.group &&
          (ev->kind == SessionEvent::Kind::kLost || ev->kind == SessionEvent::Kind::kLeft ||
           ev->kind == SessionEvent::Kind::kFailed)) {
        return absl::AbortedError(absl::StrCat("group '", o.group, "': rank ", ev->rank, " ",
                                               SessionEventKindName(ev->kind),
                                               " during setup: ", ev->detail));
      }
      if (ev->kind == SessionEvent::Kind::kDaemonShutdown ||
          ev->kind == SessionEvent::Kind::kDisconnected) {
        return absl::UnavailableError(ev->detail);
      }
    }
  }
  if (!all_ok) {
    return absl::FailedPreconditionError(absl::StrCat("group '", o.group, "': ", detail));
  }
  return absl::OkStatus();
}

absl::StatusOr<JoinOptions> Communicator::BaseJoin() const {
  const CommunicatorOptions& o = options_;
  JoinOptions j;
  j.group = o.group;
  j.rank = o.rank;
  j.world_size = o.world_size;
  j.timeout = o.timeout;
  j.handle_kind = transport_->handleKind();
  j.handle_size = o.buffer_bytes;
  j.gpu_uuid = o.gpu_uuid;
  if (o.platform == Platform::kCuda && j.gpu_uuid.empty()) {
    MC_ASSIGN_OR_RETURN(j.gpu_uuid, CurrentGpuUuid());
  }
  if (rdma_) j.rdma = rdma_->endpoint();
  return j;
}

// Before the join: which peers go over RDMA, and this rank's QPs toward
// them (their numbers travel in the join, so the peers can connect).
absl::Status Communicator::PrepareRdma() {
  const CommunicatorOptions& o = options_;
  rdma_mask_.assign(o.world_size, 0);
  if (o.route == Route::kRdma) {
    for (uint32_t r = 0; r < o.world_size; ++r) rdma_mask_[r] = r != o.rank;
  }
  for (uint32_t p : o.rdma_peers) rdma_mask_[p] = p != o.rank;
  const bool any_rdma = std::find(rdma_mask_.begin(), rdma_mask_.end(), 1) != rdma_mask_.end();
  nic_atomics_ =
      o.atomics_route == AtomicsRoute::kNic || (o.atomics_route == AtomicsRoute::kAuto && any_rdma);
  // NIC atomics: queue pairs toward every rank, this one included (the
  // loopback is what tells the device code, mc_nic_atomics).
  qp_mask_ = nic_atomics_ ? std::vector<int>(o.world_size, 1) : rdma_mask_;
  if (!any_rdma && !nic_atomics_) return absl::OkStatus();
  auto step = [](const char* what, absl::Status s) {
    return s.ok() ? s : absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
  };
  DaemonRdmaOptions ro;
  ro.sq_depth = o.rdma_sq_depth;
  ro.cqe_every = o.rdma_cqe_every;
  ro.copy_agent = o.rdma_copy_agent;
  ro.cuda = o.platform == Platform::kCuda;
  ro.nics = o.rdma_nics;
  ro.ring_memory = o.rdma_ring_memory;
  ro.gpu_doorbells = o.rdma_gpu_doorbells;
  absl::StatusOr<std::unique_ptr<DaemonRdmaTransport>> t =
      DaemonRdmaTransport::Create(client_.get(), ro);
  if (!t.ok()) return step("RDMA route", t.status());
  rdma_ = *std::move(t);
  if (rdma_->initialize("", static_cast<int>(o.world_size),
                        static_cast<int>(o.world_size * o.qps_per_peer)) != 0) {
    return step("RDMA initialize", rdma_->lastError());
  }
  // The buffer reaches the daemon as its fd: the memfd (host), or the cuMem
  // VMM fd (CUDA; legacy IPC handles carry no fd the daemon could map).
  absl::StatusOr<device::ExportedBuffer> mine = transport_->exportLocal(buffer_);
  if (!mine.ok()) return step("RDMA: exporting the buffer", mine.status());
  if (mine->fds.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the RDMA route needs the buffer as an fd, and the ", transport_->handleKind(),
        " handle has none: use the cuMem VMM handle kind (--handle vmm, or auto on a GPU with "
        "POSIX-fd handles)"));
  }
  const std::string kind = o.platform == Platform::kCuda ? "cuda-vmm-fd" : "memfd";
  MC_RETURN_IF_ERROR(step("registering the buffer for RDMA",
                          rdma_->registerMemoryFd(buffer_, o.buffer_bytes, mine->fds[0].get(), 0,
                                                  kind, mine->map_bytes)));
  if (rdma_->allocateControlBuffer() != 0) {
    return step("RDMA control memory", rdma_->lastError());
  }
  return step("creating RDMA queue pairs", rdma_->createQueuePairsFor(qp_mask_));
}

// A rank's atomics choice is visible in what it published: with NIC
// atomics it has a queue pair toward itself.
bool Communicator::PublishesLoopback(const GroupMember& m) {
  if (!m.rdma || m.rdma->qps_per_peer == 0) return false;
  const size_t self = static_cast<size_t>(m.rank) * m.rdma->qps_per_peer;
  return self < m.rdma->qpns.size() && m.rdma->qpns[self] != 0;
}

absl::Status Communicator::CheckAtomicsRoute(const GroupView& view) const {
  // An RDMA peer that published no queue pair toward this rank chose the
  // other route for the pair: ConnectRdma names that, the more basic error.
  const size_t q = options_.qps_per_peer;
  for (const GroupMember& m : view.members) {
    if (!rdmaPeer(static_cast<int>(m.rank))) continue;
    const size_t mine = static_cast<size_t>(options_.rank) * q;
    if (!m.rdma || m.rdma->qpns.size() < mine + 1 || m.rdma->qpns[mine] == 0) {
      return absl::OkStatus();
    }
  }
  std::vector<uint32_t> nic, device;
  for (const GroupMember& m : view.members) (PublishesLoopback(m) ? nic : device).push_back(m.rank);
  if (nic.empty() || device.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "atomics route: rank", nic.size() > 1 ? "s " : " ", absl::StrJoin(nic, ","),
      " send every mc_red_add through the target's NIC (atomics_route nic, or auto with RDMA "
      "peers) and rank",
      device.size() > 1 ? "s " : " ", absl::StrJoin(device, ","),
      " use SM/CPU atomics toward P2P peers: a counter both update could lose updates (a NIC "
      "atomic is atomic only against atomics through the same NIC). Set atomics_route (--atomics) "
      "to nic on every rank, or to device on every rank when no word takes adds over both "
      "routes"));
}

// After the join: connect each RDMA peer's QPs to ours.
absl::Status Communicator::ConnectRdma(const GroupView& view) {
  if (!rdma_) return absl::OkStatus();
  std::vector<std::optional<RdmaEndpointInfo>> peers(options_.world_size);
  for (const GroupMember& m : view.members) {
    if (m.rank < options_.world_size) peers[m.rank] = m.rdma;
  }
  absl::Status s = rdma_->connectEndpoints(static_cast<int>(options_.rank), peers, qp_mask_);
  if (!s.ok())
    return absl::Status(s.code(), absl::StrCat("connecting RDMA queue pairs: ", s.message()));
  return absl::OkStatus();
}

// Which peers to map: everyone the daemon says this rank reaches directly,
// except the RDMA peers.
std::vector<int> Communicator::ActiveMask(const GroupView& view) const {
  std::vector<int> active(options_.world_size, 1);
  for (const GroupMember& m : view.members) {
    if (m.rank < options_.world_size && m.rank != options_.rank &&
        (!m.p2p_reachable || rdmaPeer(static_cast<int>(m.rank)))) {
      active[m.rank] = 0;
    }
  }
  return active;
}

std::vector<int32_t> Communicator::HandleWords(const GroupMember& m) {
  std::vector<int32_t> words(m.handle_data.size() / sizeof(int32_t));
  std::memcpy(words.data(), m.handle_data.data(), words.size() * sizeof(int32_t));
  return words;
}

// The join route: the buffer's fds go with the join (one fd-channel PUT
// named by the JoinGroup request); each peer's fds come back by the view's
// tickets, all fetched on one fd-channel connection.
absl::StatusOr<GroupView> Communicator::JoinWithFds() {
  const CommunicatorOptions& o = options_;
  absl::StatusOr<device::ExportedBuffer> mine = transport_->exportLocal(buffer_);
  if (!mine.ok()) {
    return absl::Status(mine.status().code(),
                        absl::StrCat("exporting the buffer: ", mine.status().message()));
  }
  MC_ASSIGN_OR_RETURN(JoinOptions j, BaseJoin());
  j.handle_data.assign(reinterpret_cast<const char*>(mine->handle.data()),
                       mine->handle.size() * sizeof(int32_t));
  for (const UniqueFd& fd : mine->fds) j.fds.push_back(fd.get());
  MC_ASSIGN_OR_RETURN(GroupView view, client_->joinGroup(j));
  // Before anything of the peers is fetched: a rank that fails this exits,
  // and its fd tickets with it, so a later check could meet that instead.
  MC_RETURN_IF_ERROR(CheckAtomicsRoute(view));
  joined_ = true;

  const std::vector<int> active = ActiveMask(view);
  std::vector<device::PeerBuffer> peers(o.world_size);
  std::vector<std::string> tickets;
  std::vector<uint32_t> ticket_rank;
  for (const GroupMember& m : view.members) {
    if (m.rank >= o.world_size) continue;
    if (m.handle_data.size() % sizeof(int32_t) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", m.rank, " sent a malformed handle"));
    }
    peers[m.rank].handle = HandleWords(m);
    if (m.rank != o.rank && active[m.rank] && !m.fd_ticket.empty()) {
      tickets.push_back(m.fd_ticket);
      ticket_rank.push_back(m.rank);
    }
  }
  absl::StatusOr<std::vector<std::vector<UniqueFd>>> fds = client_->fetchFds(tickets);
  if (!fds.ok()) {
    return absl::Status(fds.status().code(),
                        absl::StrCat("fetching the peers' fds: ", fds.status().message()));
  }
  for (size_t i = 0; i < ticket_rank.size(); ++i) peers[ticket_rank[i]].fds = std::move((*fds)[i]);
  // Per-peer failures are in lastError and the available table; the
  // verification below reports them with the rest.
  (void)transport_->mapPeers(buffer_, static_cast<int>(o.rank), static_cast<int>(o.world_size),
                             std::move(peers), active);
  return view;
}

// The upstream route, for comparison and for code that needs export names:
// publish (fd-channel PUT + ExportFds), join with the handle bytes, then one
// ImportFds + fd-channel GET per peer inside importPeerHandles.
absl::StatusOr<GroupView> Communicator::JoinWithExport() {
  const CommunicatorOptions& o = options_;
  std::vector<int32_t> handle = transport_->exportIpcHandle(buffer_);
  if (handle.empty()) {
    return absl::Status(transport_->lastError().code(),
                        absl::StrCat("exporting the buffer: ", transport_->lastError().message()));
  }
  MC_ASSIGN_OR_RETURN(JoinOptions j, BaseJoin());
  j.handle_data.assign(reinterpret_cast<const char*>(handle.data()),
                       handle.size() * sizeof(int32_t));
  MC_ASSIGN_OR_RETURN(GroupView view, client_->joinGroup(j));
  // Before anything of the peers is fetched: a rank that fails this exits,
  // and its fd tickets with it, so a later check could meet that instead.
  MC_RETURN_IF_ERROR(CheckAtomicsRoute(view));
  joined_ = true;
  std::vector<std::vector<int32_t>> handles(o.world_size);
  for (const GroupMember& m : view.members) {
    if (m.rank >= o.world_size) continue;
    if (m.handle_data.size() % sizeof(int32_t) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", m.rank, " sent a malformed handle"));
    }
    handles[m.rank] = HandleWords(m);
  }
  transport_->importPeerHandles(buffer_, static_cast<int>(o.rank), static_cast<int>(o.world_size),
                                handles, ActiveMask(view));
  return view;
}

absl::Status Communicator::handleEvent(const SessionEvent& ev) {
  if (ev.group != options_.group || ev.rank >= options_.world_size || ev.rank == options_.rank) {
    return absl::OkStatus();
  }
  switch (ev.kind) {
    case SessionEvent::Kind::kLost:
    case SessionEvent::Kind::kLeft: return ReleasePeer(ev.rank);
    case SessionEvent::Kind::kJoined: return AdmitPeer(ev);
    default: return absl::OkStatus();
  }
}

// The peer is gone: no route to it in the tables, fresh queue pairs for
// its replacement, and the daemon told this rank let it go. Its P2P
// mapping stays until the replacement's arrives (a kernel that still
// writes there writes to memory that lives on).
absl::Status Communicator::ReleasePeer(uint32_t r) {
  if (!joined_) return absl::FailedPreconditionError("handleEvent: this rank left its group");
  auto step = [r](const char* what, absl::Status s) {
    return s.ok() ? s
                  : absl::Status(s.code(),
                                 absl::StrCat("releasing rank ", r, ": ", what, ": ", s.message()));
  };
  active_[r] = 0;
  // Queue pairs first: with NIC atomics a P2P peer has them too, and once
  // out of the P2P tables it would resolve to its (dead) queue pairs.
  std::optional<RdmaEndpointInfo> endpoint;
  if (rdma_ && qpPeer(r)) {
    MC_RETURN_IF_ERROR(
        step("replacing the queue pairs", rdma_->replaceQueuePairsToward(static_cast<int>(r))));
    endpoint = rdma_->endpoint();
  }
  if (transport_->availableSnapshot()[r] != 0) {
    MC_RETURN_IF_ERROR(step("P2P tables", transport_->markPeerUnavailable(static_cast<int>(r))));
  }
  return step("ReleaseRank", client_->releaseRank(options_.group, options_.rank, r, endpoint));
}

// A replacement took rank r: map its buffer (P2P) or connect the fresh
// queue pairs to its own (RDMA), verify, and report ready again once every
// released rank is back.
absl::Status Communicator::AdmitPeer(const SessionEvent& ev) {
  const uint32_t r = ev.rank;
  if (!ev.member) {
    return absl::InvalidArgumentError(
        absl::StrCat("JOINED of rank ", r, " carries no member entry (daemon too old?)"));
  }
  const GroupMember& m = *ev.member;
  absl::Status s = [&]() -> absl::Status {
    if (PublishesLoopback(m) != nic_atomics_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the replacement ", nic_atomics_ ? "does not send" : "sends",
          " every mc_red_add through the target's NIC and this rank ",
          nic_atomics_ ? "does" : "does not",
          ": a counter both update could lose updates; give it the same atomics_route"));
    }
    if (rdmaPeer(static_cast<int>(r))) {
      if (!m.rdma) {
        return absl::FailedPreconditionError(
            "the replacement published no RDMA endpoint: it must choose the RDMA route too");
      }
      return rdma_->connectReplacement(static_cast<int>(options_.rank), static_cast<int>(r),
                                       *m.rdma);
    }
    if (!m.p2p_reachable) {
      return absl::FailedPreconditionError(
          "the replacement is not reachable by load/store from this rank and is no RDMA peer");
    }
    if (m.handle_data.size() % sizeof(int32_t) != 0) {
      return absl::InvalidArgumentError("the replacement sent a malformed handle");
    }
    device::PeerBuffer buffer;
    buffer.handle = HandleWords(m);
    if (!m.fd_ticket.empty()) {
      absl::StatusOr<std::vector<UniqueFd>> fds = client_->fetchFds(m.fd_ticket);
      if (!fds.ok()) {
        return absl::Status(fds.status().code(),
                            absl::StrCat("fetching its fds: ", fds.status().message()));
      }
      buffer.fds = *std::move(fds);
    }
    MC_RETURN_IF_ERROR(transport_->remapPeer(static_cast<int>(r), std::move(buffer)));
    // NIC atomics: the P2P peer's atomics go through queue pairs too.
    if (!qpPeer(r)) return absl::OkStatus();
    if (!m.rdma) {
      return absl::FailedPreconditionError(
          "the replacement published no RDMA endpoint: with NIC atomics every rank has queue "
          "pairs toward every other (atomics_route nic on the replacement too)");
    }
    return rdma_->connectReplacement(static_cast<int>(options_.rank), static_cast<int>(r), *m.rdma);
  }();
  if (s.ok()) {
    active_[r] = 1;
    if (r < view_.members.size()) view_.members[r] = m;
    view_.epoch = std::max(view_.epoch, ev.epoch);
  }
  if (s.ok() && std::find(active_.begin(), active_.end(), 0) != active_.end()) {
    // A group re-forms only once every vacant rank has a replacement, and
    // each comes in a JOINED event of its own: readiness is reported after
    // the last one (a report after the first would let READY out before
    // this rank connected the others).
    return absl::OkStatus();
  }
  const std::vector<uint32_t> unreachable =
      s.ok() ? std::vector<uint32_t>{} : std::vector<uint32_t>{r};
  absl::Status reported = client_->reportReady(options_.group, options_.rank, s.ok(),
                                               s.ok() ? "" : std::string(s.message()), unreachable);
  if (!s.ok()) {
    return absl::Status(
        s.code(), absl::StrCat("admitting rank ", r, " (epoch ", ev.epoch, "): ", s.message()));
  }
  return reported;
}

std::string Communicator::handleKind() const { return transport_ ? transport_->handleKind() : ""; }

absl::Status Communicator::leave() {
  if (!joined_ || !client_) return absl::OkStatus();
  joined_ = false;
  return client_->leaveGroup(options_.group, options_.rank);
}

Communicator::~Communicator() {
  (void)leave();
  rdma_.reset();  // destroys its QPs before the buffer they write goes away
  if (transport_ && buffer_ != nullptr) transport_->freeBuffer(buffer_);
  transport_.reset();
  exchange_.reset();
  client_.reset();
}

}  // namespace mooncake
