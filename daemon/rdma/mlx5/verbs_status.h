// Turning a failed libibverbs / libmlx5 call into an absl::Status a user can
// act on. Every message names the call (with the arguments that identify the
// object), the device, the errno text and, where we know one, what is
// missing and how to get it:
//   "ibv_reg_dmabuf_mr(fd 12, offset 0, 1048576 bytes) on mlx5_0 failed:
//    Operation not supported (the kernel or the NIC driver lacks dmabuf
//    support; load nvidia-peermem for the ibv_reg_mr fallback)"
// A DevX command the firmware refused (the call fails with EREMOTEIO and the
// output mailbox carries status and syndrome) is reported with the mailbox's
// status, syndrome and the canonical code CheckCommandOut gives it.
//
// Pure functions: no verbs headers, no device; thread-safe (strerror_r).
// The mlx5 session (mlx5_session.cc) is their one caller at run time; the
// tests check every hint and code without hardware.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "rdma/mlx5/devx_commands.h"

namespace mooncake::daemon::mlx5 {

// The rdma-core calls the mlx5 session makes. Two entries for one function
// when the advice differs with what it is used on (ibv_reg_mr_iova2 on host
// memory and on a GPU mapping; umem on host memory and on a dmabuf).
enum class VerbsCall {
  kGetDeviceList,   // ibv_get_device_list
  kOpenDevice,      // mlx5dv_open_device(MLX5DV_CONTEXT_FLAGS_DEVX)
  kQueryDevice,     // mlx5dv_query_device
  kQueryPort,       // ibv_query_port
  kQueryGidTable,   // ibv_query_gid_table
  kAllocPd,         // ibv_alloc_pd
  kInitObjPd,       // mlx5dv_init_obj(MLX5DV_OBJ_PD)
  kAllocUar,        // mlx5dv_devx_alloc_uar
  kQueryEqn,        // mlx5dv_devx_query_eqn
  kRegDmabufMr,     // ibv_reg_dmabuf_mr
  kRegHostMr,       // ibv_reg_mr_iova2 on the daemon's mapping of host memory
  kRegPeermemMr,    // ibv_reg_mr_iova2 on the daemon's mapping of GPU memory
  kDeregMr,         // ibv_dereg_mr
  kUmemRegHost,     // mlx5dv_devx_umem_reg_ex on host memory
  kUmemRegDmabuf,   // mlx5dv_devx_umem_reg_ex with MLX5DV_UMEM_MASK_DMABUF
  kUmemDereg,       // mlx5dv_devx_umem_dereg
  kDevxGeneralCmd,  // mlx5dv_devx_general_cmd
  kDevxObjCreate,   // mlx5dv_devx_obj_create
  kDevxObjModify,   // mlx5dv_devx_obj_modify
  kDevxObjDestroy,  // mlx5dv_devx_obj_destroy
  kCreateAh,        // ibv_create_ah (RoCE: the kernel resolves the next hop's MAC)
  kInitObjAh,       // mlx5dv_init_obj(MLX5DV_OBJ_AH)
  kDupCommandFd,    // fcntl(F_DUPFD_CLOEXEC) of the context's command fd
};

// The function's name as rdma-core spells it ("ibv_reg_dmabuf_mr").
absl::string_view VerbsCallName(VerbsCall call);

// strerror text of `err`, thread-safe; "errno N" for numbers libc does not know.
std::string ErrnoText(int err);

// The canonical code for errno `err` from a verbs call:
//   ENOENT ENODEV ENXIO                     NotFound
//   EPERM EACCES                            PermissionDenied
//   EINVAL EBADF EFAULT ERANGE EOVERFLOW    InvalidArgument
//   ENOMEM ENOSPC EMFILE ENFILE EAGAIN      ResourceExhausted
//   EOPNOTSUPP EPROTONOSUPPORT ENOSYS       FailedPrecondition (the system lacks a feature)
//   EBUSY                                   FailedPrecondition (objects still use it)
//   ENETUNREACH EHOSTUNREACH ETIMEDOUT
//   ENODATA EADDRNOTAVAIL                   Unavailable (no path to the peer)
//   anything else (EREMOTEIO, EIO, ...)     Internal
absl::StatusCode CodeForErrno(int err);

// What to do about `err` from `call`, or "" when we have no advice beyond
// the errno text.
absl::string_view HintFor(VerbsCall call, int err);

// "<name><detail> on <device> failed: <errno text>[ (<hint>)]" with
// CodeForErrno(err). `detail` follows the name as written, e.g.
// "(fd 12, offset 0, 4096 bytes)". `err` 0 (a call that failed without
// setting errno) reads "failed without an errno" and is Internal.
absl::Status VerbsError(VerbsCall call, absl::string_view device, int err,
                        absl::string_view detail = "");

// A failed DevX command (general_cmd, obj_create, obj_modify). With
// EREMOTEIO the firmware ran the command and refused it: the status comes
// from CheckCommandOut(command.name, command.out) and reads
//   "mlx5dv_devx_obj_create(CREATE_QP) on mlx5_0 failed: CREATE_QP failed:
//    status 0x03 (bad parameter), syndrome 0x1234abcd[ (<firmware_hint>)]"
// Otherwise the kernel refused it before the firmware saw it: VerbsError
// with the command name as detail. `firmware_hint` is only used for a
// firmware refusal (e.g. "some NICs reject GPU memory for QP rings").
absl::Status DevxError(VerbsCall call, absl::string_view device, int err,
                       const DevxCommand& command, absl::string_view firmware_hint = "");

// GPU memory that neither way could register: `dmabuf` is
// ibv_reg_dmabuf_mr's error, `by_address` the nvidia-peermem fallback's.
//   "GPU memory on mlx5_0 could not be registered either way: <dmabuf
//    message>; then <fallback message>"
// with the fallback's code (the last thing tried, and what to fix first
// on a system without dmabuf support).
absl::Status BothRegistrationsFailed(absl::string_view device, const absl::Status& dmabuf,
                                     const absl::Status& by_address);

// The device named `wanted` is not among `available` (ibv_get_device_list's
// names; `list_errno` is its errno when it returned no list, else 0):
//   "RDMA device mlx5_3 not found; devices: mlx5_0, mlx5_1"
//   "RDMA device mlx5_0 not found: no RDMA devices (ibv_get_device_list:
//    Function not implemented; load the ib_uverbs kernel module ...)"
// Always NotFound.
absl::Status DeviceNotFound(absl::string_view wanted, const std::vector<std::string>& available,
                            int list_errno);

}  // namespace mooncake::daemon::mlx5
