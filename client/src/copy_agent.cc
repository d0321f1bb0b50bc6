#include "copy_agent.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "mooncake/common/log.h"
#include "mooncake/common/populate.h"
#include "mooncake/common/status.h"

namespace mooncake {
namespace {

using copy_agent::Channel;
using copy_agent::Op;
using copy_agent::Request;
using copy_agent::State;

template <class T>
std::atomic_ref<T> Ref(T& v) {
  return std::atomic_ref<T>(v);
}

// How long the thread keeps spinning after a request before it sleeps: a
// kernel's WQEs come in bursts, and a futex wake costs the daemon a system
// call and this thread a few microseconds.
constexpr auto kSpin = std::chrono::microseconds(500);
// How long one sleep lasts at most (the destructor's stop is seen then).
constexpr timespec kSleep{0, 100'000'000};

}  // namespace

absl::StatusOr<std::unique_ptr<CopyAgent>> CopyAgent::Create(
    std::shared_ptr<drivers::CudaDriver> driver, drivers::CuContext ctx, uint64_t staging_bytes) {
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  if (staging_bytes < copy_agent::kMinStagingBytes ||
      staging_bytes > copy_agent::kMaxStagingBytes || staging_bytes % page != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("copy agent staging of ", staging_bytes, " bytes: give a multiple of ", page,
                     " from ", copy_agent::kMinStagingBytes, " to ", copy_agent::kMaxStagingBytes));
  }
  const uint64_t bytes = copy_agent::kHeaderBytes + staging_bytes;
  UniqueFd fd(::memfd_create("mooncake-copy-agent", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid()) return ErrnoStatus(errno, "memfd_create (copy agent channel)");
  if (::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0 ||
      ::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) {
    return ErrnoStatus(errno, "sizing and sealing the copy agent channel");
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) return ErrnoStatus(errno, "mmap (copy agent channel)");
  // Every page in memory, charged to this process: the daemon maps only
  // populated memfds (mooncake/common/populate.h).
  if (const int err = PopulateForWrite(p, bytes); err != 0) {
    ::munmap(p, bytes);
    return ErrnoStatus(err, "populating the copy agent channel");
  }
  auto* c = static_cast<Channel*>(p);
  c->magic = copy_agent::kMagic;
  c->version = copy_agent::kVersion;
  c->staging_bytes = staging_bytes;
  std::unique_ptr<CopyAgent> agent(new CopyAgent(std::move(driver), ctx, std::move(fd),
                                                 static_cast<uint8_t*>(p), staging_bytes));
  drivers::CudaDriver& cu = *agent->driver_;
  MC_RETURN_IF_ERROR(drivers::CuStatus(cu, cu.ctxSetCurrent(ctx), "cuCtxSetCurrent (copy agent)"));
  // CU_STREAM_NON_BLOCKING: no implicit wait on the legacy default stream,
  // where the application's kernels may spin.
  MC_RETURN_IF_ERROR(
      drivers::CuStatus(cu, cu.streamCreate(&agent->stream_, 0x1), "cuStreamCreate (copy agent)"));
  agent->pinned_ = cu.memHostRegister(agent->staging(), staging_bytes,
                                      drivers::kCuMemHostRegisterPortable) == drivers::kCudaSuccess;
  if (!agent->pinned_) {
    MC_LOG(kInfo,
           "copy agent: the driver did not pin the staging area; copies go from pageable "
           "memory");
  }
  MC_RETURN_IF_ERROR(agent->WarmUp());
  agent->first_seq_ = Ref(c->request_seq).load(std::memory_order_relaxed);
  Ref(c->state).store(static_cast<uint32_t>(State::kServing), std::memory_order_release);
  agent->thread_ = std::thread([a = agent.get()] { a->Run(); });
  return agent;
}

CopyAgent::CopyAgent(std::shared_ptr<drivers::CudaDriver> driver, drivers::CuContext ctx,
                     UniqueFd fd, uint8_t* base, uint64_t staging_bytes)
    : driver_(std::move(driver)),
      ctx_(ctx),
      fd_(std::move(fd)),
      base_(base),
      staging_bytes_(staging_bytes) {}

CopyAgent::~CopyAgent() {
  // Closed first: a daemon waiting on an answer stops waiting, and none
  // asks again.
  Ref(channel()->state).store(static_cast<uint32_t>(State::kClosed), std::memory_order_release);
  stop_.store(true, std::memory_order_relaxed);
  ::syscall(SYS_futex, &channel()->request_seq, FUTEX_WAKE, 1, nullptr, nullptr, 0);
  if (thread_.joinable()) thread_.join();
  if (const uint64_t n = copies_.load(std::memory_order_relaxed); n > 0) {
    MC_LOG(kInfo, "copy agent: ", n, " copies for softnic, ", busy_ns_ / n / 1000.0,
           " us each on average from the request to the bytes in place");
  }
  drivers::CudaDriver& cu = *driver_;
  if (stream_ != nullptr || pinned_) cu.ctxSetCurrent(ctx_);
  if (stream_ != nullptr) cu.streamDestroy(stream_);
  if (pinned_) cu.memHostUnregister(staging());
  ::munmap(base_, copy_agent::kHeaderBytes + staging_bytes_);
}

absl::Status CopyAgent::WarmUp() {
  // The first copy of each kind in a process can wait until every kernel
  // running in the context has finished (seen on the H200: an 8-byte
  // host-to-device copy held back 4 s by a kernel that was waiting for it,
  // which only the daemon's timeout broke). Kernels that wait on softnic
  // are launched after the buffer is registered, so one copy of each kind
  // now, on the agent's stream, settles whatever the driver sets up.
  drivers::CudaDriver& cu = *driver_;
  drivers::CuDevicePtr scratch = 0;
  MC_RETURN_IF_ERROR(
      drivers::CuStatus(cu, cu.memAlloc(&scratch, 256), "cuMemAlloc (copy agent warm-up)"));
  drivers::CuResult r = cu.memcpyHtoDAsync(scratch, staging(), 64, stream_);
  if (r == drivers::kCudaSuccess) r = cu.memcpyDtoHAsync(staging(), scratch, 64, stream_);
  if (r == drivers::kCudaSuccess) {
    while ((r = cu.streamQuery(stream_)) == drivers::kCudaErrorNotReady) {
      std::this_thread::yield();
    }
  }
  cu.memFree(scratch);
  return drivers::CuStatus(cu, r, "copy agent warm-up copies");
}

int32_t CopyAgent::Execute(const Request& r) {
  drivers::CudaDriver& cu = *driver_;
  // The request is the daemon's; another process of this uid could write
  // the page too, so it is still checked before it names the staging area.
  if (r.staging_offset > staging_bytes_ || r.bytes > staging_bytes_ - r.staging_offset) {
    return drivers::kCudaErrorInvalidValue;
  }
  uint8_t* const s = staging() + r.staging_offset;
  drivers::CuResult res = drivers::kCudaErrorInvalidValue;
  switch (static_cast<Op>(r.op)) {
    case Op::kToDevice: res = cu.memcpyHtoDAsync(r.dst, s, r.bytes, stream_); break;
    case Op::kFromDevice: res = cu.memcpyDtoHAsync(s, r.src, r.bytes, stream_); break;
    default: return drivers::kCudaErrorInvalidValue;
  }
  if (res != drivers::kCudaSuccess) return static_cast<int32_t>(res);
  // Done only once the bytes are in place: the daemon writes the CQE next.
  while ((res = cu.streamQuery(stream_)) == drivers::kCudaErrorNotReady) {
    __builtin_ia32_pause();
  }
  return static_cast<int32_t>(res);
}

void CopyAgent::Run() {
  drivers::CudaDriver& cu = *driver_;
  if (cu.ctxSetCurrent(ctx_) != drivers::kCudaSuccess) {
    Ref(channel()->state).store(static_cast<uint32_t>(State::kClosed), std::memory_order_release);
    MC_LOG(kWarning, "copy agent: cannot enter the CUDA context; softnic copies itself");
    return;
  }
  Channel* c = channel();
  // Read before the channel went out (Create), never here: a request the
  // daemon sends before this thread first looks would count as seen.
  uint32_t seen = first_seq_;
  auto last = std::chrono::steady_clock::now();
  while (!stop_.load(std::memory_order_relaxed)) {
    const uint32_t seq = Ref(c->request_seq).load(std::memory_order_acquire);
    if (seq != seen) {
      seen = seq;
      Request r;
      r.op = Ref(c->request.op).load(std::memory_order_relaxed);
      r.dst = Ref(c->request.dst).load(std::memory_order_relaxed);
      r.src = Ref(c->request.src).load(std::memory_order_relaxed);
      r.bytes = Ref(c->request.bytes).load(std::memory_order_relaxed);
      r.staging_offset = Ref(c->request.staging_offset).load(std::memory_order_relaxed);
      const auto t0 = std::chrono::steady_clock::now();
      timespec mono{};
      ::clock_gettime(CLOCK_MONOTONIC, &mono);
      Ref(c->busy_since_ns)
          .store(uint64_t(mono.tv_sec) * 1'000'000'000ull + uint64_t(mono.tv_nsec),
                 std::memory_order_relaxed);
      const int32_t result = Execute(r);
      Ref(c->busy_since_ns).store(0, std::memory_order_relaxed);
      busy_ns_ += static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                            std::chrono::steady_clock::now() - t0)
                                            .count());
      Ref(c->result).store(result, std::memory_order_relaxed);
      Ref(c->copies).fetch_add(1, std::memory_order_relaxed);
      if (result == 0) Ref(c->bytes_copied).fetch_add(r.bytes, std::memory_order_relaxed);
      Ref(c->done_seq).store(seq, std::memory_order_release);
      copies_.fetch_add(1, std::memory_order_relaxed);
      last = std::chrono::steady_clock::now();
      continue;
    }
    if (std::chrono::steady_clock::now() - last < kSpin) {
      __builtin_ia32_pause();
      continue;
    }
    // Sleep: say so, then look once more (the daemon stores request_seq
    // and then reads agent_sleeping; copy_agent_channel.h).
    Ref(c->agent_sleeping).store(1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (Ref(c->request_seq).load(std::memory_order_relaxed) == seen &&
        !stop_.load(std::memory_order_relaxed)) {
      ::syscall(SYS_futex, &c->request_seq, FUTEX_WAIT, seen, &kSleep, nullptr, 0);
    }
    Ref(c->agent_sleeping).store(0, std::memory_order_relaxed);
    last = std::chrono::steady_clock::now() - kSpin;  // one look, then sleep again if idle
  }
  (void)cu;
}

}  // namespace mooncake
