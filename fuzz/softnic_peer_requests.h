// Peer.SoftnicExecute (proto/mooncake/v1/peer.proto) for request_fuzzer.cc:
// another node's daemon has its requester QPs' operations executed against
// this node's responder QPs, through PeerService::SoftnicExecute itself
// (daemon/server/peer_service.cc) on the core's softnic engine.
//
// Before the request, besides what PrepareRdma holds (rdma_requests.h):
//   session A2 registered a region of kPeerRegionBytes at kPeerIova with
//     remote write, read and atomic access (the fourth key), and its QP qa2
//     is connected to QP kPeerQpnA2 of node kPeerNode;
//   session B's qb is connected to QP kPeerQpnB of kPeerNode (B has no
//     region another node may touch).
// Names: a responder_qpn of 1..4 means qa0, qa1, qa2, qb; an rkey of 1..4
// A's, A2's, B's region and A2's remotely accessible one. An empty
// connection_secret means the one offered for the first operation's
// responder QP (FuzzRemoteConnections). Other values, and requester_node /
// requester_qpn, go as sent.
//
// Invariants: InvalidArgument exactly for a batch outside the documented
// bounds (at most 256 operations, a requester node of 1..64 bytes, a WRITE
// of 1 byte .. 1 MiB, atomics without data, a known kind), with no result;
// otherwise OK with one result per operation in order, up to and including
// the first that fails. Each result is what a NIC would report: unless the
// responder QP is connected to exactly (requester_node, requester_qpn) and
// the batch carries the secret offered for that QP, TRANSPORT_RETRY_EXC_ERR,
// with not_ready exactly when that QP is in RESET;
// else REMOTE_INVAL_REQ for a misaligned atomic, REMOTE_ACCESS_ERR outside
// a region of the responder's session with the access, and success
// otherwise: a write lands exactly there, an atomic returns the value before
// it and adds (both checked against a copy of A2's region kept here). No QP
// or region of any session changes.
#pragma once

#include <sys/mman.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "daemon_core.h"
#include "grpcpp/server_context.h"
#include "mooncake/device/mlx5/prm.h"
#include "mooncake/v1/peer.pb.h"
#include "rdma_requests.h"
#include "softnic/cuda_atomics_kernel.h"

namespace mooncake::fuzz {

inline constexpr char kPeerNode[] = "node-b";
inline constexpr uint32_t kPeerQpnA2 = 77;
inline constexpr uint32_t kPeerQpnB = 78;
inline constexpr uint64_t kPeerIova = 0x200000;
inline constexpr uint64_t kPeerRegionBytes = 4096;

struct PeerCaller {
  std::vector<uint32_t> rkeys;          // A's, A2's, B's, A2's remote region
  std::shared_ptr<const uint8_t> view;  // A2's remote region, read-only here
  std::string shadow;                   // what it should hold
};

// A read-only view of `fd`'s first `bytes`, unmapped with its last owner.
inline std::shared_ptr<const uint8_t> MapReadOnly(int fd, uint64_t bytes) {
  void* p = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
  FUZZ_CHECK(p != MAP_FAILED, "mmap of the peer region");
  return std::shared_ptr<const uint8_t>(static_cast<const uint8_t*>(p), [bytes](const uint8_t* q) {
    ::munmap(const_cast<uint8_t*>(q), bytes);
  });
}

inline PeerCaller PreparePeer(DaemonCore& core, const RdmaCaller& r) {
  PeerCaller c;
  c.rkeys = r.lkeys;  // softnic: rkey == lkey
  UniqueFd fd = SealedMemfd(kPeerRegionBytes);
  c.view = MapReadOnly(fd.get(), kPeerRegionBytes);
  c.shadow.assign(kPeerRegionBytes, '\0');
  auto bundle = std::make_shared<daemon::FdBundle>();
  bundle->fds.push_back(std::move(fd));
  absl::StatusOr<daemon::RdmaResources::Registered> reg = core.rdma.RegisterMemory(
      r.a2, std::move(bundle), "memfd", kPeerIova, kPeerRegionBytes, 0,
      softnic::kLocalWrite | softnic::kRemoteWrite | softnic::kRemoteRead | softnic::kRemoteAtomic);
  FUZZ_CHECK(reg.ok(), reg.status());
  c.rkeys.push_back(reg->rkey);
  for (auto [session, qpn, remote] :
       {std::tuple<const daemon::SessionInfo*, uint32_t, uint32_t>{&r.a2, r.qpns[2], kPeerQpnA2},
        {&r.b, r.qpns[3], kPeerQpnB}}) {
    absl::Status s = core.rdma.Connect(*session, {{qpn, remote, kPeerNode}});
    FUZZ_CHECK(s.ok(), s);
  }
  return c;
}

// What a batch must be (peer.proto, PeerService::SoftnicExecute).
inline bool BatchValid(const v1::SoftnicBatch& b) {
  if (b.ops_size() > 256 || b.requester_node().empty() || b.requester_node().size() > 64) {
    return false;
  }
  for (const v1::SoftnicOp& op : b.ops()) {
    if (!v1::SoftnicOp::Kind_IsValid(op.kind()) || op.data().size() > (1u << 20) ||
        (op.kind() == v1::SoftnicOp::WRITE) == op.data().empty()) {
      return false;
    }
  }
  return true;
}

inline void HandleSoftnicExecute(DaemonCore& core, const RdmaCaller& r, PeerCaller& c,
                                 const v1::SoftnicBatch& sent) {
  v1::SoftnicBatch req = sent;
  for (v1::SoftnicOp& op : *req.mutable_ops()) {
    op.set_responder_qpn(Named(op.responder_qpn(), r.qpns));
    op.set_rkey(Named(op.rkey(), c.rkeys));
  }
  if (req.connection_secret().empty() && req.ops_size() > 0) {
    req.set_connection_secret(core.remote->SecretOf(req.ops(0).responder_qpn()));
  }
  const RdmaSnapshot before = Snapshot(core);
  grpc::ServerContext ctx;
  v1::SoftnicResults resp;
  const grpc::Status s = core.peer_service.SoftnicExecute(&ctx, &req, &resp);
  const bool valid = BatchValid(req);
  FUZZ_CHECK(s.ok() == valid, "a batch that is ", valid ? "valid" : "invalid", " answered ",
             static_cast<int>(s.error_code()), ": ", s.error_message());
  if (!s.ok()) {
    FUZZ_CHECK(s.error_code() == grpc::StatusCode::INVALID_ARGUMENT && resp.results_size() == 0,
               "refused with code ", static_cast<int>(s.error_code()), " and ", resp.results_size(),
               " results");
  }
  const uint32_t qa0 = r.qpns[0], qa2 = r.qpns[2], qb = r.qpns[3];
  for (int i = 0; s.ok() && i < req.ops_size(); ++i) {
    const v1::SoftnicOp& op = req.ops(i);
    FUZZ_CHECK(i < resp.results_size(), resp.results_size(), " results for ", req.ops_size(),
               " operations, none failed");
    const v1::SoftnicResult& got = resp.results(i);
    // The responder QP connected back to exactly this requester.
    const std::string secret = core.remote->SecretOf(op.responder_qpn());
    const bool peer = req.requester_node() == kPeerNode &&
                      ((op.responder_qpn() == qa2 && req.requester_qpn() == kPeerQpnA2) ||
                       (op.responder_qpn() == qb && req.requester_qpn() == kPeerQpnB)) &&
                      !secret.empty() && req.connection_secret() == secret;
    const bool atomic = op.kind() != v1::SoftnicOp::WRITE;
    const uint64_t len =
        atomic ? (op.kind() == v1::SoftnicOp::FETCH_ADD_64 ? 8 : 4) : op.data().size();
    // Only A2's remote region is reachable, and only through qa2.
    const bool inside = op.responder_qpn() == qa2 && op.rkey() == c.rkeys[3] &&
                        op.raddr() >= kPeerIova && op.raddr() - kPeerIova <= kPeerRegionBytes &&
                        len <= kPeerRegionBytes - (op.raddr() - kPeerIova);
    uint32_t want = 0;
    if (!peer) {
      want = device::mlx5::kSyndTransportRetryExcErr;
      FUZZ_CHECK(got.not_ready() == (op.responder_qpn() == qa0), "not_ready ", got.not_ready(),
                 " for QP ", op.responder_qpn());
    } else if (atomic && op.raddr() % len != 0) {
      want = device::mlx5::kSyndRemoteInvalReqErr;
    } else if (!inside) {
      want = device::mlx5::kSyndRemoteAccessErr;
    }
    FUZZ_CHECK(got.syndrome() == want, "operation ", i, " (kind ", op.kind(), " on QP ",
               op.responder_qpn(), " at 0x", absl::Hex(op.raddr()), "+", len, " rkey ", op.rkey(),
               "): syndrome 0x", absl::Hex(got.syndrome()), ", expected 0x", absl::Hex(want));
    if (want != 0) {
      FUZZ_CHECK(resp.results_size() == i + 1, resp.results_size(),
                 " results: more after the failure of operation ", i);
      break;
    }
    char* at = c.shadow.data() + (op.raddr() - kPeerIova);
    if (op.kind() == v1::SoftnicOp::WRITE) {
      std::memcpy(at, op.data().data(), op.data().size());
    } else if (op.kind() == v1::SoftnicOp::FETCH_ADD_64) {
      uint64_t old;
      std::memcpy(&old, at, 8);
      FUZZ_CHECK(got.fetched() == old, "FETCH_ADD_64 fetched ", got.fetched(), ", held ", old);
      const uint64_t now = old + op.add();
      std::memcpy(at, &now, 8);
    } else {
      // The carries stop at the field boundaries (the engine's MaskedAdd,
      // mlx5's extended masked fetch-add).
      uint32_t old;
      std::memcpy(&old, at, 4);
      FUZZ_CHECK(got.fetched() == old, "MASKED_FETCH_ADD_32 fetched ", got.fetched(), ", held ",
                 old);
      const uint32_t now =
          softnic::MaskedAdd(old, static_cast<uint32_t>(op.add()), op.field_boundary());
      std::memcpy(at, &now, 4);
    }
    if (i + 1 == req.ops_size()) {
      FUZZ_CHECK(resp.results_size() == req.ops_size(), resp.results_size(), " results for ",
                 req.ops_size(), " operations");
    }
  }
  if (s.ok() && req.ops_size() == 0) FUZZ_CHECK(resp.results_size() == 0, "results for nothing");
  // What succeeded landed where it should, and nothing else changed.
  FUZZ_CHECK(std::memcmp(c.shadow.data(), c.view.get(), kPeerRegionBytes) == 0,
             "the region differs from its copy after ", resp.results_size(), " operations");
  const RdmaSnapshot after = Snapshot(core);
  CheckOthersUntouched(before, after, /*caller=*/0);  // no session is the caller
  CheckRdmaAccounting(core, after);
}

}  // namespace mooncake::fuzz
