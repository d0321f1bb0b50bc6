// Writes the seed corpora checked in under fuzz/corpus/: a few valid inputs
// per fuzzer, in each fuzzer's input format (see the comment at the top of
// each *_fuzzer.cc). Regenerate after changing a format:
//   cmake --build build-fuzz --target fuzz_seed_corpus
//   build-fuzz/bin/fuzz_seed_corpus fuzz/corpus
#include <sys/stat.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "buffer_handle.h"
#include "mooncake/common/version.h"
#include "mooncake/device/mlx5/wqe.h"
#include "mooncake/v1/admin.pb.h"
#include "mooncake/v1/fd_channel.pb.h"
#include "mooncake/v1/local.pb.h"
#include "mooncake/v1/peer.pb.h"
#include "mooncake/v1/rdma.pb.h"

namespace {

std::string out_dir;
int written = 0;

void Write(const std::string& target, const std::string& name, const std::string& bytes) {
  const std::string dir = out_dir + "/" + target;
  ::mkdir(dir.c_str(), 0755);
  std::ofstream f(dir + "/" + name, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!f) {
    std::fprintf(stderr, "cannot write %s/%s\n", dir.c_str(), name.c_str());
    std::exit(1);
  }
  ++written;
}

std::string U16(size_t v) {
  return std::string{static_cast<char>(v & 0xff), static_cast<char>((v >> 8) & 0xff)};
}
std::string U32(size_t v) { return U16(v & 0xffff) + U16(v >> 16); }

// ---- request_fuzzer: selector byte (kMessages order) + message bytes.
enum Selector : char {
  kHello,
  kOpenSession,
  kGetNodeInfo,
  kJoinGroup,
  kLeaveGroup,
  kReportReady,
  kExportFds,
  kImportFds,
  kGetStatus,
  kGetTopology,
  kListSessions,
  kListGroups,
  kPeerHello,
  kGetPeerTopology,
  kFdRequest,
  kGetRdmaInfo,
  kRegisterMemory,
  kDeregisterMemory,
  kCreateQueuePairs,
  kConnectQueuePairs,
  kDestroyQueuePairs,
  kSelectNic,
  kGetDoorbellAccess,
  kWatchEvents,
  kSoftnicExecute,
  kAttachCopyAgent,
};

std::string Req(Selector s, const google::protobuf::Message& m) {
  return std::string(1, s) + m.SerializeAsString();
}

mooncake::v1::JoinGroupRequest Join(const std::string& group, uint32_t rank, uint32_t n) {
  mooncake::v1::JoinGroupRequest r;
  r.set_group(group);
  r.set_rank(rank);
  r.set_world_size(n);
  r.mutable_handle()->set_kind("memfd");
  r.mutable_handle()->set_data("handle-bytes");
  r.mutable_handle()->set_size(1 << 20);
  return r;
}

// Rdma requests (fuzz/rdma_requests.h): qpns 1..4 and keys 1..3 name the
// prepared objects, "@memfd" a sealed memfd of 1 MiB.
mooncake::v1::QueuePairLayout Rings(uint64_t base, uint32_t depth) {
  mooncake::v1::QueuePairLayout l;
  l.set_sq_offset(base);
  l.set_sq_wqe_cnt(depth);
  l.set_cq_offset(base + depth * 64ull);
  l.set_cq_cqe_cnt(depth);
  l.set_sq_dbrec_offset(base + 2ull * depth * 64);
  l.set_cq_dbrec_offset(base + 2ull * depth * 64 + 8);
  return l;
}

void RdmaSeeds() {
  const std::string t = "request_fuzzer";
  namespace v1 = mooncake::v1;
  Write(t, "rdma_info", Req(kGetRdmaInfo, v1::GetRdmaInfoRequest()));
  v1::RegisterMemoryRequest reg;
  reg.set_fd_ticket("@memfd");
  reg.set_kind("memfd");
  reg.set_iova(0x7f0000001000);
  reg.set_length(8192);
  reg.set_offset(4096);
  reg.set_remote_write(true);
  Write(t, "register_memfd", Req(kRegisterMemory, reg));
  reg.set_length(130 << 10);  // past the per-uid bytes, within the session's
  Write(t, "register_past_uid_bytes", Req(kRegisterMemory, reg));
  reg.set_length(100);
  reg.set_offset((1 << 20) - 100);
  Write(t, "register_at_the_end", Req(kRegisterMemory, reg));
  reg.set_kind("cuda-vmm-fd");
  reg.set_offset(0);
  reg.set_length(4096);
  reg.set_allocation_bytes(64 << 10);
  Write(t, "register_cuda", Req(kRegisterMemory, reg));
  v1::DeregisterMemoryRequest dereg;
  dereg.set_lkey(1);
  Write(t, "deregister_own", Req(kDeregisterMemory, dereg));
  dereg.set_lkey(3);
  Write(t, "deregister_other_uid", Req(kDeregisterMemory, dereg));

  v1::CreateQueuePairsRequest create;
  create.set_fd_ticket("@memfd");
  create.set_control_bytes(1 << 20);
  *create.add_qps() = Rings(0, 4);
  *create.add_qps() = Rings(576, 4);
  Write(t, "create_two_qps", Req(kCreateQueuePairs, create));
  *create.add_qps() = Rings(1152, 8);  // a third: past the per-uid QPs
  Write(t, "create_past_uid_qps", Req(kCreateQueuePairs, create));
  create.clear_qps();
  *create.add_qps() = Rings((1 << 20) - 4096, 16);
  Write(t, "create_far_rings", Req(kCreateQueuePairs, create));
  create.clear_qps();
  *create.add_qps() = Rings(0, 4);
  create.set_control_kind("dmabuf");  // rings in GPU memory: softnic refuses them
  Write(t, "create_gpu_rings", Req(kCreateQueuePairs, create));
  create.set_control_kind("vram");
  Write(t, "create_unknown_control_kind", Req(kCreateQueuePairs, create));

  v1::ConnectQueuePairsRequest connect;
  v1::QueuePairConnection* pair = connect.add_connections();
  pair->set_qpn(1);
  pair->set_remote_qpn(3);  // the caller's uid, another session
  Write(t, "connect_same_uid", Req(kConnectQueuePairs, connect));
  *connect.add_connections() = *pair;
  Write(t, "connect_twice", Req(kConnectQueuePairs, connect));
  connect.clear_connections();
  pair = connect.add_connections();
  pair->set_qpn(1);
  pair->set_remote_qpn(4);  // another uid's
  Write(t, "connect_other_uid", Req(kConnectQueuePairs, connect));

  v1::DestroyQueuePairsRequest destroy;
  destroy.add_qpns(1);
  Write(t, "destroy_own", Req(kDestroyQueuePairs, destroy));
  destroy.add_qpns(1);
  Write(t, "destroy_twice", Req(kDestroyQueuePairs, destroy));
  destroy.clear_qpns();
  destroy.add_qpns(2);
  destroy.add_qpns(3);
  Write(t, "destroy_with_another_sessions", Req(kDestroyQueuePairs, destroy));

  v1::AttachCopyAgentRequest agent;
  agent.set_fd_ticket("@memfd");  // sealed but sparse: refused
  agent.set_staging_bytes(64 << 10);
  Write(t, "copy_agent_sparse_memfd", Req(kAttachCopyAgent, agent));
  agent.set_fd_ticket("@ticket");  // not sealed
  Write(t, "copy_agent_unsealed", Req(kAttachCopyAgent, agent));
  agent.set_staging_bytes(4097);
  Write(t, "copy_agent_odd_staging", Req(kAttachCopyAgent, agent));
}

// Admin.WatchEvents (fuzz/watch_requests.h): [how][n][script] before the
// (empty) request. A script byte is op | arg << 3.
std::string Watch(uint8_t how, const std::vector<uint8_t>& script) {
  std::string s{kWatchEvents, static_cast<char>(how), static_cast<char>(script.size())};
  for (uint8_t b : script) s += static_cast<char>(b);
  return s;
}
uint8_t WatchOp(uint8_t op, uint8_t session, uint8_t group, uint8_t rank, uint8_t not_ok = 0) {
  return static_cast<uint8_t>(op | (session + 3 * group + 9 * rank + 18 * not_ok) << 3);
}

void WatchSeeds() {
  const std::string t = "request_fuzzer";
  enum : uint8_t { wJoin, wLeave, wReady, wEnd, wRead, wCancel };
  const uint8_t read8 = wRead | 7 << 3;
  // Root watches "fuzz-forming" form (A2 takes rank 1), get ready and lose
  // a member; queue depth 8.
  Write(t, "watch_root_forms",
        Watch(2 | 6 << 2, {WatchOp(wJoin, 1, 0, 1), read8, WatchOp(wReady, 0, 0, 0),
                           WatchOp(wReady, 1, 0, 1), read8, WatchOp(wEnd, 1, 0, 0), read8}));
  // uid A with a queue of 2: events are dropped before it reads.
  Write(t, "watch_drops",
        Watch(0, {WatchOp(wJoin, 1, 0, 1), WatchOp(wJoin, 0, 1, 0), WatchOp(wJoin, 1, 1, 1),
                  WatchOp(wReady, 0, 1, 0, 1), read8}));
  // uid B watches its own group, then goes away mid-formation.
  Write(t, "watch_cancel",
        Watch(1 | 2 << 2, {WatchOp(wJoin, 2, 1, 0), read8, wCancel, WatchOp(wJoin, 2, 1, 1),
                           WatchOp(wLeave, 2, 1, 0)}));
  Write(t, "watch_tenant_socket", Watch(3, {WatchOp(wJoin, 1, 0, 1)}));
  Write(t, "watch_stopping", Watch(1 << 5, {read8}));
  Write(t, "watch_past_uid_limit", Watch(3 << 6, {WatchOp(wJoin, 1, 0, 1)}));
  Write(t, "watch_root_past_limit", Watch(2 | 3 << 6, {WatchOp(wJoin, 0, 2, 0), read8}));
}

// Peer.SoftnicExecute (fuzz/softnic_peer_requests.h): responder qpns 1..4
// and rkeys 1..4 name the prepared objects; A2's QP (3) answers node-b's
// QP 77 and its remote region (key 4) is 4 KiB at 0x200000; B's QP (4)
// answers node-b's QP 78.
mooncake::v1::SoftnicOp PeerOp(mooncake::v1::SoftnicOp::Kind kind, uint32_t qpn, uint32_t rkey,
                               uint64_t raddr, const std::string& data = "", uint64_t add = 0) {
  mooncake::v1::SoftnicOp op;
  op.set_kind(kind);
  op.set_responder_qpn(qpn);
  op.set_rkey(rkey);
  op.set_raddr(raddr);
  op.set_data(data);
  op.set_add(add);
  return op;
}

void SoftnicPeerSeeds() {
  const std::string t = "request_fuzzer";
  namespace v1 = mooncake::v1;
  v1::SoftnicBatch b;
  b.set_requester_node("node-b");
  b.set_requester_qpn(77);
  *b.add_ops() = PeerOp(v1::SoftnicOp::WRITE, 3, 4, 0x200040, "written by node-b");
  *b.add_ops() = PeerOp(v1::SoftnicOp::FETCH_ADD_64, 3, 4, 0x200040, "", 1);
  v1::SoftnicOp masked = PeerOp(v1::SoftnicOp::MASKED_FETCH_ADD_32, 3, 4, 0x200100, "", 0xffff);
  masked.set_field_boundary(0x80008000);
  *b.add_ops() = masked;
  Write(t, "softnic_peer_ops", Req(kSoftnicExecute, b));
  *b.add_ops() = PeerOp(v1::SoftnicOp::WRITE, 3, 4, 0x200ffa, "past the end");
  *b.add_ops() = PeerOp(v1::SoftnicOp::WRITE, 3, 4, 0x200000, "never executed");
  Write(t, "softnic_peer_stops_at_failure", Req(kSoftnicExecute, b));
  b.clear_ops();
  *b.add_ops() = PeerOp(v1::SoftnicOp::FETCH_ADD_64, 3, 4, 0x200004, "", 1);
  Write(t, "softnic_peer_misaligned", Req(kSoftnicExecute, b));
  b.clear_ops();
  *b.add_ops() = PeerOp(v1::SoftnicOp::WRITE, 3, 2, 0x100000, "A2's local-only region");
  Write(t, "softnic_peer_no_access", Req(kSoftnicExecute, b));
  b.set_requester_qpn(78);
  b.clear_ops();
  *b.add_ops() = PeerOp(v1::SoftnicOp::WRITE, 3, 4, 0x200000, "wrong requester");
  Write(t, "softnic_peer_wrong_requester", Req(kSoftnicExecute, b));
  b.clear_ops();
  *b.add_ops() = PeerOp(v1::SoftnicOp::FETCH_ADD_64, 4, 3, 0x100000, "", 1);
  Write(t, "softnic_peer_other_session", Req(kSoftnicExecute, b));
  b.clear_ops();
  *b.add_ops() = PeerOp(v1::SoftnicOp::WRITE, 1, 1, 0x100000, "to a QP in RESET");
  Write(t, "softnic_peer_not_ready", Req(kSoftnicExecute, b));
  b.clear_ops();
  *b.add_ops() = PeerOp(v1::SoftnicOp::FETCH_ADD_64, 3, 4, 0x200000, "atomics carry no data");
  Write(t, "softnic_peer_invalid_op", Req(kSoftnicExecute, b));
  b.set_requester_node("");
  Write(t, "softnic_peer_no_node", Req(kSoftnicExecute, b));
}

void RequestSeeds() {
  const std::string t = "request_fuzzer";
  namespace v1 = mooncake::v1;
  v1::HelloRequest hello;
  hello.set_protocol_version(mooncake::kProtocolVersion);
  hello.set_client_version("0.1.0");
  Write(t, "hello", Req(kHello, hello));
  v1::OpenSessionRequest open;
  open.set_client_name("trainer rank 3");
  Write(t, "open_session", Req(kOpenSession, open));
  Write(t, "get_node_info", Req(kGetNodeInfo, v1::GetNodeInfoRequest()));

  Write(t, "join_single", Req(kJoinGroup, Join("moe-layer0", 0, 1)));
  v1::JoinGroupRequest completes = Join("fuzz-forming", 1, 2);
  completes.mutable_device()->set_gpu_uuid("GPU-11111111-aaaa-bbbb-cccc-111111111111");
  Write(t, "join_completes_group", Req(kJoinGroup, completes));
  v1::JoinGroupRequest pci = Join("g.pci", 2, 4);
  pci.set_timeout_ms(5000);
  pci.mutable_device()->set_gpu_pci_bus_id("00000000:1B:00.0");
  Write(t, "join_waits_pci", Req(kJoinGroup, pci));
  v1::JoinGroupRequest fds = Join("with-fds", 0, 1);
  fds.mutable_handle()->set_fd_ticket("@ticket");
  Write(t, "join_with_fds", Req(kJoinGroup, fds));

  v1::LeaveGroupRequest leave;
  leave.set_group("fuzz-forming");
  Write(t, "leave_waiting", Req(kLeaveGroup, leave));
  leave.set_group("fuzz-formed");
  Write(t, "leave_formed", Req(kLeaveGroup, leave));
  v1::ReportReadyRequest ready;
  ready.set_group("fuzz-formed");
  ready.set_ok(true);
  Write(t, "ready_ok", Req(kReportReady, ready));
  ready.set_ok(false);
  ready.set_detail("rank 1 unreachable: \x1b[31mcudaErrorPeerAccessUnsupported");
  ready.add_unreachable_ranks(1);
  Write(t, "ready_failed", Req(kReportReady, ready));

  v1::ExportFdsRequest exp;
  exp.set_fd_ticket("@ticket");
  exp.set_kind("memfd");
  exp.set_size(4096);
  Write(t, "export_fds", Req(kExportFds, exp));
  v1::ImportFdsRequest imp;
  imp.set_secret("@secret");
  Write(t, "import_fds", Req(kImportFds, imp));

  Write(t, "get_status", Req(kGetStatus, v1::GetStatusRequest()));
  Write(t, "get_topology", Req(kGetTopology, v1::GetTopologyRequest()));
  Write(t, "list_sessions", Req(kListSessions, v1::ListSessionsRequest()));
  Write(t, "list_groups", Req(kListGroups, v1::ListGroupsRequest()));
  v1::PeerHelloRequest peer;
  peer.set_protocol_version(mooncake::kProtocolVersion);
  peer.set_node_id("gpu-node-02");
  peer.set_instance_id("0123456789abcdef");
  Write(t, "peer_hello", Req(kPeerHello, peer));
  Write(t, "get_peer_topology", Req(kGetPeerTopology, v1::GetPeerTopologyRequest()));
  v1::FdRequest get;
  get.set_op(v1::FdRequest::GET);
  get.set_session_token("@token");
  get.set_ticket("@ticket");
  Write(t, "fd_get", Req(kFdRequest, get));
  RdmaSeeds();
  WatchSeeds();
  SoftnicPeerSeeds();
}

// ---- broker_fuzzer: [op][arg][u16 len][bytes] ...
enum BrokerOp : char {
  bOpen,
  bJoin,
  bLeave,
  bReady,
  bPut,
  bExport,
  bImport,
  bGet,
  bEnd,
  bCancel,
  bEvents,
  bList
};

std::string Op(BrokerOp op, uint8_t arg, const std::string& bytes = "") {
  return std::string{op, static_cast<char>(arg)} + U16(bytes.size()) + bytes;
}
std::string Op(BrokerOp op, uint8_t arg, const google::protobuf::Message& m) {
  return Op(op, arg, m.SerializeAsString());
}

void BrokerSeeds() {
  const std::string t = "broker_fuzzer";
  namespace v1 = mooncake::v1;
  // Two clients form a group with fds, fetch each other's, report ready,
  // then one leaves and the other's session ends.
  v1::JoinGroupRequest j0 = Join("pair", 0, 2), j1 = Join("pair", 1, 2);
  j0.mutable_handle()->set_fd_ticket("@0");
  j1.mutable_handle()->set_fd_ticket("@0");
  v1::ReportReadyRequest r0, r1;
  r0.set_group("pair");
  r0.set_ok(true);
  r1 = r0;
  r1.set_rank(1);
  v1::LeaveGroupRequest l0;
  l0.set_group("pair");
  Write(t, "pair_with_fds",
        Op(bOpen, 0) + Op(bOpen, 1) + Op(bPut, 0) + Op(bPut, 1 | 0x10) + Op(bJoin, 0, j0) +
            Op(bJoin, 1, j1) + Op(bGet, 0) + Op(bGet, 1 | 0x10) + Op(bReady, 0, r0) +
            Op(bReady, 1, r1) + Op(bEvents, 0) + Op(bList, 0) + Op(bLeave, 0, l0) + Op(bEvents, 1) +
            Op(bEnd, 1) + Op(bList, 0));
  // A join that waits, is cancelled, joins again, and loses to a session end.
  v1::JoinGroupRequest w = Join("trio", 2, 3);
  v1::LeaveGroupRequest c;
  c.set_group("trio");
  c.set_rank(2);
  Write(t, "cancel_and_end",
        Op(bOpen, 2) + Op(bJoin, 2, w) + Op(bCancel, 2, c) + Op(bJoin, 2, w) + Op(bList, 0) +
            Op(bEnd, 2));
  // Export by one client, import by another of the same uid, then GET.
  v1::ExportFdsRequest e;
  e.set_fd_ticket("@0");
  e.set_kind("memfd");
  e.set_size(4096);
  v1::ImportFdsRequest i;
  i.set_secret("@0");
  Write(t, "export_import",
        Op(bOpen, 0) + Op(bOpen, 3) + Op(bPut, 0 | 0x20) + Op(bExport, 0, e) + Op(bImport, 3, i) +
            Op(bGet, 3) + Op(bList, 0));
  // One user past its limits (daemon_core.h): waiting joins, then view bytes.
  std::string waiting = Op(bOpen, 0);
  for (int g = 0; g < 9; ++g) waiting += Op(bJoin, 0, Join("wait" + std::to_string(g), 0, 2));
  Write(t, "budget_waiting", waiting + Op(bList, 0));
  std::string bytes = Op(bOpen, 1);
  for (int g = 0; g < 2; ++g) {
    v1::JoinGroupRequest big = Join("big" + std::to_string(g), 0, 1);
    big.mutable_handle()->set_data(std::string(2100, 'h'));
    bytes += Op(bJoin, 1, big);
  }
  Write(t, "budget_view_bytes", bytes + Op(bList, 0));
  // Two users with a group of the same name; root lists everything.
  Write(t, "two_users",
        Op(bOpen, 0) + Op(bOpen, 1 | 4) + Op(bOpen, 2 | 8) + Op(bJoin, 0, Join("same", 0, 2)) +
            Op(bJoin, 1, Join("same", 1, 2)) + Op(bJoin, 2, Join("same", 0, 1)) + Op(bList, 0));
}

// ---- fd_frame_fuzzer: [u8 fds][u16 len][bytes] chunks of the raw stream.
std::string Chunk(uint8_t fds, const std::string& bytes) {
  return std::string(1, static_cast<char>(fds)) + U16(bytes.size()) + bytes;
}
std::string FrameBytes(const google::protobuf::Message& m) {
  const std::string payload = m.SerializeAsString();
  return U32(payload.size()) + payload;
}

void FdFrameSeeds() {
  const std::string t = "fd_frame_fuzzer";
  namespace v1 = mooncake::v1;
  v1::FdRequest put;
  put.set_op(v1::FdRequest::PUT);
  put.set_session_token("@token");
  put.set_fd_count(2);
  const std::string put_frame = FrameBytes(put);
  // A PUT of two fds on the first byte, then a GET of its ticket (refused).
  v1::FdRequest get;
  get.set_op(v1::FdRequest::GET);
  get.set_session_token("@token");
  get.set_ticket("@0");
  Write(t, "put_then_get", Chunk(2, put_frame) + Chunk(0, FrameBytes(get)));
  // The same PUT with its fds spread over the bytes, one chunk per byte.
  std::string spread;
  for (size_t i = 0; i < put_frame.size(); ++i) {
    spread += Chunk(i < 2 ? 1 : 0, put_frame.substr(i, 1));
  }
  Write(t, "put_spread", spread);
  // An empty frame, then a request without a session.
  v1::FdRequest anon;
  anon.set_op(v1::FdRequest::GET);
  anon.set_ticket("t");
  Write(t, "empty_then_anonymous", Chunk(0, U32(0)) + Chunk(0, FrameBytes(anon)));
  // A PUT announcing 3 fds and carrying 2; a frame cut short.
  put.set_fd_count(3);
  Write(t, "put_count_mismatch", Chunk(2, FrameBytes(put)) + Chunk(0, U32(100) + "short"));
}

// ---- config_fuzzer: config text, or a command line starting with "--".
void ConfigSeeds() {
  const std::string t = "config_fuzzer";
  Write(t, "minimal", "socket = /tmp/mooncake.sock\n");
  Write(t, "full",
        "# every key\n"
        "socket = /run/mooncake/mooncaked.sock\n"
        "socket_mode = 0660\n"
        "socket_group = mooncake\n"
        "node_id = gpu-node-01\n"
        "log_level = warning   # trailing comment\n"
        "peer_listen = 0.0.0.0:7450\n"
        "sysfs_root = /sys\n"
        "cuda_library = libcuda.so.1\n"
        "join_timeout_ms = 30000\n"
        "max_world_size = 65536\n"
        "ticket_ttl_ms = 30000\n"
        "max_sessions_per_uid = 4096\n"
        "handshake_timeout_ms = 5000\n"
        "max_connections_per_uid = 256\n"
        "max_connections = 4096\n"
        "fd_channel_connections_per_uid = 32\n"
        "fd_channel_connections = 256\n"
        "max_fds_per_uid = 4096\n"
        "max_fds = 8192\n"
        "max_ranks_per_uid = 8192\n"
        "max_waiting_joins_per_uid = 4096\n"
        "max_view_bytes_per_uid = 268435456\n"
        "max_join_timeout_ms = 600000\n"
        "rdma_provider = auto\n"
        "rdma_gid_index = auto\n"
        "rdma_traffic_class = 0\n"
        "rdma_service_level = 0\n"
        "max_qps_per_session = 4096\n"
        "max_mrs_per_session = 256\n"
        "max_registered_bytes_per_session = 68719476736\n"
        "max_qps_per_uid = 32768\n"
        "max_mrs_per_uid = 2048\n"
        "max_registered_bytes_per_uid = 549755813888\n"
        "softnic_sink = false\n"
        "softnic_atomics = hca\n"
        "softnic_hca_atomic_window_us = 5\n"
        "softnic_hca_round_trip_us = 3\n");
  Write(t, "ipv6_peer", "peer_listen = [::1]:7450\n\t\n  socket_mode=0600\r\n");
  Write(t, "command_line",
        "--socket /tmp/m.sock --node-id=n1 --log-level debug --peer-listen [::]:7450 "
        "--socket-mode 0666");
  Write(t, "tenants",
        "socket = /run/mooncake/mooncaked.sock\n"
        "tenant_sockets = team-a, team-b:/run/mooncake/b/mooncaked.sock,ns.3\n");
  Write(t, "tenants_command_line", "--socket /tmp/m.sock --tenant-sockets a,b:/tmp/b.sock");
  Write(t, "rdma_tuning",
        "rdma_provider = mlx5\nrdma_devices = mlx5_0\nrdma_gid_index = 3\n"
        "rdma_traffic_class = 106\nrdma_service_level = 3\n");
}

// ---- escape_fuzzer: u8 max_len, then the text.
void EscapeSeeds() {
  const std::string t = "escape_fuzzer";
  Write(t, "plain", std::string("\x40") + "trainer rank 3");
  Write(t, "controls_and_bidi",
        std::string("\x10") +
            "a\nb\x1b[31m\xe2\x80\xae"
            "evil\xe2\x80\xa8\xc2\x85\\");
  Write(t, "invalid_utf8", std::string("\x08") + "\xff\xc0\xaf\xed\xa0\x80\xf4\x90\x80\x80ok");
  Write(t, "multibyte", std::string("\x05") + "\xe6\x97\xa5\xe6\x9c\xac\xf0\x9f\x98\x80\"q\"");
}

// ---- handle_fuzzer: i8 expected, i8 rank, i8 num_ranks, u8 m, m mask
// bytes, then 128-byte handles.
std::string Handle(mooncake::device::internal::HandleKind kind, const std::string& payload,
                   uint64_t map_bytes) {
  using namespace mooncake::device::internal;
  BufferHandle h;
  h.kind = kind;
  h.map_bytes = map_bytes;
  h.buffer_id = 0x1234abcd5678ef01ull;
  h.node_key = NodeKey("node-a");
  h.payload = payload;
  std::vector<int32_t> words = *EncodeHandle(h);
  std::string bytes;
  for (int32_t w : words) bytes += U32(static_cast<uint32_t>(w));
  return bytes;
}

void HandleSeeds() {
  using mooncake::device::internal::HandleKind;
  const std::string t = "handle_fuzzer";
  const std::string memfd = Handle(HandleKind::kMemfd, "", 2 << 20);
  const std::string ipc = Handle(HandleKind::kCudaIpc, std::string(64, '\x5a'), 256 << 20);
  const std::string vmm = Handle(HandleKind::kCudaVmmFd, "export-0123456789abcdef", 64 << 20);
  Write(t, "two_ranks", std::string{2, 0, 2, 0} + memfd + memfd);
  Write(t, "three_ranks_masked", std::string{3, 1, 3, 3, 1, 0, 1} + vmm + ipc + vmm);
  std::string foreign = memfd;
  foreign[0] = 'X';
  Write(t, "bad_magic_and_short", std::string{2, 1, 2, 0} + foreign + ipc.substr(0, 64));
}

}  // namespace

// ---- cluster_fuzzer: [op][arg][u16 len][bytes] ... (cluster_fuzzer.cc)
enum ClusterOp : char {
  cOpen,
  cJoin,
  cReady,
  cLeave,
  cRelease,
  cCancel,
  cEnd,
  cEvents,
  cRecord,
  cRecordGone,
  cAnswer,
  cList
};

std::string COp(ClusterOp op, uint8_t arg, const std::string& bytes = "") {
  return std::string{op, static_cast<char>(arg)} + U16(bytes.size()) + bytes;
}
// The first chunk byte of rank `rank` of a 4-rank group.
char Of4(uint32_t rank) { return static_cast<char>((rank << 2) | 2); }
// Another node's record of rank `rank` (world size 4): node-b, `pid`,
// state (0 JOINED, 1 READY, 2 FAILED, 3 LEFT, 4 LOST, 5 JOINING), epoch,
// and at most one release (rank, epoch).
std::string Rec(uint32_t rank, uint8_t pid, uint8_t state, uint8_t epoch, int released = -1,
                uint8_t released_epoch = 0) {
  std::string b{Of4(rank), 0, static_cast<char>(pid), static_cast<char>(state),
                static_cast<char>(epoch)};
  if (released < 0) return b + '\0';
  return b + static_cast<char>(1 | (1 << 1)) + static_cast<char>(released + 5 * released_epoch);
}

void ClusterSeeds() {
  const std::string t = "cluster_fuzzer";
  const std::string ok_claims =
      COp(cAnswer, 0, std::string(1, '\0')) + COp(cAnswer, 0, std::string(1, '\0'));
  // Ranks 0 and 1 here, 2 and 3 on node-b: the group forms once both
  // local claims are in, and everyone reports ready.
  const std::string form = COp(cOpen, 0) + COp(cOpen, 1) + COp(cJoin, 0, {Of4(0), 0}) +
                           COp(cJoin, 1, {Of4(1), 0}) + COp(cRecord, 0, Rec(2, 20, 0, 0)) +
                           COp(cRecord, 0, Rec(3, 30, 0, 0)) + ok_claims;
  const std::string ready = COp(cReady, 0, {Of4(0), 0}) + COp(cReady, 1, {Of4(1), 0}) +
                            COp(cRecord, 0, Rec(2, 20, 1, 1)) + COp(cRecord, 0, Rec(3, 30, 1, 1));
  Write(t, "form_across_nodes", form + ready + COp(cList, 0) + COp(cEvents, 0));
  // node-b's rank 2 is lost; both survivors here and rank 3 there release
  // it; a replacement on node-b claims it (JOINING): the group re-forms.
  const std::string lost = COp(cRecord, 0, Rec(2, 20, 4, 1)) + COp(cRelease, 0, {Of4(0), 2}) +
                           COp(cRelease, 1, {Of4(1), 2}) + COp(cRecord, 0, Rec(3, 30, 1, 1, 2, 1));
  Write(t, "remote_rank_replaced_remotely",
        form + ready + lost + COp(cRecord, 0, Rec(2, 21, 5, 1)) + COp(cEvents, 0) +
            COp(cEvents, 1) + COp(cList, 0));
  // The same loss, the replacement joining here.
  Write(t, "remote_rank_replaced_here",
        form + ready + lost + COp(cOpen, 2) + COp(cJoin, 2, {Of4(2), 0}) +
            COp(cAnswer, 0, std::string(1, '\0')) + COp(cEvents, 0) + COp(cList, 0));
  // node-b dies: both its records vanish.
  Write(t, "node_gone",
        form + ready + COp(cRecordGone, 0, {Of4(2)}) + COp(cRecordGone, 0, {Of4(3)}) +
            COp(cEvents, 0) + COp(cList, 0));
  // A local rank lost and replaced while node-b's ranks hold on; a
  // competing replacement's record arrives while ours waits for its claim.
  Write(t, "local_rank_replaced_with_a_rival",
        form + ready + COp(cEnd, 1) + COp(cRecord, 0, Rec(3, 30, 1, 1, 1, 1)) + COp(cOpen, 1) +
            COp(cJoin, 1, {Of4(1), 0}) + COp(cRecord, 0, {Of4(1), 1, 40, 5, 1, 0}) +
            COp(cAnswer, 0, "\2") + COp(cEvents, 0));
  // Raw JSON a daemon would not write.
  Write(t, "raw_records",
        form + COp(cRecord, 0, std::string(1, Of4(2)) + "{\"node_id\":\"node-b\"}") +
            COp(cRecord, 0, "{\"world_size\":4,\"node_id\":\"x\",\"epoch\":\"9007199254740993\"}") +
            COp(cAnswer, 0, "\1") + COp(cList, 0));
}

// ---- copy_agent_fuzzer: flags, four u32 words, two agent scripts, then
// daemon steps (copy_agent_fuzzer.cc, hostile_copy_agent.h).
std::string U64(uint64_t v) { return U32(v & 0xffffffffu) + U32(v >> 32); }
// An agent step: kind, arg, value. Word w written with value mode m is arg
// w + 20 * m (hostile_copy_agent.h).
std::string AStep(int kind, int arg, uint64_t value = 0) {
  return std::string{static_cast<char>(kind), static_cast<char>(arg)} + U64(value);
}
std::string AScript(const std::vector<std::string>& steps) {
  std::string out(1, static_cast<char>(steps.size()));
  for (const auto& step : steps) out += step;
  return out;
}
// A daemon step: kind (0 ToDevice, 1 FromDevice, 2 WithinDevice, 3 Between,
// 4 Mirror, 5 MirrorThenWrite, 6 usable, 7 punch staging, 8 punch header,
// 9 FetchAdd: x the word, y the add (bit 0: masked), n the boundary),
// link (0 A, 1 B), whole staging pieces, x, y, n.
std::string DStep(int kind, int link, int pieces, uint64_t x, uint64_t y, uint16_t n) {
  return std::string{static_cast<char>(kind), static_cast<char>(link | (pieces << 1))} + U64(x) +
         U64(y) + U16(n);
}

void CopyAgentSeeds() {
  const std::string t = "copy_agent_fuzzer";
  enum { kWait, kWrite, kSleep, kServe, kPassGate, kClose, kFutexSleep };
  const std::string none = AScript({});
  const auto head = [](int flags, uint32_t a_seq = 0, uint32_t b_seq = 0) {
    return std::string(1, static_cast<char>(flags)) + U32(a_seq) + U32(0) + U32(b_seq) + U32(0);
  };
  const std::string honest = head(1 | 2 | 4 | 8) + none + none;
  Write(t, "honest_both_ways",
        honest + DStep(0, 0, 0, 0x1000, 0, 100) + DStep(1, 0, 1, 0x2000, 9, 4464) +
            DStep(2, 1, 0, 0x3000, 0x4000, 5000) + DStep(3, 0, 2, 0x5000, 0x6000, 7) +
            DStep(4, 0, 0, 0x1000, 0, 64) + DStep(6, 1, 0, 0, 0, 0));
  Write(t, "silent_agent",
        head(0) + none + none + DStep(0, 0, 0, 0x1000, 0, 64) + DStep(0, 0, 0, 0x1000, 0, 64) +
            DStep(6, 0, 0, 0x1000, 0, 64));
  // The agent sits in a CUDA call (busy since 50 ms ago), then serves.
  Write(t, "stalled_then_served",
        head(1 | 4) +
            AScript(
                {AStep(kWait, 0), AStep(kWrite, 3 + 20 * 3, 50'000'000), AStep(kSleep, 0, 1500)}) +
            none + DStep(0, 0, 0, 0x1000, 0, 4096) + DStep(5, 0, 0, 0x1000, 1, 4096) +
            DStep(0, 0, 0, 0x1000, 0, 4096) + DStep(6, 0, 0, 0x1000, 0, 4096));
  // A block passes the gate and never says it landed; the agent took the
  // request and stalls: the daemon waits out its landing bound.
  Write(t, "gate_passed_never_landed",
        head(4) +
            AScript({AStep(kWait, 0), AStep(kPassGate, 1, 1), AStep(kWrite, 5 + 20 * 1),
                     AStep(kWrite, 3 + 20 * 3, 10'000'000)}) +
            none + DStep(0, 0, 0, 0x1000, 0, 16) + DStep(4, 0, 0, 0x1000, 0, 8) +
            DStep(5, 0, 0, 0x1008, 0, 8) + DStep(6, 0, 0, 0x1000, 0, 16));
  // Atomics: one answered without running (no answer written), then one
  // whose kernel passes the gate and never lands (the outcome is unknown),
  // then a within copy on the paused link.
  Write(t, "atomics_not_run_then_unknown",
        head(4) +
            AScript({AStep(kWait, 0), AStep(kServe, 0), AStep(kWait, 0), AStep(kPassGate, 1, 1),
                     AStep(kWrite, 3 + 20 * 3, 10'000'000)}) +
            none + DStep(9, 0, 0, 0x1000, 6, 0) + DStep(9, 0, 0, 0x1008, 7, 0x8000) +
            DStep(2, 0, 0, 0x2000, 0x1000, 64) + DStep(6, 0, 0, 0x1000, 0, 8));
  // Both channels of one process and context: Between lands through B's
  // agent alone, each way, gated and not.
  Write(t, "one_process_between",
        head(1 | 2 | 4 | 16) + none + none + DStep(3, 0, 0, 0x1000, 0x2000, 4096) +
            DStep(3, 1, 1, 0x2000, 0x1000, 100) + DStep(6, 0, 0, 0, 0, 0));
  Write(t, "closes_mid_request",
        head(0) + AScript({AStep(kWait, 0), AStep(kClose, 0)}) + none +
            DStep(0, 0, 0, 0x1000, 0, 64) + DStep(3, 1, 0, 0, 0, 64));
  Write(t, "punched_staging",
        head(1 | 2) + none + none + DStep(7, 0, 0, 0, 3, 0) + DStep(0, 0, 1, 0x1000, 0, 0) +
            DStep(4, 0, 0, 0x1000, 0, 4096) + DStep(8, 1, 0, 0, 0, 0) +
            DStep(1, 1, 0, 0x1000, 0, 64));
  Write(t, "sequence_wraps",
        head(1 | 2 | 4 | 8, 0xfffffffeu, 0xffffffffu) + none + none + DStep(0, 0, 0, 0x1000, 0, 8) +
            DStep(0, 0, 0, 0x1000, 0, 8) + DStep(2, 1, 0, 0x1000, 0x2000, 8) +
            DStep(0, 1, 0, 0x1000, 0, 8));
  // A futex sleep, a CUDA error for the answer (left 1.5 ms for the daemon
  // to read), then words no agent writes: the gate, the magic, and the
  // daemon's own request number.
  Write(t, "lying_words",
        head(1) +
            AScript({AStep(kFutexSleep, 0), AStep(kWait, 0), AStep(kWrite, 1, 7),
                     AStep(kWrite, 0 + 20 * 1), AStep(kSleep, 0, 1500), AStep(kWrite, 7, 1),
                     AStep(kWrite, 8 + 20 * 1), AStep(kWrite, 13, 0),
                     AStep(kWrite, 11 + 20 * 4, 1)}) +
            none + DStep(0, 0, 0, 0x1000, 0, 64) + DStep(0, 0, 0, 0x1000, 0, 64) +
            DStep(1, 0, 0, 0x1000, 0, 64));
}

// ---- wqe_ring_fuzzer: flags, then steps (wqe_ring_fuzzer.cc). WQEs are
// built with index, QPN and keys 0; the fix bits put the right ones in, and
// addresses say where in the region the picks name (Near: offset o inside
// is o << 2, o bytes before its end (o << 2) | 1).
uint64_t In(uint64_t offset) { return offset << 2; }
uint64_t BeforeEnd(uint64_t back) { return (back << 2) | 1; }
std::string Wqe(int fix, int picks, const mooncake::device::mlx5::Wqe64& w) {
  std::string out{'\0', static_cast<char>(fix), static_cast<char>(picks)};
  out.append(reinterpret_cast<const char*>(&w), sizeof(w));
  return out;
}
std::string Doorbell(int how, uint16_t v = 0) {
  return std::string{'\1', static_cast<char>(how)} + U16(v);
}
std::string CqBehind(uint16_t k) { return std::string(1, '\2') + U16(k); }
const std::string kDrain(1, '\3');

void WqeRingSeeds() {
  namespace mlx5 = mooncake::device::mlx5;
  const std::string t = "wqe_ring_fuzzer";
  constexpr int kIdx = 1, kCqe = 2, kRemote = 4, kLocal = 8, kLocal2 = 16, kSecond = 32,
                kFence = 128;
  const auto depth = [](int log4) { return static_cast<char>(log4 << 3); };
  mlx5::Wqe64 write, imm, inl, fa64, fa32, nop;
  mlx5::build_rdma_write(&write, 0, 0, 0, In(16), 0, In(32), 0, 1000);
  mlx5::build_rdma_write_imm(&imm, 0, 0, 0, In(2048), 0, In(0), 0, 64, 0x1234);
  const uint8_t payload[20] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19};
  mlx5::build_rdma_write_inline(&inl, 0, 0, 0, In(100), 0, payload, sizeof(payload));
  mlx5::build_atomic_fa64(&fa64, 0, 0, 0, In(64), 0, 5, In(8), 0);
  mlx5::build_masked_fa32(&fa32, 0, 0, 0, In(4), 0, 7, In(16), 0);
  mlx5::build_nop(&nop, 0, 0, 0);
  const int ok_write = kIdx | kCqe | kRemote | kLocal;
  const int ok_atomic = kIdx | kCqe | kRemote | kLocal2;
  // picks: remote (picks % 8) 0 = dst, 1 = dst_nowrite, 2 = dst_noatomic,
  // 3 = a_remote; local ((picks >> 3) % 8) 0 = src, 1 = src_ro, 2 = fetch.
  const int fetch = 2 << 3;
  Write(t, "every_kind",
        std::string(1, depth(2)) + Wqe(ok_write, 0, write) + Wqe(ok_write, 0, imm) +
            Wqe(kIdx | kCqe | kRemote, 0, inl) + Wqe(ok_atomic, fetch, fa64) +
            Wqe(ok_atomic, 1 | fetch, fa32) + Wqe(kIdx | kCqe, 0, nop) + Doorbell(0) + kDrain);
  // Keys as the bytes say (0): the first WQE fails, the rest flush.
  Write(t, "unknown_keys",
        std::string(1, depth(2)) + Wqe(kIdx | kCqe, 0, write) + Wqe(ok_write, 0, write) +
            Doorbell(0) + kDrain);
  // Each right missing: WRITE into dst_nowrite, an atomic on dst_noatomic,
  // the fetch into src_ro, the other pd's regions.
  Write(t, "rights_write",
        std::string(1, depth(1)) + Wqe(ok_write, 1, write) + Doorbell(0) + kDrain);
  Write(t, "rights_atomic",
        std::string(1, depth(1)) + Wqe(ok_atomic, 2 | fetch, fa64) + Doorbell(0) + kDrain);
  Write(t, "rights_fetch_read_only",
        std::string(1, depth(1)) + Wqe(ok_atomic, 1 << 3, fa64) + Doorbell(0) + kDrain);
  Write(t, "rights_other_domain",
        std::string(1, depth(1)) + Wqe(ok_write, 3, write) + Doorbell(0) + kDrain);
  // At the very end of dst (fits), then 4 bytes past it (fails).
  mlx5::Wqe64 at_end, past_end;
  mlx5::build_rdma_write(&at_end, 0, 0, 0, BeforeEnd(8), 0, In(0), 0, 8);
  mlx5::build_rdma_write(&past_end, 0, 0, 0, BeforeEnd(4), 0, In(0), 0, 8);
  Write(t, "write_at_and_past_the_end",
        std::string(1, depth(1)) + Wqe(ok_write, 0, at_end) + Wqe(ok_write, 0, past_end) +
            Doorbell(0) + kDrain);
  // A doorbell far past the ring, then more work.
  Write(t, "garbage_doorbell",
        std::string(1, depth(1)) + Wqe(ok_write, 0, write) + Doorbell(1, 1000) + kDrain +
            Wqe(ok_write, 0, write) + Doorbell(0) + kDrain);
  // kHca with a round trip: an atomic, then a fenced WRITE waits for it.
  Write(t, "fence_after_atomic",
        std::string(1, static_cast<char>(1 | 2 | depth(2))) + Wqe(ok_atomic, fetch, fa64) +
            Wqe(ok_write | kFence, 0, write) + Wqe(ok_atomic | kFence, fetch, fa64) + Doorbell(0) +
            kDrain);
  // Two requesters, a deeper CQ, and a consumer index behind what was read.
  Write(t, "two_qps_cq_behind",
        std::string(1, static_cast<char>(4 | 32 | depth(1))) + Wqe(ok_write, 0, write) +
            Wqe(ok_write | kSecond, 0, imm) + Doorbell(0) + Doorbell(1 * 3 + 0) + CqBehind(3) +
            kDrain);
  // A ring of one WQE: index and owner bits wrap on every post.
  std::string wraps(1, depth(0));
  for (int i = 0; i < 24; ++i) wraps += Wqe(kIdx | kCqe | kRemote, 0, inl) + Doorbell(0) + kDrain;
  Write(t, "ring_of_one_wraps", wraps);
}

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR   (writes CORPUS_DIR/<fuzzer>/<seed>)\n", argv[0]);
    return 2;
  }
  out_dir = argv[1];
  ::mkdir(out_dir.c_str(), 0755);
  RequestSeeds();
  BrokerSeeds();
  ClusterSeeds();
  FdFrameSeeds();
  ConfigSeeds();
  EscapeSeeds();
  HandleSeeds();
  CopyAgentSeeds();
  WqeRingSeeds();
  std::printf("wrote %d seeds under %s\n", written, out_dir.c_str());
  return 0;
}
