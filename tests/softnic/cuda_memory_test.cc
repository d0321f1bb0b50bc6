// softnic on GPU memory, without a GPU: CudaMemory against FakeCudaDriver
// (whose "device memory" is host memory, so a test reads what the engine
// wrote), and the engine's WQE paths with kCuda regions on either side:
// WRITE host->GPU, GPU->GPU, GPU->host and inline, fetch-adds on GPU words,
// and CUDA failures becoming error CQEs.
//
// A second FakeCudaDriver plays the client process: it allocates with
// cuMemCreate, maps the allocation and exports the POSIX fd the daemon
// imports, as a client does; both mappings share the memory.
//
// Atomics: the fake cannot launch kernels, so these tests pass a host
// CudaAtomics (std::atomic_ref on the fake's device pointers, which are host
// addresses) through CudaMemoryOptions::atomics. The embedded kernel runs
// only on a GPU; here a CUDA build checks that loading it against the fake
// fails cleanly.
#include "softnic/cuda_memory.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "fake_cuda_driver.h"
#include "fake_gpu.h"
#include "gmock/gmock.h"
#include "gpu_engine_fixture.h"
#include "mooncake/device/mlx5/prm.h"
#include "mooncake/device/mlx5/wqe.h"
#include "raw_qp.h"
#include "softnic/cuda_atomics_kernel.h"
#include "softnic/engine.h"
#include "softnic/shared_mapping.h"

namespace mooncake::softnic {
namespace {

using drivers::CuDevicePtr;
using drivers::FakeCudaDriver;
using drivers::FakeGpu;
using test_util::CqeBytes;
using test_util::CqeOpcode;
using test_util::CqeSyndrome;
using test_util::FindQp;
using test_util::RawQp;
using ::testing::HasSubstr;
namespace mlx5 = test_util::mlx5;
using mlx5::Cqe64;
using mlx5::Wqe64;

using test_util::ClientAllocation;
using test_util::FakeOptions;
using test_util::FakeWithGpus;
using test_util::kGran;
using test_util::Ptr;
constexpr PdId kPdA = 11;  // requesters
constexpr PdId kPdB = 22;  // the responder
constexpr uint8_t kUpd = mlx5::kCtrlCqUpdate;

uint8_t PatternByte(uint64_t i) { return static_cast<uint8_t>((i * 131 + 7) ^ (i >> 8)); }

// ---- CudaMemory -----------------------------------------------------------------

class CudaMemoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    client_cu_.addGpu(FakeGpu::Hopper(0));
    client_cu_.setGranularity(kGran);
    ASSERT_EQ(client_cu_.init(0), drivers::kCudaSuccess);
  }
  FakeCudaDriver client_cu_;
};

TEST_F(CudaMemoryTest, LoadsNothingBeforeTheFirstImportAndRetainsTheContextOnce) {
  auto cu = FakeWithGpus(1);
  auto cuda = CudaMemory::Create(FakeOptions(cu));
  EXPECT_EQ(cu->calls("init"), 0);
  EXPECT_EQ(cuda->device(), -1);
  ClientAllocation a(client_cu_, 2 * kGran), b(client_cu_, kGran);
  {
    auto first = cuda->Import(a.fd(), 2 * kGran - 100);
    ASSERT_TRUE(first.ok()) << first.status();
    auto second = cuda->Import(b.fd(), kGran);
    ASSERT_TRUE(second.ok()) << second.status();
    EXPECT_EQ(cuda->device(), 0);
    EXPECT_EQ(cu->primaryContextRefs(0), 1) << "one context for every buffer";
    EXPECT_EQ((*first)->size(), 2 * kGran - 100);
    EXPECT_EQ(cu->liveMappings(), 2u);
    EXPECT_EQ(cu->liveHandles(), 0u) << "the mappings hold the allocations";
    // The daemon's mapping shows the client's bytes.
    a.data()[kGran + 5] = 0x5a;
    EXPECT_EQ(static_cast<uint8_t*>(Ptr((*first)->base()))[kGran + 5], 0x5a);
  }
  EXPECT_EQ(cu->liveMappings(), 0u) << "unmapped with the last reference";
  EXPECT_EQ(cu->liveReservations(), 0u);
  EXPECT_EQ(cu->primaryContextRefs(0), 1) << "the context lives as long as CudaMemory";
  cuda.reset();
  EXPECT_EQ(cu->primaryContextRefs(0), 0);
}

TEST_F(CudaMemoryTest, ImportErrorsSayWhatIsMissing) {
  ClientAllocation alloc(client_cu_, kGran);
  {
    CudaMemoryOptions o = FakeOptions(nullptr);
    o.cuda_library = "libmc-no-such-cuda.so.1";
    auto r = CudaMemory::Create(o)->Import(alloc.fd(), kGran);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound) << r.status();
    EXPECT_THAT(r.status().message(), HasSubstr("needs the CUDA driver"));
    EXPECT_THAT(r.status().message(), HasSubstr("no NVIDIA driver"));
  }
  {
    auto r = CudaMemory::Create(FakeOptions(FakeWithGpus(0)))->Import(alloc.fd(), kGran);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
    EXPECT_THAT(r.status().message(), HasSubstr("no CUDA GPU is visible"));
  }
  {
    auto r = CudaMemory::Create(FakeOptions(FakeWithGpus(1)))->Import(alloc.fd(), kGran, 3);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_THAT(r.status().message(), HasSubstr("GPU 3 is not visible"));
  }
  auto cu = FakeWithGpus(1);
  auto cuda = CudaMemory::Create(FakeOptions(cu));
  EXPECT_EQ(cuda->Import(-1, kGran).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cuda->Import(alloc.fd(), 0).status().code(), absl::StatusCode::kInvalidArgument);
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  auto r = cuda->Import(pipe_fds[0], kGran);
  ::close(pipe_fds[0]);
  ::close(pipe_fds[1]);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("cuMemImportFromShareableHandle"));
  r = cuda->Import(alloc.fd(), kGran + 1);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("cuMemMap"));
  EXPECT_THAT(r.status().message(), HasSubstr("longer than the allocation"));
  cu->failNext("memSetAccess", drivers::kCudaErrorPeerAccessUnsupported);
  r = cuda->Import(alloc.fd(), kGran);
  EXPECT_THAT(r.status().message(), HasSubstr("cuMemSetAccess(read-write for GPU 0)"));
  EXPECT_THAT(r.status().message(), HasSubstr("CUDA_ERROR_PEER_ACCESS_UNSUPPORTED"));
  EXPECT_EQ(cu->liveHandles(), 0u) << "nothing is left of failed imports";
  EXPECT_EQ(cu->liveReservations(), 0u);
  EXPECT_EQ(cu->liveMappings(), 0u);
  EXPECT_TRUE(cuda->Import(alloc.fd(), kGran).ok()) << "and the next import works";
}

TEST_F(CudaMemoryTest, TheBuiltInAtomicsNeedTheEmbeddedKernel) {
  ClientAllocation alloc(client_cu_, kGran);
  auto cu = FakeWithGpus(1);
  CudaMemoryOptions o;
  o.driver = cu;  // no atomics factory: the embedded kernel or nothing
  auto r = CudaMemory::Create(o)->Import(alloc.fd(), kGran);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  if (CudaMemory::KernelAtomicsBuilt()) {
    // The fake cannot load modules, as a GPU of another architecture cannot.
    EXPECT_THAT(r.status().message(), HasSubstr("cuModuleLoadData(softnic atomics kernel)"));
    EXPECT_EQ(cu->calls("moduleLoadData"), 1);
  } else {
    EXPECT_THAT(r.status().message(), HasSubstr("built without CUDA"));
    EXPECT_EQ(cu->calls("init"), 0) << "refused before touching the driver";
  }
  EXPECT_EQ(cu->primaryContextRefs(0), 0) << "the context is let go again";
}

TEST_F(CudaMemoryTest, CopiesAndAtomicsCheckTheirArguments) {
  auto cu = FakeWithGpus(1);
  auto cuda = CudaMemory::Create(FakeOptions(cu));
  uint64_t host[2] = {1, 2};
  const ByteSpan h0{MemoryKind::kHost, reinterpret_cast<uintptr_t>(&host[0]), 8};
  const ByteSpan h1{MemoryKind::kHost, reinterpret_cast<uintptr_t>(&host[1]), 8};
  EXPECT_EQ(cuda->Copy(h0, h1).code(), absl::StatusCode::kInvalidArgument) << "no GPU side";
  ClientAllocation alloc(client_cu_, kGran);
  const ByteSpan g{MemoryKind::kCuda, alloc.va(), 8, cuda.get()};
  EXPECT_EQ(cuda->Copy(g, h0).code(), absl::StatusCode::kFailedPrecondition)
      << "nothing imported yet: no context";
  auto buffer = cuda->Import(alloc.fd(), kGran);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  const ByteSpan d{MemoryKind::kCuda, (*buffer)->base(), 8, cuda.get()};
  EXPECT_EQ(cuda->Copy(d, ByteSpan{MemoryKind::kHost, h0.addr, 4}).code(),
            absl::StatusCode::kInvalidArgument)
      << "lengths differ";
  ASSERT_TRUE(cuda->Copy(d, h1).ok());
  EXPECT_EQ(std::memcmp(alloc.data(), &host[1], 8), 0);
  EXPECT_EQ(cuda->FetchAdd64((*buffer)->base() + 4, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cuda->MaskedFetchAdd32((*buffer)->base() + 2, 1, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto old = cuda->FetchAdd64((*buffer)->base(), 5);
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_EQ(*old, 2u);
  uint64_t now;
  std::memcpy(&now, alloc.data(), 8);
  EXPECT_EQ(now, 7u);
}

// ---- the engine on GPU memory -----------------------------------------------------

class CudaEngineTest : public test_util::GpuEngineFixture {
 protected:
  void SetUp() override {
    client_cu_.addGpu(FakeGpu::Hopper(0));
    client_cu_.setGranularity(kGran);
    ASSERT_EQ(client_cu_.init(0), drivers::kCudaSuccess);
    cu_ = FakeWithGpus(1);
    cuda_ = CudaMemory::Create(FakeOptions(cu_, atomic_failures_));
    StartEngine();
  }

  // Posts `wqes` (their indexes 0, 1, ...) and returns their CQEs.
  std::vector<Cqe64> Run(RawQp& qp, const std::vector<Wqe64>& wqes) {
    for (const Wqe64& w : wqes) qp.Write(w);
    qp.Ring();
    std::vector<Cqe64> out;
    for (size_t i = 0; i < wqes.size(); ++i) {
      Cqe64 c;
      if (!qp.Next(&c)) {
        ADD_FAILURE() << "no CQE for WQE " << i;
        break;
      }
      out.push_back(c);
    }
    return out;
  }

  FakeCudaDriver client_cu_;            // the client process
  std::shared_ptr<FakeCudaDriver> cu_;  // the daemon's
  std::shared_ptr<std::atomic<int>> atomic_failures_ = std::make_shared<std::atomic<int>>(0);
};

TEST_F(CudaEngineTest, WritesHostToGpu) {
  ClientAllocation dst(client_cu_, kGran);
  const uint32_t dst_key = GpuRegion(kPdB, dst, kRemoteWrite);
  const uint32_t src_key = HostRegion(kPdA, 0, 8192, 0);
  for (uint64_t i = 0; i < 8192; ++i) host_->data()[i] = PatternByte(i);
  auto qp = NewQp();
  ASSERT_NE(qp, nullptr);
  const int syncs = cu_->calls("streamQuery");
  Wqe64 w;
  mlx5::build_rdma_write(&w, 0, qp->qpn(), kUpd, dst.va() + 100, dst_key, HostIova(0), src_key,
                         8000);
  std::vector<Cqe64> c = Run(*qp, {w});
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(CqeOpcode(c[0]), mlx5::kCqeReq);
  EXPECT_EQ(CqeBytes(c[0]), 8000u);
  EXPECT_EQ(std::memcmp(dst.data() + 100, host_->data(), 8000), 0);
  EXPECT_EQ(dst.data()[99], 0);
  EXPECT_EQ(dst.data()[8100], 0);
  EXPECT_EQ(cu_->calls("memcpyHtoD"), 1);
  EXPECT_EQ(cu_->calls("streamQuery"), syncs + 1) << "complete before the CQE";
}

TEST_F(CudaEngineTest, WritesGpuToGpuAndGpuToHost) {
  ClientAllocation a(client_cu_, 2 * kGran), b(client_cu_, kGran);
  const uint32_t a_key = GpuRegion(kPdA, a, 0);
  const uint32_t b_key = GpuRegion(kPdB, b, kRemoteWrite);
  const uint32_t host_key = HostRegion(kPdB, 4096, 4096, kRemoteWrite);
  for (uint64_t i = 0; i < a.size(); ++i) a.data()[i] = PatternByte(i);
  auto qp = NewQp();
  ASSERT_NE(qp, nullptr);
  Wqe64 gpu_to_gpu, gpu_to_host;
  mlx5::build_rdma_write(&gpu_to_gpu, 0, qp->qpn(), kUpd, b.va() + 8, b_key, a.va() + kGran, a_key,
                         10000);
  mlx5::build_rdma_write(&gpu_to_host, 1, qp->qpn(), kUpd, HostIova(4096), host_key, a.va() + 3,
                         a_key, 4096);
  std::vector<Cqe64> c = Run(*qp, {gpu_to_gpu, gpu_to_host});
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(CqeOpcode(c[0]), mlx5::kCqeReq);
  EXPECT_EQ(CqeOpcode(c[1]), mlx5::kCqeReq);
  EXPECT_EQ(std::memcmp(b.data() + 8, a.data() + kGran, 10000), 0);
  EXPECT_EQ(std::memcmp(host_->data() + 4096, a.data() + 3, 4096), 0);
  EXPECT_EQ(cu_->calls("memcpy"), 1) << "one device-to-device copy";
  EXPECT_EQ(cu_->calls("memcpyDtoH"), 1);
}

TEST_F(CudaEngineTest, InlineDataAndASignalAfterIt) {
  ClientAllocation dst(client_cu_, kGran);
  const uint32_t dst_key = GpuRegion(kPdB, dst, kRemoteWrite);
  const uint32_t src_key = HostRegion(kPdA, 0, 4096, 0);
  std::memset(host_->data(), 0x3c, 4096);
  auto qp = NewQp();
  ASSERT_NE(qp, nullptr);
  std::vector<Wqe64> w(3);
  // Bulk data, an odd-sized inline payload at an odd address, then an
  // 8-byte inline signal: each lands before the next starts.
  mlx5::build_rdma_write(&w[0], 0, qp->qpn(), 0, dst.va() + 4096, dst_key, HostIova(0), src_key,
                         4096);
  const uint8_t odd[5] = {1, 2, 3, 4, 5};
  mlx5::build_rdma_write_inline(&w[1], 1, qp->qpn(), 0, dst.va() + 33, dst_key, odd, 5);
  const uint64_t signal = 0x1122334455667788ull;
  mlx5::build_rdma_write_inline(&w[2], 2, qp->qpn(), kUpd, dst.va() + 64, dst_key, &signal, 8);
  for (const Wqe64& x : w) qp->Write(x);
  qp->Ring();
  Cqe64 c;
  ASSERT_TRUE(qp->Next(&c));
  EXPECT_EQ(CqeOpcode(c), mlx5::kCqeReq);
  EXPECT_EQ(CqeBytes(c), 8u);
  uint64_t seen;
  std::memcpy(&seen, dst.data() + 64, 8);
  EXPECT_EQ(seen, signal);
  EXPECT_EQ(std::memcmp(dst.data() + 33, odd, 5), 0);
  EXPECT_EQ(dst.data()[4096], 0x3c);
  EXPECT_EQ(dst.data()[8191], 0x3c);
  EXPECT_EQ(cu_->calls("memcpyHtoD"), 3);
}

TEST_F(CudaEngineTest, FetchAddsOnGpuWords) {
  ClientAllocation remote(client_cu_, kGran), local(client_cu_, kGran);
  const uint32_t remote_key = GpuRegion(kPdB, remote, kRemoteAtomic);
  const uint32_t local_key = GpuRegion(kPdA, local, kLocalWrite);
  const uint32_t fetch_key = HostRegion(kPdA, 0, 64, kLocalWrite);
  const uint64_t start64 = 0xfffffffffffffff0ull;
  const uint32_t start32 = 0x01FF7F10;
  std::memcpy(remote.data() + 16, &start64, 8);
  std::memcpy(remote.data() + 40, &start32, 4);
  auto qp = NewQp();
  ASSERT_NE(qp, nullptr);
  std::vector<Wqe64> w(2);
  // 64-bit: old value to host memory, host order.
  mlx5::build_atomic_fa64(&w[0], 0, qp->qpn(), kUpd, remote.va() + 16, remote_key, 0x20,
                          HostIova(8), fetch_key);
  // 32-bit masked, four 8-bit fields: old value to GPU memory, big-endian.
  mlx5::build_masked_fa32(&w[1], 1, qp->qpn(), kUpd, remote.va() + 40, remote_key, 0x01010101,
                          local.va() + 12, local_key);
  w[1].word[9] = mlx5::be32(0x80808080u);
  std::vector<Cqe64> c = Run(*qp, w);
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(CqeOpcode(c[0]), mlx5::kCqeReq);
  EXPECT_EQ(CqeOpcode(c[1]), mlx5::kCqeReq);
  uint64_t now64, fetched64;
  uint32_t now32, fetched32;
  std::memcpy(&now64, remote.data() + 16, 8);
  std::memcpy(&fetched64, host_->data() + 8, 8);
  std::memcpy(&now32, remote.data() + 40, 4);
  std::memcpy(&fetched32, local.data() + 12, 4);
  EXPECT_EQ(now64, 0x10u) << "wrapped";
  EXPECT_EQ(fetched64, start64);
  EXPECT_EQ(now32, 0x02008011u) << "each field wraps on its own";
  EXPECT_EQ(mlx5::be32(fetched32), start32);
}

TEST_F(CudaEngineTest, CudaFailuresBecomeErrorCqesAndTheEngineGoesOn) {
  ClientAllocation gpu_src(client_cu_, kGran), gpu_dst(client_cu_, kGran);
  const uint32_t src_key = GpuRegion(kPdA, gpu_src, 0);
  const uint32_t dst_key = GpuRegion(kPdB, gpu_dst, kRemoteWrite | kRemoteAtomic);
  const uint32_t host_src = HostRegion(kPdA, 0, 256, kLocalWrite);
  const uint32_t host_dst = HostRegion(kPdB, 4096, 256, kRemoteWrite);
  struct Case {
    const char* name;
    const char* method;  // the driver call that fails, or null: the atomic
    uint8_t syndrome;
    void (*build)(Wqe64*, uint32_t qpn, uint64_t, uint32_t src_key, uint32_t dst_key,
                  uint32_t host_src, uint32_t host_dst, const ClientAllocation& gpu_src,
                  const ClientAllocation& gpu_dst);
  };
  const Case cases[] = {
      {"host -> GPU, the copy faults", "memcpyHtoD", mlx5::kSyndRemoteAccessErr,
       [](Wqe64* w, uint32_t qpn, uint64_t host, uint32_t, uint32_t dk, uint32_t hs, uint32_t,
          const ClientAllocation&, const ClientAllocation& gd) {
         mlx5::build_rdma_write(w, 0, qpn, kUpd, gd.va(), dk, host, hs, 64);
       }},
      {"GPU -> host, reading the source faults", "memcpyDtoH", mlx5::kSyndLocalProtErr,
       [](Wqe64* w, uint32_t qpn, uint64_t host, uint32_t sk, uint32_t, uint32_t, uint32_t hd,
          const ClientAllocation& gs, const ClientAllocation&) {
         mlx5::build_rdma_write(w, 0, qpn, kUpd, host + 4096, hd, gs.va(), sk, 64);
       }},
      {"GPU -> GPU, the copy fails at synchronize", "streamQuery", mlx5::kSyndRemoteAccessErr,
       [](Wqe64* w, uint32_t qpn, uint64_t, uint32_t sk, uint32_t dk, uint32_t, uint32_t,
          const ClientAllocation& gs, const ClientAllocation& gd) {
         mlx5::build_rdma_write(w, 0, qpn, kUpd, gd.va(), dk, gs.va(), sk, 64);
       }},
      {"inline into GPU memory, the context is gone", "ctxSetCurrent", mlx5::kSyndRemoteAccessErr,
       [](Wqe64* w, uint32_t qpn, uint64_t, uint32_t, uint32_t dk, uint32_t, uint32_t,
          const ClientAllocation&, const ClientAllocation& gd) {
         const uint64_t v = 1;
         mlx5::build_rdma_write_inline(w, 0, qpn, kUpd, gd.va(), dk, &v, 8);
       }},
      {"fetch-add on a GPU word fails", nullptr, mlx5::kSyndRemoteAccessErr,
       [](Wqe64* w, uint32_t qpn, uint64_t host, uint32_t, uint32_t dk, uint32_t hs, uint32_t,
          const ClientAllocation&, const ClientAllocation& gd) {
         mlx5::build_atomic_fa64(w, 0, qpn, kUpd, gd.va() + 8, dk, 1, host + 128, hs);
       }},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    auto qp = NewQp();
    ASSERT_NE(qp, nullptr);
    if (k.method != nullptr) {
      cu_->failNext(k.method, drivers::kCudaErrorIllegalAddress);
    } else {
      atomic_failures_->store(1);
    }
    std::memset(host_->data() + 128, 0xee, 8);
    Wqe64 w;
    k.build(&w, qp->qpn(), HostIova(0), src_key, dst_key, host_src, host_dst, gpu_src, gpu_dst);
    std::vector<Cqe64> c = Run(*qp, {w});
    ASSERT_EQ(c.size(), 1u);
    EXPECT_EQ(CqeOpcode(c[0]), mlx5::kCqeReqErr);
    EXPECT_EQ(CqeSyndrome(c[0]), k.syndrome);
    EXPECT_EQ(FindQp(engine_, qp->qpn()).state, QpState::kError);
    EXPECT_EQ(host_->data()[128], 0xee) << "a failed atomic fetches nothing";
  }
  // Another QP is served as before.
  auto qp = NewQp();
  ASSERT_NE(qp, nullptr);
  const uint64_t v = 0xabcdef;
  Wqe64 w;
  mlx5::build_rdma_write_inline(&w, 0, qp->qpn(), kUpd, gpu_dst.va() + 200, dst_key, &v, 8);
  std::vector<Cqe64> c = Run(*qp, {w});
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(CqeOpcode(c[0]), mlx5::kCqeReq);
  uint64_t seen;
  std::memcpy(&seen, gpu_dst.data() + 200, 8);
  EXPECT_EQ(seen, v);
}

TEST_F(CudaEngineTest, RegionsStayInsideTheirBufferAndReleaseIt) {
  ClientAllocation alloc(client_cu_, kGran);
  auto buffer = cuda_->Import(alloc.fd(), 1000);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  RegionSpec spec;
  spec.pd = kPdB;
  spec.iova = alloc.va();
  spec.kind = MemoryKind::kCuda;
  spec.cuda = *buffer;
  spec.access = kRemoteWrite;
  spec.offset = 500;
  spec.length = 501;
  EXPECT_EQ(engine_.RegisterRegion(spec).status().code(), absl::StatusCode::kInvalidArgument)
      << "past the imported size";
  spec.length = 500;
  auto key = engine_.RegisterRegion(spec);
  ASSERT_TRUE(key.ok()) << key.status();
  auto list = engine_.ListRegions();
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0].kind, MemoryKind::kCuda);

  // iova + 0 is byte 500 of the buffer.
  auto qp = NewQp();
  ASSERT_NE(qp, nullptr);
  const uint32_t v = 0x77;
  Wqe64 w;
  mlx5::build_rdma_write_inline(&w, 0, qp->qpn(), kUpd, alloc.va(), *key, &v, 4);
  ASSERT_EQ(Run(*qp, {w}).size(), 1u);
  EXPECT_EQ(alloc.data()[500], 0x77);

  spec.cuda.reset();
  buffer->reset();
  EXPECT_EQ(cu_->liveMappings(), 1u) << "the region keeps its buffer mapped";
  engine_.DestroyPd(kPdB);
  EXPECT_EQ(cu_->liveMappings(), 0u);
  EXPECT_EQ(cu_->liveReservations(), 0u);
}

// ---- on a real GPU (skipped without one) ------------------------------------------

// The same paths through the real driver and the embedded atomics kernel:
// they run where libcuda and a GPU are, and are skipped elsewhere (CI).
// The "client" allocations are made in this process, in GPU 0's primary
// context, which the daemon-side CudaMemory then shares.
class RealGpuTest : public ::testing::Test {
 protected:
  struct Allocation {
    drivers::CuMemHandle handle = 0;
    CuDevicePtr va = 0;
    size_t size = 0;
    int fd = -1;
  };

  void SetUp() override {
    if (!CudaMemory::KernelAtomicsBuilt()) GTEST_SKIP() << "built without CUDA";
    auto driver = drivers::LoadCudaDriver();
    if (!driver.ok()) GTEST_SKIP() << driver.status();
    cu_ = *driver;
    int count = 0;
    if (cu_->init(0) != drivers::kCudaSuccess ||
        cu_->deviceGetCount(&count) != drivers::kCudaSuccess || count == 0) {
      GTEST_SKIP() << "no CUDA GPU";
    }
    ASSERT_EQ(cu_->deviceGet(&dev_, 0), drivers::kCudaSuccess);
    ASSERT_EQ(cu_->devicePrimaryCtxRetain(&ctx_, dev_), drivers::kCudaSuccess);
    ASSERT_EQ(cu_->ctxSetCurrent(ctx_), drivers::kCudaSuccess);
    drivers::CuMemAllocationProp prop = Prop();
    ASSERT_EQ(
        cu_->memGetAllocationGranularity(&gran_, &prop, drivers::kCuMemAllocGranularityRecommended),
        drivers::kCudaSuccess);
  }
  void TearDown() override {
    if (ctx_ == nullptr) return;
    for (Allocation& a : allocations_) {
      ::close(a.fd);
      cu_->memUnmap(a.va, a.size);
      cu_->memAddressFree(a.va, a.size);
      cu_->memRelease(a.handle);
    }
    cu_->devicePrimaryCtxRelease(dev_);
  }

  static drivers::CuMemAllocationProp Prop() {
    drivers::CuMemAllocationProp prop{};
    prop.type = drivers::kCuMemAllocationTypePinned;
    prop.location = {drivers::kCuMemLocationTypeDevice, 0};
    prop.requestedHandleTypes = drivers::kCuMemHandleTypePosixFileDescriptor;
    return prop;
  }
  // A zeroed allocation exported as a POSIX fd, mapped here as a client does.
  const Allocation& Allocate() {
    Allocation a;
    a.size = gran_;
    drivers::CuMemAllocationProp prop = Prop();
    EXPECT_EQ(cu_->memCreate(&a.handle, a.size, &prop, 0), drivers::kCudaSuccess);
    EXPECT_EQ(cu_->memAddressReserve(&a.va, a.size, gran_, 0, 0), drivers::kCudaSuccess);
    EXPECT_EQ(cu_->memMap(a.va, a.size, 0, a.handle, 0), drivers::kCudaSuccess);
    drivers::CuMemAccessDesc access{{drivers::kCuMemLocationTypeDevice, 0},
                                    drivers::kCuMemAccessFlagsProtReadWrite};
    EXPECT_EQ(cu_->memSetAccess(a.va, a.size, &access, 1), drivers::kCudaSuccess);
    EXPECT_EQ(cu_->memsetD8(a.va, 0, a.size), drivers::kCudaSuccess);
    EXPECT_EQ(cu_->ctxSynchronize(), drivers::kCudaSuccess);
    EXPECT_EQ(cu_->memExportToShareableHandle(&a.fd, a.handle,
                                              drivers::kCuMemHandleTypePosixFileDescriptor, 0),
              drivers::kCudaSuccess);
    allocations_.push_back(a);
    return allocations_.back();
  }
  std::vector<uint8_t> Read(CuDevicePtr p, size_t n) {
    std::vector<uint8_t> out(n);
    EXPECT_EQ(cu_->ctxSetCurrent(ctx_), drivers::kCudaSuccess);
    EXPECT_EQ(cu_->memcpyDtoH(out.data(), p, n), drivers::kCudaSuccess);
    return out;
  }

  std::shared_ptr<drivers::CudaDriver> cu_;
  drivers::CuDevice dev_ = 0;
  drivers::CuContext ctx_ = nullptr;
  size_t gran_ = 0;
  std::vector<Allocation> allocations_;
};

TEST_F(RealGpuTest, WritesAndAtomicsThroughTheEngine) {
  allocations_.reserve(2);
  const Allocation& a = Allocate();
  const Allocation& b = Allocate();
  auto cuda = CudaMemory::Create();
  auto a_buf = cuda->Import(a.fd, a.size);
  ASSERT_TRUE(a_buf.ok()) << a_buf.status();
  auto b_buf = cuda->Import(b.fd, b.size);
  ASSERT_TRUE(b_buf.ok()) << b_buf.status();
  EXPECT_EQ(cuda->device(), 0);

  auto host = SharedMapping::Anonymous(64 << 10);
  ASSERT_TRUE(host.ok()) << host.status();
  for (uint64_t i = 0; i < 8192; ++i) (*host)->data()[i] = PatternByte(i);
  const uint64_t host_iova = reinterpret_cast<uintptr_t>((*host)->data());

  Engine engine;
  auto region = [&](PdId pd, uint64_t iova, std::shared_ptr<CudaBuffer> buffer, uint32_t access) {
    RegionSpec spec;
    spec.pd = pd;
    spec.iova = iova;
    spec.length = buffer->size();
    spec.access = access;
    spec.kind = MemoryKind::kCuda;
    spec.cuda = std::move(buffer);
    auto key = engine.RegisterRegion(spec);
    EXPECT_TRUE(key.ok()) << key.status();
    return key.ok() ? *key : 0;
  };
  const uint32_t a_key = region(kPdA, a.va, *a_buf, kLocalWrite);
  const uint32_t b_key = region(kPdB, b.va, *b_buf, kRemoteWrite | kRemoteAtomic);
  RegionSpec hs;
  hs.pd = kPdA;
  hs.iova = host_iova;
  hs.length = 64 << 10;
  hs.access = kLocalWrite | kRemoteWrite;
  hs.mapping = *host;
  auto host_key = engine.RegisterRegion(hs);
  ASSERT_TRUE(host_key.ok()) << host_key.status();
  hs.pd = kPdB;  // the same memory as the responder's too
  auto host_b_key = engine.RegisterRegion(hs);
  ASSERT_TRUE(host_b_key.ok()) << host_b_key.status();
  auto responder = RawQp::Create(engine, kPdB, 1, 1);
  auto qp = RawQp::Create(engine, kPdA, 16, 16);
  ASSERT_NE(responder, nullptr);
  ASSERT_NE(qp, nullptr);
  ASSERT_TRUE(engine.Connect(kPdA, qp->qpn(), responder->qpn()).ok());
  engine.Start();

  // host -> GPU, GPU -> GPU, an inline signal into GPU memory, fetch-adds
  // on GPU words with the old values to host and to GPU memory, GPU -> host.
  std::vector<Wqe64> w(6);
  const uint64_t signal = 0x5151515151515151ull;
  const uint64_t start64 = 0xfffffffffffffff0ull;
  std::memcpy((*host)->data() + 16384, &start64, 8);
  mlx5::build_rdma_write(&w[0], 0, qp->qpn(), kUpd, b.va + 65536, b_key, host_iova + 16384,
                         *host_key, 8);
  mlx5::build_rdma_write(&w[1], 1, qp->qpn(), kUpd, b.va, b_key, a.va, a_key, 8192);
  mlx5::build_rdma_write_inline(&w[2], 2, qp->qpn(), kUpd, b.va + 8192, b_key, &signal, 8);
  mlx5::build_atomic_fa64(&w[3], 3, qp->qpn(), kUpd, b.va + 65536, b_key, 0x20, host_iova + 32768,
                          *host_key);
  mlx5::build_masked_fa32(&w[4], 4, qp->qpn(), kUpd, b.va + 65544, b_key, 0x01010101, a.va + 16384,
                          a_key);
  w[4].word[9] = mlx5::be32(0x80808080u);
  mlx5::build_rdma_write(&w[5], 5, qp->qpn(), kUpd, host_iova + 40960, *host_b_key, a.va + 16384,
                         a_key, 4);
  const uint32_t start32 = 0x01FF7F10;
  ASSERT_EQ(cu_->ctxSetCurrent(ctx_), drivers::kCudaSuccess);
  ASSERT_EQ(cu_->memcpyHtoD(a.va, (*host)->data(), 8192), drivers::kCudaSuccess);
  ASSERT_EQ(cu_->memcpyHtoD(b.va + 65544, &start32, 4), drivers::kCudaSuccess);
  ASSERT_EQ(cu_->ctxSynchronize(), drivers::kCudaSuccess);
  for (const Wqe64& x : w) qp->Write(x);
  qp->Ring();
  std::vector<Cqe64> c(6);
  for (size_t i = 0; i < c.size(); ++i) ASSERT_TRUE(qp->Next(&c[i])) << "WQE " << i;
  for (size_t i = 0; i < c.size(); ++i) {
    EXPECT_EQ(CqeOpcode(c[i]), mlx5::kCqeReq)
        << "WQE " << i << " syndrome 0x" << std::hex << int{CqeSyndrome(c[i])};
  }
  engine.Stop();

  std::vector<uint8_t> got = Read(b.va, 8192);
  EXPECT_EQ(std::memcmp(got.data(), (*host)->data(), 8192), 0) << "GPU -> GPU";
  uint64_t v64;
  std::memcpy(&v64, Read(b.va + 8192, 8).data(), 8);
  EXPECT_EQ(v64, signal) << "inline into GPU memory";
  std::memcpy(&v64, Read(b.va + 65536, 8).data(), 8);
  EXPECT_EQ(v64, 0x10u) << "host -> GPU, then a fetch-add that wraps";
  uint64_t fetched64;
  std::memcpy(&fetched64, (*host)->data() + 32768, 8);
  EXPECT_EQ(fetched64, start64);
  uint32_t v32, fetched32;
  std::memcpy(&v32, Read(b.va + 65544, 4).data(), 4);
  std::memcpy(&fetched32, Read(a.va + 16384, 4).data(), 4);
  EXPECT_EQ(v32, 0x02008011u) << "masked fetch-add on the GPU";
  EXPECT_EQ(mlx5::be32(fetched32), start32) << "old value into GPU memory, big-endian";
  EXPECT_EQ(std::memcmp((*host)->data() + 40960, &fetched32, 4), 0) << "GPU -> host";
}

}  // namespace
}  // namespace mooncake::softnic
