// What the doorbell hand-off ("gpu-uar") gives away (issue 24 item 8).
// Whoever holds a DevX context's command fd has that context's rights, and
// the kernel fixed them when the context was opened, from the opener's
// capabilities: with CAP_NET_RAW a context may create raw-packet QPs and
// flow steering rules, with CAP_SYS_RAWIO it may issue privileged firmware
// commands. A context the daemon opens while holding either must therefore
// never reach a client. The shipped unit bounds the daemon to CAP_CHOWN and
// the DaemonSet drops every capability but IPC_LOCK, so this refuses only a
// daemon started by hand as full root.
//
// What a client can still do through a context opened without them: create
// and destroy objects in it (PDs, MRs, CQs, QPs, umem), which the rdma
// cgroup counts against the client's cgroup (rdma.max hca_object), and
// write its own UAR. It reaches nothing of other sessions: each session
// has its own context.
#pragma once

#include <functional>
#include <string>

#include "absl/status/status.h"

namespace mooncake::daemon::mlx5 {

// OK when a context opened now carries no more rights than its client's
// own: this process's effective set holds neither CAP_NET_RAW nor
// CAP_SYS_RAWIO. FailedPrecondition naming those it holds and what to
// change; Internal when capget fails.
absl::Status CheckHandOffRights();

// Replaces CheckHandOffRights for tests; null restores it.
using HandOffRightsCheck = std::function<absl::Status()>;

}  // namespace mooncake::daemon::mlx5
