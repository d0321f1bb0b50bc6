// mcctl-selftest-gpu: the steps of `mcctl selftest rdma` from CUDA kernels
// (issue 24 item 10), which `mcctl selftest rdma --gpu G` runs (mcctl
// itself carries no CUDA code). A pair of ranks in this process on GPU G,
// joined through the local mooncaked, once per ring placement the node
// supports: rings in host memory, then in GPU memory (a placement the
// daemon, the NIC or the driver refuses is reported as not supported here,
// with the reason, and is not a failure). The doorbell mode is whatever the
// daemon gives the session (gpu-uar where the GPU maps the UAR, else
// cpu-assisted; softnic: the doorbell record), and is printed; where it is
// gpu-uar, the host-ring run is repeated with the daemon ringing
// (cpu-assisted), so every mode the node offers runs.
//
// Each step runs in a one-thread kernel that times itself with %globaltimer:
// per operation (posted, then mc_quiet) for the latency, and back to back
// for the rate. The checks read the peer's buffer with kernels. ring-wrap
// posts 69 999 NOPs and then one inline WRITE: the ring's owner bit and
// 16-bit counter wrap as with WRITEs, and the last WRITE must land.
//
// softnic writes GPU memory through CUDA: the process's copy agent
// (tens of microseconds), else the daemon's own context, which waits for a
// time slice while the kernel spins (about 2.4 ms each on an H200: issue
// 24 item 11), so on softnic the timed steps run 50 operations and 200
// back to back instead of 500 and 4000.
//
// Usage: mcctl-selftest-gpu --socket S [--nic N] [--gpu G] [--json]
// Runs the steps with the rings in host memory, then in GPU memory (where
// the node takes them), then, where kernels rang the NIC themselves
// (gpu-uar), once more with the daemon ringing (cpu-assisted).
// Exit: 0 all passed, 1 a step or a setup failed, 2 bad usage or no GPU.
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "mooncake/client/communicator.h"
#include "mooncake/common/escape.h"
#include "mooncake/device/comm_device.h"
#include "mooncake/device/qp_error.h"
#include "mooncake/mcctl/selftest_rdma.h"

namespace {

using mooncake::device::CommCtx;
using mooncake::device::IbgdaQpDevCtx;
using mooncake::device::McPeer;
using mooncake::device::McStatus;
using mooncake::mcctl::SelftestReport;
using mooncake::mcctl::SelftestStep;

using namespace mooncake::mcctl::selftest;  // the buffer layout and step sizes

enum class Op { kWriteInline, kWrite, kAdd64, kAdd32, kWrap, kLoopback, kBadKey };

// What a step's kernel reports.
struct Result {
  int status;                              // McStatus of the first failure, else kOk
  unsigned long long lat_ns[kLatencyOps];  // per operation, posted then quieted
  unsigned long long rate_ns;              // kRateOps (kWrapWqes for kWrap) back to back
  unsigned long long ops;                  // operations done
  unsigned long long scratch;              // address of the queue pair's fetch scratch
  unsigned error;                          // the queue pair's error word after the step
};

__device__ McStatus PostOne(Op op, const McPeer& peer, uint8_t* buf, uint64_t v) {
  using namespace mooncake::device;
  switch (op) {
    case Op::kWriteInline:
    case Op::kWrap: return mc_put_thread(peer, buf + kWordOff, &v, sizeof(v));
    case Op::kWrite: return mc_put_thread(peer, buf + kDstOff, buf + kSrcOff, kWriteBytes);
    case Op::kAdd64:
      return mc_red_add(peer, reinterpret_cast<unsigned long long*>(buf + kCounter64Off), 1ull);
    case Op::kAdd32: return mc_red_add(peer, reinterpret_cast<uint32_t*>(buf + kCounter32Off), 1u);
    case Op::kLoopback:
      return mc_red_add(peer, reinterpret_cast<unsigned long long*>(buf + kLoopbackOff), 1ull);
    case Op::kBadKey: return mc_put_thread(peer, buf + kBadKeyOff, &v, sizeof(v));
  }
  return McStatus::kNoRoute;
}

__global__ void StepKernel(CommCtx ctx, int dst, Op op, uint8_t* buf, int latency_ops, int rate_ops,
                           Result* r) {
  using namespace mooncake::device;
  namespace mlx5 = mooncake::device::mlx5;
  McPeer peer = mc_peer(ctx, dst);
  IbgdaQpDevCtx* qp = peer.qp != nullptr ? peer.qp : peer.atomic_qp;
  if (op == Op::kBadKey) peer.rkey ^= 0x00a5a5ffu;  // a key the peer never gave
  if (op == Op::kWrite) {
    for (uint64_t i = 0; i < kWriteBytes; ++i) buf[kSrcOff + i] = static_cast<uint8_t>(i * 131 + 7);
  }
  McStatus st = McStatus::kOk;
  uint64_t v = 1;
  if (op == Op::kWrap || op == Op::kBadKey) latency_ops = 0;
  for (int i = 0; i < latency_ops && st == McStatus::kOk; ++i) {
    const uint64_t t0 = mc_time_ns();
    st = PostOne(op, peer, buf, v++);
    if (st == McStatus::kOk) st = mc_quiet(ctx);
    r->lat_ns[i] = mc_time_ns() - t0;
  }
  const uint64_t back_to_back = op == Op::kWrap     ? kWrapWqes
                                : op == Op::kBadKey ? 1
                                                    : static_cast<uint64_t>(rate_ops);
  const uint64_t t0 = mc_time_ns();
  if (op == Op::kWrap) {
    mlx5::Wqe64 nop;
    mlx5::build_nop(&nop, 0, qp->qpn, mlx5::kCtrlCqUpdate);
    for (uint64_t i = 1; i < kWrapWqes && st == McStatus::kOk; ++i) st = mc_qp_post(qp, nop);
    v = kWrapWqes;
    if (st == McStatus::kOk) st = PostOne(op, peer, buf, v++);
  } else {
    for (uint64_t i = 0; i < back_to_back && st == McStatus::kOk; ++i) {
      st = PostOne(op, peer, buf, v++);
    }
  }
  if (st == McStatus::kOk)
    st = op == Op::kBadKey && qp != nullptr ? mc_qp_quiet(qp) : mc_quiet(ctx);
  r->rate_ns = mc_time_ns() - t0;
  r->ops = v - 1;
  r->status = static_cast<int>(st);
  r->scratch = qp != nullptr ? reinterpret_cast<uintptr_t>(qp->fetch_scratch) : 0;
  r->error = qp != nullptr ? *reinterpret_cast<volatile unsigned*>(&qp->error) : 0;
}

__global__ void CountWrongKernel(const uint8_t* got, unsigned long long* bad) {
  for (uint64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < kWriteBytes;
       i += gridDim.x * blockDim.x) {
    if (got[i] != static_cast<uint8_t>(i * 131 + 7)) atomicAdd(bad, 1ull);
  }
}

const char* kLinkHint =
    "no completion, or an error completion, for a plain WRITE from a kernel: check the port "
    "state and link (mcctl nics), the GID index and MTU, on RoCE PFC/ECN, and for rings or "
    "data in GPU memory the dmabuf or peer-memory support (docs/rdma.md, \"First run\")";
const char* kAtomicsHint =
    "NIC atomics: mcctl nics shows what the NIC answers; the firmware must allow PCI atomics "
    "(docs/rdma.md, \"First run\")";

std::string StatusText(int st, unsigned error) {
  std::string s = st == static_cast<int>(McStatus::kRdmaError) ? "an error completion"
                  : st == static_cast<int>(McStatus::kTimedOut)
                      ? "no completion within the queue pair's timeout"
                      : absl::StrCat("status ", st);
  if (error != 0) absl::StrAppend(&s, " (", mooncake::device::DescribeQpError(error), ")");
  return s;
}

template <class T>
T ReadPeer(const mooncake::Communicator& c, uint64_t off) {
  T v{};
  cudaMemcpy(&v, static_cast<const uint8_t*>(c.buffer()) + off, sizeof(T), cudaMemcpyDeviceToHost);
  return v;
}

struct Pair {
  std::unique_ptr<mooncake::Communicator> rank[2];
  std::string error;
};

Pair SetUp(const std::string& socket, const std::string& nic, int gpu,
           mooncake::DaemonRdmaOptions::RingMemory rings, bool gpu_doorbells) {
  std::mt19937_64 rng(static_cast<uint64_t>(::getpid()) ^ reinterpret_cast<uintptr_t>(&rng));
  const std::string group =
      absl::StrFormat("mcctl-selftest-gpu-%d-%08x", ::getpid(), static_cast<uint32_t>(rng()));
  Pair p;
  std::string errors[2];
  auto make = [&](int r) {
    cudaSetDevice(gpu);
    mooncake::CommunicatorOptions o;
    o.socket_path = socket;
    o.group = group;
    o.rank = r;
    o.world_size = 2;
    o.buffer_bytes = kBufferBytes;
    o.platform = mooncake::Platform::kCuda;
    o.route = mooncake::Route::kRdma;
    o.atomics_route = mooncake::AtomicsRoute::kNic;  // loopback QPs for loopback-atomic
    o.rdma_sq_depth = 256;
    o.rdma_ring_memory = rings;
    o.rdma_gpu_doorbells = gpu_doorbells;
    o.client_name = "mcctl selftest rdma --gpu";
    if (!nic.empty()) o.rdma_nics = {nic};
    auto c = mooncake::Communicator::Create(o);
    if (c.ok()) {
      p.rank[r] = *std::move(c);
    } else {
      errors[r] = std::string(c.status().message());
    }
  };
  std::thread t(make, 1);
  make(0);
  t.join();
  if (!p.rank[0] || !p.rank[1]) {
    p.error = !errors[0].empty() ? errors[0] : errors[1];
    p.rank[0].reset();
    p.rank[1].reset();
  }
  return p;
}

double MedianUs(const Result& r, int n) {
  if (n == 0) return 0;
  std::vector<double> v(r.lat_ns, r.lat_ns + n);
  std::nth_element(v.begin(), v.begin() + n / 2, v.end());
  return v[n / 2] / 1e3;
}

// The 8 bytes of a queue pair's fetch scratch: in the rings' control
// memory, host memory (this process's address) or GPU memory.
uint64_t ReadScratch(uint64_t address, bool rings_on_gpu) {
  uint64_t v = 0;
  if (address == 0) return 0;
  if (rings_on_gpu) {
    cudaMemcpy(&v, reinterpret_cast<const void*>(address), sizeof(v), cudaMemcpyDeviceToHost);
  } else {
    std::memcpy(&v, reinterpret_cast<const void*>(address), sizeof(v));
  }
  return v;
}

SelftestStep RunStep(Pair& p, Op op, const char* name, bool rings_on_gpu, bool softnic,
                     Result* dev) {
  SelftestStep s{.name = name};
  cudaMemset(dev, 0, sizeof(Result));
  const int dst = op == Op::kLoopback ? 0 : 1;
  const int latency_ops = softnic ? 50 : kLatencyOps, rate_ops = softnic ? 200 : kRateOps;
  StepKernel<<<1, 1>>>(p.rank[0]->ctx(), dst, op, static_cast<uint8_t*>(p.rank[0]->buffer()),
                       latency_ops, rate_ops, dev);
  const cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) {
    s.detail = absl::StrCat("the kernel failed: ", cudaGetErrorString(e));
    s.hint = "report this with the output of compute-sanitizer";
    return s;
  }
  auto r = std::make_unique<Result>();
  cudaMemcpy(r.get(), dev, sizeof(Result), cudaMemcpyDeviceToHost);
  const bool timed = op != Op::kWrap && op != Op::kBadKey;
  s.latency_us = timed ? MedianUs(*r, latency_ops) : 0;
  const double back_to_back = op == Op::kWrap ? kWrapWqes : op == Op::kBadKey ? 0 : rate_ops;
  s.rate = back_to_back > 0 && r->rate_ns > 0 ? back_to_back / (r->rate_ns / 1e9) : 0;
  const bool ok = r->status == static_cast<int>(McStatus::kOk);
  switch (op) {
    case Op::kWriteInline:
    case Op::kWrap: {
      const uint64_t seen = ReadPeer<uint64_t>(*p.rank[1], kWordOff);
      if (!ok) {
        s.detail = StatusText(r->status, r->error);
        s.hint = op == Op::kWrap ? "the ring failed while wrapping: report this with `mcctl qps`"
                                 : kLinkHint;
      } else if (seen != r->ops) {
        s.detail =
            absl::StrCat("the peer's word holds ", seen, ", not the last value (", r->ops, ")");
        s.hint = "completions arrive but data does not land: report this with `mcctl qps`";
      } else {
        s.pass = true;
        s.detail = op == Op::kWrap ? absl::StrCat(kWrapWqes,
                                                  " WQEs (NOPs, then a WRITE) from a kernel "
                                                  "through a 256-deep ring (the 16-bit counter "
                                                  "wrapped), the last landed")
                                   : absl::StrCat(r->ops,
                                                  " inline WRITEs of 8 B from a kernel, "
                                                  "the last value landed");
      }
      break;
    }
    case Op::kWrite: {
      unsigned long long* bad = nullptr;
      cudaMalloc(&bad, sizeof(*bad));
      cudaMemset(bad, 0, sizeof(*bad));
      CountWrongKernel<<<64, 256>>>(static_cast<const uint8_t*>(p.rank[1]->buffer()) + kDstOff,
                                    bad);
      unsigned long long nbad = 0;
      cudaMemcpy(&nbad, bad, sizeof(nbad), cudaMemcpyDeviceToHost);
      cudaFree(bad);
      if (!ok) {
        s.detail = StatusText(r->status, r->error);
        s.hint = kLinkHint;
      } else if (nbad != 0) {
        s.detail = absl::StrCat(nbad, " of ", kWriteBytes, " bytes wrong at the peer");
        s.hint = "completions arrive but data does not land: report this with `mcctl mrs`";
      } else {
        s.pass = true;
        s.detail = absl::StrCat(r->ops, " WRITEs of 64 KiB from a kernel (",
                                absl::StrFormat("%.2f", s.rate * kWriteBytes / 1e9),
                                " GB/s back to back), every byte checked");
      }
      break;
    }
    case Op::kAdd64:
    case Op::kAdd32:
    case Op::kLoopback: {
      const bool k32 = op == Op::kAdd32;
      const auto& holder = op == Op::kLoopback ? *p.rank[0] : *p.rank[1];
      const uint64_t off = op == Op::kAdd64 ? kCounter64Off : k32 ? kCounter32Off : kLoopbackOff;
      const uint64_t total =
          k32 ? ReadPeer<uint32_t>(holder, off) : ReadPeer<uint64_t>(holder, off);
      const uint64_t raw = ReadScratch(r->scratch, rings_on_gpu);
      const uint64_t fetched =
          k32 ? mooncake::device::mlx5::be32(static_cast<uint32_t>(raw & 0xffffffffu)) : raw;
      if (!ok) {
        s.detail = StatusText(r->status, r->error);
        s.hint = kAtomicsHint;
      } else if (total != r->ops) {
        s.detail = absl::StrCat("the counter holds ", total, " after ", r->ops, " adds");
        s.hint = kAtomicsHint;
      } else if (op != Op::kLoopback && fetched != r->ops - 1) {
        s.detail = absl::StrCat("the last add fetched ", fetched, ", expected ", r->ops - 1);
        s.hint =
            "the NIC's atomic reply is not in the byte order kernels assume: report this "
            "with `mcctl nics`";
      } else {
        s.pass = true;
        s.detail = op == Op::kLoopback
                       ? absl::StrCat(r->ops,
                                      " adds from a kernel to this rank's own word "
                                      "through its NIC")
                       : absl::StrCat(r->ops,
                                      " adds from a kernel, the total and the fetched "
                                      "old value right (",
                                      k32 ? "big-endian" : "host order", ")");
      }
      break;
    }
    case Op::kBadKey: {
      const uint8_t syndrome = static_cast<uint8_t>(r->error & 0xffu);
      if (r->status == static_cast<int>(McStatus::kRdmaError) &&
          (r->error & mooncake::device::kQpErrCqe) != 0 &&
          syndrome == mooncake::device::mlx5::kSyndRemoteAccessErr) {
        s.pass = true;
        s.detail = absl::StrCat("refused: ", mooncake::device::DescribeQpError(r->error));
      } else if (ok) {
        s.detail = "a WRITE with a forged key completed: the peer's memory is not protected";
        s.hint = "report this at once, with `mcctl mrs`";
      } else {
        s.detail =
            absl::StrCat("expected the remote access error, got ", StatusText(r->status, r->error));
        s.hint = kLinkHint;
      }
      break;
    }
  }
  return s;
}

// `gpu_doorbells` false: the daemon rings for the kernels (cpu-assisted)
// even where it would hand the doorbell over.
SelftestReport RunPlacement(const std::string& socket, const std::string& nic, int gpu,
                            mooncake::DaemonRdmaOptions::RingMemory rings, const char* where,
                            Result* dev, bool gpu_doorbells = true) {
  SelftestReport r;
  Pair p = SetUp(socket, nic, gpu, rings, gpu_doorbells);
  r.where = absl::StrCat("a pair of ranks in this process, from CUDA kernels on GPU ", gpu,
                         ", rings in ", where);
  if (!p.rank[0]) {
    r.setup_error = p.error;
    r.setup_hint =
        "two ranks on this GPU could not form an RDMA pair through mooncaked: run `mcctl "
        "selftest rdma` (CPU) first, then check `mcctl gpus` and `mcctl doctor`";
    return r;
  }
  bool agents = false;
  if (mooncake::DaemonRdmaTransport* t = p.rank[0]->rdmaTransport()) {
    r.nic = t->nic();
    r.provider = t->nodeInfo().provider;
    r.doorbell_mode = t->doorbellMode();
    agents = t->copyAgentRunning();
  }
  const bool on_gpu = rings == mooncake::DaemonRdmaOptions::RingMemory::kGpu;
  const bool softnic = r.provider == "softnic";
  const std::pair<Op, const char*> steps[] = {
      {Op::kWriteInline, "write-inline"}, {Op::kWrite, "write"},
      {Op::kAdd64, "fetch-add-8"},        {Op::kAdd32, "masked-fa-4"},
      {Op::kWrap, "ring-wrap"},           {Op::kLoopback, "loopback-atomic"},
      {Op::kBadKey, "bad-rkey"}};  // last: it fails the queue pair
  for (const auto& [op, name] : steps)
    r.steps.push_back(RunStep(p, op, name, on_gpu, softnic, dev));
  if (softnic) {
    r.where = absl::StrCat(r.where, agents ? ", GPU bytes moved by this process's copy agents"
                                           : ", GPU bytes moved by mooncaked (no copy agent)");
    // Milliseconds are softnic's, not the node's: say so where a first
    // user would read them as the RDMA route's latency.
    for (SelftestStep& step : r.steps) {
      if (step.pass && step.latency_us > 1000) {
        step.detail =
            absl::StrCat(step.detail,
                         "; softnic ran it in mooncaked's CUDA context, which waits for a GPU "
                         "time slice while a kernel spins (",
                         agents ? "the copy agent did not serve this step: paused on a "
                                  "blocked CUDA call, or running without its kernels (the "
                                  "client's log says which)"
                                : "MOONCAKE_COPY_AGENT=0 or no agent: writes and atomics go there",
                         "; docs/rdma.md, the copy agent): a NIC takes microseconds");
      }
    }
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::string socket, nic;
  int gpu = 0;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--socket" && i + 1 < argc) {
      socket = argv[++i];
    } else if (a == "--nic" && i + 1 < argc) {
      nic = argv[++i];
    } else if (a == "--gpu" && i + 1 < argc) {
      gpu = std::atoi(argv[++i]);
    } else if (a == "--json") {
      json = true;
    } else {
      std::fprintf(stderr, "usage: mcctl-selftest-gpu --socket S [--nic N] [--gpu G] [--json]\n");
      return 2;
    }
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || gpu < 0 || gpu >= count) {
    std::fprintf(stderr, "selftest rdma --gpu %d: this process sees %d GPU(s)\n", gpu, count);
    return 2;
  }
  cudaSetDevice(gpu);
  Result* dev = nullptr;
  if (cudaMalloc(&dev, sizeof(Result)) != cudaSuccess) {
    std::fprintf(stderr, "selftest rdma --gpu %d: cudaMalloc failed\n", gpu);
    return 2;
  }
  using Rings = mooncake::DaemonRdmaOptions::RingMemory;
  SelftestReport host = RunPlacement(socket, nic, gpu, Rings::kHost, "host memory", dev);
  SelftestReport gpumem = RunPlacement(socket, nic, gpu, Rings::kGpu, "GPU memory", dev);
  // Every doorbell mode the node offers: where kernels rang the NIC
  // themselves (gpu-uar), once more with the daemon ringing for them
  // (cpu-assisted, the mode of a refused hand-off), host rings (GPU rings
  // need gpu-uar). softnic has one mode (doorbell-record).
  const bool both_modes = host.doorbell_mode == "gpu-uar";
  SelftestReport assisted;
  if (both_modes) {
    assisted = RunPlacement(socket, nic, gpu, Rings::kHost, "host memory", dev,
                            /*gpu_doorbells=*/false);
  }
  // GPU rings are optional: a node that refuses them at setup does not
  // support them, which is no failure (the reason is shown).
  const bool gpu_supported = gpumem.setup_error.empty();
  const bool ok = host.ok() && (!gpu_supported || gpumem.ok()) && (!both_modes || assisted.ok());
  if (json) {
    std::printf(
        "{\"ok\":%s,\"host_rings\":%s,\"gpu_rings\":%s%s}\n", ok ? "true" : "false",
        mooncake::mcctl::SelftestJson(host).c_str(),
        gpu_supported
            ? mooncake::mcctl::SelftestJson(gpumem).c_str()
            : absl::StrCat(
                  "{\"supported\":false,\"report\":", mooncake::mcctl::SelftestJson(gpumem), "}")
                  .c_str(),
        both_modes
            ? absl::StrCat(",\"cpu_assisted\":", mooncake::mcctl::SelftestJson(assisted)).c_str()
            : "");
  } else {
    std::fputs(mooncake::mcctl::FormatSelftest(host).c_str(), stdout);
    if (gpu_supported) {
      std::fputs(mooncake::mcctl::FormatSelftest(gpumem).c_str(), stdout);
    } else {
      std::printf("rings in GPU memory: not supported on this node: %s\n",
                  mooncake::EscapeForDisplay(gpumem.setup_error, 1024).c_str());
    }
    if (both_modes) std::fputs(mooncake::mcctl::FormatSelftest(assisted).c_str(), stdout);
  }
  cudaFree(dev);
  return ok ? 0 : 1;
}
