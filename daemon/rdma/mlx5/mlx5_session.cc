#include "rdma/mlx5/mlx5_session.h"

#include <fcntl.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "mooncake/common/log.h"
#include "mooncake/common/status.h"
#include "rdma/mlx5/verbs_status.h"

#if MOONCAKE_HAVE_MLX5DV
#include <infiniband/mlx5dv.h>
#include <infiniband/verbs.h>
#endif

namespace mooncake::daemon::mlx5 {

const char* MrPathName(NicSession::MrPath path) {
  switch (path) {
    case Mlx5Session::MrPath::kDmabuf: return "dmabuf";
    case Mlx5Session::MrPath::kPeermem: return "peermem";
    case Mlx5Session::MrPath::kHost: return "host";
  }
  return "unknown";
}

namespace {

absl::Status CheckOptions(const Mlx5SessionOptions& o) {
  if (o.device.empty()) return absl::InvalidArgumentError("mlx5 session: no device name given");
  // ibv_query_port takes a uint8_t port number.
  if (o.port == 0 || o.port > 255) {
    return absl::InvalidArgumentError(
        absl::StrCat("mlx5 session on ", o.device, ": port ", o.port, " is outside 1..255"));
  }
  // The address path's src_addr_index is 8 bits.
  if (o.gid_index.has_value() && *o.gid_index > 255) {
    return absl::InvalidArgumentError(absl::StrCat("mlx5 session on ", o.device, ": GID index ",
                                                   *o.gid_index, " is outside 0..255"));
  }
  return absl::OkStatus();
}

}  // namespace

Mlx5Session::Mlx5Session(Mlx5SessionOptions options) : options_(std::move(options)) {}

Mlx5Session::~Mlx5Session() { ReleaseAll(); }

size_t Mlx5Session::memory_region_count() const {
  absl::MutexLock lock(&mu_);
  return mrs_.size();
}
size_t Mlx5Session::umem_count() const {
  absl::MutexLock lock(&mu_);
  return umems_.size();
}
size_t Mlx5Session::queue_pair_count() const {
  absl::MutexLock lock(&mu_);
  return qps_.size();
}
bool Mlx5Session::InReset(uint32_t qpn) const {
  absl::MutexLock lock(&mu_);
  auto it = qps_.find(qpn);
  return it != qps_.end() && it->second.state == QpState::kReset;
}

#if MOONCAKE_HAVE_MLX5DV

// Our enums carry rdma-core's values, so they pass through unconverted.
static_assert(uint32_t{kMrLocalWrite} == IBV_ACCESS_LOCAL_WRITE &&
              uint32_t{kMrRemoteWrite} == IBV_ACCESS_REMOTE_WRITE &&
              uint32_t{kMrRemoteRead} == IBV_ACCESS_REMOTE_READ &&
              uint32_t{kMrRemoteAtomic} == IBV_ACCESS_REMOTE_ATOMIC);
static_assert(static_cast<int>(GidType::kIb) == IBV_GID_TYPE_IB &&
              static_cast<int>(GidType::kRoceV1) == IBV_GID_TYPE_ROCE_V1 &&
              static_cast<int>(GidType::kRoceV2) == IBV_GID_TYPE_ROCE_V2);
static_assert(static_cast<int>(PathMtu::k256) == IBV_MTU_256 &&
              static_cast<int>(PathMtu::k4096) == IBV_MTU_4096);
static_assert(sizeof(Gid) == sizeof(ibv_gid::raw));

namespace {

// `prefix: message`, same code.
absl::Status Annotate(const absl::Status& s, absl::string_view prefix) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(prefix, ": ", s.message()));
}

void LogReleaseFailure(absl::string_view device, VerbsCall call, int err, absl::string_view what) {
  MC_LOG(kWarning, "mlx5 session teardown on ", device, ": ", VerbsCallName(call), " of ", what,
         " failed: ", ErrnoText(err), " (the kernel frees it with the context)");
}

}  // namespace

absl::StatusOr<std::unique_ptr<Mlx5Session>> Mlx5Session::Open(const Mlx5SessionOptions& options) {
  MC_RETURN_IF_ERROR(CheckOptions(options));
  // From here on every failure returns and `s`'s destructor releases what
  // was made so far.
  std::unique_ptr<Mlx5Session> s(new Mlx5Session(options));
  const std::string& dev = s->options_.device;

  int count = 0;
  errno = 0;
  ibv_device** list = ibv_get_device_list(&count);
  if (list == nullptr) return DeviceNotFound(dev, {}, errno);
  std::vector<std::string> names;
  ibv_device* found = nullptr;
  for (int i = 0; i < count; ++i) {
    names.emplace_back(ibv_get_device_name(list[i]));
    if (names.back() == dev) found = list[i];
  }
  if (found == nullptr) {
    ibv_free_device_list(list);
    return DeviceNotFound(dev, names, 0);
  }
  if (!mlx5dv_is_supported(found)) {
    ibv_free_device_list(list);
    return absl::FailedPreconditionError(
        absl::StrCat(dev,
                     " is not an mlx5 device (libmlx5 does not drive it): the DevX provider "
                     "needs a ConnectX NIC; use the softnic provider on this node"));
  }
  // One context per session: its command fd goes to this session's client.
  mlx5dv_context_attr attr = {};
  attr.flags = MLX5DV_CONTEXT_FLAGS_DEVX;
  errno = 0;
  s->context_ = mlx5dv_open_device(found, &attr);
  const int open_errno = errno;
  // Opened contexts outlive the list (ibv_get_device_list(3)).
  ibv_free_device_list(list);
  if (s->context_ == nullptr) return VerbsError(VerbsCall::kOpenDevice, dev, open_errno, "(DevX)");

  // The IBGDA path expects CQE version 1, as upstream Mooncake's and
  // NVSHMEM's IBGDA do (shared/references.md section 2); a context's CQE
  // version is negotiated with the kernel at open.
  mlx5dv_context dv = {};
  if (int rc = mlx5dv_query_device(s->context_, &dv); rc != 0) {
    return VerbsError(VerbsCall::kQueryDevice, dev, rc);
  }
  if ((dv.flags & MLX5DV_CONTEXT_FLAGS_CQE_V1) == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(dev,
                     ": the verbs context uses CQE version 0; the IBGDA path needs version 1 "
                     "(update the NIC firmware and rdma-core)"));
  }

  DevxCommand query = BuildQueryGeneralCaps(HcaCapMode::kCurrent);
  if (int rc = mlx5dv_devx_general_cmd(s->context_, query.in.data(), query.in.size(),
                                       query.out.data(), query.out.size());
      rc != 0) {
    return DevxError(VerbsCall::kDevxGeneralCmd, dev, rc, query);
  }
  MC_ASSIGN_OR_RETURN(s->caps_, ParseQueryGeneralCapsOut(query.out));
  MC_RETURN_IF_ERROR(Annotate(CheckRcOverDevx(s->caps_), dev));
  // Atomics are checked here, at open, not found missing by a kernel's
  // first mc_signal (issue 24 item 2).
  DevxCommand atomics = BuildQueryAtomicCaps(HcaCapMode::kCurrent);
  if (int rc = mlx5dv_devx_general_cmd(s->context_, atomics.in.data(), atomics.in.size(),
                                       atomics.out.data(), atomics.out.size());
      rc != 0) {
    return DevxError(VerbsCall::kDevxGeneralCmd, dev, rc, atomics);
  }
  MC_ASSIGN_OR_RETURN(HcaAtomicCaps atomic_caps, ParseQueryAtomicCapsOut(atomics.out));
  MC_RETURN_IF_ERROR(Annotate(CheckAtomics(atomic_caps), dev));
  s->atomics_ = DescribeAtomics(atomic_caps);
  if (s->caps_.num_ports != 0 && options.port > s->caps_.num_ports) {
    return absl::InvalidArgumentError(absl::StrCat("port ", options.port, " of ", dev,
                                                   " does not exist: the device has ",
                                                   s->caps_.num_ports, " port(s)"));
  }

  ibv_port_attr port_attr = {};
  if (int rc = ibv_query_port(s->context_, static_cast<uint8_t>(options.port), &port_attr);
      rc != 0) {
    return VerbsError(VerbsCall::kQueryPort, dev, rc, absl::StrCat("(port ", options.port, ")"));
  }
  const LinkLayer link_layer = port_attr.link_layer == IBV_LINK_LAYER_ETHERNET
                                   ? LinkLayer::kEthernet
                                   : LinkLayer::kInfiniBand;

  // HcaGeneralCaps::gid_table_size is meant as entries per port, but
  // cmd_hca_cap.gid_table_size holds a code (entries = 8 << code, Linux
  // mlx5_get_gid_table_len) and RoCE ports size their table by the RoCE
  // caps' roce_address_table_size instead. The kernel decodes the right
  // one into ibv_port_attr.gid_tbl_len: use that for the GID index checks.
  s->caps_.gid_table_size = static_cast<uint32_t>(std::max(port_attr.gid_tbl_len, 0));

  // The table covers every port of the device; keep this port's entries.
  const size_t per_port = std::max<size_t>(s->caps_.gid_table_size, 1);
  std::vector<ibv_gid_entry> raw(per_port * std::max<size_t>(s->caps_.num_ports, 1));
  const ssize_t n = ibv_query_gid_table(s->context_, raw.data(), raw.size(), 0);
  if (n < 0) return VerbsError(VerbsCall::kQueryGidTable, dev, static_cast<int>(-n));
  std::vector<GidEntry> gids;
  for (ssize_t i = 0; i < n; ++i) {
    if (raw[i].port_num != options.port) continue;
    GidEntry e;
    e.index = raw[i].gid_index;
    std::memcpy(e.gid.data(), raw[i].gid.raw, e.gid.size());
    e.type = static_cast<GidType>(raw[i].gid_type);
    e.ndev_ifindex = raw[i].ndev_ifindex;
    gids.push_back(e);
  }
  absl::StatusOr<GidEntry> gid = ChooseGid(gids, link_layer, options.gid_index);
  if (!gid.ok()) {
    return Annotate(gid.status(), absl::StrCat(dev, " port ", options.port));
  }
  s->endpoint_.link_layer = link_layer;
  s->endpoint_.lid = port_attr.lid;
  s->endpoint_.gid = *gid;
  s->endpoint_.active_mtu = static_cast<uint32_t>(port_attr.active_mtu);

  errno = 0;
  s->pd_ = ibv_alloc_pd(s->context_);
  if (s->pd_ == nullptr) return VerbsError(VerbsCall::kAllocPd, dev, errno);
  mlx5dv_pd dv_pd = {};
  mlx5dv_obj obj = {};
  obj.pd.in = s->pd_;
  obj.pd.out = &dv_pd;
  if (int rc = mlx5dv_init_obj(&obj, MLX5DV_OBJ_PD); rc != 0) {
    return VerbsError(VerbsCall::kInitObjPd, dev, rc);
  }
  s->pdn_ = dv_pd.pdn;

  // A non-cached UAR first: a doorbell is one 8-byte store, nothing to gain
  // from write combining, and a GPU or a second process maps it as plain
  // MMIO. libmlx5 has one only where the kernel can allocate it
  // (mlx5dv_devx_alloc_uar: EOPNOTSUPP otherwise); then a BlueFlame
  // (write-combining) UAR, rung the same way.
  errno = 0;
  s->uar_ = mlx5dv_devx_alloc_uar(s->context_, MLX5DV_UAR_ALLOC_TYPE_NC);
  int uar_errno = errno;
  s->uar_info_.non_cached = s->uar_ != nullptr;
  if (s->uar_ == nullptr) {
    errno = 0;
    s->uar_ = mlx5dv_devx_alloc_uar(s->context_, MLX5DV_UAR_ALLOC_TYPE_BF);
    if (s->uar_ == nullptr) {
      return Annotate(VerbsError(VerbsCall::kAllocUar, dev, errno, "(BlueFlame)"),
                      absl::StrCat("non-cached UAR refused (", ErrnoText(uar_errno), "), then"));
    }
  }
  s->uar_info_.page_id = s->uar_->page_id;
  s->uar_info_.mmap_offset = static_cast<int64_t>(s->uar_->mmap_off);
  s->uar_info_.reg_offset = static_cast<uint64_t>(static_cast<const char*>(s->uar_->reg_addr) -
                                                  static_cast<const char*>(s->uar_->base_addr));

  if (int rc = mlx5dv_devx_query_eqn(s->context_, options.completion_vector, &s->eqn_); rc != 0) {
    return VerbsError(VerbsCall::kQueryEqn, dev, rc,
                      absl::StrCat("(vector ", options.completion_vector, ")"));
  }
  MC_LOG(kInfo, "mlx5 session on ", dev, " port ", options.port, ": pdn ", s->pdn_, ", ",
         s->uar_info_.non_cached ? "NC" : "BF", " UAR page ", s->uar_info_.page_id, ", GID ",
         s->endpoint_.gid.index, " (", GidTypeName(s->endpoint_.gid.type), " ",
         FormatGid(s->endpoint_.gid.gid), "), atomics ", s->atomics_);
  return s;
}

void Mlx5Session::ReleaseAll() {
  const std::string& dev = options_.device;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [qpn, entry] : qps_) {
      if (absl::Status s = DestroyObjects(entry); !s.ok()) {
        MC_LOG(kWarning, "mlx5 session teardown: ", s.message(),
               " (the kernel frees it with the context)");
      }
    }
    qps_.clear();
    for (auto& [id, entry] : umems_) {
      if (int rc = mlx5dv_devx_umem_dereg(entry.umem); rc != 0) {
        LogReleaseFailure(dev, VerbsCall::kUmemDereg, rc, absl::StrCat("umem ", id));
      }
    }
    umems_.clear();
    for (auto& [lkey, entry] : mrs_) {
      if (int rc = ibv_dereg_mr(entry.mr); rc != 0) {
        LogReleaseFailure(dev, VerbsCall::kDeregMr, rc, absl::StrCat("lkey ", lkey));
      }
    }
    mrs_.clear();
  }
  if (uar_ != nullptr) mlx5dv_devx_free_uar(uar_);
  uar_ = nullptr;
  if (pd_ != nullptr) {
    if (int rc = ibv_dealloc_pd(pd_); rc != 0) {
      MC_LOG(kWarning, "mlx5 session teardown on ", dev,
             ": ibv_dealloc_pd failed: ", ErrnoText(rc));
    }
  }
  pd_ = nullptr;
  if (context_ != nullptr && ibv_close_device(context_) != 0) {
    MC_LOG(kWarning, "mlx5 session teardown on ", dev,
           ": ibv_close_device failed: ", ErrnoText(errno));
  }
  context_ = nullptr;
}

int Mlx5Session::command_fd() const { return context_ != nullptr ? context_->cmd_fd : -1; }

volatile void* Mlx5Session::doorbell_register() const {
  return uar_ != nullptr ? static_cast<volatile void*>(uar_->reg_addr) : nullptr;
}

absl::StatusOr<UniqueFd> Mlx5Session::DupCommandFd() const {
  const int fd = fcntl(command_fd(), F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return VerbsError(VerbsCall::kDupCommandFd, options_.device, errno);
  return UniqueFd(fd);
}

// ---- memory regions -----------------------------------------------------------------------------

absl::StatusOr<Mlx5Session::MemoryRegion> Mlx5Session::AddMr(
    ibv_mr* mr, MrPath path, std::shared_ptr<const void> keep_alive) {
  if (mrs_.contains(mr->lkey)) {
    // Keys are unique per device while registered; a repeat means our own
    // bookkeeping is wrong. Give the new region back rather than lose track
    // of the one already held under that key.
    const uint32_t lkey = mr->lkey;
    if (int rc = ibv_dereg_mr(mr); rc != 0) {
      LogReleaseFailure(options_.device, VerbsCall::kDeregMr, rc, "a duplicate key");
    }
    return absl::InternalError(absl::StrCat("mlx5 session on ", options_.device,
                                            ": the NIC returned lkey 0x", absl::Hex(lkey),
                                            " already held by this session"));
  }
  MemoryRegion r{mr->lkey, mr->rkey, path};
  mrs_.emplace(mr->lkey, MrEntry{mr, path, std::move(keep_alive)});
  return r;
}

absl::StatusOr<Mlx5Session::MemoryRegion> Mlx5Session::RegisterGpuMemory(const GpuMemory& m) {
  const std::string& dev = options_.device;
  if (m.dmabuf_fd < 0) {
    return absl::InvalidArgumentError(absl::StrCat("GPU memory on ", dev, ": no dmabuf fd"));
  }
  MC_ASSIGN_OR_RETURN(const uint32_t access, RegistrationAccess(m.access));
  MC_RETURN_IF_ERROR(CheckDmabufRange(m.offset, m.length, m.iova, kUmemPageSize));

  absl::MutexLock lock(&mu_);
  errno = 0;
  ibv_mr* mr =
      ibv_reg_dmabuf_mr(pd_, m.offset, m.length, m.iova, m.dmabuf_fd, static_cast<int>(access));
  if (mr != nullptr) return AddMr(mr, MrPath::kDmabuf, nullptr);
  const int dmabuf_errno = errno;
  absl::Status dmabuf_error = VerbsError(VerbsCall::kRegDmabufMr, dev, dmabuf_errno,
                                         absl::StrFormat("(fd %d, offset %d, %d bytes, iova 0x%x)",
                                                         m.dmabuf_fd, m.offset, m.length, m.iova));
  if (!DmabufRefusalAllowsFallback(dmabuf_errno) || m.daemon_address == nullptr) {
    return dmabuf_error;
  }
  // The same bytes by address: the kernel pins GPU pages through
  // nvidia-peermem's peer-memory client.
  errno = 0;
  mr = ibv_reg_mr_iova2(pd_, m.daemon_address, m.length, m.iova, access);
  if (mr != nullptr) {
    MC_LOG(kInfo, "mlx5 session on ", dev, ": ", dmabuf_error.message(),
           "; registered through nvidia-peermem instead");
    return AddMr(mr, MrPath::kPeermem, m.keep_alive);
  }
  return BothRegistrationsFailed(dev, dmabuf_error,
                                 VerbsError(VerbsCall::kRegPeermemMr, dev, errno,
                                            absl::StrFormat("(GPU address %p, %d bytes, iova 0x%x)",
                                                            m.daemon_address, m.length, m.iova)));
}

absl::StatusOr<Mlx5Session::MemoryRegion> Mlx5Session::RegisterHostMemory(
    void* daemon_address, uint64_t length, uint64_t iova, uint32_t access,
    std::shared_ptr<const void> keep_alive) {
  const std::string& dev = options_.device;
  if (daemon_address == nullptr || length == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("host memory on ", dev, ": no mapping or 0 bytes to register"));
  }
  MC_ASSIGN_OR_RETURN(const uint32_t verbs_access, RegistrationAccess(access));
  absl::MutexLock lock(&mu_);
  errno = 0;
  ibv_mr* mr = ibv_reg_mr_iova2(pd_, daemon_address, length, iova, verbs_access);
  if (mr == nullptr) {
    return VerbsError(VerbsCall::kRegHostMr, dev, errno,
                      absl::StrFormat("(%d bytes, iova 0x%x)", length, iova));
  }
  return AddMr(mr, MrPath::kHost, std::move(keep_alive));
}

absl::StatusOr<Mlx5Session::MemoryRegion> Mlx5Session::RegisterPeermemMemory(
    void* daemon_address, uint64_t length, uint64_t iova, uint32_t access,
    std::shared_ptr<const void> keep_alive) {
  const std::string& dev = options_.device;
  if (daemon_address == nullptr || length == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("GPU memory on ", dev, ": no mapping or 0 bytes to register"));
  }
  MC_ASSIGN_OR_RETURN(const uint32_t verbs_access, RegistrationAccess(access));
  absl::MutexLock lock(&mu_);
  errno = 0;
  ibv_mr* mr = ibv_reg_mr_iova2(pd_, daemon_address, length, iova, verbs_access);
  if (mr == nullptr) {
    return VerbsError(
        VerbsCall::kRegPeermemMr, dev, errno,
        absl::StrFormat("(GPU address %p, %d bytes, iova 0x%x)", daemon_address, length, iova));
  }
  return AddMr(mr, MrPath::kPeermem, std::move(keep_alive));
}

absl::Status Mlx5Session::DeregisterMemory(uint32_t lkey) {
  absl::MutexLock lock(&mu_);
  auto it = mrs_.find(lkey);
  if (it == mrs_.end()) {
    return absl::NotFoundError(absl::StrCat("no memory region with lkey 0x", absl::Hex(lkey),
                                            " in this session on ", options_.device));
  }
  if (int rc = ibv_dereg_mr(it->second.mr); rc != 0) {
    return VerbsError(VerbsCall::kDeregMr, options_.device, rc,
                      absl::StrCat("(lkey 0x", absl::Hex(lkey), ")"));
  }
  mrs_.erase(it);
  return absl::OkStatus();
}

// ---- umem ---------------------------------------------------------------------------------------

absl::StatusOr<uint32_t> Mlx5Session::AddUmem(mlx5dv_devx_umem* umem, uint64_t bytes, bool dmabuf,
                                              std::shared_ptr<const void> keep_alive) {
  const uint32_t id = umem->umem_id;
  if (umems_.contains(id)) {
    if (int rc = mlx5dv_devx_umem_dereg(umem); rc != 0) {
      LogReleaseFailure(options_.device, VerbsCall::kUmemDereg, rc, "a duplicate umem id");
    }
    return absl::InternalError(absl::StrCat("mlx5 session on ", options_.device,
                                            ": the NIC returned umem id ", id,
                                            " already held by this session"));
  }
  UmemEntry e;
  e.umem = umem;
  e.bytes = bytes;
  e.dmabuf = dmabuf;
  e.keep_alive = std::move(keep_alive);
  umems_.emplace(id, std::move(e));
  return id;
}

absl::StatusOr<uint32_t> Mlx5Session::RegisterHostUmem(void* daemon_address, uint64_t bytes,
                                                       std::shared_ptr<const void> keep_alive) {
  if (daemon_address == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("host umem on ", options_.device, ": no mapping given"));
  }
  MC_RETURN_IF_ERROR(
      CheckUmemRange("host umem", reinterpret_cast<uintptr_t>(daemon_address), bytes));
  mlx5dv_devx_umem_in in = {};
  in.addr = daemon_address;
  in.size = bytes;
  // The NIC reads WQEs and doorbell records and writes CQEs: local access.
  in.access = IBV_ACCESS_LOCAL_WRITE;
  in.pgsz_bitmap = kUmemPageSize;
  absl::MutexLock lock(&mu_);
  errno = 0;
  mlx5dv_devx_umem* umem = mlx5dv_devx_umem_reg_ex(context_, &in);
  if (umem == nullptr) {
    return VerbsError(VerbsCall::kUmemRegHost, options_.device, errno,
                      absl::StrCat("(", bytes, " bytes)"));
  }
  return AddUmem(umem, bytes, /*dmabuf=*/false, std::move(keep_alive));
}

absl::StatusOr<uint32_t> Mlx5Session::RegisterDmabufUmem(int dmabuf_fd, uint64_t offset,
                                                         uint64_t bytes) {
  if (dmabuf_fd < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("dmabuf umem on ", options_.device, ": no dmabuf fd"));
  }
  MC_RETURN_IF_ERROR(CheckUmemRange("dmabuf umem", offset, bytes));
  mlx5dv_devx_umem_in in = {};
  // With a dmabuf, addr is the offset into it (mlx5dv_devx_umem_reg(3)).
  in.addr = reinterpret_cast<void*>(static_cast<uintptr_t>(offset));
  in.size = bytes;
  in.access = IBV_ACCESS_LOCAL_WRITE;
  in.pgsz_bitmap = kUmemPageSize;
  in.comp_mask = MLX5DV_UMEM_MASK_DMABUF;
  in.dmabuf_fd = dmabuf_fd;
  absl::MutexLock lock(&mu_);
  errno = 0;
  mlx5dv_devx_umem* umem = mlx5dv_devx_umem_reg_ex(context_, &in);
  if (umem == nullptr) {
    return VerbsError(VerbsCall::kUmemRegDmabuf, options_.device, errno,
                      absl::StrCat("(fd ", dmabuf_fd, ", offset ", offset, ", ", bytes, " bytes)"));
  }
  return AddUmem(umem, bytes, /*dmabuf=*/true, nullptr);
}

absl::Status Mlx5Session::DeregisterUmem(uint32_t umem_id) {
  absl::MutexLock lock(&mu_);
  auto it = umems_.find(umem_id);
  if (it == umems_.end()) {
    return absl::NotFoundError(
        absl::StrCat("no umem ", umem_id, " in this session on ", options_.device));
  }
  if (it->second.users != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("umem ", umem_id, " on ", options_.device, " is still used by ",
                     it->second.users, " ring(s) of live queue pairs: destroy them first"));
  }
  if (int rc = mlx5dv_devx_umem_dereg(it->second.umem); rc != 0) {
    return VerbsError(VerbsCall::kUmemDereg, options_.device, rc,
                      absl::StrCat("(umem ", umem_id, ")"));
  }
  umems_.erase(it);
  return absl::OkStatus();
}

void Mlx5Session::UseRings(const QpRings& rings, int delta) {
  for (uint32_t id :
       {rings.sq.umem_id, rings.sq_dbrec.umem_id, rings.cq.umem_id, rings.cq_dbrec.umem_id}) {
    auto it = umems_.find(id);
    if (it != umems_.end()) it->second.users += delta;
  }
}

// ---- queue pairs --------------------------------------------------------------------------------

absl::Status Mlx5Session::DestroyObjects(QpEntry& entry) {
  // The QP names the CQ: the QP goes first, and a CQ whose QP could not be
  // destroyed stays.
  if (entry.qp != nullptr) {
    if (int rc = mlx5dv_devx_obj_destroy(entry.qp); rc != 0) {
      return VerbsError(VerbsCall::kDevxObjDestroy, options_.device, rc, "(DESTROY_QP)");
    }
    entry.qp = nullptr;
  }
  if (entry.cq != nullptr) {
    if (int rc = mlx5dv_devx_obj_destroy(entry.cq); rc != 0) {
      return VerbsError(VerbsCall::kDevxObjDestroy, options_.device, rc, "(DESTROY_CQ)");
    }
    entry.cq = nullptr;
  }
  return absl::OkStatus();
}

absl::StatusOr<Mlx5Session::QueuePair> Mlx5Session::CreateQueuePair(const QpRings& rings) {
  const std::string& dev = options_.device;
  absl::MutexLock lock(&mu_);
  absl::flat_hash_map<uint32_t, uint64_t> sizes;
  for (const auto& [id, entry] : umems_) sizes.emplace(id, entry.bytes);
  MC_RETURN_IF_ERROR(ValidateQpRings(rings, sizes));

  CreateCqParams cq_params = MakeCreateCqParams(rings, uar_info_.page_id, eqn_);
  // The CQN is not known yet; a valid placeholder lets every other value be
  // checked before anything is created.
  CreateQpParams qp_params = MakeCreateQpParams(rings, pdn_, uar_info_.page_id, 1, caps_);
  MC_RETURN_IF_ERROR(CheckAgainstCaps(cq_params, caps_));
  MC_RETURN_IF_ERROR(CheckAgainstCaps(qp_params, caps_));
  MC_RETURN_IF_ERROR(BuildCreateQp(qp_params).status());
  MC_ASSIGN_OR_RETURN(DevxCommand cq_cmd, BuildCreateCq(cq_params));

  const bool gpu_cq = umems_.at(rings.cq.umem_id).dmabuf;
  const bool gpu_sq = umems_.at(rings.sq.umem_id).dmabuf;
  constexpr absl::string_view kGpuRingsHint =
      "some NICs and firmware refuse GPU memory for queue rings: put the rings in host memory";

  QpEntry entry;
  entry.rings = rings;
  errno = 0;
  entry.cq = mlx5dv_devx_obj_create(context_, cq_cmd.in.data(), cq_cmd.in.size(), cq_cmd.out.data(),
                                    cq_cmd.out.size());
  if (entry.cq == nullptr) {
    return DevxError(VerbsCall::kDevxObjCreate, dev, errno, cq_cmd, gpu_cq ? kGpuRingsHint : "");
  }
  absl::StatusOr<uint32_t> cqn = ParseCreateCqOut(cq_cmd.out);
  if (!cqn.ok()) {
    (void)DestroyObjects(entry);
    return cqn.status();
  }
  entry.cqn = *cqn;

  qp_params.cqn_snd = entry.cqn;
  qp_params.cqn_rcv = entry.cqn;
  absl::StatusOr<DevxCommand> qp_cmd = BuildCreateQp(qp_params);
  if (!qp_cmd.ok()) {
    (void)DestroyObjects(entry);
    return qp_cmd.status();
  }
  errno = 0;
  entry.qp = mlx5dv_devx_obj_create(context_, qp_cmd->in.data(), qp_cmd->in.size(),
                                    qp_cmd->out.data(), qp_cmd->out.size());
  if (entry.qp == nullptr) {
    absl::Status error =
        DevxError(VerbsCall::kDevxObjCreate, dev, errno, *qp_cmd, gpu_sq ? kGpuRingsHint : "");
    if (absl::Status s = DestroyObjects(entry); !s.ok()) {
      MC_LOG(kWarning, "mlx5 session on ", dev, ": after a failed CREATE_QP: ", s.message());
    }
    return error;
  }
  absl::StatusOr<uint32_t> qpn = ParseCreateQpOut(qp_cmd->out);
  if (!qpn.ok() || qps_.contains(*qpn)) {
    (void)DestroyObjects(entry);
    if (!qpn.ok()) return qpn.status();
    return absl::InternalError(absl::StrCat("mlx5 session on ", dev, ": the NIC returned QPN 0x",
                                            absl::Hex(*qpn), " already held by this session"));
  }
  UseRings(rings, +1);
  const QueuePair result{*qpn, entry.cqn};
  qps_.emplace(*qpn, std::move(entry));
  return result;
}

absl::StatusOr<std::array<uint8_t, 6>> Mlx5Session::ResolveRemoteMac(const Init2RtrParams& rtr,
                                                                     const ConnectTuning& tuning) {
  // The kernel resolves the next hop for a RoCE address handle (neighbour
  // and route lookup of the peer's IP; mlx5_create_ah reads the MAC from
  // the kernel's reply) and libmlx5 exposes it in the AH's address vector.
  // UCX (uct_rc_mlx5_iface_common_devx_connect_qp) and NVSHMEM's IBGDA
  // transport get the MAC for their DevX RoCE QPs the same way. The AH is
  // only a lookup: the MAC is copied into the QP context and the AH freed.
  ibv_ah_attr ah_attr = {};
  ah_attr.is_global = 1;
  ah_attr.port_num = static_cast<uint8_t>(options_.port);
  ah_attr.sl = static_cast<uint8_t>(tuning.service_level);
  std::memcpy(ah_attr.grh.dgid.raw, rtr.rgid.data(), rtr.rgid.size());
  ah_attr.grh.sgid_index = static_cast<uint8_t>(rtr.gid_index);
  ah_attr.grh.hop_limit = static_cast<uint8_t>(rtr.hop_limit);
  ah_attr.grh.traffic_class = static_cast<uint8_t>(rtr.traffic_class);
  ah_attr.grh.flow_label = rtr.flow_label;
  const std::string detail =
      absl::StrCat("(peer GID ", FormatGid(rtr.rgid), ", local GID index ", rtr.gid_index, ")");
  errno = 0;
  ibv_ah* ah = ibv_create_ah(pd_, &ah_attr);
  if (ah == nullptr) return VerbsError(VerbsCall::kCreateAh, options_.device, errno, detail);
  mlx5dv_ah dv_ah = {};
  mlx5dv_obj obj = {};
  obj.ah.in = ah;
  obj.ah.out = &dv_ah;
  const int rc = mlx5dv_init_obj(&obj, MLX5DV_OBJ_AH);
  std::array<uint8_t, 6> mac{};
  if (rc == 0) std::memcpy(mac.data(), dv_ah.av->rmac, mac.size());
  if (int drc = ibv_destroy_ah(ah); drc != 0) {
    LogReleaseFailure(options_.device, VerbsCall::kCreateAh, drc, "the lookup address handle");
  }
  if (rc != 0) return VerbsError(VerbsCall::kInitObjAh, options_.device, rc, detail);
  if (std::all_of(mac.begin(), mac.end(), [](uint8_t b) { return b == 0; })) {
    return absl::UnavailableError(absl::StrCat("ibv_create_ah", detail, " on ", options_.device,
                                               " resolved no MAC address for the peer"));
  }
  return mac;
}

absl::Status Mlx5Session::Connect(uint32_t qpn, uint32_t local_psn, const RemoteQp& remote,
                                  const ConnectTuning& tuning) {
  const std::string& dev = options_.device;
  absl::MutexLock lock(&mu_);
  auto it = qps_.find(qpn);
  if (it == qps_.end()) {
    return absl::NotFoundError(
        absl::StrCat("no queue pair 0x", absl::Hex(qpn), " in this session on ", dev));
  }
  QpEntry& entry = it->second;
  if (entry.state != QpState::kReset) {
    return absl::FailedPreconditionError(absl::StrCat(
        "queue pair 0x", absl::Hex(qpn), " on ", dev,
        " is not in RESET (already connected, or a connect failed half way): destroy it and "
        "create a new one"));
  }
  // The port's state, LID and MTU can change after Open; connect with what
  // they are now.
  ibv_port_attr port_attr = {};
  if (int rc = ibv_query_port(context_, static_cast<uint8_t>(options_.port), &port_attr); rc != 0) {
    return VerbsError(VerbsCall::kQueryPort, dev, rc, absl::StrCat("(port ", options_.port, ")"));
  }
  if (port_attr.state != IBV_PORT_ACTIVE) {
    return absl::UnavailableError(absl::StrCat("port ", options_.port, " of ", dev, " is ",
                                               ibv_port_state_str(port_attr.state),
                                               ", not ACTIVE: check the cable, the switch and "
                                               "(InfiniBand) the subnet manager"));
  }
  LocalPort local;
  local.port = options_.port;
  local.link_layer = endpoint_.link_layer;
  local.lid = port_attr.lid;
  local.active_mtu = static_cast<uint32_t>(port_attr.active_mtu);
  local.gid = endpoint_.gid;
  const std::string what =
      absl::StrFormat("connecting QP 0x%x on %s to remote QP 0x%x", qpn, dev, remote.qpn);
  absl::StatusOr<ConnectPlan> plan = PlanConnect(qpn, local_psn, local, caps_, remote, tuning);
  if (!plan.ok()) return Annotate(plan.status(), what);
  if (plan->needs_remote_mac) {
    absl::StatusOr<std::array<uint8_t, 6>> mac = ResolveRemoteMac(plan->init2rtr, tuning);
    if (!mac.ok()) return Annotate(mac.status(), what);
    plan->init2rtr.rmac = *mac;
  }

  struct Step {
    absl::StatusOr<DevxCommand> command;
    QpState reached;
  };
  Step steps[] = {
      {BuildRst2Init(plan->rst2init), QpState::kInit},
      {BuildInit2Rtr(plan->init2rtr), QpState::kRtr},
      {BuildRtr2Rts(plan->rtr2rts), QpState::kRts},
  };
  for (Step& step : steps) {
    if (!step.command.ok()) return Annotate(step.command.status(), what);
    DevxCommand& cmd = *step.command;
    if (int rc = mlx5dv_devx_obj_modify(entry.qp, cmd.in.data(), cmd.in.size(), cmd.out.data(),
                                        cmd.out.size());
        rc != 0) {
      return Annotate(DevxError(VerbsCall::kDevxObjModify, dev, rc, cmd), what);
    }
    entry.state = step.reached;
  }
  return absl::OkStatus();
}

absl::Status Mlx5Session::DestroyQueuePair(uint32_t qpn) {
  absl::MutexLock lock(&mu_);
  auto it = qps_.find(qpn);
  if (it == qps_.end()) {
    return absl::NotFoundError(
        absl::StrCat("no queue pair 0x", absl::Hex(qpn), " in this session on ", options_.device));
  }
  MC_RETURN_IF_ERROR(DestroyObjects(it->second));
  UseRings(it->second.rings, -1);
  qps_.erase(it);
  return absl::OkStatus();
}

#else  // !MOONCAKE_HAVE_MLX5DV

namespace {

absl::Status NotBuilt() {
  return absl::FailedPreconditionError(
      "mooncaked was built without rdma-core's libibverbs and libmlx5: install libibverbs-dev "
      "and ibverbs-providers, then configure and build again (or use the softnic provider)");
}

}  // namespace

absl::StatusOr<std::unique_ptr<Mlx5Session>> Mlx5Session::Open(const Mlx5SessionOptions& options) {
  MC_RETURN_IF_ERROR(CheckOptions(options));
  return NotBuilt();
}
void Mlx5Session::ReleaseAll() {}
int Mlx5Session::command_fd() const { return -1; }
volatile void* Mlx5Session::doorbell_register() const { return nullptr; }
absl::StatusOr<UniqueFd> Mlx5Session::DupCommandFd() const { return NotBuilt(); }
absl::StatusOr<Mlx5Session::MemoryRegion> Mlx5Session::RegisterGpuMemory(const GpuMemory&) {
  return NotBuilt();
}
absl::StatusOr<Mlx5Session::MemoryRegion> Mlx5Session::RegisterHostMemory(
    void*, uint64_t, uint64_t, uint32_t, std::shared_ptr<const void>) {
  return NotBuilt();
}
absl::StatusOr<Mlx5Session::MemoryRegion> Mlx5Session::RegisterPeermemMemory(
    void*, uint64_t, uint64_t, uint32_t, std::shared_ptr<const void>) {
  return NotBuilt();
}
absl::Status Mlx5Session::DeregisterMemory(uint32_t) { return NotBuilt(); }
absl::StatusOr<uint32_t> Mlx5Session::RegisterHostUmem(void*, uint64_t,
                                                       std::shared_ptr<const void>) {
  return NotBuilt();
}
absl::StatusOr<uint32_t> Mlx5Session::RegisterDmabufUmem(int, uint64_t, uint64_t) {
  return NotBuilt();
}
absl::Status Mlx5Session::DeregisterUmem(uint32_t) { return NotBuilt(); }
absl::StatusOr<Mlx5Session::QueuePair> Mlx5Session::CreateQueuePair(const QpRings&) {
  return NotBuilt();
}
absl::Status Mlx5Session::Connect(uint32_t, uint32_t, const RemoteQp&, const ConnectTuning&) {
  return NotBuilt();
}
absl::Status Mlx5Session::DestroyQueuePair(uint32_t) { return NotBuilt(); }

#endif  // MOONCAKE_HAVE_MLX5DV

}  // namespace mooncake::daemon::mlx5
