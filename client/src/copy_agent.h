// CopyAgent: this process's side of softnic's copy agent (issue 24 item 11;
// the channel is described in mooncake/common/copy_agent_channel.h). A
// thread of this process runs, on its own non-blocking stream in the
// caller's CUDA context, the copies softnic asks for into and out of this
// process's GPU memory. They run beside this process's kernels, where a
// copy in mooncaked's context would wait for a GPU time slice while a
// kernel spins (2.4 ms per copy on an H200, against about 10 us here).
//
//   auto agent = CopyAgent::Create(driver, ctx, copy_agent::kDefaultStagingBytes);
//   client->attachCopyAgent(agent->fd(), agent->staging_bytes());
//
// DaemonRdmaTransport does this on the CUDA platform when the daemon's
// provider is softnic, unless the agent is turned off (DaemonRdmaOptions::
// copy_agent, MOONCAKE_COPY_AGENT=0), before the first GPU region is
// registered.
//
// The thread spins for a while after each request (copies come in bursts:
// a kernel's WQEs), then sleeps on a futex the daemon wakes. The channel is
// pinned and mapped for the context (cuMemHostRegister) so copies go by
// DMA; where the driver refuses, copies still work, from pageable memory.
//
// Copies into GPU memory go through a landing kernel when the CUDA build
// has one and its warm-up landing worked (gated()): the daemon can call
// such a copy off after its submission, so a copy whose submit call was
// blocked never lands after the daemon wrote the bytes itself
// (mooncake/common/copy_agent_gate.h). Otherwise they are copy-engine
// copies, queued again with the newest bytes when the daemon writes over
// one it gave up on (Channel::mirror_seq). A gated agent also runs, for
// the daemon, copies from GPU memory to GPU memory of this process (one
// landing straight from the source) and the NIC's atomics on its GPU
// words (a one-thread kernel, decided at the same gate, that says whether
// it added), all on its stream beside the process's kernels.
//
// Requests of at most CopyAgentOptions::resident_max_bytes (0 by default:
// on the H200 it saves 3 us a copy in and costs 1 us a copy out, and holds
// an SM slot while busy: bench/results/2026-12-05-h200-resident-kernel.md)
// go, both ways, to the agent's resident
// kernel (gated builds): one block of 256 threads,
// launched on a stream of its own when such a request comes, serving each
// one the thread hands it by number, with no CUDA call per request; told
// to return when the thread goes to sleep (kSpin after the last request),
// and returning by itself after 0.5 ms idle or 2 ms alive
// (copy_agent_gate.h): a cudaDeviceSynchronize of the process waits for it
// too, that long at most once requests stop coming.
//
// Destruction marks the channel closed (the daemon then copies itself),
// stops the thread and frees everything. Not copyable; thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <thread>

#include "absl/status/statusor.h"
#include "mooncake/common/copy_agent_channel.h"
#include "mooncake/common/unique_fd.h"
#include "mooncake/drivers/cuda_driver.h"

namespace mooncake {

// What a resident kernel serves when it is on (MOONCAKE_COPY_AGENT_RESIDENT=1).
inline constexpr uint64_t kResidentMaxBytes = uint64_t{64} << 10;

struct CopyAgentOptions {
  // Requests up to this size go to the resident kernel; 0 (the default
  // until the kernel has run on a GPU): none do, each copy is a launch or
  // a copy-engine copy.
  uint64_t resident_max_bytes = 0;
};

class CopyAgent {
 public:
  // Makes the channel (a sealed, populated memfd of kHeaderBytes +
  // staging_bytes) and starts the thread in `ctx`. `driver` must outlive
  // the agent. InvalidArgument for a staging size the daemon would refuse;
  // the errno or CUDA error of a setup step, named.
  static absl::StatusOr<std::unique_ptr<CopyAgent>> Create(
      std::shared_ptr<drivers::CudaDriver> driver, drivers::CuContext ctx, uint64_t staging_bytes,
      CopyAgentOptions options = {});
  ~CopyAgent();
  CopyAgent(const CopyAgent&) = delete;
  CopyAgent& operator=(const CopyAgent&) = delete;

  int fd() const { return fd_.get(); }  // the channel memfd, to send
  uint64_t staging_bytes() const { return staging_bytes_; }
  // Requests answered so far.
  uint64_t copies() const { return copies_.load(std::memory_order_relaxed); }
  // Whether copies into GPU memory go through the landing kernel.
  bool gated() const { return land_ != nullptr; }
  // Whether small requests go to the resident kernel (false too once it
  // failed), and how many it served.
  bool resident() const { return resident_usable_.load(std::memory_order_relaxed); }
  uint64_t served_by_resident() const { return by_resident_.load(std::memory_order_relaxed); }

 private:
  CopyAgent(std::shared_ptr<drivers::CudaDriver> driver, drivers::CuContext ctx, UniqueFd fd,
            uint8_t* base, uint64_t staging_bytes, CopyAgentOptions options);
  void Run();
  // One copy of each kind on the stream, waited for (see the .cc).
  absl::Status WarmUp();
  // Loads the landing kernel and lands 64 bytes with it; on any failure
  // (logged) the agent copies without it. Needs the channel mapped.
  void LoadLandingKernel(drivers::CuDevicePtr scratch);
  // Runs request `seq`; returns its CUDA result (0: done). *answered: the
  // caller must not answer it: the resident kernel did, or the agent is
  // closing while the kernel still holds it (the daemon, seeing the
  // channel closed, calls it off at the gate; an answer would make it
  // write over a landing still to come).
  int32_t Execute(const copy_agent::Request& r, uint32_t seq, bool* answered);
  // Hands request `seq` to the resident kernel (launched first when not
  // running) and waits for its answer. *answered false: it could not, and
  // the resident kernel is used no more (logged); the caller runs the
  // request itself.
  int32_t ServeResident(const copy_agent::Request& r, uint32_t seq, bool* answered);
  drivers::CuResult LaunchResident(uint32_t served);
  // Tells the resident kernel to return (it does once it looks); `wait`:
  // until it has, up to a second.
  void StopResident(bool wait);
  void DropResident(const char* why, drivers::CuResult r);
  // Queues request `seq`'s copy into GPU memory on the stream: a landing
  // from the staging area, or a plain copy without the landing kernel.
  drivers::CuResult SubmitToDevice(const copy_agent::Request& r, uint32_t seq);
  // Queues a landing kernel of request `seq`: src -> dst (device
  // addresses: the staging area's, or the process's GPU memory).
  drivers::CuResult SubmitLanding(uint64_t dst, uint64_t src, uint64_t bytes, uint32_t seq);
  // Queues the atomic kernel for request `seq` (kFetchAdd64 or
  // kMaskedFetchAdd32), its answer into the staging area.
  drivers::CuResult SubmitAtomic(const copy_agent::Request& r, uint32_t seq);
  // Adds one copy's time; logs a slow one, saying which call it sat in.
  void NoteTiming(const copy_agent::Request& r, std::chrono::nanoseconds submit,
                  std::chrono::nanoseconds wait);
  copy_agent::Channel* channel() const { return reinterpret_cast<copy_agent::Channel*>(base_); }
  uint8_t* staging() const { return base_ + copy_agent::kHeaderBytes; }

  const std::shared_ptr<drivers::CudaDriver> driver_;
  const drivers::CuContext ctx_;
  UniqueFd fd_;
  uint8_t* const base_;
  const uint64_t staging_bytes_;
  bool pinned_ = false;                   // the whole channel, header and staging
  drivers::CuDevicePtr channel_dev_ = 0;  // its device address, when pinned
  drivers::CuModule module_ = nullptr;
  drivers::CuFunction land_ = nullptr;    // null: plain copies
  drivers::CuFunction atomic_ = nullptr;  // set with land_ (the gate needs both)
  const CopyAgentOptions options_;
  // The resident kernel (the thread's, but for the flags read by tests).
  drivers::CuFunction serve_ = nullptr;  // null: not used (none, or it failed)
  drivers::CuStream resident_stream_ = nullptr;
  bool resident_running_ = false;  // launched and not yet seen to return
  uint32_t resident_served_ = 0;   // the last request handed to it
  uint32_t launches_ = 0;          // resident kernels launched (Resident::exited)
  // A non-blocking stream of the context's highest priority.
  drivers::CuResult CreateStream(drivers::CuStream* stream);
  std::atomic<bool> resident_usable_{false};
  std::atomic<uint64_t> by_resident_{0};
  uint32_t first_seq_ = 0;  // request_seq when the thread starts
  drivers::CuStream stream_ = nullptr;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> copies_{0};
  // The thread's (read after join): time in Execute, copies over kSlowCopy.
  uint64_t busy_ns_ = 0;
  uint64_t slow_copies_ = 0;
  uint64_t refreshes_ = 0;   // copies queued again with newer bytes (mirror_seq)
  uint64_t cancelled_ = 0;   // requests the daemon gave up on before they were taken
  uint64_t called_off_ = 0;  // landings the daemon called off after they were submitted
  std::thread thread_;
};

}  // namespace mooncake
