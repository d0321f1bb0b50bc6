// RemoteLink: how a softnic engine reaches queue pairs on another node
// (issue 9 item 5). A QP connected to (node, qpn) elsewhere hands its WQEs
// to the link in batches; the other node's daemon executes them against
// its own engine (Engine::ExecuteForPeer) and answers with one result per
// operation, stopping after the first that fails. The requester then
// writes the CQEs as for a local responder: same order, same syndromes,
// TRANSPORT_RETRY_EXC_ERR when the other node cannot be reached.
//
// The engine never waits for the network: Send queues the batch and
// returns; `done` runs later on a thread of the link (never on the caller's,
// which may hold the engine's lock). The peering layer implements it over
// the peer port (peering/softnic_peer_link.h).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "softnic/responder_op.h"

namespace mooncake::softnic {

// One responder operation as it travels: the payload is copied out of the
// requester's memory, so nothing of that memory is needed afterwards.
struct RemoteOp {
  ResponderOp::Kind kind = ResponderOp::Kind::kWrite;
  uint32_t responder_qpn = 0;
  uint64_t raddr = 0;
  uint32_t rkey = 0;
  std::string data;  // kWrite: the bytes to write at raddr
  uint64_t add = 0;  // atomics
  uint32_t field_boundary = 0;
};

struct RemoteBatch {
  std::string node;  // where the responder QP lives
  uint32_t requester_qpn = 0;
  // What the responder's node offered for this connection
  // (Engine::AcceptConnectionSecret); the responder refuses batches without it.
  std::string secret;
  std::vector<RemoteOp> ops;
};

// Results in op order: all of them, or up to and including the first whose
// syndrome is not 0. An error status: the batch could not be delivered or
// answered (nothing of it may be assumed done).
using RemoteDone = std::function<void(absl::StatusOr<std::vector<ResponderResult>> results)>;

class RemoteLink {
 public:
  virtual ~RemoteLink() = default;
  // Batches for one node are executed there in the order they were sent.
  virtual void Send(RemoteBatch batch, RemoteDone done) = 0;
};

}  // namespace mooncake::softnic
