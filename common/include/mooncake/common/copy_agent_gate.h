// The copy agent's gate (issue 24 item 11): how a copy into GPU memory that
// the agent submitted can still be called off after its submission.
//
// Why: the agent's CUDA call can block (another thread of its process sits
// in a synchronous cudaMemcpy from pageable memory while a kernel waits for
// this very copy). softnic then gives up on the copy and writes the bytes
// itself, the kernel ends, the application moves on and writes that memory
// again, and only then does the blocked call return. A copy-engine copy
// submitted then would land the old bytes over the application's newer
// ones (seen on the H200, 2026-12-05). So the agent does not submit a copy
// but a landing kernel, and the decision to write is taken on the GPU when
// the kernel runs, against the daemon's cancel word, with a Dekker
// handshake (both sides store, fence, then load the other's word), since
// a GPU atomic on host memory is not atomic against the CPU over PCIe:
//
//   block b (GPU)                      daemon giving up on request `seq`
//   intent[b] = seq                    cancel_seq = seq
//   fence.sc.sys                       full fence
//   if cancel_seq != seq: copy         for each block b of the request:
//   fence.sc.sys                         if intent[b] == seq:
//   landed[b] = seq                        wait until landed[b] == seq
//
// With both fences at least one side sees the other's store: a block that
// copies is waited for, and a block the daemon does not wait for sees the
// cancel and writes nothing. After that the daemon's own write is the last
// one, and the held kernel, whenever it runs, lands nothing.
//
// The same handshake serves the agent's resident kernel (Resident below):
// one block that stays on the GPU while requests come and serves the small
// ones itself, both ways, so that they need no CUDA call at all.
//
// This header holds what the GPU reads of the channel (the request, the
// gate, the resident kernel's words): plain C++ that nvcc compiles too (the
// kernels include it): no absl, no CUDA header.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define MC_COPY_AGENT_HD __host__ __device__
#else
#define MC_COPY_AGENT_HD
#endif

namespace mooncake::copy_agent {

// A landing kernel runs LandingBlocks(bytes) blocks of kLandingThreads
// threads; block i copies LandingSlice(bytes, blocks, i).
inline constexpr uint32_t kMaxLandingBlocks = 64;
inline constexpr uint32_t kLandingThreads = 256;
inline constexpr uint64_t kLandingBytesPerBlock = uint64_t{16} << 10;
// The kernels' names in the agent's embedded module.
inline constexpr const char* kLandingKernel = "mc_copy_agent_land";
// mc_copy_agent_atomic(uint64_t word, uint64_t add, uint32_t field_boundary,
//                      uint32_t op, AtomicAnswer* answer, Gate* gate,
//                      uint32_t seq): one block of one thread, block 0 of
// the gate.
inline constexpr const char* kAtomicKernel = "mc_copy_agent_atomic";

// What the agent does for a request. Addresses are the agent process's own
// (CUDA unified addressing); staging offsets are from the staging area.
// Every op that writes GPU memory (all but kFromDevice) is decided at the
// gate when the agent has its kernels (Gate::gated), so the daemon can
// call it off after submission; kWithinDevice and the atomics the daemon
// sends only then.
enum class Op : uint32_t {
  kNone = 0,
  kToDevice = 1,    // staging[staging_offset, +bytes) -> dst
  kFromDevice = 2,  // src -> staging[staging_offset, +bytes)
  // src -> dst, both GPU memory of the process, by the landing kernel
  // straight from src: one request where the staging area would take two
  // (the blocks read src only once past the gate, so a landing called off
  // reads and writes nothing).
  kWithinDevice = 3,
  // The NIC's atomics on a GPU word (dst) of the process, on the GPU's own
  // atomic units: atomic against the process's kernels and NVLink peers.
  // src: the value to add; field_boundary: the masked add's. The answer
  // (AtomicAnswer) goes to staging[staging_offset, +bytes); bytes is its
  // size.
  kFetchAdd64 = 4,
  kMaskedFetchAdd32 = 5,
};

// Whether `op` writes the process's GPU memory when it runs (and so is
// decided at the gate, and may still land after the daemon gave up on it).
MC_COPY_AGENT_HD constexpr bool WritesGpuMemory(Op op) {
  return op == Op::kToDevice || op == Op::kWithinDevice || op == Op::kFetchAdd64 ||
         op == Op::kMaskedFetchAdd32;
}

struct alignas(64) Request {
  uint32_t op = 0;              // Op
  uint32_t field_boundary = 0;  // kMaskedFetchAdd32's
  uint64_t dst = 0;
  uint64_t src = 0;
  uint64_t bytes = 0;
  uint64_t staging_offset = 0;
};

// What the atomic kernel leaves in the staging area: the word's value
// before the add, and whether it ran the add (`applied` == the request's
// number) or saw the daemon's cancel first (anything else). The daemon
// reads it once the agent answered, or once the kernel's block landed
// after a call-off: an atomic cannot be undone, so the daemon runs it
// itself only where this says it did not run, and never twice.
struct AtomicAnswer {
  uint64_t old = 0;
  uint32_t applied = 0;
  uint32_t reserved = 0;
};

struct Gate {
  // Written by the daemon: the request it gave up on.
  alignas(64) uint32_t cancel_seq;
  // Written by the agent at creation: 1 when its copies into GPU memory go
  // through landing kernels (the daemon may then call them off); 0 when
  // they are plain copies (no kernel image, or the warm-up landing failed).
  uint32_t gated;
  // Written by the landing kernel's blocks.
  alignas(64) uint32_t intent[kMaxLandingBlocks];
  alignas(64) uint32_t landed[kMaxLandingBlocks];
};

// The agent's resident kernel (mc_copy_agent_serve): launched when a small
// request comes and the kernel is not running, told to return when the
// agent goes to sleep (and returning by itself: kResidentIdleNs,
// kResidentLifeNs). Between, the agent hands it each small request by its
// number, and the kernel answers it in the channel as the agent would
// (result, then done_seq), having cleared busy_since_ns.
//
// The agent stores `go` before it launches a kernel, and a kernel looks at
// `go` once before it minds its clock, so a kernel launched for a request
// serves it however late it starts. A kernel
// that decides to return stores its launch number in `exited` first and
// reads `go` no more: the agent may then launch the next one at once (it
// queues behind the last on their stream) instead of waiting to see the
// stream empty; a request handed over meanwhile goes to the new one.
struct Resident {
  alignas(64) uint32_t go;  // agent -> kernel: serve request `go`
  uint32_t stop;            // agent -> kernel: return once nothing is handed over
  uint32_t exited;          // kernel -> agent: launch `exited` returns and serves no more
};
inline constexpr const char* kServeKernel = "mc_copy_agent_serve";
// The resident kernel returns on its own after this long with nothing
// handed over, or once this old (checked before each look at `go`, so also
// under steady traffic): a synchronize of the process waits for it no
// longer than that and the request it is serving.
inline constexpr uint64_t kResidentIdleNs = 500'000;
inline constexpr uint64_t kResidentLifeNs = 2'000'000;
inline constexpr uint32_t kServeThreads = 256;

// The resident kernel's one parameter: device addresses of the channel's
// words (mapped host memory) and the staging area.
struct ServeArgs {
  Request* request;
  uint32_t* done_seq;
  int32_t* result;
  uint64_t* busy_since_ns;
  Gate* gate;
  Resident* resident;
  uint8_t* staging;
  uint64_t staging_bytes;
  uint32_t served;  // the last request handed to a resident kernel before this launch
  uint32_t launch;  // this launch's number, stored in Resident::exited when it returns
};

MC_COPY_AGENT_HD constexpr uint32_t LandingBlocks(uint64_t bytes) {
  const uint64_t blocks = (bytes + kLandingBytesPerBlock - 1) / kLandingBytesPerBlock;
  return blocks == 0                  ? 1
         : blocks > kMaxLandingBlocks ? kMaxLandingBlocks
                                      : static_cast<uint32_t>(blocks);
}

// Block `i` of `blocks` lands [*begin, *end) of a `bytes`-byte copy: whole
// 16-byte units, spread evenly; the last slices may be empty.
MC_COPY_AGENT_HD constexpr void LandingSlice(uint64_t bytes, uint32_t blocks, uint32_t i,
                                             uint64_t* begin, uint64_t* end) {
  const uint64_t units = (bytes + 15) / 16;
  const uint64_t per = (units + blocks - 1) / blocks;
  const uint64_t b = static_cast<uint64_t>(i) * per * 16;
  const uint64_t e = b + per * 16;
  *begin = b < bytes ? b : bytes;
  *end = e < bytes ? e : bytes;
}

}  // namespace mooncake::copy_agent
