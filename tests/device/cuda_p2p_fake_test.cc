// The CUDA P2pTransport's handle-kind choice and peer mapping, on the host:
// the transport runs against FakeCudaDriver (drivers/fake/), whose VMM
// memory is memfd-backed host memory and whose fabric handles work once the
// test says the node has an IMEX channel. Covers fabric handles (MNNVL):
// chosen when the GPU reports them and an export succeeds, the logged
// fallback to VMM fds when the export fails, no attempt when the GPU lacks
// them, the explicit request's errors, and groups whose ranks chose
// differently. Verification (a kernel launch) cannot run here; mappings are
// checked by storing through one and loading through the other.
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "buffer_handle.h"
#include "cuda_p2p_transport.h"
#include "fake_cuda_driver.h"
#include "fake_handle_exchange.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "mooncake/common/log.h"

namespace mooncake::device {
namespace {

using drivers::FakeCudaDriver;
using drivers::FakeGpu;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr size_t kBytes = 1 << 20;

// An exchange that claims to run on `node`: forwards the fds to one shared
// in-process exchange.
class NodeExchange final : public HandleExchange {
 public:
  NodeExchange(std::shared_ptr<testing::InProcessHandleExchange> fds, std::string node)
      : fds_(std::move(fds)), node_(std::move(node)) {}
  absl::StatusOr<std::string> exportFds(const std::vector<int>& fds, std::string_view kind,
                                        uint64_t size) override {
    return fds_->exportFds(fds, kind, size);
  }
  absl::StatusOr<std::vector<UniqueFd>> importFds(std::string_view exported) override {
    return fds_->importFds(exported);
  }
  std::string nodeId() const override { return node_; }

 private:
  std::shared_ptr<testing::InProcessHandleExchange> fds_;
  std::string node_;
};

class CudaP2pFakeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cu_ = std::make_shared<FakeCudaDriver>();
    ASSERT_EQ(cu_->init(0), drivers::kCudaSuccess);
    cu_->addGpu(FakeGpu::Hopper(0));  // reports fabric handles
    cu_->setModulesLoadable(true);    // the verification kernel "loads"
    fds_ = std::make_shared<testing::InProcessHandleExchange>();
  }

  std::shared_ptr<HandleExchange> Exchange(std::string node = "node-a") {
    return std::make_shared<NodeExchange>(fds_, std::move(node));
  }

  absl::StatusOr<std::unique_ptr<BrokeredP2pTransport>> Make(CudaHandleKind kind,
                                                             std::shared_ptr<HandleExchange> ex,
                                                             int num_ranks = 2) {
    return internal::CreateCudaP2pTransport(num_ranks, std::move(ex), kind, cu_);
  }

  // Creates a transport with stderr captured; `log` gets what was logged.
  absl::StatusOr<std::unique_ptr<BrokeredP2pTransport>> MakeLogged(
      CudaHandleKind kind, std::shared_ptr<HandleExchange> ex, std::string* log) {
    ::testing::internal::CaptureStderr();
    auto t = Make(kind, std::move(ex));
    *log = ::testing::internal::GetCapturedStderr();
    return t;
  }

  // Two fabric transports on two nodes (an IMEX channel present), a buffer
  // each, and their upstream-route handles.
  struct TwoNodes {
    std::unique_ptr<BrokeredP2pTransport> a, b;
    void* pa = nullptr;
    void* pb = nullptr;
    std::vector<std::vector<int32_t>> handles;
  };
  TwoNodes FabricOnTwoNodes() {
    cu_->setImexChannel(true);
    TwoNodes n;
    auto a = Make(CudaHandleKind::kFabric, Exchange("node-a"));
    auto b = Make(CudaHandleKind::kFabric, Exchange("node-b"));
    EXPECT_TRUE(a.ok() && b.ok());
    if (!a.ok() || !b.ok()) return n;
    n.a = *std::move(a);
    n.b = *std::move(b);
    n.pa = n.a->allocateBuffer(kBytes);
    n.pb = n.b->allocateBuffer(kBytes);
    n.handles = {n.a->exportIpcHandle(n.pa), n.b->exportIpcHandle(n.pb)};
    return n;
  }

  static int FabricLines(const std::string& log) {
    int n = 0;
    for (absl::string_view line : absl::StrSplit(log, '\n')) {
      if (absl::StrContains(line, "fabric")) ++n;
    }
    return n;
  }

  // Stores through `writer`'s own buffer, loads through `reader`'s mapping
  // of it (the fake's device pointers are host addresses).
  static void ExpectShared(void* writer_local, void* reader_view, uint64_t value) {
    if (writer_local == nullptr || reader_view == nullptr) {
      ADD_FAILURE() << "no mapping to check (writer " << writer_local << ", reader " << reader_view
                    << ")";
      return;
    }
    std::memcpy(writer_local, &value, sizeof(value));
    uint64_t seen = 0;
    std::memcpy(&seen, reader_view, sizeof(seen));
    EXPECT_EQ(seen, value);
  }

  std::shared_ptr<FakeCudaDriver> cu_;
  std::shared_ptr<testing::InProcessHandleExchange> fds_;
};

TEST_F(CudaP2pFakeTest, AutoPicksFabricWhenTheExportWorks) {
  cu_->setImexChannel(true);
  std::string log;
  auto t = MakeLogged(CudaHandleKind::kAuto, Exchange(), &log);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->handleKind(), "cuda-fabric");
  EXPECT_EQ(FabricLines(log), 0) << log;
  EXPECT_EQ(cu_->calls("memCreate"), 1) << "one probe allocation";
  EXPECT_EQ(cu_->liveHandles(), 0u) << "the probe allocation is released";
  // The handle needs no exchange: the 64-byte fabric handle is inside it.
  auto bare = Make(CudaHandleKind::kAuto, nullptr);
  ASSERT_TRUE(bare.ok()) << bare.status();
  EXPECT_EQ((*bare)->handleKind(), "cuda-fabric");
}

// Upstream route without any exchange: only the fabric import can map.
TEST_F(CudaP2pFakeTest, FabricPeersMapThroughTheFabricHandle) {
  cu_->setImexChannel(true);
  std::unique_ptr<BrokeredP2pTransport> t[2];
  void* buf[2];
  std::vector<std::vector<int32_t>> handles(2);
  for (int r = 0; r < 2; ++r) {
    auto made = Make(CudaHandleKind::kFabric, nullptr);
    ASSERT_TRUE(made.ok()) << made.status();
    t[r] = *std::move(made);
    buf[r] = t[r]->allocateBuffer(kBytes);
    ASSERT_NE(buf[r], nullptr) << t[r]->lastError();
    handles[r] = t[r]->exportIpcHandle(buf[r]);
    ASSERT_FALSE(handles[r].empty()) << t[r]->lastError();
    auto h = internal::DecodeHandle(handles[r]);
    ASSERT_TRUE(h.ok()) << h.status();
    EXPECT_EQ(h->kind, internal::HandleKind::kCudaFabric);
    EXPECT_EQ(h->payload.size(), internal::kFabricHandleBytes);
  }
  const int imports_before = cu_->calls("memImportFromShareableHandle");
  for (int r = 0; r < 2; ++r) {
    t[r]->importPeerHandles(buf[r], r, 2, handles, {});
    EXPECT_TRUE(t[r]->lastError().ok()) << t[r]->lastError();
    EXPECT_TRUE(t[r]->allPeersAccessible());
  }
  EXPECT_EQ(cu_->calls("memImportFromShareableHandle") - imports_before, 2);
  void** peers0 = t[0]->peerPtrsTablePtr();
  void** peers1 = t[1]->peerPtrsTablePtr();
  ASSERT_NE(peers0[1], nullptr);
  ASSERT_NE(peers0[1], buf[1]) << "a second mapping, not the owner's address";
  ExpectShared(buf[1], peers0[1], 0x1111222233334444ull);
  ExpectShared(buf[0], peers1[0], 0x5555666677778888ull);
}

// The join route sends a fabric buffer's POSIX fd beside its handle; a
// fabric importer still maps through the fabric handle, so the fd is not
// needed.
TEST_F(CudaP2pFakeTest, JoinRouteFabricHandlesNeedNoFd) {
  cu_->setImexChannel(true);
  auto a = Make(CudaHandleKind::kFabric, nullptr);
  auto b = Make(CudaHandleKind::kFabric, nullptr);
  ASSERT_TRUE(a.ok() && b.ok());
  void* pa = (*a)->allocateBuffer(kBytes);
  void* pb = (*b)->allocateBuffer(kBytes);
  auto eb = (*b)->exportLocal(pb);
  ASSERT_TRUE(eb.ok()) << eb.status();
  EXPECT_EQ(eb->fds.size(), 1u) << "the POSIX fd for same-node ranks without fabric handles";
  std::vector<PeerBuffer> peers(2);
  peers[1].handle = eb->handle;  // no fds
  ASSERT_TRUE((*a)->mapPeers(pa, 0, 2, std::move(peers), {}).ok()) << (*a)->lastError();
  ExpectShared(pb, (*a)->peerPtrsTablePtr()[1], 42);
}

// MNNVL: a fabric handle from another node is mapped, not left to RDMA;
// a VMM-fd transport leaves the same off-node rank to the RDMA route.
TEST_F(CudaP2pFakeTest, FabricMapsRanksOfOtherNodes) {
  TwoNodes n = FabricOnTwoNodes();
  ASSERT_NE(n.a, nullptr);
  std::vector<std::vector<int32_t>>& handles = n.handles;
  n.a->importPeerHandles(n.pa, 0, 2, handles, {});
  EXPECT_TRUE(n.a->allPeersAccessible()) << n.a->lastError();
  ExpectShared(n.pb, n.a->peerPtrsTablePtr()[1], 7);

  auto v = Make(CudaHandleKind::kVmmPosixFd, Exchange("node-a"));
  ASSERT_TRUE(v.ok()) << v.status();
  void* pv = (*v)->allocateBuffer(kBytes);
  handles[0] = (*v)->exportIpcHandle(pv);
  (*v)->importPeerHandles(pv, 0, 2, handles, {});
  EXPECT_TRUE((*v)->lastError().ok()) << (*v)->lastError();
  EXPECT_FALSE((*v)->allPeersAccessible()) << "off-node without fabric: the RDMA route's";
  EXPECT_EQ((*v)->peerPtrsTablePtr()[1], nullptr);
}

// Upstream's default (MC_USE_NVLINK_IPC unset): same-node sharing, and no
// fabric probe at all, though the GPU and an IMEX channel offer it.
TEST_F(CudaP2pFakeTest, SameNodeKindNeverTriesFabric) {
  cu_->setImexChannel(true);
  auto t = Make(CudaHandleKind::kSameNode, Exchange());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->handleKind(), "cuda-vmm-fd");
  EXPECT_EQ(cu_->calls("memCreate"), 0) << "no fabric probe";
}

// MNNVL tables: a fabric rank of another node is available with its
// pointer; a VMM-fd rank of that node is not (the RDMA route's), and that
// is no error.
TEST_F(CudaP2pFakeTest, FabricCrossNodePeersAreInTheAvailableTable) {
  cu_->setImexChannel(true);
  auto a = Make(CudaHandleKind::kFabric, Exchange("node-a"), 3);
  auto b = Make(CudaHandleKind::kFabric, Exchange("node-b"), 3);
  auto c = Make(CudaHandleKind::kVmmPosixFd, Exchange("node-b"), 3);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  void* pa = (*a)->allocateBuffer(kBytes);
  void* pb = (*b)->allocateBuffer(kBytes);
  void* pc = (*c)->allocateBuffer(kBytes);
  const std::vector<std::vector<int32_t>> handles = {
      (*a)->exportIpcHandle(pa), (*b)->exportIpcHandle(pb), (*c)->exportIpcHandle(pc)};
  (*a)->importPeerHandles(pa, 0, 3, handles, {});
  EXPECT_TRUE((*a)->lastError().ok()) << (*a)->lastError();
  EXPECT_EQ((*a)->availableSnapshot(), (std::vector<int32_t>{1, 1, 0}));
  const auto* available = static_cast<const int32_t*>((*a)->availableTablePtr());
  EXPECT_EQ(available[1], 1);
  EXPECT_EQ(available[2], 0);
  EXPECT_EQ((*a)->peerPtrsTablePtr()[2], nullptr);
  EXPECT_FALSE((*a)->allPeersAccessible());
  ExpectShared(pb, (*a)->peerPtrsTablePtr()[1], 11);
}

// A second import replaces the first: dropped ranks leave the tables,
// mappings do not pile up, and the tables stay where they are.
TEST_F(CudaP2pFakeTest, ReimportReplacesTheTablesAndMappings) {
  for (CudaHandleKind kind : {CudaHandleKind::kFabric, CudaHandleKind::kVmmPosixFd}) {
    SCOPED_TRACE(kind == CudaHandleKind::kFabric ? "fabric" : "vmm-fd");
    cu_->setImexChannel(true);
    auto a = Make(kind, Exchange("node-a"));
    auto b = Make(kind, Exchange("node-a"));
    ASSERT_TRUE(a.ok() && b.ok());
    void* pa = (*a)->allocateBuffer(kBytes);
    void* pb = (*b)->allocateBuffer(kBytes);
    const std::vector<std::vector<int32_t>> handles = {(*a)->exportIpcHandle(pa),
                                                       (*b)->exportIpcHandle(pb)};
    (*a)->importPeerHandles(pa, 0, 2, handles, {});
    ASSERT_TRUE((*a)->allPeersAccessible()) << (*a)->lastError();
    const size_t mapped = cu_->liveMappings();
    void* const table = (*a)->peerPtrsTablePtr();
    (*a)->importPeerHandles(pa, 0, 2, handles, {1, 0});
    EXPECT_EQ(static_cast<const int32_t*>((*a)->availableTablePtr())[1], 0);
    EXPECT_EQ((*a)->peerPtrsTablePtr()[1], nullptr);
    EXPECT_LT(cu_->liveMappings(), mapped);
    for (int round = 0; round < 3; ++round) {
      (*a)->importPeerHandles(pa, 0, 2, handles, {});
      EXPECT_EQ(cu_->liveMappings(), mapped) << "round " << round;
      EXPECT_EQ((*a)->peerPtrsTablePtr(), table);
    }
    ExpectShared(pb, (*a)->peerPtrsTablePtr()[1], 13);
    // Freeing the imported-for buffer drops its peers too.
    (*a)->freeBuffer(pa);
    EXPECT_EQ((*a)->availableSnapshot(), (std::vector<int32_t>{0, 0}));
    EXPECT_EQ((*a)->peerPtrsTablePtr()[1], nullptr);
    EXPECT_EQ((*a)->p2pContext().local_base, nullptr);
  }
}

// Another node's fabric handle that does not import here (another NVLink
// domain): the rank is left to the RDMA route as it was before fabric
// handles, and the transport stays healthy.
TEST_F(CudaP2pFakeTest, AnOffNodeFabricHandleThatDoesNotImportTakesTheRdmaRoute) {
  TwoNodes n = FabricOnTwoNodes();
  ASSERT_NE(n.a, nullptr);
  cu_->failNext("memImportFromShareableHandle", drivers::kCudaErrorNotPermitted);
  n.a->importPeerHandles(n.pa, 0, 2, n.handles, {});
  EXPECT_TRUE(n.a->lastError().ok()) << n.a->lastError();
  EXPECT_FALSE(n.a->allPeersAccessible());
  EXPECT_EQ(n.a->peerPtrsTablePtr()[1], nullptr);
}

TEST_F(CudaP2pFakeTest, AutoFallsBackToVmmFdsWhenTheFabricExportFails) {
  // No IMEX channel (the fake's default, and the machines here): the GPU
  // reports fabric handles, cuMemCreate works, the export does not.
  std::string log;
  auto t = MakeLogged(CudaHandleKind::kAuto, Exchange(), &log);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->handleKind(), "cuda-vmm-fd");
  EXPECT_EQ(FabricLines(log), 1) << "one line says why:\n" << log;
  EXPECT_THAT(
      log, AllOf(HasSubstr("GPU 0: fabric handles unavailable"),
                 HasSubstr("cuMemExportToShareableHandle(fabric)"),
                 HasSubstr("CUDA_ERROR_NOT_SUPPORTED"), HasSubstr("/dev/nvidia-caps-imex-channels"),
                 HasSubstr("fabric manager"), HasSubstr("using VMM POSIX fds")));
  EXPECT_EQ(cu_->liveHandles(), 0u) << "the probe allocation is released";
  void* p = (*t)->allocateBuffer(kBytes);
  ASSERT_NE(p, nullptr) << (*t)->lastError();
  auto e = (*t)->exportLocal(p);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(internal::DecodeHandle(e->handle)->kind, internal::HandleKind::kCudaVmmFd);
}

TEST_F(CudaP2pFakeTest, AutoFallsBackWhenTheFabricAllocationFails) {
  cu_->setImexChannel(true);
  cu_->failNext("memCreate", drivers::kCudaErrorNotPermitted);
  std::string log;
  auto t = MakeLogged(CudaHandleKind::kAuto, Exchange(), &log);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->handleKind(), "cuda-vmm-fd");
  EXPECT_EQ(FabricLines(log), 1) << log;
  EXPECT_THAT(log, AllOf(HasSubstr("cuMemCreate(fabric handle type)"),
                         HasSubstr("CUDA_ERROR_NOT_PERMITTED"), HasSubstr("IMEX channel")));
  // Without an exchange the fallback is legacy IPC, still in one line.
  cu_->failNext("memCreate", drivers::kCudaErrorNotPermitted);
  auto bare = MakeLogged(CudaHandleKind::kAuto, nullptr, &log);
  ASSERT_TRUE(bare.ok()) << bare.status();
  EXPECT_EQ((*bare)->handleKind(), "cuda-ipc");
  EXPECT_EQ(FabricLines(log), 1) << log;
  EXPECT_THAT(log, AllOf(HasSubstr("CUDA_ERROR_NOT_PERMITTED"), HasSubstr("legacy IPC")));
}

// Issue 24 item 9: the probe is one driver allocation, made once per
// driver (per process for the real one) and device; and a process without
// IMEX channel device files makes none (the call could only fail, and
// compute-sanitizer counted that failure as an error).
TEST_F(CudaP2pFakeTest, TheFabricProbeRunsOnceAndNotWithoutAnImexChannel) {
  cu_->setImexDeviceFiles(false);
  std::string log;
  auto none = MakeLogged(CudaHandleKind::kAuto, Exchange(), &log);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ((*none)->handleKind(), "cuda-vmm-fd");
  EXPECT_EQ(cu_->calls("memCreate"), 0) << "no probe allocation without an IMEX channel";
  EXPECT_THAT(log, AllOf(HasSubstr("no IMEX channel in this process"),
                         HasSubstr("/dev/nvidia-caps-imex-channels")));

  cu_->setImexDeviceFiles(true);
  cu_->setImexChannel(true);
  auto first = Make(CudaHandleKind::kAuto, Exchange());
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ((*first)->handleKind(), "cuda-fabric");
  const int creates = cu_->calls("memCreate");
  EXPECT_EQ(creates, 1) << "one probe allocation";
  auto second = Make(CudaHandleKind::kAuto, Exchange());
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ((*second)->handleKind(), "cuda-fabric");
  EXPECT_EQ(cu_->calls("memCreate"), creates) << "the kept answer, no second probe";
}

TEST_F(CudaP2pFakeTest, AutoDoesNotTryFabricWhenTheGpuLacksIt) {
  cu_->setImexChannel(true);
  cu_->gpu(0).attributes[drivers::kCuDeviceAttrHandleTypeFabricSupported] = 0;
  std::string log;
  auto t = MakeLogged(CudaHandleKind::kAuto, Exchange(), &log);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->handleKind(), "cuda-vmm-fd");
  EXPECT_EQ(cu_->calls("memCreate"), 0) << "no probe allocation";
  EXPECT_EQ(cu_->calls("memExportToShareableHandle"), 0);
  EXPECT_EQ(FabricLines(log), 0) << log;
}

TEST_F(CudaP2pFakeTest, ExplicitFabricSaysWhyItCannot) {
  // The export fails (no IMEX channel).
  auto no_imex = Make(CudaHandleKind::kFabric, Exchange());
  ASSERT_FALSE(no_imex.ok());
  EXPECT_EQ(no_imex.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(no_imex.status().message(),
              AllOf(HasSubstr("createCudaP2pTransport(kFabric): GPU 0 reports fabric handle"),
                    HasSubstr("cuMemExportToShareableHandle(fabric)"),
                    HasSubstr("CUDA_ERROR_NOT_SUPPORTED"),
                    HasSubstr("/dev/nvidia-caps-imex-channels"), HasSubstr("kVmmPosixFd")));
  EXPECT_EQ(cu_->primaryContextRefs(0), 0) << "the context is let go again";
  EXPECT_EQ(cu_->liveHandles(), 0u);

  // The GPU lacks fabric handles: refused without trying.
  cu_->setImexChannel(true);
  cu_->gpu(0).attributes[drivers::kCuDeviceAttrHandleTypeFabricSupported] = 0;
  const int creates = cu_->calls("memCreate");
  auto unsupported = Make(CudaHandleKind::kFabric, Exchange());
  ASSERT_FALSE(unsupported.ok());
  EXPECT_EQ(unsupported.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(unsupported.status().message(), AllOf(HasSubstr("GPU 0 lacks fabric handles"),
                                                    HasSubstr("HANDLE_TYPE_FABRIC_SUPPORTED=0")));
  EXPECT_EQ(cu_->calls("memCreate"), creates);
  EXPECT_EQ(cu_->primaryContextRefs(0), 0);
}

// One rank with fabric handles, one with VMM fds, on one node: the join
// route maps both ways (the fabric buffer's fd travels beside its handle);
// the upstream route sends no fd with a fabric handle, and the VMM-fd rank
// says clearly why it cannot map it.
TEST_F(CudaP2pFakeTest, MixedKindsOnOneNode) {
  cu_->setImexChannel(true);
  auto f = Make(CudaHandleKind::kFabric, Exchange());
  auto v = Make(CudaHandleKind::kVmmPosixFd, Exchange());
  ASSERT_TRUE(f.ok() && v.ok());
  void* pf = (*f)->allocateBuffer(kBytes);
  void* pv = (*v)->allocateBuffer(kBytes);
  ASSERT_NE(pf, nullptr);
  ASSERT_NE(pv, nullptr);

  auto join = [&](BrokeredP2pTransport& t, void* local, int rank) {
    std::vector<PeerBuffer> peers(2);
    for (auto [r, tr, p] : {std::tuple{0, f->get(), pf}, std::tuple{1, v->get(), pv}}) {
      auto e = tr->exportLocal(p);
      EXPECT_TRUE(e.ok()) << e.status();
      peers[r].handle = e->handle;
      peers[r].fds = std::move(e->fds);
    }
    return t.mapPeers(local, rank, 2, std::move(peers), {});
  };
  ASSERT_TRUE(join(**f, pf, 0).ok()) << (*f)->lastError();
  ASSERT_TRUE(join(**v, pv, 1).ok()) << (*v)->lastError();
  ExpectShared(pv, (*f)->peerPtrsTablePtr()[1], 0xabcdull);
  ExpectShared(pf, (*v)->peerPtrsTablePtr()[0], 0xdcbaull);

  std::vector<std::vector<int32_t>> handles = {(*f)->exportIpcHandle(pf),
                                               (*v)->exportIpcHandle(pv)};
  (*f)->importPeerHandles(pf, 0, 2, handles, {});
  EXPECT_TRUE((*f)->allPeersAccessible()) << (*f)->lastError();
  (*v)->importPeerHandles(pv, 1, 2, handles, {});
  EXPECT_FALSE((*v)->allPeersAccessible());
  EXPECT_EQ((*v)->lastError().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT((*v)->lastError().message(),
              AllOf(HasSubstr("rank 0: its buffer is shared as a fabric handle only"),
                    HasSubstr("this rank uses cuda-vmm-fd"), HasSubstr("kVmmPosixFd")));
}

// Legacy IPC and the VMM kinds do not mix (different allocations
// entirely): a VMM transport refuses a legacy IPC handle by name.
TEST_F(CudaP2pFakeTest, VmmTransportsRefuseLegacyIpcHandles) {
  cu_->setImexChannel(true);
  for (CudaHandleKind kind : {CudaHandleKind::kFabric, CudaHandleKind::kVmmPosixFd}) {
    auto t = Make(kind, Exchange());
    ASSERT_TRUE(t.ok()) << t.status();
    void* p = (*t)->allocateBuffer(kBytes);
    auto own = (*t)->exportLocal(p);
    ASSERT_TRUE(own.ok()) << own.status();
    internal::BufferHandle ipc = *internal::DecodeHandle(own->handle);  // same node, same size
    ipc.kind = internal::HandleKind::kCudaIpc;
    ipc.payload.assign(64, 'i');
    std::vector<PeerBuffer> peers(2);
    peers[1].handle = *internal::EncodeHandle(ipc);
    absl::Status s = (*t)->mapPeers(p, 0, 2, std::move(peers), {});
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(s.message(),
                HasSubstr("handle kind cuda-ipc, this rank uses " + (*t)->handleKind()));
  }
}

}  // namespace
}  // namespace mooncake::device
