// gpu_handoff_bench: what softnic's GPU workers cost and what they buy,
// on CPU. softnic runs WQEs that touch GPU memory on GPU worker threads
// (daemon/softnic/gpu_workers.h) and host-only WQEs on its engine thread.
// The engine runs in this process on the fake CUDA driver, whose "GPU
// memory" is host memory, so a GPU copy costs a memmove and what is
// measured is the hand-off, not CUDA. In one run, side by side:
//
//   host      an 8-byte inline WRITE into host memory, ring to CQE (the
//             engine thread alone: the baseline)
//   gpu       the same WRITE into GPU memory (engine thread, a worker,
//             back): the hand-off's cost per WQE
//   isolated  another session's host WRITE while one session keeps a GPU
//             atomic in flight that stalls --stall-us each, as an atomic
//             waits for a time slice behind a client's spinning kernel
//             (2.4 ms on an H200): before the workers this waited for it
//
//   gpu_handoff_bench [--iters N] [--stall-us S] [--smoke]
//
// --smoke (CI): few iterations, a 20 ms stall; exits 1 when the isolated
// WRITE's median waits for the stall. Ends with "result key=value ...".
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "bench_support.h"
#include "fake_cuda_driver.h"
#include "mooncake/device/mlx5/prm.h"
#include "mooncake/device/mlx5/wqe.h"
#include "raw_qp.h"
#include "softnic/cuda_memory.h"
#include "softnic/engine.h"
#include "softnic/shared_mapping.h"

namespace mooncake::softnic {
namespace {

using bench::NowNs;
using drivers::CuDevicePtr;
using test_util::RawQp;
namespace mlx5 = ::mooncake::device::mlx5;
constexpr uint8_t kUpd = mlx5::kCtrlCqUpdate;
constexpr size_t kGran = size_t{64} << 10;

// GPU atomics that take `stall_us` first (a time slice), on the fake's
// device pointers (host addresses).
class StallingAtomics final : public CudaAtomics {
 public:
  explicit StallingAtomics(uint32_t stall_us) : stall_us_(stall_us) {}
  absl::StatusOr<uint64_t> FetchAdd64(const CudaLane&, CuDevicePtr word, uint64_t add) override {
    std::this_thread::sleep_for(std::chrono::microseconds(stall_us_));
    return std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(static_cast<uintptr_t>(word)))
        .fetch_add(add);
  }
  absl::StatusOr<uint32_t> MaskedFetchAdd32(const CudaLane&, CuDevicePtr, uint32_t,
                                            uint32_t) override {
    return absl::UnimplementedError("not used");
  }

 private:
  const uint32_t stall_us_;
};

// A client's GPU allocation, made and exported as a client library does,
// on the client's own fake driver.
struct ClientGpuMemory {
  drivers::FakeCudaDriver* cu = nullptr;
  drivers::CuMemHandle handle = 0;
  CuDevicePtr va = 0;
  int fd = -1;
};

bool Allocate(drivers::FakeCudaDriver& cu, ClientGpuMemory* m) {
  drivers::CuMemAllocationProp prop{};
  prop.type = drivers::kCuMemAllocationTypePinned;
  prop.location = {drivers::kCuMemLocationTypeDevice, 0};
  prop.requestedHandleTypes = drivers::kCuMemHandleTypePosixFileDescriptor;
  drivers::CuMemAccessDesc access{{drivers::kCuMemLocationTypeDevice, 0},
                                  drivers::kCuMemAccessFlagsProtReadWrite};
  m->cu = &cu;
  return cu.memCreate(&m->handle, kGran, &prop, 0) == drivers::kCudaSuccess &&
         cu.memAddressReserve(&m->va, kGran, 0, 0, 0) == drivers::kCudaSuccess &&
         cu.memMap(m->va, kGran, 0, m->handle, 0) == drivers::kCudaSuccess &&
         cu.memSetAccess(m->va, kGran, &access, 1) == drivers::kCudaSuccess &&
         cu.memExportToShareableHandle(&m->fd, m->handle,
                                       drivers::kCuMemHandleTypePosixFileDescriptor,
                                       0) == drivers::kCudaSuccess;
}

// Rings one 8-byte inline WRITE on `qp` and waits for its CQE; the time
// from the doorbell to the CQE in microseconds, or -1.
double TimedWrite(RawQp& qp, uint64_t raddr, uint32_t rkey, uint64_t value) {
  mlx5::Wqe64 w;
  mlx5::build_rdma_write_inline(&w, static_cast<uint16_t>(qp.pi()), qp.qpn(), kUpd, raddr, rkey,
                                &value, 8);
  qp.Write(w);
  const int64_t t0 = NowNs();
  qp.Ring();
  mlx5::Cqe64 c;
  if (!qp.Next(&c, std::chrono::seconds(10))) return -1;
  if (mlx5::cqe_opcode(c.op_own) != mlx5::kCqeReq) return -1;
  return static_cast<double>(NowNs() - t0) / 1e3;
}

void Print(const char* name, const bench::Stats& s) {
  std::printf("%-9s n=%-6zu p50 %8.2f us  p99 %8.2f us  max %9.2f us\n", name, s.n, s.p50, s.p99,
              s.max);
}

int Main(int argc, char** argv) {
  int iters = 20000;
  uint32_t stall_us = 2400;
  bool smoke = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--smoke") {
      smoke = true;
    } else if (a == "--iters" && i + 1 < argc && absl::SimpleAtoi(argv[i + 1], &iters) &&
               iters > 0) {
      ++i;
    } else if (a == "--stall-us" && i + 1 < argc && absl::SimpleAtoi(argv[i + 1], &stall_us)) {
      ++i;
    } else {
      std::fprintf(stderr, "usage: gpu_handoff_bench [--iters N] [--stall-us S] [--smoke]\n");
      return 2;
    }
  }
  if (smoke) {
    iters = 300;
    stall_us = 20000;
  }

  drivers::FakeCudaDriver client_cu;
  client_cu.addGpu(drivers::FakeGpu::Hopper(0));
  client_cu.setGranularity(kGran);
  auto daemon_cu = std::make_shared<drivers::FakeCudaDriver>();
  daemon_cu->addGpu(drivers::FakeGpu::Hopper(0));
  daemon_cu->setGranularity(kGran);
  ClientGpuMemory gpu;
  if (client_cu.init(0) != drivers::kCudaSuccess || !Allocate(client_cu, &gpu)) {
    std::fprintf(stderr, "the fake client allocation failed\n");
    return 1;
  }
  CudaMemoryOptions options;
  options.driver = daemon_cu;
  options.atomics = [stall_us](drivers::CudaDriver&) {
    return absl::StatusOr<std::unique_ptr<CudaAtomics>>(
        std::make_unique<StallingAtomics>(stall_us));
  };
  std::shared_ptr<CudaMemory> cuda = CudaMemory::Create(options);
  absl::StatusOr<std::shared_ptr<CudaBuffer>> buffer = cuda->Import(gpu.fd, kGran);
  absl::StatusOr<std::shared_ptr<SharedMapping>> host = SharedMapping::Anonymous(1 << 20);
  if (!buffer.ok() || !host.ok()) {
    std::fprintf(stderr, "setup: %s %s\n", buffer.status().ToString().c_str(),
                 host.status().ToString().c_str());
    return 1;
  }

  // Sessions: 1 requests, 2 responds (host and GPU memory), 3 is the other
  // session with a QP pair of its own.
  Engine engine;
  auto region = [&](PdId pd, uint64_t offset, uint32_t access) {
    RegionSpec spec;
    spec.pd = pd;
    spec.iova = reinterpret_cast<uintptr_t>((*host)->data()) + offset;
    spec.length = 4096;
    spec.access = access;
    spec.mapping = *host;
    spec.offset = offset;
    return engine.RegisterRegion(spec);
  };
  RegionSpec gpu_spec;
  gpu_spec.pd = 2;
  gpu_spec.kind = MemoryKind::kCuda;
  gpu_spec.iova = gpu.va;
  gpu_spec.length = kGran;
  gpu_spec.access = kRemoteWrite | kRemoteAtomic;
  gpu_spec.cuda = *buffer;
  absl::StatusOr<uint32_t> host_key = region(2, 0, kRemoteWrite);
  absl::StatusOr<uint32_t> fetch_key = region(1, 4096, kLocalWrite);
  absl::StatusOr<uint32_t> other_key = region(3, 8192, kRemoteWrite);
  absl::StatusOr<uint32_t> gpu_key = engine.RegisterRegion(gpu_spec);
  std::unique_ptr<RawQp> responder = RawQp::Create(engine, 2, 1, 1);
  std::unique_ptr<RawQp> writer = RawQp::Create(engine, 1, 64, 64);
  std::unique_ptr<RawQp> staller = RawQp::Create(engine, 1, 64, 64);
  std::unique_ptr<RawQp> other_responder = RawQp::Create(engine, 3, 1, 1);
  std::unique_ptr<RawQp> other = RawQp::Create(engine, 3, 64, 64);
  if (!host_key.ok() || !fetch_key.ok() || !other_key.ok() || !gpu_key.ok() || !responder ||
      !writer || !staller || !other_responder || !other ||
      !engine.Connect(1, writer->qpn(), responder->qpn()).ok() ||
      !engine.Connect(1, staller->qpn(), responder->qpn()).ok() ||
      !engine.Connect(3, other->qpn(), other_responder->qpn()).ok()) {
    std::fprintf(stderr, "setup: regions or queue pairs failed\n");
    return 1;
  }
  engine.Start();
  const uint64_t host_addr = reinterpret_cast<uintptr_t>((*host)->data());

  auto measure = [&](RawQp& qp, uint64_t raddr, uint32_t rkey, int n) {
    std::vector<double> v;
    v.reserve(n);
    for (int i = 0; i < n; ++i) {
      const double us = TimedWrite(qp, raddr, rkey, static_cast<uint64_t>(i));
      if (us < 0) break;
      v.push_back(us);
    }
    return v;
  };
  // Warm-up: the first GPU WQE starts a worker thread and makes a lane.
  measure(*writer, host_addr, *host_key, 100);
  measure(*writer, gpu.va, *gpu_key, 100);
  const std::vector<double> host_v = measure(*writer, host_addr, *host_key, iters);
  const std::vector<double> gpu_v = measure(*writer, gpu.va, *gpu_key, iters);

  // One GPU atomic in flight at a time on `staller`, each stalling.
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> stalled{0};
  std::thread stalling([&] {
    while (!stop.load()) {
      mlx5::Wqe64 w;
      mlx5::build_atomic_fa64(&w, static_cast<uint16_t>(staller->pi()), staller->qpn(), kUpd,
                              gpu.va + 64, *gpu_key, 1, host_addr + 4096, *fetch_key);
      staller->Write(w);
      staller->Ring();
      mlx5::Cqe64 c;
      if (!staller->Next(&c, std::chrono::seconds(30))) break;
      stalled.fetch_add(1);
    }
  });
  // The stalling atomic first, so the other session starts behind it.
  std::this_thread::sleep_for(std::chrono::microseconds(stall_us / 4));
  const int isolated_n = std::max(iters / 10, 50);
  const std::vector<double> isolated_v = measure(*other, host_addr + 8192, *other_key, isolated_n);
  stop.store(true);
  stalling.join();
  engine.Stop();

  const bench::Stats host_s = bench::Summarize(host_v);
  const bench::Stats gpu_s = bench::Summarize(gpu_v);
  const bench::Stats iso_s = bench::Summarize(isolated_v);
  Print("host", host_s);
  Print("gpu", gpu_s);
  Print("isolated", iso_s);
  std::printf("stalled GPU atomics meanwhile: %llu of %u us each\n",
              static_cast<unsigned long long>(stalled.load()), stall_us);
  const bool complete = host_v.size() == static_cast<size_t>(iters) &&
                        gpu_v.size() == static_cast<size_t>(iters) &&
                        isolated_v.size() == static_cast<size_t>(isolated_n) && stalled.load() > 0;
  // Waiting for the stall would put the median near stall_us.
  const bool isolated = iso_s.p50 < stall_us / 2.0;
  std::printf(
      "result host_p50_us=%.2f host_p99_us=%.2f gpu_p50_us=%.2f gpu_p99_us=%.2f "
      "isolated_p50_us=%.2f isolated_p99_us=%.2f stall_us=%u stalled=%llu complete=%d "
      "isolated=%d\n",
      host_s.p50, host_s.p99, gpu_s.p50, gpu_s.p99, iso_s.p50, iso_s.p99, stall_us,
      static_cast<unsigned long long>(stalled.load()), complete ? 1 : 0, isolated ? 1 : 0);
  ::close(gpu.fd);
  return complete && isolated ? 0 : 1;
}

}  // namespace
}  // namespace mooncake::softnic

int main(int argc, char** argv) { return mooncake::softnic::Main(argc, argv); }
