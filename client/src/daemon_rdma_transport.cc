#include "mooncake/client/daemon_rdma_transport.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>

#include "absl/strings/str_cat.h"
#include "copy_agent.h"
#include "gpu_doorbell.h"
#include "gpu_rings.h"
#include "mooncake/common/log.h"
#include "mooncake/common/status.h"
#include "mooncake/common/unique_fd.h"
#include "mooncake/device/ibgda_qp.h"
#include "mooncake/device/mlx5/prm.h"
#include "mooncake/drivers/cuda_driver.h"
#include "populated_memfd.h"
#include "rdma_control_layout.h"

namespace mooncake {
namespace {

drivers::CudaDriver& Cuda(const std::shared_ptr<void>& p) {
  return *static_cast<drivers::CudaDriver*>(p.get());
}

}  // namespace

absl::StatusOr<std::unique_ptr<DaemonRdmaTransport>> DaemonRdmaTransport::Create(
    Client* client, DaemonRdmaOptions options) {
  if (options.sq_depth == 0 || (options.sq_depth & (options.sq_depth - 1)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("sq_depth ", options.sq_depth, " is not a power of two"));
  }
  if (options.cqe_every == 0 || (options.cqe_every & (options.cqe_every - 1)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cqe_every ", options.cqe_every, " is not a power of two"));
  }
  MC_ASSIGN_OR_RETURN(RdmaNodeInfo info, client->rdmaInfo());
  if (info.max_sq_wqes != 0 && options.sq_depth > info.max_sq_wqes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sq_depth ", options.sq_depth, " exceeds the daemon's limit of ", info.max_sq_wqes));
  }
  std::unique_ptr<DaemonRdmaTransport> t(new DaemonRdmaTransport(client, options, std::move(info)));
  if (options.cuda) {
    MC_ASSIGN_OR_RETURN(std::shared_ptr<drivers::CudaDriver> drv, drivers::LoadCudaDriver());
    t->cuda_ = std::static_pointer_cast<void>(drv);
  } else if (options.ring_memory == DaemonRdmaOptions::RingMemory::kGpu) {
    return absl::InvalidArgumentError(
        "ring_memory kGpu needs the CUDA platform (host ranks keep their rings in host memory)");
  }
  DaemonRdmaTransport* raw = t.get();
  t->loss_handler_ =
      client->addDaemonLossHandler([raw](const std::string& why) { raw->OnDaemonLoss(why); });
  return t;
}

DaemonRdmaTransport::DaemonRdmaTransport(Client* client, DaemonRdmaOptions options,
                                         RdmaNodeInfo info)
    : client_(client), options_(options), info_(std::move(info)) {
  doorbell_mode_ = info_.doorbell_mode;
}

DaemonRdmaTransport::~DaemonRdmaTransport() {
  // First: a loss handler running now returns before what it reads goes.
  client_->removeDaemonLossHandler(loss_handler_);
  copy_agent_.reset();  // closed: the daemon stops asking it
  ReleaseQueues();
  ReleaseGpuDoorbells();
}

void DaemonRdmaTransport::OnDaemonLoss(const std::string& why) {
  std::lock_guard<std::mutex> lock(loss_mu_);
  // First the UAR, then the rings (issue 24 item 7; DetachThenFailRings):
  // in gpu-uar mode this process holds the command fd, so the verbs
  // context, and with it the NIC's QPs, live on after the daemon; a NIC
  // still completing WQEs could write a CQE over a flush entry. Letting go
  // of the fd's mapping ends the context, and only then is the CQ ours
  // alone.
  const bool holds_uar = uar_page_ != nullptr && !uar_detached_;
  GpuUar mapped;
  if (holds_uar) mapped = GpuUar{uar_page_, uar_page_bytes_, uar_register_dev_, false};
  // The daemon's objects are gone once the UAR is (softnic stopped with
  // the daemon; a NIC's QPs went with the verbs context): nothing will
  // complete these QPs' WQEs again.
  int failed = 0;
  std::string gpu_error;
  const absl::Status detach = DetachThenFailRings(mapped, [&] {
    if (gpu_control_ != nullptr) {
      // On the memory's own stream and context: never behind the kernels.
      drivers::CudaDriver& drv = Cuda(cuda_);
      for (size_t slot = 0; slot < qpns_.size(); ++slot) {
        if (qpns_[slot] == 0) continue;
        absl::Status s =
            FailGpuQueuePairRings(drv, *gpu_control_, options_.sq_depth, slot, qpns_[slot]);
        if (s.ok()) {
          ++failed;
        } else if (gpu_error.empty()) {
          gpu_error = absl::StrCat("; a QP's rings in GPU memory could not be failed (",
                                   s.message(), "): its kernels get kTimedOut after timeout_ns");
        }
      }
    } else if (control_ != nullptr) {
      for (size_t slot = 0; slot < qpns_.size(); ++slot) {
        if (qpns_[slot] == 0) continue;
        FailQueuePairRings(control_, options_.sq_depth, slot, qpns_[slot]);
        ++failed;
      }
    }
  });
  std::string uar;
  if (holds_uar) {
    uar_detached_ = mapped.detached;
    uar = detach.ok() ? "; the UAR page no longer holds the daemon's verbs context"
                      : absl::StrCat("; ", detach.message());
  }
  if (failed > 0 || !uar.empty() || !gpu_error.empty()) {
    MC_LOG(kWarning, "mooncaked went away (", why, "): ", failed,
           " RDMA queue pair(s) failed (WR_FLUSH_ERR: kernels get kRdmaError)", gpu_error, uar);
  }
}

void DaemonRdmaTransport::SetUpGpuDoorbells() {
  absl::Status why;
  absl::StatusOr<DoorbellAccess> access = client_->doorbellAccess();
  if (access.ok()) {
    absl::StatusOr<GpuUar> uar = MapUarForGpu(*access, Cuda(cuda_));
    if (uar.ok()) {
      std::lock_guard<std::mutex> lock(loss_mu_);
      uar_page_ = uar->page;
      uar_page_bytes_ = uar->page_bytes;
      uar_register_dev_ = uar->device_register;
      uar_detached_ = false;
      doorbell_mode_ = "gpu-uar";
      static std::once_flag logged;
      std::call_once(logged, [&] {
        MC_LOG(kInfo, "RDMA doorbells: gpu-uar (kernels ring ", access->device, "'s UAR directly)");
      });
      return;
    }
    why = uar.status();
    // Nothing was registered yet: the daemon takes the ringing back.
    if (absl::Status r = client_->releaseDoorbellAccess(); !r.ok()) {
      why = absl::Status(
          why.code(), absl::StrCat(why.message(), "; and releasing the hand-off: ", r.message()));
    }
  } else {
    why = access.status();
  }
  static std::once_flag logged;
  std::call_once(logged, [&] {
    MC_LOG(kWarning, "RDMA doorbells: ", info_.doorbell_mode,
           " (the daemon rings for this process): ", why.message());
  });
}

void DaemonRdmaTransport::ReleaseGpuDoorbells() {
  std::lock_guard<std::mutex> lock(loss_mu_);
  if (uar_page_ == nullptr) return;
  GpuUar uar{uar_page_, uar_page_bytes_, uar_register_dev_, uar_detached_};
  UnmapUarForGpu(uar, Cuda(cuda_));
  uar_page_ = nullptr;
  uar_register_dev_ = 0;
  uar_detached_ = false;
}

int DaemonRdmaTransport::Fail(absl::Status s) {
  last_error_ = std::move(s);
  return 1;
}

void DaemonRdmaTransport::ReleaseQueues() {
  std::vector<uint32_t> live;
  for (uint32_t q : qpns_) {
    if (q != 0) live.push_back(q);
  }
  // Best effort: the daemon destroys them with the session anyway.
  if (!live.empty()) (void)client_->destroyQueuePairs(live);
  if (control_keys_.lkey != 0) (void)client_->deregisterMemory(control_keys_.lkey);
  control_keys_ = {};
  std::lock_guard<std::mutex> lock(loss_mu_);
  if (cuda_) {
    // Kernels using the context must have finished (the caller's contract).
    drivers::CudaDriver& drv = Cuda(cuda_);
    for (uint64_t* d : {&qps_dev_, &raddrs_dev_, &rkeys_dev_}) {
      if (*d != 0) (void)drv.memFree(*d);
      *d = 0;
    }
    if (control_dev_ != 0) (void)drv.memHostUnregister(control_);
    control_dev_ = 0;
    if (gpu_control_ != nullptr) FreeGpuControlMemory(drv, *gpu_control_);
  }
  gpu_control_.reset();
  any_queue_pair_ = false;
  qpns_.assign(qpns_.size(), 0);
  parked_.clear();
  if (qps_ != nullptr) {
    ::operator delete[](qps_, std::align_val_t(64));
    qps_ = nullptr;
  }
  if (control_ != nullptr) ::munmap(control_, control_bytes_);
  control_ = nullptr;
  if (control_fd_ >= 0) ::close(control_fd_);
  control_fd_ = -1;
}

int DaemonRdmaTransport::initialize(const std::string& device_name, int num_ranks, int num_qps) {
  if (num_ranks < 1 || num_qps < num_ranks || num_qps % num_ranks != 0) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("initialize: num_qps (", num_qps,
                     ") must be a positive multiple of num_ranks (", num_ranks, ")")));
  }
  // The NIC first (the session's objects go on it), then the doorbell
  // hand-off, then registrations: the daemon's order.
  const std::vector<std::string> allowed =
      device_name.empty() ? options_.nics : std::vector<std::string>{device_name};
  std::string gpu;
  if (cuda_) {
    drivers::CudaDriver& drv = Cuda(cuda_);
    drivers::CuDevice dev = 0;
    char bus[32] = {};
    if (drv.ctxGetDevice(&dev) == drivers::kCudaSuccess &&
        drv.deviceGetPCIBusId(bus, sizeof(bus), dev) == drivers::kCudaSuccess) {
      gpu = bus;
    }
  }
  absl::StatusOr<std::pair<std::string, std::string>> nic = client_->selectNic(allowed, gpu);
  if (!nic.ok()) return Fail(nic.status());
  nic_ = nic->first;
  nic_reason_ = nic->second;
  if (cuda_ && info_.provider == "mlx5" && options_.gpu_doorbells && !doorbell_tried_) {
    doorbell_tried_ = true;  // once per session (the daemon's rule)
    SetUpGpuDoorbells();
  }
  // The session's NIC is chosen now: its link (isRoce, gidIndex) and name
  // replace the default NIC's that Create() saw.
  absl::StatusOr<RdmaNodeInfo> now = client_->rdmaInfo();
  if (!now.ok()) return Fail(now.status());
  info_.nic = now->nic;
  info_.is_roce = now->is_roce;
  info_.gid_index = now->gid_index;
  num_ranks_ = num_ranks;
  qps_per_peer_ = num_qps / num_ranks;
  // Upstream's EP asks for MAX_QP_COUNT / n * n queue pairs in all: 128 per
  // peer on two ranks, 256 on one. The daemon's budgets bound what one
  // session and one user hold (max_qps_per_session, max_qps_per_uid).
  if (qps_per_peer_ < 1 || qps_per_peer_ > kMaxQpsPerPeer) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "initialize(num_ranks ", num_ranks, ", num_qps ", num_qps, "): ", qps_per_peer_,
        " queue pairs per peer; 1 to ", kMaxQpsPerPeer, " (upstream's MAX_QP_COUNT) are allowed")));
  }
  std::lock_guard<std::mutex> lock(loss_mu_);
  qpns_.assign(static_cast<size_t>(num_qps), 0);
  raddrs_.assign(static_cast<size_t>(num_ranks), 0);
  rkeys_.assign(static_cast<size_t>(num_ranks), 0);
  return 0;
}

int DaemonRdmaTransport::registerMemory(void*, size_t) {
  return Fail(absl::FailedPreconditionError(
      "registerMemory: on the host platform give the buffer's memfd with registerMemoryFd"));
}

absl::Status DaemonRdmaTransport::registerMemoryFd(void* ptr, size_t bytes, int fd, uint64_t offset,
                                                   const std::string& kind,
                                                   uint64_t allocation_bytes) {
  if (num_ranks_ == 0) return absl::FailedPreconditionError("registerMemoryFd before initialize");
  if (cuda_ && kind == "cuda-vmm-fd" && info_.provider == "softnic") StartCopyAgent();
  // A NIC registers GPU memory from a dma-buf (ibv_reg_dmabuf_mr); softnic
  // maps the VMM fd itself. Without dma-buf export in the driver the VMM fd
  // goes anyway and the daemon says what its provider can do with it.
  UniqueFd dmabuf;
  std::string send_kind = kind;
  int send_fd = fd;
  if (cuda_ && kind == "cuda-vmm-fd" && info_.provider != "softnic") {
    const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
    const uint64_t span =
        allocation_bytes != 0 ? allocation_bytes : (bytes + page - 1) / page * page;
    int out = -1;
    drivers::CudaDriver& drv = Cuda(cuda_);
    const drivers::CuResult r = drv.memGetDmabufFd(
        &out, static_cast<drivers::CuDevicePtr>(reinterpret_cast<uintptr_t>(ptr)), span);
    if (r == drivers::kCudaSuccess && out >= 0) {
      dmabuf = UniqueFd(out);
      send_kind = "dmabuf";
      send_fd = dmabuf.get();
    } else if (r != drivers::kCudaErrorNotSupported) {
      return drivers::CuStatus(drv, r,
                               "cuMemGetHandleForAddressRange (dma-buf of the RDMA buffer)");
    }
  }
  MC_ASSIGN_OR_RETURN(buffer_keys_,
                      client_->registerMemory(send_fd, reinterpret_cast<uintptr_t>(ptr), bytes,
                                              send_kind == "dmabuf" ? 0 : offset,
                                              /*remote_write=*/true, /*remote_atomic=*/true,
                                              send_kind, allocation_bytes));
  buffer_ = ptr;
  buffer_bytes_ = bytes;
  buffer_registered_ = true;
  return absl::OkStatus();
}

void DaemonRdmaTransport::StartCopyAgent() {
  bool wanted = options_.copy_agent;
  if (const char* e = std::getenv("MOONCAKE_COPY_AGENT"); e != nullptr && *e != '\0') {
    wanted = std::string(e) == "1";
  }
  if (!wanted || copy_agent_tried_) return;
  copy_agent_tried_ = true;  // once per session: the daemon takes one agent
  auto driver = std::static_pointer_cast<drivers::CudaDriver>(cuda_);
  drivers::CuContext ctx = nullptr;
  absl::Status s = drivers::CuStatus(*driver, driver->ctxGetCurrent(&ctx), "cuCtxGetCurrent");
  if (s.ok() && ctx == nullptr) s = absl::FailedPreconditionError("no CUDA context is current");
  // The resident kernel is opt-in until it has run on a GPU (copy_agent.h).
  CopyAgentOptions agent_options;
  if (const char* e = std::getenv("MOONCAKE_COPY_AGENT_RESIDENT");
      e != nullptr && std::string(e) == "1") {
    agent_options.resident_max_bytes = kResidentMaxBytes;
  }
  absl::StatusOr<std::unique_ptr<CopyAgent>> agent =
      s.ok() ? CopyAgent::Create(driver, ctx, copy_agent::kDefaultStagingBytes, agent_options)
             : absl::StatusOr<std::unique_ptr<CopyAgent>>(s);
  if (agent.ok()) s = client_->attachCopyAgent((*agent)->fd(), (*agent)->staging_bytes());
  if (!agent.ok() || !s.ok()) {
    MC_LOG(kWarning, "softnic copy agent not started (",
           (agent.ok() ? s : agent.status()).message(),
           "): mooncaked copies this process's GPU memory in its own CUDA context, which waits "
           "for a GPU time slice while a kernel spins (milliseconds per WQE)");
    return;
  }
  copy_agent_ = *std::move(agent);
  // Under lazy loading (CUDA's default) a kernel's first launch while
  // another kernel waits on softnic holds the agent's copies until the
  // kernels end; softnic then copies itself, milliseconds per WQE
  // (docs/rdma.md, the copy agent). Said once per process.
  static std::once_flag hint;
  const char* loading = std::getenv("CUDA_MODULE_LOADING");
  if (loading == nullptr || std::string(loading) != "EAGER") {
    std::call_once(hint, [] {
      MC_LOG(kInfo,
             "softnic copy agent started; CUDA_MODULE_LOADING is not EAGER, so a kernel "
             "launched for the first time while another waits on an RDMA completion holds "
             "the agent's copies until the kernels end (set CUDA_MODULE_LOADING=EAGER, or "
             "launch each kernel once before such waits)");
    });
  }
}

int DaemonRdmaTransport::allocateControlBuffer() {
  if (num_ranks_ == 0)
    return Fail(absl::FailedPreconditionError("allocateControlBuffer before initialize"));
  if (control_ != nullptr || gpu_control_ != nullptr) return 0;
  const bool gpu = WantGpuRings();
  absl::Status s = AllocateControl(gpu);
  if (!s.ok() && gpu &&
      FallsBackToHostRings(options_.ring_memory, /*any_queue_pair=*/false, s.code())) {
    s = FallBackToHostRings(s);
  }
  return s.ok() ? 0 : Fail(std::move(s));
}

bool DaemonRdmaTransport::WantGpuRings() const {
  if (!cuda_) return false;
  switch (options_.ring_memory) {
    case DaemonRdmaOptions::RingMemory::kHost: return false;
    case DaemonRdmaOptions::RingMemory::kGpu: return true;
    case DaemonRdmaOptions::RingMemory::kAuto: break;
  }
  // Only a session that rings its own doorbells: otherwise the daemon reads
  // the doorbell records, which it cannot in GPU memory.
  return doorbell_mode_ == "gpu-uar";
}

absl::Status DaemonRdmaTransport::AllocateControl(bool in_gpu_memory) {
  const uint64_t slots = qpns_.size();
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  control_bytes_ = (slots * QpControlSlotBytes(options_.sq_depth) + page - 1) / page * page;
  MC_RETURN_IF_ERROR(in_gpu_memory ? AllocateGpuControl() : AllocateHostControl());
  if (qps_ == nullptr) {
    qps_ = static_cast<device::IbgdaQpDevCtx*>(
        ::operator new[](slots * sizeof(device::IbgdaQpDevCtx), std::align_val_t(64)));
    for (uint64_t i = 0; i < slots; ++i) new (&qps_[i]) device::IbgdaQpDevCtx();
  }
  return absl::OkStatus();
}

absl::Status DaemonRdmaTransport::AllocateGpuControl() {
  drivers::CudaDriver& drv = Cuda(cuda_);
  drivers::CuDevice dev = 0;
  MC_RETURN_IF_ERROR(drivers::CuStatus(drv, drv.ctxGetDevice(&dev), "cuCtxGetDevice"));
  MC_ASSIGN_OR_RETURN(GpuControlMemory m, AllocateGpuControlMemory(drv, dev, control_bytes_));
  // The fetch scratch is in this memory too: the NIC writes fetched values
  // there, so it is a region as well (iova = the GPU address).
  absl::StatusOr<RdmaKeys> keys =
      client_->registerMemory(m.dmabuf.get(), m.base, control_bytes_, 0, /*remote_write=*/false,
                              /*remote_atomic=*/false, "dmabuf");
  if (!keys.ok()) {
    FreeGpuControlMemory(drv, m);
    return absl::Status(keys.status().code(),
                        absl::StrCat("registering the RDMA rings' GPU memory (dmabuf) on ", nic_,
                                     ": ", keys.status().message()));
  }
  control_keys_ = *keys;
  std::lock_guard<std::mutex> lock(loss_mu_);
  gpu_control_ = std::make_unique<GpuControlMemory>(std::move(m));
  return absl::OkStatus();
}

absl::Status DaemonRdmaTransport::AllocateHostControl() {
  // Built in locals and kept only whole: a refusal leaves nothing half made
  // (a later allocateControlBuffer, or the fallback, starts clean).
  MC_ASSIGN_OR_RETURN(
      PopulatedMemfd m,
      CreatePopulatedMemfd("mooncake-rdma-control", control_bytes_, "RDMA control memory"));
  UniqueFd fd = std::move(m.fd);
  uint8_t* const host = m.data;
  drivers::CuDevicePtr dev = 0;
  absl::Status s;
  if (cuda_) {
    // The GPU writes WQEs and doorbell records here and softnic reads them
    // through its own mapping of the memfd: pinned, mapped for the device.
    drivers::CudaDriver& drv = Cuda(cuda_);
    s = drivers::CuStatus(drv,
                          drv.memHostRegister(host, control_bytes_,
                                              drivers::kCuMemHostRegisterPortable |
                                                  drivers::kCuMemHostRegisterDeviceMap),
                          "cuMemHostRegister (RDMA control memory)");
    if (s.ok()) {
      s = drivers::CuStatus(drv, drv.memHostGetDevicePointer(&dev, host, 0),
                            "cuMemHostGetDevicePointer (RDMA control memory)");
      if (!s.ok()) (void)drv.memHostUnregister(host);
    }
  }
  absl::StatusOr<RdmaKeys> keys;
  if (s.ok()) {
    keys = client_->registerMemory(fd.get(), reinterpret_cast<uintptr_t>(host), control_bytes_, 0,
                                   /*remote_write=*/false, /*remote_atomic=*/false);
    if (!keys.ok()) {
      s = keys.status();
      if (cuda_) (void)Cuda(cuda_).memHostUnregister(host);
    }
  }
  if (!s.ok()) {
    ::munmap(host, control_bytes_);
    return s;
  }
  control_keys_ = *keys;
  std::lock_guard<std::mutex> lock(loss_mu_);
  control_fd_ = fd.release();
  control_ = host;
  control_dev_ = dev;
  return absl::OkStatus();
}

absl::Status DaemonRdmaTransport::FallBackToHostRings(const absl::Status& why) {
  static std::once_flag logged;
  std::call_once(logged, [&] {
    MC_LOG(kInfo, "RDMA rings: host memory (GPU memory was refused: ", why.message(), ")");
  });
  // Nothing of the GPU form is kept: no QP uses it yet.
  if (control_keys_.lkey != 0) (void)client_->deregisterMemory(control_keys_.lkey);
  control_keys_ = {};
  {
    std::lock_guard<std::mutex> lock(loss_mu_);
    if (gpu_control_ != nullptr) FreeGpuControlMemory(Cuda(cuda_), *gpu_control_);
    gpu_control_.reset();
  }
  return AllocateControl(/*in_gpu_memory=*/false);
}

absl::Status DaemonRdmaTransport::ClearRings(size_t slot) {
  const uint32_t depth = options_.sq_depth;
  if (gpu_control_ != nullptr) return ClearGpuQueueRings(Cuda(cuda_), *gpu_control_, depth, slot);
  for (const RingFill& f : CleanRings(depth, slot)) std::memset(control_ + f.at, f.value, f.bytes);
  return absl::OkStatus();
}

int DaemonRdmaTransport::createQueuePairs(void*) {
  std::vector<int> mask(static_cast<size_t>(num_ranks_), 1);
  absl::Status s = createQueuePairsFor(mask);
  return s.ok() ? 0 : Fail(std::move(s));
}

// Upstream's contract: the queue pairs are made again, on the same control
// memory, and qpDevCtxsPtr(), raddrsPtr() and rkeysPtr() keep their
// addresses and the tables their contents (a kernel or CUDA graph that
// captured them stays valid). The peers are those that had queue pairs;
// after a createQueuePairs that made none, every rank, as upstream remakes
// all num_qps.
int DaemonRdmaTransport::recreateQueuePairs(void* stream) {
  (void)stream;
  if (control_ == nullptr && gpu_control_ == nullptr) {
    return Fail(absl::FailedPreconditionError("recreateQueuePairs before allocateControlBuffer"));
  }
  std::vector<int> mask(static_cast<size_t>(num_ranks_), 0);
  std::vector<uint32_t> live;
  for (size_t i = 0; i < qpns_.size(); ++i) {
    if (qpns_[i] == 0) continue;
    mask[i / static_cast<size_t>(qps_per_peer_)] = 1;
    live.push_back(qpns_[i]);
  }
  if (live.empty()) mask.assign(mask.size(), 1);
  if (!live.empty()) {
    if (absl::Status s = client_->destroyQueuePairs(live); !s.ok()) return Fail(std::move(s));
  }
  {
    std::lock_guard<std::mutex> lock(loss_mu_);
    for (size_t i = 0; i < qpns_.size(); ++i) {
      if (qpns_[i] == 0) continue;
      qpns_[i] = 0;
      if (qps_ != nullptr) qps_[i] = device::IbgdaQpDevCtx();
    }
    parked_.clear();
  }
  absl::Status s = createQueuePairsFor(mask);
  return s.ok() ? 0 : Fail(std::move(s));
}

absl::Status DaemonRdmaTransport::createQueuePairsFor(const std::vector<int>& peer_mask) {
  if (control_ == nullptr && gpu_control_ == nullptr) {
    return absl::FailedPreconditionError("createQueuePairs before allocateControlBuffer");
  }
  if (!buffer_registered_)
    return absl::FailedPreconditionError("createQueuePairs before registerMemory");
  const uint32_t depth = options_.sq_depth;
  std::vector<RdmaQpLayout> layouts;
  std::vector<size_t> slots;
  for (size_t slot = 0; slot < qpns_.size(); ++slot) {
    const size_t peer = slot / static_cast<size_t>(qps_per_peer_);
    if (peer >= peer_mask.size() || !peer_mask[peer] || qpns_[slot] != 0) continue;
    const QpControlLayout at = QpControlAt(depth, slot);
    RdmaQpLayout l;
    l.sq_offset = at.sq;
    l.sq_wqe_cnt = depth;
    l.cq_offset = at.cq;
    l.cq_cqe_cnt = depth;
    l.sq_dbrec_offset = at.misc + kSqDbrecAt;
    l.cq_dbrec_offset = at.misc + kCqDbrecAt;
    layouts.push_back(l);
    slots.push_back(slot);
  }
  if (layouts.empty()) return absl::OkStatus();
  auto create = [&]() -> absl::StatusOr<std::vector<uint32_t>> {
    for (size_t slot : slots) MC_RETURN_IF_ERROR(ClearRings(slot));
    if (gpu_control_ != nullptr) {
      return client_->createQueuePairs(gpu_control_->dmabuf.get(), control_bytes_, layouts,
                                       "dmabuf");
    }
    return client_->createQueuePairs(control_fd_, control_bytes_, layouts);
  };
  absl::StatusOr<std::vector<uint32_t>> created = create();
  // GPU rings refused on the first QPs (the daemon, the NIC or CREATE_QP):
  // host rings instead, when the caller let us choose.
  if (!created.ok() && gpu_control_ != nullptr &&
      FallsBackToHostRings(options_.ring_memory, any_queue_pair_, created.status().code())) {
    MC_RETURN_IF_ERROR(FallBackToHostRings(created.status()));
    created = create();
  }
  if (!created.ok()) return created.status();
  any_queue_pair_ = true;
  const std::vector<uint32_t> qpns = *std::move(created);
  if (qpns.size() != layouts.size()) {
    return absl::InternalError("CreateQueuePairs answered a different number of QPs");
  }
  // Where the kernel (or host thread) addresses the control memory. Host
  // rings: the fetch scratch keeps its host address, the iova softnic
  // writes to; GPU rings: one address for the kernel and the NIC.
  uint8_t* const iova_base =
      gpu_control_ != nullptr
          ? reinterpret_cast<uint8_t*>(static_cast<uintptr_t>(gpu_control_->base))
          : control_;
  uint8_t* view = gpu_control_ != nullptr ? iova_base
                  : cuda_ ? reinterpret_cast<uint8_t*>(static_cast<uintptr_t>(control_dev_))
                          : control_;
  std::unique_lock<std::mutex> lock(loss_mu_);
  for (size_t i = 0; i < slots.size(); ++i) {
    const RdmaQpLayout& l = layouts[i];
    device::IbgdaQpDevCtx& q = qps_[slots[i]];
    q = device::IbgdaQpDevCtx();
    q.sq = view + l.sq_offset;
    q.sq_dbrec = reinterpret_cast<uint32_t*>(view + l.sq_dbrec_offset);
    // gpu-uar: the kernel rings the UAR; otherwise the provider watches the
    // doorbell record (softnic, or the daemon's CPU-assisted thread).
    q.bf_reg = reinterpret_cast<uint64_t*>(static_cast<uintptr_t>(uar_register_dev_));
    q.cq = reinterpret_cast<device::mlx5::Cqe64*>(view + l.cq_offset);
    q.cq_dbrec = reinterpret_cast<uint32_t*>(view + l.cq_dbrec_offset);
    q.fetch_scratch =
        reinterpret_cast<uint64_t*>(iova_base + l.sq_dbrec_offset - kSqDbrecAt + kScratchAt);
    q.local_base = reinterpret_cast<uintptr_t>(buffer_);
    q.local_size = buffer_bytes_;
    q.timeout_ns = options_.timeout_ns;
    q.qpn = qpns[i];
    q.sq_wqe_cnt = l.sq_wqe_cnt;
    q.cq_cqe_cnt = l.cq_cqe_cnt;
    q.cqe_every = std::min(options_.cqe_every, std::max(l.sq_wqe_cnt / 2, 1u));
    q.rings_on_gpu = gpu_control_ != nullptr ? 1 : 0;
    q.lkey = buffer_keys_.lkey;
    q.scratch_lkey = control_keys_.lkey;
    qpns_[slots[i]] = qpns[i];
  }
  lock.unlock();
  return PublishQps(slots);
}

absl::Status DaemonRdmaTransport::PublishQps(const std::vector<size_t>& slots) {
  if (!cuda_) return absl::OkStatus();
  drivers::CudaDriver& drv = Cuda(cuda_);
  constexpr size_t kCtx = sizeof(device::IbgdaQpDevCtx);
  if (qps_dev_ == 0) {
    const size_t bytes = qpns_.size() * kCtx;
    drivers::CuDevicePtr d = 0;
    MC_RETURN_IF_ERROR(drivers::CuStatus(drv, drv.memAlloc(&d, bytes), "cuMemAlloc (QP contexts)"));
    qps_dev_ = d;
    return drivers::CuStatus(drv, drv.memcpyHtoD(qps_dev_, qps_, bytes), "copying QP contexts");
  }
  for (size_t slot : slots) {
    if (slot >= qpns_.size()) continue;
    MC_RETURN_IF_ERROR(drivers::CuStatus(drv,
                                         drv.memcpyHtoD(qps_dev_ + slot * kCtx, &qps_[slot], kCtx),
                                         absl::StrCat("copying the context of QP slot ", slot)));
  }
  return absl::OkStatus();
}

absl::Status DaemonRdmaTransport::PublishTables() {
  if (!cuda_) return absl::OkStatus();
  drivers::CudaDriver& drv = Cuda(cuda_);
  const size_t n = raddrs_.size();
  const std::pair<uint64_t*, size_t> tables[] = {{&raddrs_dev_, n * sizeof(uint64_t)},
                                                 {&rkeys_dev_, n * sizeof(uint32_t)}};
  for (const auto& [dev, bytes] : tables) {
    if (*dev == 0) {
      drivers::CuDevicePtr d = 0;
      MC_RETURN_IF_ERROR(
          drivers::CuStatus(drv, drv.memAlloc(&d, bytes), "cuMemAlloc (raddr/rkey tables)"));
      *dev = d;
    }
  }
  MC_RETURN_IF_ERROR(drivers::CuStatus(
      drv, drv.memcpyHtoD(raddrs_dev_, raddrs_.data(), n * sizeof(uint64_t)), "copying raddrs"));
  return drivers::CuStatus(drv, drv.memcpyHtoD(rkeys_dev_, rkeys_.data(), n * sizeof(uint32_t)),
                           "copying rkeys");
}

void* DaemonRdmaTransport::raddrsPtr() {
  return cuda_ ? reinterpret_cast<void*>(static_cast<uintptr_t>(raddrs_dev_)) : raddrs_.data();
}
void* DaemonRdmaTransport::rkeysPtr() {
  return cuda_ ? reinterpret_cast<void*>(static_cast<uintptr_t>(rkeys_dev_)) : rkeys_.data();
}
void* DaemonRdmaTransport::qpDevCtxsPtr() {
  return cuda_ ? reinterpret_cast<void*>(static_cast<uintptr_t>(qps_dev_)) : qps_;
}

RdmaEndpointInfo DaemonRdmaTransport::endpoint() const {
  RdmaEndpointInfo e;
  e.raddr = reinterpret_cast<uintptr_t>(buffer_);
  e.rkey = buffer_keys_.rkey;
  e.qps_per_peer = static_cast<uint32_t>(qps_per_peer_);
  e.qpns = qpns_;
  e.nic = info_.nic;
  return e;
}

absl::Status DaemonRdmaTransport::connectEndpoints(
    int local_rank, const std::vector<std::optional<RdmaEndpointInfo>>& peers,
    const std::vector<int>& peer_mask) {
  std::vector<std::pair<uint32_t, uint32_t>> pairs;
  std::vector<std::string> nodes;  // each pair's remote node ("" = this one)
  bool any_remote = false;
  const size_t q = static_cast<size_t>(qps_per_peer_);
  for (size_t p = 0; p < peer_mask.size() && p < static_cast<size_t>(num_ranks_); ++p) {
    // Self in the mask: the loopback queue pair of NIC atomics, connected to
    // itself (its endpoint is this rank's own, as the view carries it).
    if (!peer_mask[p]) continue;
    const std::optional<RdmaEndpointInfo>& e = p < peers.size() ? peers[p] : std::nullopt;
    const size_t theirs = static_cast<size_t>(local_rank) * q;
    if (!e || e->qps_per_peer != q || e->qpns.size() < theirs + q || e->qpns[theirs] == 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "rank ", p, " published no RDMA queue pair toward rank ", local_rank,
          (e && e->qps_per_peer != q
               ? absl::StrCat(" (it uses ", e->qps_per_peer, " QPs per peer, this rank ", q, ")")
               : std::string()),
          ": both ranks of a pair must choose the RDMA route, with the same QPs per peer"));
    }
    for (size_t c = 0; c < q; ++c) {
      pairs.emplace_back(qpns_[p * q + c], e->qpns[theirs + c]);
      nodes.push_back(e->node);
    }
    any_remote |= !e->node.empty();
    raddrs_[p] = e->raddr;
    rkeys_[p] = e->rkey;
  }
  if (!pairs.empty()) {
    MC_RETURN_IF_ERROR(
        client_->connectQueuePairs(pairs, any_remote ? nodes : std::vector<std::string>{}));
  }
  // This rank's own QPs, now connected to themselves: NIC atomics'
  // loopbacks (mc_nic_atomics). Not live yet, so their contexts may be
  // copied to the device whole.
  const size_t self = static_cast<size_t>(local_rank);
  if (self < peer_mask.size() && peer_mask[self] && self < static_cast<size_t>(num_ranks_)) {
    std::vector<size_t> loops;
    {
      std::lock_guard<std::mutex> lock(loss_mu_);
      for (size_t c = 0; c < q; ++c) {
        qps_[self * q + c].loopback = 1;
        loops.push_back(self * q + c);
      }
    }
    MC_RETURN_IF_ERROR(PublishQps(loops));
  }
  return PublishTables();
}

int DaemonRdmaTransport::connectPeers(int local_rank, bool,
                                      const std::vector<int64_t>& remote_addrs,
                                      const std::vector<int32_t>& remote_keys,
                                      const std::vector<int32_t>& remote_qpns,
                                      const std::vector<int32_t>&, const std::vector<int64_t>&,
                                      const std::vector<int64_t>&,
                                      const std::vector<int>& active_ranks_mask) {
  const size_t n = static_cast<size_t>(num_ranks_);
  const size_t q = static_cast<size_t>(qps_per_peer_);
  if (remote_addrs.size() < n || remote_keys.size() < n || remote_qpns.size() < n * q) {
    return Fail(absl::InvalidArgumentError(
        "connectPeers: remote_addrs/remote_keys need num_ranks entries and remote_qpns "
        "num_ranks * qps_per_peer"));
  }
  std::vector<std::pair<uint32_t, uint32_t>> pairs;
  for (size_t p = 0; p < n; ++p) {
    if (static_cast<int>(p) == local_rank) continue;
    if (!active_ranks_mask.empty() && (p >= active_ranks_mask.size() || !active_ranks_mask[p])) {
      continue;
    }
    for (size_t c = 0; c < q; ++c) {
      if (qpns_[p * q + c] == 0) continue;
      pairs.emplace_back(qpns_[p * q + c], static_cast<uint32_t>(remote_qpns[p * q + c]));
    }
    raddrs_[p] = static_cast<uint64_t>(remote_addrs[p]);
    rkeys_[p] = static_cast<uint32_t>(remote_keys[p]);
  }
  absl::Status s = pairs.empty() ? absl::OkStatus() : client_->connectQueuePairs(pairs);
  if (s.ok()) s = PublishTables();
  return s.ok() ? 0 : Fail(std::move(s));
}

device::RdmaLocalMetadata DaemonRdmaTransport::localMetadata() const {
  device::RdmaLocalMetadata m;
  m.raddr = static_cast<int64_t>(reinterpret_cast<uintptr_t>(buffer_));
  m.rkey = static_cast<int32_t>(buffer_keys_.rkey);
  for (uint32_t q : qpns_) m.qpns.push_back(static_cast<int32_t>(q));
  m.lids.assign(qpns_.size(), 0);
  return m;
}

device::IbgdaContext DaemonRdmaTransport::ibgdaContext() const {
  device::IbgdaContext c;
  auto* self = const_cast<DaemonRdmaTransport*>(this);
  c.qp_devctxs = static_cast<device::IbgdaQpDevCtx*>(self->qpDevCtxsPtr());
  c.raddrs = static_cast<const uint64_t*>(self->raddrsPtr());
  c.rkeys = static_cast<const uint32_t*>(self->rkeysPtr());
  c.qps_per_rank = qps_per_peer_;
  c.local_atomic_base = nullptr;
  c.remote_atomic_base = nullptr;
  return c;
}

absl::Status DaemonRdmaTransport::replaceQueuePairsToward(int peer) {
  if (peer < 0 || peer >= num_ranks_) {
    return absl::InvalidArgumentError(
        absl::StrCat("replaceQueuePairsToward: rank ", peer, " is outside 0..", num_ranks_ - 1));
  }
  if (qps_ == nullptr) {
    return absl::FailedPreconditionError("replaceQueuePairsToward before allocateControlBuffer");
  }
  const size_t q = static_cast<size_t>(qps_per_peer_);
  std::vector<size_t> peer_slots;
  for (size_t slot = static_cast<size_t>(peer) * q; slot < static_cast<size_t>(peer + 1) * q;
       ++slot) {
    peer_slots.push_back(slot);
  }
  std::vector<uint32_t> old;
  {
    std::lock_guard<std::mutex> lock(loss_mu_);
    for (size_t slot : peer_slots) {
      if (qpns_[slot] == 0) continue;
      old.push_back(qpns_[slot]);
      qpns_[slot] = 0;
      qps_[slot] = device::IbgdaQpDevCtx();  // no sq: kernels find no route
    }
  }
  if (old.empty()) return absl::OkStatus();  // never an RDMA peer
  raddrs_[peer] = 0;
  rkeys_[peer] = 0;
  MC_RETURN_IF_ERROR(PublishQps(peer_slots));
  MC_RETURN_IF_ERROR(PublishTables());
  // Their peer's session is gone, so they are half dead already; destroying
  // them frees the slots' numbers in the daemon.
  MC_RETURN_IF_ERROR(client_->destroyQueuePairs(old));
  std::vector<int> mask(static_cast<size_t>(num_ranks_), 0);
  mask[static_cast<size_t>(peer)] = 1;
  MC_RETURN_IF_ERROR(createQueuePairsFor(mask));
  // Unconnected: a WQE posted now would meet a queue pair in RESET.
  for (size_t slot : peer_slots) {
    parked_.emplace_back(slot, qps_[slot]);
    qps_[slot] = device::IbgdaQpDevCtx();
  }
  return PublishQps(peer_slots);
}

absl::Status DaemonRdmaTransport::connectReplacement(int local_rank, int peer,
                                                     const RdmaEndpointInfo& e) {
  if (peer < 0 || peer >= num_ranks_) {
    return absl::InvalidArgumentError(
        absl::StrCat("connectReplacement: rank ", peer, " is outside 0..", num_ranks_ - 1));
  }
  std::vector<std::optional<RdmaEndpointInfo>> peers(static_cast<size_t>(num_ranks_));
  peers[static_cast<size_t>(peer)] = e;
  std::vector<int> mask(static_cast<size_t>(num_ranks_), 0);
  mask[static_cast<size_t>(peer)] = 1;
  MC_RETURN_IF_ERROR(connectEndpoints(local_rank, peers, mask));
  const size_t q = static_cast<size_t>(qps_per_peer_);
  std::vector<size_t> restored;
  for (auto it = parked_.begin(); it != parked_.end();) {
    if (it->first / q == static_cast<size_t>(peer)) {
      qps_[it->first] = it->second;
      restored.push_back(it->first);
      it = parked_.erase(it);
    } else {
      ++it;
    }
  }
  return PublishQps(restored);
}

}  // namespace mooncake
