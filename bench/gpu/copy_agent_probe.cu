// copy_agent_probe: what a helper thread's CUDA copies do while the same
// process's kernel waits for them (issue 24 item 11, softnic's copy agent).
//
// The copy agent (client/src/copy_agent.h) is a thread of the application
// that copies into the application's GPU memory for softnic while the
// application's kernel spins waiting for those bytes. On the H200 one such
// copy in about a thousand came back only after the kernels ended when
// another thread of the process sat in cudaDeviceSynchronize. This program
// finds out which call blocks, under which conditions, and whether a copy
// that was submitted but not yet run reads its source when it runs or when
// it was submitted. It needs one GPU and no daemon.
//
//   copy_agent_probe blocking   # 256 kernel threads x 4 rounds, each waiting
//                               # for its word; every combination below
//   copy_agent_probe capture    # does a queued copy read its source late?
//   copy_agent_probe barrier    # and while the main thread launches a kernel
//                               # for the first time or copies synchronously?
//
// blocking: the copy is cuMemcpyHtoDAsync from pinned host memory, or
// cuMemcpyDtoDAsync from the same memory's device alias; completion is
// learnt by polling cuStreamQuery, or from a cuStreamWriteValue32 into host
// memory the thread polls; the main thread waits for the kernel with
// cudaDeviceSynchronize, cudaStreamSynchronize, or by polling host memory
// (no CUDA call) before synchronizing; the destination is cudaMalloc or
// cuMemCreate memory. A watchdog ends the kernel when one call has taken
// longer than 1 s (the kernel would otherwise wait forever), and the row
// counts it as blocked.
#include <cuda.h>
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "bench_util.cuh"

namespace {

#define PROBE_CU(expr)                                                                          \
  do {                                                                                          \
    CUresult r_ = (expr);                                                                       \
    if (r_ != CUDA_SUCCESS) {                                                                   \
      const char* s_ = nullptr;                                                                 \
      cuGetErrorName(r_, &s_);                                                                  \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #expr, s_ ? s_ : "?"); \
      std::exit(2);                                                                             \
    }                                                                                           \
  } while (0)

constexpr int kThreads = 256;
constexpr int kRounds = 4;

// Host memory both sides see (cudaHostAlloc, mapped).
struct Shared {
  uint32_t req[kThreads];  // kernel -> agent: the round thread t asks for
  uint32_t abort;          // watchdog -> kernel: give up
  uint32_t completed;      // cuStreamWriteValue32 target
};

__device__ uint32_t LoadSys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__global__ void WaitersKernel(Shared* s, uint8_t* dst, size_t stride, int rounds) {
  const unsigned t = threadIdx.x;
  volatile uint64_t* word = reinterpret_cast<volatile uint64_t*>(dst + t * stride);
  for (int r = 1; r <= rounds; ++r) {
    const uint64_t want = (uint64_t(t) << 16) | uint64_t(r);
    __threadfence_system();
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(&s->req[t]), "r"(uint32_t(r))
                 : "memory");
    while (*word != want) {
      if (LoadSys(&s->abort) != 0) return;
      __nanosleep(200);
    }
  }
}

enum class Copy { kHtoD, kDtoDAlias };
enum class Done { kStreamQuery, kWriteValue };
enum class Sync { kDeviceSync, kStreamSync, kHostPoll };
enum class Dest { kCudaMalloc, kVmm };

const char* Name(Copy c) { return c == Copy::kHtoD ? "HtoD" : "DtoD-alias"; }
const char* Name(Done d) { return d == Done::kStreamQuery ? "cuStreamQuery" : "writeValue32"; }
const char* Name(Sync s) {
  return s == Sync::kDeviceSync   ? "cudaDeviceSynchronize"
         : s == Sync::kStreamSync ? "cudaStreamSynchronize"
                                  : "host poll";
}
const char* Name(Dest d) { return d == Dest::kCudaMalloc ? "cudaMalloc" : "cuMemCreate"; }

uint64_t NowNs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

struct DeviceBuffer {
  CUdeviceptr ptr = 0;
  size_t bytes = 0;
  bool vmm = false;
  CUmemGenericAllocationHandle handle{};
};

DeviceBuffer Allocate(Dest d, size_t bytes) {
  DeviceBuffer b;
  b.vmm = d == Dest::kVmm;
  if (!b.vmm) {
    b.bytes = bytes;
    PROBE_CU(cuMemAlloc(&b.ptr, bytes));
    return b;
  }
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  size_t gran = 0;
  PROBE_CU(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  b.bytes = (bytes + gran - 1) / gran * gran;
  PROBE_CU(cuMemCreate(&b.handle, b.bytes, &prop, 0));
  PROBE_CU(cuMemAddressReserve(&b.ptr, b.bytes, 0, 0, 0));
  PROBE_CU(cuMemMap(b.ptr, b.bytes, 0, b.handle, 0));
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  PROBE_CU(cuMemSetAccess(b.ptr, b.bytes, &access, 1));
  return b;
}

void Free(DeviceBuffer& b) {
  if (!b.vmm) {
    cuMemFree(b.ptr);
    return;
  }
  cuMemUnmap(b.ptr, b.bytes);
  cuMemAddressFree(b.ptr, b.bytes);
  cuMemRelease(b.handle);
}

struct Row {
  int runs = 0;
  int blocked = 0;  // runs the watchdog had to end
  int stale = 0;    // words wrong after a run that was not ended
  uint64_t copies = 0;
  uint64_t slow_submit = 0;  // submit calls over 1 ms
  uint64_t slow_done = 0;    // completions over 1 ms
  uint64_t max_submit_ns = 0;
  uint64_t max_done_ns = 0;
  std::vector<double> done_us;
  std::string blocked_in;  // which call the watchdog found it in
};

// One run: the kernel's 256 threads each ask for their word kRounds times;
// the agent thread copies each answer in.
void RunOnce(Copy copy, Done done, Sync sync, Dest dest, size_t bytes, Row& row) {
  CUcontext ctx = nullptr;
  PROBE_CU(cuCtxGetCurrent(&ctx));
  Shared* shared = nullptr;
  BENCH_CUDA(cudaHostAlloc(&shared, sizeof(Shared), cudaHostAllocMapped | cudaHostAllocPortable));
  std::memset(shared, 0, sizeof(Shared));
  Shared* shared_dev = nullptr;
  BENCH_CUDA(cudaHostGetDevicePointer(reinterpret_cast<void**>(&shared_dev), shared, 0));
  const size_t stride = bytes < 64 ? 64 : bytes;
  DeviceBuffer dst = Allocate(dest, stride * kThreads);
  PROBE_CU(cuMemsetD8(dst.ptr, 0, stride * kThreads));
  uint8_t* staging = nullptr;
  BENCH_CUDA(
      cudaHostAlloc(&staging, stride * kThreads, cudaHostAllocMapped | cudaHostAllocPortable));
  CUdeviceptr staging_dev = 0;
  PROBE_CU(cuMemHostGetDevicePointer(&staging_dev, staging, 0));
  CUdeviceptr completed_dev = 0;
  PROBE_CU(cuMemHostGetDevicePointer(&completed_dev, &shared->completed, 0));

  std::atomic<uint64_t> busy_since{0};
  std::atomic<int> phase{0};  // 1 submit, 2 completion
  std::atomic<bool> agent_done{false};
  std::atomic<bool> stop_watch{false};
  std::atomic<bool> ended{false};
  std::string blocked_in;

  std::thread agent([&] {
    cuCtxSetCurrent(ctx);
    CUstream stream = nullptr;
    PROBE_CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    std::vector<uint32_t> served(kThreads, 0);
    uint32_t seq = 0;
    uint64_t left = uint64_t(kThreads) * kRounds;
    while (left > 0 && !ended.load()) {
      for (int t = 0; t < kThreads && !ended.load(); ++t) {
        const uint32_t want = std::atomic_ref<uint32_t>(shared->req[t]).load();
        if (want == served[t]) continue;
        const uint64_t value = (uint64_t(t) << 16) | want;
        uint8_t* s = staging + t * stride;
        std::memset(s, int(want), bytes);
        std::memcpy(s, &value, std::min<size_t>(8, bytes));
        const uint64_t t0 = NowNs();
        busy_since.store(t0);
        phase.store(1);
        if (copy == Copy::kHtoD) {
          PROBE_CU(cuMemcpyHtoDAsync(dst.ptr + t * stride, s, bytes, stream));
        } else {
          PROBE_CU(
              cuMemcpyDtoDAsync(dst.ptr + t * stride, staging_dev + t * stride, bytes, stream));
        }
        ++seq;
        if (done == Done::kWriteValue) {
          PROBE_CU(cuStreamWriteValue32(stream, completed_dev, seq, CU_STREAM_WRITE_VALUE_DEFAULT));
        }
        const uint64_t t1 = NowNs();
        phase.store(2);
        if (done == Done::kStreamQuery) {
          CUresult r;
          while ((r = cuStreamQuery(stream)) == CUDA_ERROR_NOT_READY) {
          }
          if (r != CUDA_SUCCESS) PROBE_CU(r);
        } else {
          while (std::atomic_ref<uint32_t>(shared->completed).load() != seq && !ended.load()) {
          }
        }
        const uint64_t t2 = NowNs();
        busy_since.store(0);
        phase.store(0);
        row.max_submit_ns = std::max(row.max_submit_ns, t1 - t0);
        row.max_done_ns = std::max(row.max_done_ns, t2 - t1);
        row.slow_submit += (t1 - t0) > 1'000'000;
        row.slow_done += (t2 - t1) > 1'000'000;
        row.done_us.push_back((t2 - t0) / 1e3);
        ++row.copies;
        served[t] = want;
        --left;
      }
    }
    cuStreamSynchronize(stream);
    cuStreamDestroy(stream);
    agent_done.store(true);
  });
  std::thread watchdog([&] {
    while (!stop_watch.load()) {
      const uint64_t since = busy_since.load();
      if (since != 0 && NowNs() - since > 1'000'000'000ull) {
        blocked_in = phase.load() == 1 ? "submit" : "completion";
        ended.store(true);
        std::atomic_ref<uint32_t>(shared->abort).store(1);
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });

  WaitersKernel<<<1, kThreads>>>(shared_dev, reinterpret_cast<uint8_t*>(dst.ptr), stride, kRounds);
  BENCH_CUDA(cudaGetLastError());
  switch (sync) {
    case Sync::kDeviceSync: BENCH_CUDA(cudaDeviceSynchronize()); break;
    case Sync::kStreamSync: BENCH_CUDA(cudaStreamSynchronize(0)); break;
    case Sync::kHostPoll:
      while (!agent_done.load() && !ended.load()) std::this_thread::yield();
      BENCH_CUDA(cudaDeviceSynchronize());
      break;
  }
  agent.join();
  stop_watch.store(true);
  watchdog.join();
  ++row.runs;
  if (ended.load()) {
    ++row.blocked;
    if (row.blocked_in.find(blocked_in) == std::string::npos) {
      row.blocked_in += (row.blocked_in.empty() ? "" : "+") + blocked_in;
    }
  } else {
    std::vector<uint64_t> words(kThreads);
    for (int t = 0; t < kThreads; ++t) {
      PROBE_CU(cuMemcpyDtoH(&words[t], dst.ptr + t * stride, 8));
      const uint64_t want = (uint64_t(t) << 16) | kRounds;
      if (bytes >= 8 ? words[t] != want : (words[t] & 0xff) != (want & 0xff)) ++row.stale;
    }
  }
  Free(dst);
  cudaFreeHost(staging);
  cudaFreeHost(shared);
}

int Blocking(int repeats) {
  std::printf("%-10s %-13s %-22s %-11s %6s %5s %7s %6s %7s %9s %9s %9s %10s %s\n", "copy",
              "completion", "main thread", "dest", "bytes", "runs", "blocked", "stale", "copies",
              "p50 us", "p99 us", "max sub", "max done", "blocked in");
  int bad_rows = 0;
  for (Dest dest : {Dest::kVmm, Dest::kCudaMalloc}) {
    for (Sync sync : {Sync::kDeviceSync, Sync::kStreamSync, Sync::kHostPoll}) {
      for (Done done : {Done::kStreamQuery, Done::kWriteValue}) {
        for (Copy copy : {Copy::kHtoD, Copy::kDtoDAlias}) {
          for (size_t bytes : {size_t(8), size_t(4096)}) {
            Row row;
            for (int i = 0; i < repeats; ++i) RunOnce(copy, done, sync, dest, bytes, row);
            std::vector<double> v = row.done_us;
            std::sort(v.begin(), v.end());
            const double p99 = v.empty() ? 0 : v[std::min(v.size() - 1, v.size() * 99 / 100)];
            std::printf(
                "%-10s %-13s %-22s %-11s %6zu %5d %7d %6d %7llu %9.1f %9.1f %9.1f %10.1f %s\n",
                Name(copy), Name(done), Name(sync), Name(dest), bytes, row.runs, row.blocked,
                row.stale, (unsigned long long)row.copies, mcbench::median(row.done_us), p99,
                row.max_submit_ns / 1e3, row.max_done_ns / 1e3,
                row.blocked_in.empty() ? "-" : row.blocked_in.c_str());
            std::fflush(stdout);
            bad_rows += (row.blocked + row.stale) > 0;
          }
        }
      }
    }
  }
  std::printf("rows with a blocked run or a stale word: %d\n", bad_rows);
  return 0;
}

// Does a copy queued behind a wait read its source when it runs, or when it
// was submitted? The stream waits on a host word; the copy is submitted;
// the source changes; the wait is released.
int Capture() {
  CUstream stream = nullptr;
  PROBE_CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  uint32_t* gate = nullptr;
  BENCH_CUDA(cudaHostAlloc(&gate, 4096, cudaHostAllocMapped | cudaHostAllocPortable));
  CUdeviceptr gate_dev = 0;
  PROBE_CU(cuMemHostGetDevicePointer(&gate_dev, gate, 0));
  const size_t max = size_t(1) << 20;
  uint8_t* src = nullptr;
  BENCH_CUDA(cudaHostAlloc(&src, max, cudaHostAllocMapped | cudaHostAllocPortable));
  CUdeviceptr src_dev = 0;
  PROBE_CU(cuMemHostGetDevicePointer(&src_dev, src, 0));
  std::vector<uint8_t> back(max);
  std::printf("%-10s %-11s %8s  %s\n", "copy", "dest", "bytes", "bytes that landed");
  for (Dest dest : {Dest::kVmm, Dest::kCudaMalloc}) {
    DeviceBuffer dst = Allocate(dest, max);
    for (Copy copy : {Copy::kHtoD, Copy::kDtoDAlias}) {
      for (size_t n : {size_t(8), size_t(64), size_t(4096), size_t(65536), size_t(65537), max}) {
        PROBE_CU(cuMemsetD8(dst.ptr, 0, max));
        *gate = 0;
        std::memset(src, 0xAA, n);  // "at submit"
        PROBE_CU(cuStreamWaitValue32(stream, gate_dev, 1, CU_STREAM_WAIT_VALUE_EQ));
        if (copy == Copy::kHtoD) {
          PROBE_CU(cuMemcpyHtoDAsync(dst.ptr, src, n, stream));
        } else {
          PROBE_CU(cuMemcpyDtoDAsync(dst.ptr, src_dev, n, stream));
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        const bool ran_early = cuStreamQuery(stream) == CUDA_SUCCESS;
        std::memset(src, 0xBB, n);  // "at run"
        std::atomic_ref<uint32_t>(*gate).store(1);
        PROBE_CU(cuStreamSynchronize(stream));
        PROBE_CU(cuMemcpyDtoH(back.data(), dst.ptr, n));
        size_t a = 0, b = 0;
        for (size_t i = 0; i < n; ++i) {
          a += back[i] == 0xAA;
          b += back[i] == 0xBB;
        }
        std::printf("%-10s %-11s %8zu  %s%s\n", Name(copy), Name(dest), n,
                    a == n   ? "as at submit (captured)"
                    : b == n ? "as at run (read late)"
                             : ("mixed: " + std::to_string(a) + " at submit, " + std::to_string(b) +
                                " at run")
                                   .c_str(),
                    ran_early ? " [ran before the gate opened!]" : "");
      }
    }
    Free(dst);
  }
  cudaFreeHost(src);
  cudaFreeHost(gate);
  cuStreamDestroy(stream);
  return 0;
}

// A kernel that waits for a host word: the application's spinning kernel.
// It also records the first non-zero value it sees at `watch` (the copy's
// destination) in seen[0], as the bytes are in GPU memory: whether the
// copy has landed, independent of what its stream reports.
__global__ void WaitForGoKernel(const uint32_t* go, const volatile uint64_t* watch,
                                unsigned long long* seen) {
  while (LoadSys(go) == 0) {
    const uint64_t v = *watch;
    if (v != 0 && seen[0] == 0) {
      seen[0] = v;
      __threadfence_system();
    }
    __nanosleep(1000);
  }
}
// Kernels launched for the first time while WaitForGoKernel spins: each
// instantiation is its own function, which lazy loading loads at its first
// launch.
template <int I>
__global__ void FreshKernel(uint32_t* out) {
  out[I] = I;
}
template <int... I>
void LaunchFresh(int which, uint32_t* out, std::integer_sequence<int, I...>) {
  ((which == I ? (FreshKernel<I><<<1, 1>>>(out), 0) : 0), ...);
}

// What the main thread does while the kernel spins and the helper thread
// copies: nothing; launch a kernel never launched before (lazy loading);
// a synchronous cudaMemcpy into pageable memory, which waits for the kernel.
enum class Main { kNothing, kFreshLaunch, kSyncPageableCopy };
const char* Name(Main m) {
  return m == Main::kNothing       ? "nothing"
         : m == Main::kFreshLaunch ? "first launch of a kernel"
                                   : "sync cudaMemcpy to pageable";
}

// The helper thread submits an 8-byte copy of the value A while the kernel
// spins, then changes the source to B, waits 50 ms and releases the kernel.
// Prints how long the submission took, whether the copy ran before the
// release, and whether A (read at submission) or B (read when it ran)
// landed.
int Barrier() {
  uint32_t* go = nullptr;
  BENCH_CUDA(cudaHostAlloc(&go, 4096, cudaHostAllocMapped | cudaHostAllocPortable));
  uint32_t* go_dev = nullptr;
  BENCH_CUDA(cudaHostGetDevicePointer(reinterpret_cast<void**>(&go_dev), go, 0));
  uint8_t* staging = nullptr;
  BENCH_CUDA(cudaHostAlloc(&staging, 4096, cudaHostAllocMapped | cudaHostAllocPortable));
  CUdeviceptr staging_dev = 0;
  PROBE_CU(cuMemHostGetDevicePointer(&staging_dev, staging, 0));
  uint32_t* fresh_out = nullptr;
  BENCH_CUDA(cudaMalloc(&fresh_out, 64 * sizeof(uint32_t)));
  CUcontext ctx = nullptr;
  PROBE_CU(cuCtxGetCurrent(&ctx));
  CUstream stream = nullptr;
  PROBE_CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  // Warm-up, as the copy agent does: one copy of each kind, idle GPU.
  DeviceBuffer warm = Allocate(Dest::kCudaMalloc, 4096);
  PROBE_CU(cuMemcpyHtoDAsync(warm.ptr, staging, 64, stream));
  PROBE_CU(cuMemcpyDtoDAsync(warm.ptr, staging_dev, 64, stream));
  PROBE_CU(cuStreamSynchronize(stream));
  unsigned long long* seen = nullptr;
  BENCH_CUDA(cudaHostAlloc(&seen, 64, cudaHostAllocMapped | cudaHostAllocPortable));
  unsigned long long* seen_dev = nullptr;
  BENCH_CUDA(cudaHostGetDevicePointer(reinterpret_cast<void**>(&seen_dev), seen, 0));
  unsigned long long seen_before_go = 0;
  std::printf("%-30s %-10s %-11s %12s %14s %16s  %s\n", "main thread", "copy", "dest", "submit us",
              "stream done", "kernel saw it", "bytes that landed");
  std::printf(
      "(before the kernel was released; the source changed from A to B 5 ms after "
      "the submission)\n");
  int fresh = 0;
  for (Main main_does : {Main::kNothing, Main::kFreshLaunch, Main::kSyncPageableCopy}) {
    for (Dest dest : {Dest::kVmm, Dest::kCudaMalloc}) {
      for (Copy copy : {Copy::kHtoD, Copy::kDtoDAlias}) {
        DeviceBuffer dst = Allocate(dest, 4096);
        PROBE_CU(cuMemsetD8(dst.ptr, 0, 4096));
        PROBE_CU(cuCtxSynchronize());
        std::atomic_ref<uint32_t>(*go).store(0);
        seen[0] = 0;
        std::memset(staging, 0xAA, 8);
        WaitForGoKernel<<<1, 1>>>(go_dev, reinterpret_cast<const uint64_t*>(dst.ptr), seen_dev);
        double submit_us = 0;
        std::atomic<bool> ran_early{false};
        std::thread helper([&] {
          cuCtxSetCurrent(ctx);
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
          const uint64_t t0 = NowNs();
          if (copy == Copy::kHtoD) {
            PROBE_CU(cuMemcpyHtoDAsync(dst.ptr, staging, 8, stream));
          } else {
            PROBE_CU(cuMemcpyDtoDAsync(dst.ptr, staging_dev, 8, stream));
          }
          submit_us = (NowNs() - t0) / 1e3;
        });
        // Changes the source, then releases the kernel, whatever the helper
        // is stuck in.
        std::thread releaser([&] {
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
          std::memset(staging, 0xBB, 8);
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
          ran_early.store(cuStreamQuery(stream) == CUDA_SUCCESS);
          seen_before_go = std::atomic_ref<unsigned long long>(seen[0]).load();
          std::atomic_ref<uint32_t>(*go).store(1);
        });
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        uint32_t pageable = 0;
        if (main_does == Main::kFreshLaunch) {
          LaunchFresh(fresh++, fresh_out, std::make_integer_sequence<int, 16>{});
        } else if (main_does == Main::kSyncPageableCopy) {
          BENCH_CUDA(cudaMemcpy(&pageable, fresh_out, sizeof(pageable), cudaMemcpyDeviceToHost));
        }
        helper.join();
        releaser.join();
        PROBE_CU(cuCtxSynchronize());
        uint8_t back[8];
        PROBE_CU(cuMemcpyDtoH(back, dst.ptr, 8));
        const char* landed = back[0] == 0xAA   ? "as at submit (captured)"
                             : back[0] == 0xBB ? "as when it ran (read late)"
                                               : "neither";
        const char* seen_early = seen_before_go == 0               ? "no"
                                 : (seen_before_go & 0xff) == 0xAA ? "yes, A"
                                 : (seen_before_go & 0xff) == 0xBB ? "yes, B"
                                                                   : "yes, other";
        std::printf("%-30s %-10s %-11s %12.1f %14s %16s  %s\n", Name(main_does), Name(copy),
                    Name(dest), submit_us, ran_early.load() ? "yes" : "NO", seen_early, landed);
        std::fflush(stdout);
        Free(dst);
      }
    }
  }
  Free(warm);
  cuStreamDestroy(stream);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "blocking";
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 3;
  BENCH_CUDA(cudaSetDevice(0));
  BENCH_CUDA(cudaFree(nullptr));  // the primary context, current on this thread
  if (mode == "capture") return Capture();
  if (mode == "barrier") return Barrier();
  if (mode == "blocking") return Blocking(repeats);
  std::fprintf(stderr, "usage: copy_agent_probe blocking [repeats] | capture | barrier\n");
  return 2;
}
