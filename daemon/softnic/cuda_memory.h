// CudaMemory: GPU memory for softnic. A client registers a buffer of its GPU
// by sending the POSIX fd of the cuMem VMM allocation
// (CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR); mooncaked imports and maps it
// in its own CUDA context (a CudaBuffer), and the engine moves bytes to and
// from it (Copy) and runs atomics on it (FetchAdd64, MaskedFetchAdd32).
//
//   auto cuda = CudaMemory::Create({.cuda_library = config.cuda_library});
//   absl::StatusOr<std::shared_ptr<CudaBuffer>> buffer = cuda->Import(fd, length);
//   RegionSpec spec{.kind = MemoryKind::kCuda, .cuda = *buffer, ...};  // offset into the buffer
//
// Context: nothing is loaded or created until the first Import: then the
// driver is loaded (LoadCudaDriver(cuda_library), or the driver given in the
// options), cuInit runs, and the primary context of one GPU, the home
// device, is retained for the life of this object. Every buffer is mapped
// read-write for the home device and every copy and kernel runs in its
// context. The home device is, in this order: the `device` passed to the
// first Import, CudaMemoryOptions::device, or GPU 0 (logged when several
// GPUs are visible). A buffer that lives on another GPU is then reached over
// NVLink/PCIe peer access (cuMemSetAccess fails where there is none, and
// the import says so). The daemon cannot ask the driver which GPU owns an
// imported allocation (cuMemGetAllocationPropertiesFromHandle is not
// wrapped), and the RegisterMemory request carries no GPU; on one GPU,
// where every rank shares the device, the choice is exact.
//
// Copies are synchronous and in issue order: each returns once its bytes
// are in place (every copy and atomic is queued on the call's lane, below,
// which is then polled with cuStreamQuery until done, since host-to-device
// copies from pageable memory and device-to-device copies may return
// early). Polling yields for the first 50 us, then sleeps in 20 us steps:
// several workers waiting out a time slice at once take no core each. So a small signal written
// after earlier data lands after that data, as the host path's release stores guarantee, and a CQE
// written after Copy returns never announces bytes still in flight.
//
// Lanes: each call borrows a lane, a non-blocking stream of the home
// context with a device word for atomics' old values, for its duration.
// Two threads (two GPU workers serving two sessions) therefore copy at the
// same time, and one waits for no other: not for the other's stream (a
// non-blocking stream does not wait for the legacy stream or any other),
// and not for a mutex held across GPU work (the mutex below guards only the
// context and the free lanes). Lanes are made on demand, at most kMaxLanes;
// a caller beyond that waits for a free one.
//
// Atomics run on the GPU's atomic units (a GPU kernel of the client, or a
// peer over NVLink, may update the same word at the same time): a
// one-thread kernel from the fatbin embedded in CUDA builds
// (cuda_atomics_kernel.h) on the lane's stream, and a copy of the old value
// back from the lane's scratch word. Builds without CUDA have no kernel: Import then fails
// with FailedPrecondition unless CudaMemoryOptions::atomics supplies another
// implementation (tests pass a host one for the fake driver, whose device
// pointers are host addresses).
//
// Copies for a process that runs a copy agent do not come here while the
// agent answers (copy_agent_link.h): this is the fallback, and the path of
// atomics in kDevice mode.
//
// Cost: the daemon's GPU work shares the GPU with the clients' kernels by
// time slicing (separate processes, no MPS). Measured on an H200 (driver
// 580, one GPU): an 8-byte copy into GPU memory takes about 7 us and an
// atomic about 19 us while the client's GPU is idle, but about 2.4 ms each
// (one time slice) while a client kernel is resident and spinning, as a
// kernel waiting for a CQE is. It completes, it is only slow: signals and
// CQ polling that must be fast belong in host memory (memfd regions), the
// client runs a copy agent (copy_agent_link.h: its copies and atomics run
// in its own context, and come here only when it cannot serve), or the
// node runs MPS. The engine calls from its GPU workers, so that wait
// holds up only the QP whose WQE it is (softnic/gpu_workers.h), and the
// lanes keep two sessions' copies from waiting for each other.
//
// Failures: every method returns the CUDA error as a Status naming the call
// ("cuMemcpyHtoD(64 bytes): CUDA_ERROR_ILLEGAL_ADDRESS (...)"); the engine
// turns a failed copy or atomic into an error CQE. Failed copies and
// atomics are also logged (the first one and then at powers of two, so a
// sticky context error cannot flood the log).
//
// Thread-safety: all methods may be called from any thread, at the same
// time; each makes the home context current on the calling thread (the
// daemon's threads use no other context). Ownership: each CudaBuffer keeps
// its CudaMemory alive; the context and the lanes are released when the
// last goes.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "mooncake/drivers/cuda_driver.h"
#include "softnic/responder_op.h"

namespace mooncake::softnic {

// What one call uses of the home context, alone (see "Lanes" above).
struct CudaLane {
  drivers::CuStream stream = nullptr;  // non-blocking
  drivers::CuDevicePtr scratch = 0;    // 8 bytes of device memory
};

// Atomic read-modify-writes on GPU memory. Called with the home context
// current, from several threads at once, each with a lane of its own;
// `word` is a device address in that context, aligned to the operand's
// width. Returns the value before the add.
class CudaAtomics {
 public:
  virtual ~CudaAtomics() = default;
  virtual absl::StatusOr<uint64_t> FetchAdd64(const CudaLane& lane, drivers::CuDevicePtr word,
                                              uint64_t add) = 0;
  // The mlx5 extended masked fetch-add (see MaskedAdd in cuda_atomics_kernel.h).
  virtual absl::StatusOr<uint32_t> MaskedFetchAdd32(const CudaLane& lane, drivers::CuDevicePtr word,
                                                    uint32_t add, uint32_t field_boundary) = 0;
};

struct CudaMemoryOptions {
  using AtomicsFactory =
      std::function<absl::StatusOr<std::unique_ptr<CudaAtomics>>(drivers::CudaDriver&)>;

  // The driver library to load at the first import (DaemonConfig::cuda_library).
  std::string cuda_library = "libcuda.so.1";
  // Use this driver instead of loading one (tests: a FakeCudaDriver).
  std::shared_ptr<drivers::CudaDriver> driver;
  // The home device's ordinal; -1: see the header comment.
  int device = -1;
  // Makes the atomics once the home context is current; null: the embedded
  // kernel (CUDA builds only).
  AtomicsFactory atomics;
};

class CudaBuffer;

class CudaMemory : public std::enable_shared_from_this<CudaMemory> {
 public:
  // Loads nothing yet (see the header comment).
  static std::shared_ptr<CudaMemory> Create(CudaMemoryOptions options = {});
  ~CudaMemory();
  CudaMemory(const CudaMemory&) = delete;
  CudaMemory& operator=(const CudaMemory&) = delete;

  // True when this build embeds the atomics kernel (built with CUDA).
  static bool KernelAtomicsBuilt();

  // Imports the allocation behind `fd` (a cuMem POSIX fd, borrowed: the
  // caller still closes it) and maps its first `bytes` (rounded up to the
  // allocation granularity) read-write for the home device. `device`: the
  // GPU the caller says owns the allocation (-1: unknown); it picks the home
  // device on the first import and is otherwise only checked.
  // Errors: InvalidArgument (bytes 0, fd < 0, `device` not a visible GPU;
  // an fd that is no cuMem allocation, or one smaller than `bytes`, as the
  // driver reports it), FailedPrecondition / NotFound (no CUDA driver on
  // this node, no GPU, a build without the atomics kernel), or the CUDA
  // error of the step that failed, naming it.
  absl::StatusOr<std::shared_ptr<CudaBuffer>> Import(int fd, uint64_t bytes, int device = -1);

  // Copies src to dst (equal lengths, at least one side kCuda; every kCuda
  // address one this object mapped). Synchronous: see the header comment.
  // Overlapping device ranges give unspecified bytes in the overlap.
  absl::Status Copy(const ByteSpan& dst, const ByteSpan& src);

  // Atomics on a device address this object mapped (aligned to 8 / 4).
  absl::StatusOr<uint64_t> FetchAdd64(drivers::CuDevicePtr word, uint64_t add);
  absl::StatusOr<uint32_t> MaskedFetchAdd32(drivers::CuDevicePtr word, uint32_t add,
                                            uint32_t field_boundary);

  // The home device's ordinal, or -1 before the first successful import.
  int device() const;

  // Lanes made so far (never more than kMaxLanes).
  int lanes() const;
  static constexpr int kMaxLanes = 16;

 private:
  friend class CudaBuffer;
  class LaneLease;
  explicit CudaMemory(CudaMemoryOptions options);

  // Loads the driver and retains the home context on first use.
  absl::Status EnsureContextLocked(int device) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes the home context current on this thread.
  absl::Status EnterLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Unmaps what a CudaBuffer mapped.
  void Release(drivers::CuDevicePtr base, uint64_t mapped);
  // Makes a lane (the home context current).
  absl::StatusOr<CudaLane*> MakeLaneLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts and logs a failed copy or atomic; returns it.
  absl::Status NoteFailure(absl::Status s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Failed(absl::Status s) ABSL_LOCKS_EXCLUDED(mu_);

  const CudaMemoryOptions options_;
  mutable absl::Mutex mu_;
  std::shared_ptr<drivers::CudaDriver> driver_ ABSL_GUARDED_BY(mu_);
  int device_ ABSL_GUARDED_BY(mu_) = -1;  // home ordinal
  drivers::CuDevice cu_device_ ABSL_GUARDED_BY(mu_) = 0;
  drivers::CuContext ctx_ ABSL_GUARDED_BY(mu_) = nullptr;  // retained primary context
  size_t granularity_ ABSL_GUARDED_BY(mu_) = 0;
  std::unique_ptr<CudaAtomics> atomics_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<CudaLane>> lanes_ ABSL_GUARDED_BY(mu_);  // every lane made
  std::vector<CudaLane*> free_lanes_ ABSL_GUARDED_BY(mu_);
  uint64_t failures_ ABSL_GUARDED_BY(mu_) = 0;
};

// One imported allocation, mapped in the home context: [base(), base() +
// size()) is device memory the engine may touch. Unmapped (and the
// daemon's reference to the allocation dropped) when the last owner lets go.
class CudaBuffer {
 public:
  ~CudaBuffer();
  CudaBuffer(const CudaBuffer&) = delete;
  CudaBuffer& operator=(const CudaBuffer&) = delete;

  drivers::CuDevicePtr base() const { return base_; }
  uint64_t size() const { return size_; }  // as imported (the mapping may be larger)
  CudaMemory* memory() const { return memory_.get(); }

 private:
  friend class CudaMemory;
  CudaBuffer(std::shared_ptr<CudaMemory> memory, drivers::CuDevicePtr base, uint64_t size,
             uint64_t mapped)
      : memory_(std::move(memory)), base_(base), size_(size), mapped_(mapped) {}

  const std::shared_ptr<CudaMemory> memory_;
  const drivers::CuDevicePtr base_;
  const uint64_t size_;
  const uint64_t mapped_;
};

}  // namespace mooncake::softnic
