#include "copy_agent.h"

#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "mooncake/common/log.h"
#include "mooncake/common/status.h"
#include "populated_memfd.h"

#if MC_CLIENT_HAVE_LANDING_KERNEL
#include "copy_agent_landing_kernel.h"
#endif

namespace mooncake {
namespace {

using copy_agent::Channel;
using copy_agent::Op;
using copy_agent::Phase;
using copy_agent::Ref;
using copy_agent::Request;
using copy_agent::State;

// How long the thread keeps spinning after a request before it sleeps: a
// kernel's WQEs come in bursts, and a futex wake costs the daemon a system
// call and this thread a few microseconds.
constexpr auto kSpin = std::chrono::microseconds(500);
// How long one sleep lasts at most (the destructor's stop is seen then).
constexpr timespec kSleep{0, 100'000'000};
// A copy that takes longer is logged: a staged piece of 16 MiB takes about
// a millisecond at PCIe speed.
constexpr std::chrono::milliseconds kSlowCopy{5};

// Waits (yielding) until `stream`'s work is done or `bound` passed: its
// result, kCudaErrorNotReady past the bound. The warm-ups and a stop.
drivers::CuResult WaitForStream(drivers::CudaDriver& cu, drivers::CuStream stream,
                                std::chrono::nanoseconds bound = std::chrono::hours(1)) {
  const auto deadline = std::chrono::steady_clock::now() + bound;
  drivers::CuResult r;
  while ((r = cu.streamQuery(stream)) == drivers::kCudaErrorNotReady &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
  }
  return r;
}

// This process's token in every channel it makes (Channel::process_token):
// random, drawn once. A child forked later inherits it, but not its pid.
uint64_t ProcessToken() {
  static const uint64_t token = [] {
    uint64_t t = 0;
    for (int tries = 0; tries < 4 && t == 0; ++tries) {
      if (::getrandom(&t, sizeof(t), 0) != static_cast<ssize_t>(sizeof(t))) t = 0;
    }
    // No getrandom: a guess needs this process's start time to the
    // nanosecond and its stack address; 0 (no token) is never used.
    if (t == 0) {
      t = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
          (reinterpret_cast<uintptr_t>(&t) << 20) ^ static_cast<uint64_t>(::getpid());
    }
    return t == 0 ? 1 : t;
  }();
  return token;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CopyAgent>> CopyAgent::Create(
    std::shared_ptr<drivers::CudaDriver> driver, drivers::CuContext ctx, uint64_t staging_bytes,
    CopyAgentOptions options) {
  MC_RETURN_IF_ERROR(
      copy_agent::CheckStagingBytes(staging_bytes, static_cast<uint64_t>(::sysconf(_SC_PAGESIZE))));
  const uint64_t bytes = copy_agent::kHeaderBytes + staging_bytes;
  MC_ASSIGN_OR_RETURN(PopulatedMemfd m,
                      CreatePopulatedMemfd("mooncake-copy-agent", bytes, "copy agent channel"));
  auto* c = reinterpret_cast<Channel*>(m.data);
  c->magic = copy_agent::kMagic;
  c->version = copy_agent::kVersion;
  c->staging_bytes = staging_bytes;
  c->process_token = ProcessToken();
  std::unique_ptr<CopyAgent> agent(
      new CopyAgent(std::move(driver), ctx, std::move(m.fd), m.data, staging_bytes, options));
  drivers::CudaDriver& cu = *agent->driver_;
  MC_RETURN_IF_ERROR(drivers::CuStatus(cu, cu.ctxSetCurrent(ctx), "cuCtxSetCurrent (copy agent)"));
  // Which context: the daemon lands copies between two agents of this
  // process straight from the source only when both run in the same one.
  c->context = reinterpret_cast<uintptr_t>(ctx);
  // CU_STREAM_NON_BLOCKING: no implicit wait on the legacy default stream,
  // where the application's kernels may spin.
  MC_RETURN_IF_ERROR(
      drivers::CuStatus(cu, agent->CreateStream(&agent->stream_), "cuStreamCreate (copy agent)"));
  // The whole channel: the staging area for DMA, and the header because
  // the landing kernel reads and writes the gate in it.
  agent->pinned_ =
      cu.memHostRegister(agent->base_, bytes,
                         drivers::kCuMemHostRegisterPortable |
                             drivers::kCuMemHostRegisterDeviceMap) == drivers::kCudaSuccess;
  if (agent->pinned_ &&
      cu.memHostGetDevicePointer(&agent->channel_dev_, agent->base_, 0) != drivers::kCudaSuccess) {
    agent->channel_dev_ = 0;
  }
  if (!agent->pinned_) {
    MC_LOG(kInfo,
           "copy agent: the driver did not pin the channel; copies go from pageable memory, "
           "and without the landing kernel");
  }
  MC_RETURN_IF_ERROR(agent->WarmUp());
  agent->first_seq_ = Ref(c->request_seq).load(std::memory_order_relaxed);
  Ref(c->state).store(static_cast<uint32_t>(State::kServing), std::memory_order_release);
  agent->thread_ = std::thread([a = agent.get()] { a->Run(); });
  return agent;
}

CopyAgent::CopyAgent(std::shared_ptr<drivers::CudaDriver> driver, drivers::CuContext ctx,
                     UniqueFd fd, uint8_t* base, uint64_t staging_bytes, CopyAgentOptions options)
    : driver_(std::move(driver)),
      ctx_(ctx),
      fd_(std::move(fd)),
      base_(base),
      staging_bytes_(staging_bytes),
      options_(options) {}

CopyAgent::~CopyAgent() {
  // Closed first: a daemon waiting on an answer stops waiting, and none
  // asks again.
  Ref(channel()->state).store(static_cast<uint32_t>(State::kClosed), std::memory_order_release);
  stop_.store(true, std::memory_order_relaxed);
  ::syscall(SYS_futex, &channel()->request_seq, FUTEX_WAKE, 1, nullptr, nullptr, 0);
  if (thread_.joinable()) thread_.join();
  // A resident kernel that has not returned (never scheduled, or the GPU
  // is wedged) may still read and write the channel when it runs: its
  // module, registration and mapping are then left in place (a leak, said
  // once) rather than freed under it.
  bool kernel_may_run = false;
  if (resident_running_) {
    driver_->ctxSetCurrent(ctx_);
    StopResident(/*wait=*/true);
    kernel_may_run = resident_running_;
  }
  if (const uint64_t n = copies_.load(std::memory_order_relaxed); n > 0) {
    MC_LOG(kInfo, "copy agent: ", n, " copies for softnic, ", busy_ns_ / n / 1000.0,
           " us each on average from the request to the bytes in place; ", slow_copies_, " over ",
           absl::FormatDuration(absl::FromChrono(kSlowCopy)), "; ", refreshes_,
           " queued again with newer bytes; ", cancelled_, " skipped, given up on before taken; ",
           called_off_, " called off after submission; ",
           by_resident_.load(std::memory_order_relaxed), " served by the resident kernel");
  }
  drivers::CudaDriver& cu = *driver_;
  if (stream_ != nullptr || pinned_ || module_ != nullptr) cu.ctxSetCurrent(ctx_);
  if (stream_ != nullptr) cu.streamDestroy(stream_);
  if (resident_stream_ != nullptr) cu.streamDestroy(resident_stream_);
  if (kernel_may_run) {
    MC_LOG(kWarning,
           "copy agent: the resident kernel did not return within 1 s; its channel "
           "(",
           (copy_agent::kHeaderBytes + staging_bytes_) >> 10,
           " KiB) and module stay mapped for it");
    return;
  }
  if (module_ != nullptr) cu.moduleUnload(module_);
  if (pinned_) cu.memHostUnregister(base_);
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
  if (r == drivers::kCudaSuccess) r = WaitForStream(cu, stream_);
  if (r == drivers::kCudaSuccess) LoadLandingKernel(scratch);
  cu.memFree(scratch);
  return drivers::CuStatus(cu, r, "copy agent warm-up copies");
}

void CopyAgent::LoadLandingKernel(drivers::CuDevicePtr scratch) {
#if MC_CLIENT_HAVE_LANDING_KERNEL
  drivers::CudaDriver& cu = *driver_;
  if (channel_dev_ == 0) return;  // said at Create
  const auto fail = [&](const char* step, drivers::CuResult r) {
    MC_LOG(kInfo, "copy agent: without the landing kernel (", step, ": ", cu.describe(r),
           "); a copy into GPU memory whose submission blocks can land after softnic gave up "
           "on it (docs/rdma.md, the copy agent)");
    if (module_ != nullptr) cu.moduleUnload(module_);
    module_ = nullptr;
    land_ = nullptr;
    atomic_ = nullptr;
  };
  if (drivers::CuResult r = cu.moduleLoadData(&module_, internal::kCopyAgentLandingImage);
      r != drivers::kCudaSuccess) {
    module_ = nullptr;
    return fail("cuModuleLoadData", r);
  }
  if (drivers::CuResult r = cu.moduleGetFunction(&land_, module_, copy_agent::kLandingKernel);
      r != drivers::kCudaSuccess) {
    return fail("cuModuleGetFunction", r);
  }
  // One landing now, checked, so the module's first launch (and a lazy
  // load of its code) is not the first request's.
  constexpr uint64_t kProbe = 64;
  for (uint64_t i = 0; i < kProbe; ++i) staging()[i] = static_cast<uint8_t>(i * 7 + 1);
  if (drivers::CuResult r =
          SubmitLanding(scratch, channel_dev_ + copy_agent::kHeaderBytes, kProbe, ~0u);
      r != drivers::kCudaSuccess) {
    return fail("cuLaunchKernel", r);
  }
  uint8_t back[kProbe] = {};
  drivers::CuResult r = cu.memcpyDtoHAsync(back, scratch, kProbe, stream_);
  if (r == drivers::kCudaSuccess) r = WaitForStream(cu, stream_);
  if (r != drivers::kCudaSuccess) return fail("the warm-up landing", r);
  if (std::memcmp(back, staging(), kProbe) != 0) {
    return fail("the warm-up landing moved other bytes", drivers::kCudaErrorInvalidValue);
  }
  // The atomic kernel, once, on a word of the scratch memory: it must add
  // and answer with the old value, or the agent runs without its kernels
  // (the daemon then sends it no atomic and no device-to-device copy).
  if (drivers::CuResult r = cu.moduleGetFunction(&atomic_, module_, copy_agent::kAtomicKernel);
      r != drivers::kCudaSuccess) {
    return fail("cuModuleGetFunction (atomic)", r);
  }
  {
    constexpr uint64_t kAnswerAt = 128;  // past the probe's bytes
    auto* answer = reinterpret_cast<copy_agent::AtomicAnswer*>(staging() + kAnswerAt);
    *answer = copy_agent::AtomicAnswer{};
    const Request add{.op = static_cast<uint32_t>(Op::kFetchAdd64),
                      .dst = scratch,
                      .src = 5,
                      .bytes = sizeof(copy_agent::AtomicAnswer),
                      .staging_offset = kAnswerAt};
    uint64_t before = 0, after = 0;
    std::memcpy(&before, staging(), 8);  // what the landing put in the word
    drivers::CuResult r = SubmitAtomic(add, ~0u);
    if (r == drivers::kCudaSuccess) r = cu.memcpyDtoHAsync(&after, scratch, 8, stream_);
    if (r == drivers::kCudaSuccess) r = WaitForStream(cu, stream_);
    if (r != drivers::kCudaSuccess) return fail("the warm-up atomic", r);
    if (Ref(answer->applied).load() != ~0u || Ref(answer->old).load() != before ||
        after != before + 5) {
      return fail("the warm-up atomic added or answered wrong", drivers::kCudaErrorInvalidValue);
    }
  }
  Ref(channel()->gate.gated).store(1, std::memory_order_release);
  // The resident kernel: loaded and launched once now, told beforehand to
  // return at its first look.
  if (options_.resident_max_bytes == 0) return;
  const auto no_resident = [&](const char* step, drivers::CuResult r) {
    MC_LOG(kInfo, "copy agent: without the resident kernel (", step, ": ", cu.describe(r),
           "); each copy is a CUDA call");
    serve_ = nullptr;
  };
  if (drivers::CuResult r = cu.moduleGetFunction(&serve_, module_, copy_agent::kServeKernel);
      r != drivers::kCudaSuccess) {
    return no_resident("cuModuleGetFunction", r);
  }
  if (drivers::CuResult r = CreateStream(&resident_stream_); r != drivers::kCudaSuccess) {
    resident_stream_ = nullptr;
    return no_resident("cuStreamCreate", r);
  }
  Ref(channel()->resident.stop).store(1, std::memory_order_release);
  if (drivers::CuResult r = LaunchResident(Ref(channel()->resident.go).load());
      r != drivers::kCudaSuccess) {
    return no_resident("cuLaunchKernel", r);
  }
  if ((r = WaitForStream(cu, resident_stream_)) != drivers::kCudaSuccess) {
    return no_resident("the resident kernel's warm-up", r);
  }
  resident_usable_.store(true, std::memory_order_relaxed);
#else
  (void)scratch;
#endif
}

drivers::CuResult CopyAgent::CreateStream(drivers::CuStream* stream) {
  // The highest priority the context has: when an SM slot frees, a landing
  // or the resident kernel goes before the rest of a grid that waits, as
  // its spinning blocks do, for this very copy. A driver without
  // priorities gets a plain stream.
  drivers::CudaDriver& cu = *driver_;
  int least = 0, greatest = 0;
  if (cu.ctxGetStreamPriorityRange(&least, &greatest) == drivers::kCudaSuccess &&
      cu.streamCreateWithPriority(stream, drivers::kCuStreamNonBlocking, greatest) ==
          drivers::kCudaSuccess) {
    return drivers::kCudaSuccess;
  }
  return cu.streamCreate(stream, drivers::kCuStreamNonBlocking);
}

drivers::CuResult CopyAgent::SubmitToDevice(const Request& r, uint32_t seq) {
  if (land_ == nullptr) {
    return driver_->memcpyHtoDAsync(r.dst, staging() + r.staging_offset, r.bytes, stream_);
  }
  return SubmitLanding(r.dst, channel_dev_ + copy_agent::kHeaderBytes + r.staging_offset, r.bytes,
                       seq);
}

drivers::CuResult CopyAgent::SubmitLanding(uint64_t dst, uint64_t src, uint64_t bytes,
                                           uint32_t seq) {
  uint64_t gate = channel_dev_ + offsetof(Channel, gate);
  uint32_t s = seq;
  void* args[] = {&dst, &src, &bytes, &gate, &s};
  return driver_->launchKernel(land_, copy_agent::LandingBlocks(bytes), 1, 1,
                               copy_agent::kLandingThreads, 1, 1, 0, stream_, args, nullptr);
}

drivers::CuResult CopyAgent::SubmitAtomic(const Request& r, uint32_t seq) {
  uint64_t word = r.dst;
  uint64_t add = r.src;
  uint32_t boundary = r.field_boundary;
  uint32_t op = r.op;
  uint64_t answer = channel_dev_ + copy_agent::kHeaderBytes + r.staging_offset;
  uint64_t gate = channel_dev_ + offsetof(Channel, gate);
  uint32_t s = seq;
  void* args[] = {&word, &add, &boundary, &op, &answer, &gate, &s};
  return driver_->launchKernel(atomic_, 1, 1, 1, 1, 1, 1, 0, stream_, args, nullptr);
}

drivers::CuResult CopyAgent::LaunchResident(uint32_t served) {
  copy_agent::ServeArgs a{};
  const auto at = [&](auto* field) {
    return reinterpret_cast<decltype(field)>(channel_dev_ +
                                             (reinterpret_cast<uint8_t*>(field) - base_));
  };
  Channel* c = channel();
  a.request = at(&c->request);
  a.done_seq = at(&c->done_seq);
  a.result = at(&c->result);
  a.busy_since_ns = at(&c->busy_since_ns);
  a.gate = at(&c->gate);
  a.resident = at(&c->resident);
  a.staging = reinterpret_cast<uint8_t*>(channel_dev_ + copy_agent::kHeaderBytes);
  a.staging_bytes = staging_bytes_;
  a.served = served;
  a.launch = ++launches_;
  void* args[] = {&a};
  return driver_->launchKernel(serve_, 1, 1, 1, copy_agent::kServeThreads, 1, 1, 0,
                               resident_stream_, args, nullptr);
}

void CopyAgent::DropResident(const char* why, drivers::CuResult r) {
  MC_LOG(kWarning, "copy agent: the resident kernel is used no more (", why, ": ",
         driver_->describe(r), "); each copy is a CUDA call from now on");
  serve_ = nullptr;
  resident_usable_.store(false, std::memory_order_relaxed);
}

void CopyAgent::StopResident(bool wait) {
  if (!resident_running_) return;
  Ref(channel()->resident.stop).store(1, std::memory_order_release);
  if (!wait) return;  // seen to have returned at the next request
  resident_running_ = WaitForStream(*driver_, resident_stream_, std::chrono::seconds(1)) ==
                      drivers::kCudaErrorNotReady;
}

int32_t CopyAgent::ServeResident(const Request& r, uint32_t seq, bool* answered) {
  drivers::CudaDriver& cu = *driver_;
  Channel* c = channel();
  const auto t0 = std::chrono::steady_clock::now();
  const uint32_t before = resident_served_;
  // A kernel that said it returns reads `go` no more: the next one is
  // launched below, behind it on the stream.
  const auto said_it_returns = [&] {
    return Ref(c->resident.exited).load(std::memory_order_acquire) == launches_;
  };
  if (resident_running_ && said_it_returns()) resident_running_ = false;
  // Told to stop when this thread last went idle: it serves on if it has
  // not looked yet. Handed over before any launch, so that a kernel
  // launched for this request sees it at its first look (one launched
  // first could reach its idle bound before this thread stores `go`, if
  // this thread is descheduled between the two).
  Ref(c->resident.stop).store(0, std::memory_order_relaxed);
  Ref(c->resident.go).store(seq, std::memory_order_release);
  resident_served_ = seq;
  bool relaunched = false;
  drivers::CuResult res = drivers::kCudaSuccess;
  if (!resident_running_) {
    Ref(c->phase).store(static_cast<uint32_t>(Phase::kSubmitting), std::memory_order_relaxed);
    if ((res = LaunchResident(before)) != drivers::kCudaSuccess) {
      DropResident("cuLaunchKernel", res);
      return res;
    }
    resident_running_ = true;
    relaunched = true;
  }
  const auto t1 = std::chrono::steady_clock::now();
  Ref(c->phase).store(static_cast<uint32_t>(Phase::kResident), std::memory_order_relaxed);
  for (uint32_t spins = 1; Ref(c->done_seq).load(std::memory_order_acquire) != seq; ++spins) {
    if (stop_.load(std::memory_order_relaxed)) {
      *answered = true;  // left to the daemon's call-off (Execute)
      return drivers::kCudaErrorInvalidValue;
    }
    // The kernel may have returned before it saw this request: it says so
    // (then it is launched again at once, once), or, had it failed, its
    // stream does (looked at now and then).
    const bool returned = said_it_returns();
    if (!returned && (spins & 255) != 0) {
      __builtin_ia32_pause();
      continue;
    }
    res = returned ? drivers::kCudaSuccess : cu.streamQuery(resident_stream_);
    if (res == drivers::kCudaErrorNotReady) continue;
    if (Ref(c->done_seq).load(std::memory_order_acquire) == seq) break;
    resident_running_ = false;
    if (res == drivers::kCudaSuccess && !relaunched) {
      Ref(c->phase).store(static_cast<uint32_t>(Phase::kSubmitting), std::memory_order_relaxed);
      if ((res = LaunchResident(before)) == drivers::kCudaSuccess) {
        resident_running_ = true;
        relaunched = true;
        Ref(c->phase).store(static_cast<uint32_t>(Phase::kResident), std::memory_order_relaxed);
        continue;
      }
    }
    DropResident("it returned without answering",
                 res == drivers::kCudaSuccess ? drivers::kCudaErrorInvalidValue : res);
    return res == drivers::kCudaSuccess ? drivers::kCudaErrorInvalidValue : res;
  }
  *answered = true;
  by_resident_.fetch_add(1, std::memory_order_relaxed);
  if (static_cast<Op>(r.op) == Op::kToDevice &&
      Ref(c->gate.cancel_seq).load(std::memory_order_acquire) == seq) {
    ++called_off_;
  }
  Ref(c->phase).store(static_cast<uint32_t>(Phase::kIdle), std::memory_order_relaxed);
  NoteTiming(r, t1 - t0, std::chrono::steady_clock::now() - t1);
  return 0;
}

int32_t CopyAgent::Execute(const Request& r, uint32_t seq, bool* answered) {
  drivers::CudaDriver& cu = *driver_;
  *answered = false;
  // The request is the daemon's; another process of this uid could write
  // the page too, so it is still checked before it names the staging area.
  if (r.staging_offset > staging_bytes_ || r.bytes > staging_bytes_ - r.staging_offset) {
    return drivers::kCudaErrorInvalidValue;
  }
  if (serve_ != nullptr && r.bytes <= options_.resident_max_bytes &&
      (static_cast<Op>(r.op) == Op::kToDevice || static_cast<Op>(r.op) == Op::kFromDevice)) {
    const int32_t res = ServeResident(r, seq, answered);
    if (*answered || serve_ != nullptr) return res;
    // It failed before taking this one: run it here.
  }
  Channel* c = channel();
  uint8_t* const s = staging() + r.staging_offset;
  const auto t0 = std::chrono::steady_clock::now();
  Ref(c->phase).store(static_cast<uint32_t>(Phase::kSubmitting), std::memory_order_relaxed);
  const Op op = static_cast<Op>(r.op);
  const bool to_device = op == Op::kToDevice;
  uint32_t mirrored = Ref(c->mirror_seq).load(std::memory_order_acquire);
  drivers::CuResult res = drivers::kCudaErrorInvalidValue;
  switch (op) {
    case Op::kToDevice: res = SubmitToDevice(r, seq); break;
    case Op::kFromDevice: res = cu.memcpyDtoHAsync(s, r.src, r.bytes, stream_); break;
    case Op::kWithinDevice:
      // Only through the landing kernel, whose blocks read src past the
      // gate (the daemon sends it only to a gated agent).
      if (land_ != nullptr) res = SubmitLanding(r.dst, r.src, r.bytes, seq);
      break;
    case Op::kFetchAdd64:
    case Op::kMaskedFetchAdd32:
      if (atomic_ != nullptr && r.bytes >= sizeof(copy_agent::AtomicAnswer) &&
          r.staging_offset % alignof(copy_agent::AtomicAnswer) == 0) {
        res = SubmitAtomic(r, seq);
      }
      break;
    default: break;
  }
  const auto t1 = std::chrono::steady_clock::now();
  if (res == drivers::kCudaSuccess) {
    // Done only once the bytes are in place: the daemon writes the CQE next.
    Ref(c->phase).store(static_cast<uint32_t>(Phase::kWaiting), std::memory_order_relaxed);
    // The daemon gave up on this copy and wrote newer bytes for its range
    // into the staging area (copy_agent_channel.h, mirror_seq): queue the
    // copy again behind the first, so that the copy landing last carries
    // them. Looked at once more after the stream is done: a write seen
    // only then may have reached GPU memory before this stream's last copy.
    // Not for landings: one the daemon gave up on lands nothing.
    for (;;) {
      res = cu.streamQuery(stream_);
      if (res != drivers::kCudaSuccess && res != drivers::kCudaErrorNotReady) break;
      const uint32_t m = Ref(c->mirror_seq).load(std::memory_order_acquire);
      if (to_device && land_ == nullptr && m != mirrored) {
        mirrored = m;
        ++refreshes_;
        if ((res = cu.memcpyHtoDAsync(r.dst, s, r.bytes, stream_)) != drivers::kCudaSuccess) break;
        continue;
      }
      if (res == drivers::kCudaSuccess) break;
      __builtin_ia32_pause();
    }
  }
  if (copy_agent::WritesGpuMemory(op) && land_ != nullptr &&
      Ref(c->gate.cancel_seq).load(std::memory_order_acquire) == seq) {
    ++called_off_;
  }
  Ref(c->phase).store(static_cast<uint32_t>(Phase::kIdle), std::memory_order_relaxed);
  NoteTiming(r, t1 - t0, std::chrono::steady_clock::now() - t1);
  return static_cast<int32_t>(res);
}

void CopyAgent::NoteTiming(const Request& r, std::chrono::nanoseconds submit,
                           std::chrono::nanoseconds wait) {
  const auto total = submit + wait;
  busy_ns_ += static_cast<uint64_t>(total.count());
  if (total < kSlowCopy) return;
  // A copy this slow waited for something of the GPU's or the driver's:
  // which of the two calls it sat in tells which (docs/rdma.md, the copy
  // agent).
  ++slow_copies_;
  if ((slow_copies_ & (slow_copies_ - 1)) == 0) {
    const Op op = static_cast<Op>(r.op);
    MC_LOG(kWarning, "copy agent: a ", r.bytes, "-byte ",
           op == Op::kToDevice       ? "copy to the GPU"
           : op == Op::kFromDevice   ? "copy from the GPU"
           : op == Op::kWithinDevice ? "copy within the GPU"
                                     : "request (an atomic on a GPU word)",
           " took ", absl::FormatDuration(absl::FromChrono(total)), ": ",
           absl::FormatDuration(absl::FromChrono(submit)), " submitting it, ",
           absl::FormatDuration(absl::FromChrono(wait)), " until it ran (", slow_copies_,
           " copies over ", absl::FormatDuration(absl::FromChrono(kSlowCopy)), " so far)");
  }
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
      r.field_boundary = Ref(c->request.field_boundary).load(std::memory_order_relaxed);
      r.dst = Ref(c->request.dst).load(std::memory_order_relaxed);
      r.src = Ref(c->request.src).load(std::memory_order_relaxed);
      r.bytes = Ref(c->request.bytes).load(std::memory_order_relaxed);
      r.staging_offset = Ref(c->request.staging_offset).load(std::memory_order_relaxed);
      if (copy_agent::Settle(*c, seq, seq) != seq) {
        // The daemon gave up on this request before this thread took it
        // (asleep, or the process stopped, past the daemon's bound): it
        // copied the bytes itself, and running it now could only write
        // old bytes over newer ones.
        ++cancelled_;
        Ref(c->done_seq).store(seq, std::memory_order_release);
        continue;
      }
      timespec mono{};
      ::clock_gettime(CLOCK_MONOTONIC, &mono);
      Ref(c->busy_since_ns)
          .store(uint64_t(mono.tv_sec) * 1'000'000'000ull + uint64_t(mono.tv_nsec),
                 std::memory_order_relaxed);
      bool answered = false;
      const int32_t result = Execute(r, seq, &answered);
      if (!answered) {
        Ref(c->busy_since_ns).store(0, std::memory_order_relaxed);
        Ref(c->result).store(result, std::memory_order_relaxed);
        Ref(c->done_seq).store(seq, std::memory_order_release);
      }
      copies_.fetch_add(1, std::memory_order_relaxed);
      last = std::chrono::steady_clock::now();
      continue;
    }
    if (std::chrono::steady_clock::now() - last < kSpin) {
      __builtin_ia32_pause();
      continue;
    }
    // Sleep: the resident kernel returns (a cudaDeviceSynchronize of the
    // process waits for it otherwise); say so, then look once more (the
    // daemon stores request_seq and then reads agent_sleeping;
    // copy_agent_channel.h).
    StopResident(/*wait=*/false);
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
