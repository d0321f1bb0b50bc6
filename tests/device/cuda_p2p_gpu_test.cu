// CUDA P2pTransport + Device API on real GPUs: buffers shared as cuMem VMM
// fds (in one process and across two processes) and as legacy cudaIpc
// handles (across processes), verified, then driven by kernels — all-to-all
// puts in thread/warp/block form + signals + waits with every byte checked,
// red_add from many threads of two GPUs, and LL ping-pong.
//
// Skips when no GPU is visible, so it is safe in CI; the GPU machine runs it
// (two GPUs: ranks on different GPUs over NVLink; one GPU: both ranks on it).
// The cross-process cases re-execute this binary as the peer rank (a fresh
// process: fork() after CUDA initialisation is not allowed).
#include <cuda_runtime.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "fake_handle_exchange.h"
#include "mooncake/device/comm_device.h"
#include "mooncake/device/device_transport.h"

namespace mooncake::device {
namespace {

using testing::InProcessHandleExchange;
using testing::SocketHandleExchange;

constexpr uint64_t kWaitNs = 10'000'000'000ull;

__host__ __device__ inline unsigned char PatternByte(int src, int dst, uint32_t round, size_t i) {
  uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t(src) << 40) ^ (uint64_t(dst) << 32) ^
               (uint64_t(round) << 20);
  return static_cast<unsigned char>((x >> 29) ^ (x >> 47) ^ i);
}

struct Layout {
  int n;
  size_t chunk;
  // Rounded up so the signal words and LL slots after the data stay aligned.
  __host__ __device__ size_t data_bytes() const { return (chunk * n + 63) / 64 * 64; }
  __host__ __device__ size_t sig_offset(int s) const { return data_bytes() + 64 * s; }
  __host__ __device__ size_t counter_offset() const { return data_bytes() + 64 * n; }
  __host__ __device__ size_t ll_offset(int r) const { return counter_offset() + 64 + 16 * r; }
  __host__ __device__ size_t bytes() const { return ll_offset(n) + 64; }
};

enum Form : int { kThreadForm = 0, kWarpForm = 1, kBlockForm = 2 };

__global__ void fillSources(unsigned char* src, int rank, Layout L, uint32_t round) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < L.data_bytes();
       i += (size_t)gridDim.x * blockDim.x) {
    const int d = static_cast<int>(i / L.chunk);
    src[i] = PatternByte(rank, d, round, i % L.chunk);
  }
}

// One block: puts this rank's chunk into every rank, signals each, then
// waits for every rank's signal. `status` counts failures.
__global__ void allToAll(CommCtx ctx, unsigned char* base, const unsigned char* src, Layout L,
                         uint32_t round, int form, int* status) {
  const int rank = ctx.rank;
  for (int dd = 0; dd < L.n; ++dd) {
    const int d = (rank + dd) % L.n;
    void* dst_sym = base + rank * L.chunk;
    const unsigned char* s = src + d * L.chunk;
    McStatus st = McStatus::kOk;
    if (form == kThreadForm) {
      if (threadIdx.x == 0) st = mc_put_thread(ctx, d, dst_sym, s, L.chunk);
    } else if (form == kWarpForm) {
      if (threadIdx.x < 32) st = mc_put_warp(ctx, d, dst_sym, s, L.chunk, threadIdx.x);
    } else {
      st = mc_put_block(ctx, d, dst_sym, s, L.chunk);
    }
    if (st != McStatus::kOk) atomicAdd(status, 1);
    // Orders the other threads' stores before thread 0's release signal.
    __syncthreads();
    if (threadIdx.x == 0) {
      auto* sig = reinterpret_cast<uint32_t*>(base + L.sig_offset(rank));
      if (mc_signal(ctx, d, sig, round) != McStatus::kOk) atomicAdd(status, 1);
    }
  }
  if (threadIdx.x == 0) {
    for (int s = 0; s < L.n; ++s) {
      uint32_t seen = 0;
      const auto* sig = reinterpret_cast<const uint32_t*>(base + L.sig_offset(s));
      if (!mc_wait_until_for(sig, McCmp::kGe, round, kWaitNs, &seen)) atomicAdd(status, 1000);
    }
  }
}

__global__ void redAdd(CommCtx ctx, unsigned char* base, Layout L, int iters, int* status) {
  auto* ctr = reinterpret_cast<unsigned long long*>(base + L.counter_offset());
  for (int i = 0; i < iters; ++i) {
    if (mc_red_add(ctx, 0, reinterpret_cast<uint64_t*>(ctr), uint64_t{1}) != McStatus::kOk)
      atomicAdd(status, 1);
  }
}

// Rank 0 sends `rounds` LL values to rank 1 and expects each back inverted.
__global__ void llPingPong(CommCtx ctx, unsigned char* base, Layout L, uint32_t rounds,
                           int* status) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  const int peer = 1 - ctx.rank;
  auto* out_sym = reinterpret_cast<McLLSlot*>(base + L.ll_offset(peer));
  const auto* in = reinterpret_cast<const McLLSlot*>(base + L.ll_offset(ctx.rank));
  for (uint32_t r = 1; r <= rounds; ++r) {
    const uint64_t v = (uint64_t{r} << 35) ^ 0x5a5a5a5a12345ull;
    if (ctx.rank == 0) {
      if (mc_put_signal_ll(ctx, peer, out_sym, v, r) != McStatus::kOk) atomicAdd(status, 1);
      if (mc_wait_ll(in, r) != ~v) atomicAdd(status, 1);
    } else {
      const uint64_t got = mc_wait_ll(in, r);
      if (mc_put_signal_ll(ctx, peer, out_sym, ~got, r) != McStatus::kOk) atomicAdd(status, 1);
    }
  }
}

std::string CudaCheck(cudaError_t e, const char* what) {
  return e == cudaSuccess ? "" : absl::StrCat(what, ": ", cudaGetErrorString(e));
}
#define RET_IF_CUDA(expr)                        \
  do {                                           \
    std::string err_ = CudaCheck((expr), #expr); \
    if (!err_.empty()) return err_;              \
  } while (0)

// Everything one rank does after the import, on its own GPU. Runs the three
// put forms, red_add and (n == 2) LL. `peer_ready` synchronises phases with
// the other rank(s) between kernels (threads or processes).
template <class Barrier>
std::string DriveRank(BrokeredP2pTransport& t, void* buf, int rank, int n, int device, Layout L,
                      Barrier&& barrier) {
  RET_IF_CUDA(cudaSetDevice(device));
  CommCtx ctx;
  ctx.p2p = t.p2pContext();
  ctx.rank = rank;
  ctx.num_ranks = n;
  auto* base = static_cast<unsigned char*>(buf);
  unsigned char* src = nullptr;
  int* status = nullptr;
  RET_IF_CUDA(cudaMalloc(&src, L.data_bytes()));
  RET_IF_CUDA(cudaMalloc(&status, sizeof(int)));
  RET_IF_CUDA(cudaMemset(status, 0, sizeof(int)));
  std::vector<unsigned char> host(L.data_bytes());
  std::string err;
  uint32_t round = 0;
  for (int form : {kThreadForm, kWarpForm, kBlockForm}) {
    ++round;
    fillSources<<<64, 256>>>(src, rank, L, round);
    RET_IF_CUDA(cudaDeviceSynchronize());
    barrier();  // previous round fully checked everywhere before anyone overwrites
    allToAll<<<1, 256>>>(ctx, base, src, L, round, form, status);
    RET_IF_CUDA(cudaDeviceSynchronize());
    int st = 0;
    RET_IF_CUDA(cudaMemcpy(&st, status, sizeof(int), cudaMemcpyDeviceToHost));
    if (st != 0) return absl::StrCat("rank ", rank, " form ", form, ": kernel status ", st);
    RET_IF_CUDA(cudaMemcpy(host.data(), base, L.data_bytes(), cudaMemcpyDeviceToHost));
    for (int s = 0; s < n; ++s) {
      for (size_t i = 0; i < L.chunk; ++i) {
        if (host[s * L.chunk + i] != PatternByte(s, rank, round, i)) {
          return absl::StrCat("rank ", rank, " form ", form, ": byte ", i, " from rank ", s, " is ",
                              int(host[s * L.chunk + i]), ", expected ",
                              int(PatternByte(s, rank, round, i)));
        }
      }
    }
  }
  barrier();
  constexpr int kBlocks = 32, kThreads = 256, kIters = 50;
  redAdd<<<kBlocks, kThreads>>>(ctx, base, L, kIters, status);
  RET_IF_CUDA(cudaDeviceSynchronize());
  barrier();  // every rank's adds are done
  if (rank == 0) {
    unsigned long long total = 0;
    RET_IF_CUDA(cudaMemcpy(&total, base + L.counter_offset(), 8, cudaMemcpyDeviceToHost));
    const unsigned long long want = 1ull * n * kBlocks * kThreads * kIters;
    if (total != want) return absl::StrCat("red_add total ", total, ", expected ", want);
  }
  if (n == 2) {
    llPingPong<<<1, 32>>>(ctx, base, L, 5000, status);
    RET_IF_CUDA(cudaDeviceSynchronize());
  }
  int st = 0;
  RET_IF_CUDA(cudaMemcpy(&st, status, sizeof(int), cudaMemcpyDeviceToHost));
  if (st != 0) return absl::StrCat("rank ", rank, ": red_add/LL status ", st);
  cudaFree(src);
  cudaFree(status);
  barrier();
  return "";
}

int GpuCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

// ---- one process, each rank on its own GPU (or both on GPU 0) ---------------

// Drives every rank of one process on its own thread (rank r on GPU r % gpus)
// through the data checks of DriveRank.
void DriveInProcessRanks(std::vector<std::unique_ptr<BrokeredP2pTransport>>& t,
                         std::vector<void*>& buf, int gpus, const Layout& L) {
  const int n = static_cast<int>(t.size());
  std::barrier<> sync(n);
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      errors[r] = DriveRank(*t[r], buf[r], r, n, r % gpus, L, [&] { sync.arrive_and_wait(); });
    });
  }
  for (auto& th : threads) th.join();
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

TEST(CudaP2pTransport, VmmRanksInOneProcess) {
  const int gpus = GpuCount();
  if (gpus == 0) GTEST_SKIP() << "no CUDA GPU visible";
  constexpr int kN = 2;
  const Layout L{kN, (1 << 20) + 13};
  auto ex = std::make_shared<InProcessHandleExchange>();
  std::vector<std::unique_ptr<BrokeredP2pTransport>> t(kN);
  std::vector<void*> buf(kN);
  std::vector<std::vector<int32_t>> handles(kN);
  for (int r = 0; r < kN; ++r) {
    ASSERT_EQ(cudaSetDevice(r % gpus), cudaSuccess);
    auto made = createCudaP2pTransport(kN, ex, CudaHandleKind::kVmmPosixFd);
    ASSERT_TRUE(made.ok()) << made.status();
    t[r] = *std::move(made);
    EXPECT_EQ(t[r]->handleKind(), "cuda-vmm-fd");
    buf[r] = t[r]->allocateBuffer(L.bytes());
    ASSERT_NE(buf[r], nullptr) << t[r]->lastError();
    handles[r] = t[r]->exportIpcHandle(buf[r]);
    ASSERT_EQ(handles[r].size(), 32u) << t[r]->lastError();
  }
  for (int r = 0; r < kN; ++r) {
    t[r]->importPeerHandles(buf[r], r, kN, handles, {});
    ASSERT_TRUE(t[r]->lastError().ok()) << t[r]->lastError();
    ASSERT_TRUE(t[r]->verifyPeerAccess()) << t[r]->lastError();
    EXPECT_EQ(t[r]->availableSnapshot(), (std::vector<int32_t>{1, 1}));
  }
  DriveInProcessRanks(t, buf, gpus, L);
}

// Whether fabric handles work on GPU 0 (an IMEX channel is present): the
// explicit request either succeeds or says why not.
bool FabricWorks() { return createCudaP2pTransport(2, nullptr, CudaHandleKind::kFabric).ok(); }

TEST(CudaP2pTransport, AutoPicksVmmWithAnExchangeAndLegacyWithout) {
  if (GpuCount() == 0) GTEST_SKIP() << "no CUDA GPU visible";
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  // With an IMEX channel kAuto takes fabric handles, exchange or not.
  const bool fabric = FabricWorks();
  auto with = createCudaP2pTransport(2, std::make_shared<InProcessHandleExchange>());
  ASSERT_TRUE(with.ok()) << with.status();
  // H200: VMM + POSIX fd supported.
  EXPECT_EQ((*with)->handleKind(), fabric ? "cuda-fabric" : "cuda-vmm-fd");
  auto without = createCudaP2pTransport(2, nullptr);
  ASSERT_TRUE(without.ok()) << without.status();
  EXPECT_EQ((*without)->handleKind(), fabric ? "cuda-fabric" : "cuda-ipc");
  // VMM without an exchange is the join route (fds travel with the join).
  auto vmm_bare = createCudaP2pTransport(2, nullptr, CudaHandleKind::kVmmPosixFd);
  ASSERT_TRUE(vmm_bare.ok()) << vmm_bare.status();
  void* b = (*without)->allocateBuffer(4096);
  ASSERT_NE(b, nullptr) << (*without)->lastError();
  EXPECT_EQ((*without)->exportIpcHandle(b).size(), 32u);  // one length for every kind
}

// Fabric handles (MNNVL). Where the node has an IMEX channel: two ranks in
// one process share through the 64-byte fabric handle alone (no exchange),
// verified and driven. Elsewhere (single-node machines: the GPU reports
// fabric support, but there is no IMEX channel, or the export fails):
// kFabric is refused naming the missing channel or the CUDA error, and kAuto falls back to VMM fds
// with one log line saying the same. The outcome is printed, so the log records what this machine's
// driver answered.
TEST(CudaP2pTransport, FabricHandlesOrTheLoggedFallback) {
  const int gpus = GpuCount();
  if (gpus == 0) GTEST_SKIP() << "no CUDA GPU visible";
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  auto fabric = createCudaP2pTransport(2, nullptr, CudaHandleKind::kFabric);
  if (!fabric.ok()) {
    std::printf("fabric handles on GPU 0: unavailable: %s\n", fabric.status().ToString().c_str());
    EXPECT_EQ(fabric.status().code(), absl::StatusCode::kFailedPrecondition) << fabric.status();
    const std::string why(fabric.status().message());
    const bool claimed = why.find("reports fabric handle support, but") != std::string::npos;
    if (claimed) {
      EXPECT_NE(why.find("/dev/nvidia-caps-imex-channels"), std::string::npos) << why;
      // Without an IMEX channel device file no driver call is made (the
      // probe says so); with one, the failing call's CUDA error is named.
      EXPECT_TRUE(why.find("CUDA_ERROR_") != std::string::npos ||
                  why.find("no IMEX channel in this process") != std::string::npos)
          << "names the CUDA error or the missing channel: " << why;
    } else {
      EXPECT_NE(why.find("lacks fabric handles"), std::string::npos) << why;
    }
    ::testing::internal::CaptureStderr();
    auto autok = createCudaP2pTransport(2, std::make_shared<InProcessHandleExchange>());
    const std::string log = ::testing::internal::GetCapturedStderr();
    std::printf("kAuto logged: %s", log.empty() ? "(nothing)\n" : log.c_str());
    ASSERT_TRUE(autok.ok()) << autok.status();
    EXPECT_EQ((*autok)->handleKind(), "cuda-vmm-fd");
    if (claimed) {
      EXPECT_NE(log.find("fabric handles unavailable"), std::string::npos) << log;
      EXPECT_NE(log.find("using VMM POSIX fds"), std::string::npos) << log;
      // The same reason as the explicit request's: its CUDA error, or the
      // missing IMEX channel.
      const size_t at = why.find("CUDA_ERROR_");
      const std::string reason = at != std::string::npos
                                     ? why.substr(at, why.find(' ', at) - at)
                                     : std::string("no IMEX channel in this process");
      EXPECT_NE(log.find(reason), std::string::npos) << reason << " not in: " << log;
    }
    return;
  }
  std::printf("fabric handles on GPU 0: available (IMEX channel present)\n");
  constexpr int kN = 2;
  const Layout L{kN, (1 << 20) + 13};
  std::vector<std::unique_ptr<BrokeredP2pTransport>> t(kN);
  std::vector<void*> buf(kN);
  std::vector<std::vector<int32_t>> handles(kN);
  for (int r = 0; r < kN; ++r) {
    ASSERT_EQ(cudaSetDevice(r % gpus), cudaSuccess);
    auto made = createCudaP2pTransport(kN, nullptr, CudaHandleKind::kFabric);
    ASSERT_TRUE(made.ok()) << made.status();
    t[r] = *std::move(made);
    EXPECT_EQ(t[r]->handleKind(), "cuda-fabric");
    buf[r] = t[r]->allocateBuffer(L.bytes());
    ASSERT_NE(buf[r], nullptr) << t[r]->lastError();
    handles[r] = t[r]->exportIpcHandle(buf[r]);
    ASSERT_EQ(handles[r].size(), 32u) << t[r]->lastError();
  }
  for (int r = 0; r < kN; ++r) {
    t[r]->importPeerHandles(buf[r], r, kN, handles, {});
    ASSERT_TRUE(t[r]->lastError().ok()) << t[r]->lastError();
    ASSERT_TRUE(t[r]->verifyPeerAccess()) << t[r]->lastError();
  }
  DriveInProcessRanks(t, buf, gpus, L);
}

// The join route on CUDA VMM: exportLocal's fd goes straight to the peer's
// mapPeers, no HandleExchange involved (what Communicator does through the
// daemon's JoinGroup).
TEST(CudaP2pTransport, JoinRouteMapsVmmPeers) {
  const int gpus = GpuCount();
  if (gpus == 0) GTEST_SKIP() << "no CUDA GPU visible";
  constexpr int kN = 2;
  const Layout L{kN, (1 << 20) + 13};
  std::vector<std::unique_ptr<BrokeredP2pTransport>> t(kN);
  std::vector<void*> buf(kN);
  std::vector<ExportedBuffer> exported(kN);
  for (int r = 0; r < kN; ++r) {
    ASSERT_EQ(cudaSetDevice(r % gpus), cudaSuccess);
    auto made = createCudaP2pTransport(kN, nullptr, CudaHandleKind::kVmmPosixFd);
    ASSERT_TRUE(made.ok()) << made.status();
    t[r] = *std::move(made);
    buf[r] = t[r]->allocateBuffer(L.bytes());
    ASSERT_NE(buf[r], nullptr) << t[r]->lastError();
    auto e = t[r]->exportLocal(buf[r]);
    ASSERT_TRUE(e.ok()) << e.status();
    ASSERT_EQ(e->fds.size(), 1u);
    exported[r] = *std::move(e);
  }
  for (int r = 0; r < kN; ++r) {
    std::vector<PeerBuffer> peers(kN);
    for (int p = 0; p < kN; ++p) {
      peers[p].handle = exported[p].handle;
      if (p != r) peers[p].fds.push_back(*testing::DupFd(exported[p].fds[0].get()));
    }
    absl::Status s = t[r]->mapPeers(buf[r], r, kN, std::move(peers), {});
    ASSERT_TRUE(s.ok()) << s;
    ASSERT_TRUE(t[r]->verifyPeerAccess()) << t[r]->lastError();
  }
  DriveInProcessRanks(t, buf, gpus, L);
}

// ---- two processes ----------------------------------------------------------

// Rank `rank` of a two-process group; the handle and barrier messages go
// over `ctl`, fds over the exchange sockets.
std::string RunProcessRank(int rank, CudaHandleKind kind, UniqueFd serve, UniqueFd request,
                           int ctl) {
  constexpr int kN = 2;
  const Layout L{kN, (1 << 20) + 7};
  const int gpus = GpuCount();
  if (gpus == 0) return "no GPU";
  const int device = rank % gpus;
  RET_IF_CUDA(cudaSetDevice(device));
  auto ex = std::make_shared<SocketHandleExchange>(std::move(serve), std::move(request));
  auto made = createCudaP2pTransport(kN, ex, kind);
  if (!made.ok()) return made.status().ToString();
  BrokeredP2pTransport& t = **made;
  void* buf = t.allocateBuffer(L.bytes());
  if (buf == nullptr) return t.lastError().ToString();
  std::vector<int32_t> mine = t.exportIpcHandle(buf);
  if (mine.empty()) return t.lastError().ToString();
  std::string wire(reinterpret_cast<const char*>(mine.data()), mine.size() * 4);
  if (auto s = SendFrame(ctl, wire, {}); !s.ok()) return s.ToString();
  auto got = RecvFrame(ctl, absl::Seconds(60));
  if (!got.ok()) return got.status().ToString();
  std::vector<int32_t> theirs(got->payload.size() / 4);
  std::memcpy(theirs.data(), got->payload.data(), theirs.size() * 4);
  std::vector<std::vector<int32_t>> handles(kN);
  handles[rank] = mine;
  handles[1 - rank] = theirs;
  t.importPeerHandles(buf, rank, kN, handles, {});
  if (!t.lastError().ok()) return t.lastError().ToString();
  if (!t.verifyPeerAccess()) return t.lastError().ToString();
  std::string barrier_error;
  auto barrier = [&] {
    if (!barrier_error.empty()) return;
    if (auto s = SendFrame(ctl, "b", {}); !s.ok()) barrier_error = s.ToString();
    auto m = RecvFrame(ctl, absl::Seconds(60));
    if (!m.ok()) barrier_error = m.status().ToString();
  };
  std::string err = DriveRank(t, buf, rank, kN, device, L, barrier);
  if (!err.empty()) return err;
  return barrier_error;
}

constexpr char kChildEnv[] = "MOONCAKE_CUDA_P2P_TEST_CHILD";

// Starts this binary again as rank 1; returns its pid. Everything the child
// needs is built before fork(): the parent is multithreaded (CUDA), so the
// child may only exec.
pid_t SpawnPeer(CudaHandleKind kind, int serve, int request, int ctl) {
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
  env_strings.push_back(
      absl::StrCat(kChildEnv, "=", static_cast<int>(kind), ",", serve, ",", request, ",", ctl));
  std::vector<char*> envp;
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  char self[] = "/proc/self/exe";
  char* argv[] = {self, nullptr};
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::execve(self, argv, envp.data());
    ::_exit(127);
  }
  return pid;
}

int ChildMain(const char* spec) {
  int kind = 0, serve = -1, request = -1, ctl = -1;
  if (std::sscanf(spec, "%d,%d,%d,%d", &kind, &serve, &request, &ctl) != 4) return 2;
  std::string err =
      RunProcessRank(1, static_cast<CudaHandleKind>(kind), UniqueFd(serve), UniqueFd(request), ctl);
  if (!err.empty()) {
    std::fprintf(stderr, "rank 1 (child): %s\n", err.c_str());
    return 1;
  }
  return 0;
}

class CudaP2pTwoProcesses : public ::testing::TestWithParam<CudaHandleKind> {};

TEST_P(CudaP2pTwoProcesses, ShareVerifyAndDrive) {
  if (GpuCount() == 0) GTEST_SKIP() << "no CUDA GPU visible";
  int a[2], b[2], ctl[2];
  // The child's ends must survive execv: no CLOEXEC on them.
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, a), 0);
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, b), 0);
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, ctl), 0);
  for (int fd : {a[0], b[0], ctl[0]}) ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  const pid_t pid = SpawnPeer(GetParam(), a[1], b[1], ctl[1]);
  ASSERT_GT(pid, 0);
  ::close(a[1]);
  ::close(b[1]);
  ::close(ctl[1]);
  std::string err = RunProcessRank(0, GetParam(), UniqueFd(b[0]), UniqueFd(a[0]), ctl[0]);
  ::close(ctl[0]);
  EXPECT_EQ(err, "") << "rank 0 (parent)";
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  pid_t done = 0;
  while ((done = ::waitpid(pid, &status, WNOHANG)) == 0 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (done == 0) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    FAIL() << "peer process did not finish in 120 s";
  }
  ASSERT_TRUE(WIFEXITED(status)) << "peer died by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "peer rank failed (its error is on stderr)";
}

INSTANTIATE_TEST_SUITE_P(Kinds, CudaP2pTwoProcesses,
                         ::testing::Values(CudaHandleKind::kVmmPosixFd, CudaHandleKind::kLegacyIpc),
                         [](const ::testing::TestParamInfo<CudaHandleKind>& info) {
                           return info.param == CudaHandleKind::kVmmPosixFd ? "VmmPosixFd"
                                                                            : "LegacyIpc";
                         });

}  // namespace
}  // namespace mooncake::device

int main(int argc, char** argv) {
  if (const char* spec = std::getenv(mooncake::device::kChildEnv)) {
    return mooncake::device::ChildMain(spec);
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
