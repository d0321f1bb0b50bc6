#include "rdma/mlx5/verbs_status.h"

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace mooncake::daemon::mlx5 {

absl::string_view VerbsCallName(VerbsCall call) {
  switch (call) {
    case VerbsCall::kGetDeviceList: return "ibv_get_device_list";
    case VerbsCall::kOpenDevice: return "mlx5dv_open_device";
    case VerbsCall::kQueryDevice: return "mlx5dv_query_device";
    case VerbsCall::kQueryPort: return "ibv_query_port";
    case VerbsCall::kQueryGidTable: return "ibv_query_gid_table";
    case VerbsCall::kAllocPd: return "ibv_alloc_pd";
    case VerbsCall::kInitObjPd: return "mlx5dv_init_obj(MLX5DV_OBJ_PD)";
    case VerbsCall::kAllocUar: return "mlx5dv_devx_alloc_uar";
    case VerbsCall::kQueryEqn: return "mlx5dv_devx_query_eqn";
    case VerbsCall::kRegDmabufMr: return "ibv_reg_dmabuf_mr";
    case VerbsCall::kRegHostMr: return "ibv_reg_mr_iova2";
    case VerbsCall::kRegPeermemMr: return "ibv_reg_mr_iova2";
    case VerbsCall::kDeregMr: return "ibv_dereg_mr";
    case VerbsCall::kUmemRegHost: return "mlx5dv_devx_umem_reg_ex";
    case VerbsCall::kUmemRegDmabuf: return "mlx5dv_devx_umem_reg_ex";
    case VerbsCall::kUmemDereg: return "mlx5dv_devx_umem_dereg";
    case VerbsCall::kDevxGeneralCmd: return "mlx5dv_devx_general_cmd";
    case VerbsCall::kDevxObjCreate: return "mlx5dv_devx_obj_create";
    case VerbsCall::kDevxObjModify: return "mlx5dv_devx_obj_modify";
    case VerbsCall::kDevxObjDestroy: return "mlx5dv_devx_obj_destroy";
    case VerbsCall::kCreateAh: return "ibv_create_ah";
    case VerbsCall::kInitObjAh: return "mlx5dv_init_obj(MLX5DV_OBJ_AH)";
    case VerbsCall::kDupCommandFd: return "fcntl(F_DUPFD_CLOEXEC)";
  }
  return "unknown verbs call";
}

std::string ErrnoText(int err) {
  char buf[256];
  // GNU strerror_r: returns the text, in `buf` or a static string.
  const char* text = strerror_r(err, buf, sizeof(buf));
  if (text == nullptr || text[0] == '\0') return absl::StrCat("errno ", err);
  return text;
}

absl::StatusCode CodeForErrno(int err) {
  switch (err) {
    case ENOENT:
    case ENODEV:
    case ENXIO: return absl::StatusCode::kNotFound;
    case EPERM:
    case EACCES: return absl::StatusCode::kPermissionDenied;
    case EINVAL:
    case EBADF:
    case EFAULT:
    case ERANGE:
    case EOVERFLOW: return absl::StatusCode::kInvalidArgument;
    case ENOMEM:
    case ENOSPC:
    case EMFILE:
    case ENFILE:
    case EAGAIN: return absl::StatusCode::kResourceExhausted;
    case EOPNOTSUPP:
    case EPROTONOSUPPORT:
    case ENOSYS:
    case EBUSY: return absl::StatusCode::kFailedPrecondition;
    case ENETUNREACH:
    case EHOSTUNREACH:
    case ETIMEDOUT:
    case ENODATA:
    case EADDRNOTAVAIL: return absl::StatusCode::kUnavailable;
    default: return absl::StatusCode::kInternal;
  }
}

namespace {

bool Unsupported(int err) { return err == EOPNOTSUPP || err == EPROTONOSUPPORT || err == ENOSYS; }

constexpr absl::string_view kMemlockHint =
    "the locked-memory limit is too low: raise RLIMIT_MEMLOCK for mooncaked "
    "(LimitMEMLOCK=infinity in its systemd unit)";
constexpr absl::string_view kUverbsAccessHint =
    "mooncaked needs read-write access to /dev/infiniband/uverbs*: run it as root or in a group "
    "that owns those files (rdma)";

}  // namespace

absl::string_view HintFor(VerbsCall call, int err) {
  switch (call) {
    case VerbsCall::kGetDeviceList:
      return "load the ib_uverbs kernel module and the NIC's driver (mlx5_ib), and check "
             "/sys/class/infiniband";
    case VerbsCall::kOpenDevice:
      if (err == EPERM || err == EACCES) return kUverbsAccessHint;
      if (Unsupported(err)) {
        return "libmlx5 or the kernel's mlx5_ib cannot open a DevX context on this device; "
               "DevX needs an mlx5 NIC, a kernel with mlx5_ib DevX support and ibverbs-providers";
      }
      if (err == EINVAL) {
        return "the kernel refused a DevX user context: the device reports none "
               "(cmd_hca_cap.log_max_uctx = 0; e.g. a VF or firmware without DevX)";
      }
      if (err == ENOMEM || err == EMFILE || err == ENFILE) {
        return "out of memory or file descriptors for one more verbs context (one per session)";
      }
      return "";
    case VerbsCall::kQueryPort:
      if (err == EINVAL) {
        return "no such port on this device (ports are numbered from 1; see ibv_devinfo)";
      }
      return "";
    case VerbsCall::kAllocPd:
      if (err == ENOMEM || err == ENOSPC) {
        return "the device is out of protection domains (one per session)";
      }
      return "";
    case VerbsCall::kAllocUar:
      if (Unsupported(err)) {
        return "the kernel offers DevX contexts no UAR of this type (non-cached UARs need a newer "
               "mlx5_ib; BlueFlame ones are the fallback)";
      }
      if (err == ENOMEM || err == ENOSPC) {
        return "the device has no free UAR pages (one per session): fewer concurrent sessions";
      }
      return "";
    case VerbsCall::kQueryEqn:
      if (err == EINVAL) {
        return "no such completion vector on this device (see num_comp_vectors in ibv_devinfo -v)";
      }
      return "";
    case VerbsCall::kRegDmabufMr:
      if (Unsupported(err)) {
        return "the kernel or the NIC driver lacks dmabuf support; load nvidia-peermem for the "
               "ibv_reg_mr fallback";
      }
      if (err == EINVAL) {
        return "the range lies outside the dmabuf, iova and offset differ in their page offset, "
               "or the exporter refused to pin it; load nvidia-peermem for the ibv_reg_mr "
               "fallback";
      }
      if (err == EBADF) return "the fd is not a dmabuf (cuMemGetHandleForAddressRange gives one)";
      return "";
    case VerbsCall::kRegHostMr:
      if (err == ENOMEM || err == EAGAIN) return kMemlockHint;
      if (err == EFAULT) return "the daemon's mapping does not cover the range";
      return "";
    case VerbsCall::kRegPeermemMr:
      if (err == EFAULT || err == EINVAL || Unsupported(err)) {
        return "the kernel cannot pin GPU memory by address: load nvidia-peermem "
               "(modprobe nvidia-peermem), or use a kernel and NIC driver with dmabuf support";
      }
      if (err == ENOMEM || err == EAGAIN) return kMemlockHint;
      return "";
    case VerbsCall::kUmemRegHost:
      if (err == ENOMEM || err == EAGAIN) return kMemlockHint;
      if (err == EINVAL) {
        return "the range is not page aligned or no 4 KiB page size fits it";
      }
      return "";
    case VerbsCall::kUmemRegDmabuf:
      if (Unsupported(err)) {
        return "libmlx5 (rdma-core >= 43) or the kernel's mlx5_ib lacks dmabuf umem "
               "(MLX5_IB_ATTR_DEVX_UMEM_REG_DMABUF_FD); put the rings in host memory instead";
      }
      if (err == EINVAL) {
        return "the range lies outside the dmabuf or the exporter refused to pin it; put the "
               "rings in host memory instead";
      }
      if (err == EBADF) return "the fd is not a dmabuf";
      return "";
    case VerbsCall::kUmemDereg:
    case VerbsCall::kDevxObjDestroy:
    case VerbsCall::kDeregMr:
      if (err == EBUSY) return "objects still refer to it";
      return "";
    case VerbsCall::kDevxGeneralCmd:
    case VerbsCall::kDevxObjCreate:
    case VerbsCall::kDevxObjModify:
      if (err == EPERM || err == EACCES) {
        return "the kernel refused the DevX command for this context (a privileged command, or "
               "an object of another context)";
      }
      if (Unsupported(err)) return "the context was opened without DevX";
      return "";
    case VerbsCall::kCreateAh:
      return "the kernel could not resolve the next hop's MAC for the peer's GID: check the "
             "route to the peer's address on this port's netdev (ip route get <address>) and "
             "that the peer answers ARP/ND";
    case VerbsCall::kInitObjAh:
    case VerbsCall::kInitObjPd:
    case VerbsCall::kQueryDevice:
      if (Unsupported(err)) return "the context is not an mlx5 context";
      return "";
    case VerbsCall::kQueryGidTable:
    case VerbsCall::kDupCommandFd: return "";
  }
  return "";
}

absl::Status VerbsError(VerbsCall call, absl::string_view device, int err,
                        absl::string_view detail) {
  if (err == 0) {
    return absl::InternalError(
        absl::StrCat(VerbsCallName(call), detail, " on ", device, " failed without an errno"));
  }
  std::string message =
      absl::StrCat(VerbsCallName(call), detail, " on ", device, " failed: ", ErrnoText(err));
  if (absl::string_view hint = HintFor(call, err); !hint.empty()) {
    absl::StrAppend(&message, " (", hint, ")");
  }
  return absl::Status(CodeForErrno(err), message);
}

absl::Status DevxError(VerbsCall call, absl::string_view device, int err,
                       const DevxCommand& command, absl::string_view firmware_hint) {
  const std::string detail = absl::StrCat("(", command.name, ")");
  if (err == EREMOTEIO) {
    absl::Status firmware = CheckCommandOut(command.name, command.out);
    if (!firmware.ok()) {
      std::string message = absl::StrCat(VerbsCallName(call), detail, " on ", device,
                                         " failed: ", firmware.message());
      if (!firmware_hint.empty()) absl::StrAppend(&message, " (", firmware_hint, ")");
      return absl::Status(firmware.code(), message);
    }
    // EREMOTEIO with a clean mailbox: the kernel's own doing; report the errno.
  }
  return VerbsError(call, device, err, detail);
}

absl::Status BothRegistrationsFailed(absl::string_view device, const absl::Status& dmabuf,
                                     const absl::Status& by_address) {
  return absl::Status(by_address.code(),
                      absl::StrCat("GPU memory on ", device,
                                   " could not be registered either way: ", dmabuf.message(),
                                   "; then ", by_address.message()));
}

absl::Status DeviceNotFound(absl::string_view wanted, const std::vector<std::string>& available,
                            int list_errno) {
  if (!available.empty()) {
    return absl::NotFoundError(absl::StrCat(
        "RDMA device ", wanted, " not found; devices: ", absl::StrJoin(available, ", ")));
  }
  std::string message = absl::StrCat("RDMA device ", wanted, " not found: no RDMA devices");
  if (list_errno != 0) {
    absl::StrAppend(&message, " (", VerbsCallName(VerbsCall::kGetDeviceList), ": ",
                    ErrnoText(list_errno), ")");
  }
  absl::StrAppend(&message, "; ", HintFor(VerbsCall::kGetDeviceList, list_errno));
  return absl::NotFoundError(message);
}

}  // namespace mooncake::daemon::mlx5
