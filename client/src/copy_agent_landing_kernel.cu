// The copy agent's kernels (copy_agent_landing_kernel.h):
//   mc_copy_agent_land   moves the bytes of one request from the staging
//                        area (host memory), or from other GPU memory of
//                        the process, into its GPU memory, unless the
//                        daemon called the request off first;
//   mc_copy_agent_atomic runs a NIC atomic on a GPU word of the process,
//                        under the same rule;
//   mc_copy_agent_serve  the resident kernel: one block that stays while
//                        requests come and serves the small ones both ways.
// The call-off is the Dekker handshake of mooncake/common/copy_agent_gate.h.
// Each block decides for itself: a block the daemon did not see start
// writes nothing, and the daemon waits for every block it saw start before
// it writes.
#include <cstdint>

#include "copy_agent_block_copy.h"
#include "mooncake/common/copy_agent_gate.h"
#include "mooncake/common/masked_add.h"
#include "mooncake/device/platform.h"  // the ordered loads and stores, the fence, the clock

namespace {

using mooncake::copy_agent::AtomicAnswer;
using mooncake::copy_agent::Gate;
using mooncake::copy_agent::Op;
using mooncake::copy_agent::Request;  // its layout, read field by field
using mooncake::copy_agent::ServeArgs;
using mooncake::device::mc_fence_sc_sys;
using mooncake::device::mc_ld_acquire;
using mooncake::device::mc_ld_relaxed;
using mooncake::device::mc_st_relaxed;
using mooncake::device::mc_st_release;
using mooncake::device::mc_time_ns;

// Loads read again from memory (never a line an earlier request left in a
// cache): one side of every copy is the staging area, host memory another
// process writes. For copy_agent_block_copy.h.
struct VolatileLoads {
  __device__ __forceinline__ uint4 operator()(const uint4* p) const {
    uint4 v;
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p)
                 : "memory");
    return v;
  }
  template <class T>
  __device__ __forceinline__ T operator()(const T* p) const {
    return *reinterpret_cast<const volatile T*>(p);
  }
  __device__ __forceinline__ uint8_t Byte(const uint8_t* p) const {
    return *reinterpret_cast<const volatile uint8_t*>(p);
  }
};

// The block's half of the handshake for request `seq` (thread 0 only):
// whether the daemon had not called it off.
__device__ __forceinline__ bool PassGate(Gate* gate, uint32_t b, uint32_t seq) {
  mc_st_relaxed<uint32_t>(&gate->intent[b], seq);
  mc_fence_sc_sys();
  return mc_ld_relaxed<uint32_t>(&gate->cancel_seq) != seq;
}

// This block's threads copy [0, n) from `src` to `dst`
// (copy_agent_block_copy.h: the widest unit both are aligned to, four loads
// in flight per thread).
__device__ __forceinline__ void BlockCopy(uint8_t* dst, const uint8_t* src, uint64_t n) {
  mooncake::copy_agent::BlockCopy(dst, src, n, threadIdx.x, blockDim.x, VolatileLoads{});
}

}  // namespace

extern "C" __global__ void mc_copy_agent_land(uint8_t* dst, const uint8_t* src, uint64_t bytes,
                                              Gate* gate, uint32_t seq) {
  __shared__ int go;
  const uint32_t b = blockIdx.x;
  if (threadIdx.x == 0) go = PassGate(gate, b, seq);
  __syncthreads();
  if (go) {
    uint64_t begin = 0, end = 0;
    mooncake::copy_agent::LandingSlice(bytes, gridDim.x, b, &begin, &end);
    BlockCopy(dst + begin, src + begin, end - begin);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    // Every thread's stores to dst before `landed`: the daemon writes dst
    // itself once it sees it.
    mc_fence_sc_sys();
    mc_st_relaxed<uint32_t>(&gate->landed[b], seq);
  }
}

// The NIC's atomic on a GPU word of this process, decided at the gate as a
// landing is (block 0; one thread): the add runs only past the gate, and
// the answer says whether it ran (copy_agent_gate.h, AtomicAnswer), so the
// daemon, having called it off, runs it itself only when it did not.
// System scope, as softnic's own kernel: the word's other writers are this
// process's kernels, NVLink peers and the CPU.
extern "C" __global__ void mc_copy_agent_atomic(uint64_t word, uint64_t add, uint32_t boundary,
                                                uint32_t op, AtomicAnswer* answer, Gate* gate,
                                                uint32_t seq) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  const bool wide = static_cast<Op>(op) == Op::kFetchAdd64;
  const bool known = wide || static_cast<Op>(op) == Op::kMaskedFetchAdd32;
  // Unaligned words the daemon never sends (it checks the iova and the
  // mapping); another process of this uid could write the request page.
  const bool aligned = word % (wide ? 8 : 4) == 0;
  uint64_t old = 0;
  uint32_t applied = 0;
  if (known && aligned && PassGate(gate, 0, seq)) {
    if (wide) {
      old = atomicAdd_system(reinterpret_cast<unsigned long long*>(word),
                             static_cast<unsigned long long>(add));
    } else {
      auto* w = reinterpret_cast<unsigned int*>(word);
      unsigned int expected = *reinterpret_cast<volatile unsigned int*>(w);
      for (;;) {
        const unsigned int seen = atomicCAS_system(
            w, expected, mooncake::MaskedAdd(expected, static_cast<uint32_t>(add), boundary));
        if (seen == expected) break;
        expected = seen;
      }
      old = expected;
    }
    applied = seq;
  }
  mc_st_relaxed<uint64_t>(&answer->old, old);
  mc_st_relaxed<uint32_t>(&answer->applied, applied);
  // The answer before `landed`: the daemon reads it once it sees landed.
  mc_fence_sc_sys();
  mc_st_relaxed<uint32_t>(&gate->landed[0], seq);
}

extern "C" __global__ void mc_copy_agent_serve(ServeArgs a) {
  __shared__ uint32_t seq;
  __shared__ int stop, go;
  // The request's fields (plain scalars: a __shared__ variable takes no
  // initializer, and Request has default member initializers).
  struct Fields {
    uint32_t op;
    uint64_t dst, src, bytes, staging_offset;
  };
  __shared__ Fields r;
  uint32_t served = a.served;
  // It also returns on its own, whatever the agent thread does: idle for
  // kResidentIdleNs, or kResidentLifeNs old (checked before each look at
  // `go`, so under steady traffic too). A cudaDeviceSynchronize of the
  // process waits for this kernel, and the agent thread that would tell it
  // to stop may itself be blocked in a CUDA call behind that synchronize.
  // It says it returns (Resident::exited) before it does; the agent
  // launches the next one on its next request.
  const uint64_t born = mc_time_ns();
  uint64_t last = born;
  bool first_look = true;  // a launch looks at `go` once whatever the clock says
  for (;;) {
    if (threadIdx.x == 0) {
      // Each look is a read of host memory over PCIe: that paces the loop.
      uint32_t g = served;
      for (;;) {
        const uint64_t now = mc_time_ns();
        if (!first_look && (now - born > mooncake::copy_agent::kResidentLifeNs ||
                            now - last > mooncake::copy_agent::kResidentIdleNs)) {
          break;
        }
        first_look = false;
        g = mc_ld_acquire<uint32_t>(&a.resident->go);
        if (g != served || mc_ld_relaxed<uint32_t>(&a.resident->stop) != 0) break;
      }
      seq = g;
      stop = g == served;
      if (stop) {
        // `go` is read no more: a request handed over from now on is the
        // next launch's.
        mc_st_release<uint32_t>(&a.resident->exited, a.launch);
      } else {
        // After `go` (acquire): the agent handed it over once it read the
        // daemon's request.
        r.op = mc_ld_relaxed<uint32_t>(&a.request->op);
        r.dst = mc_ld_relaxed<uint64_t>(&a.request->dst);
        r.src = mc_ld_relaxed<uint64_t>(&a.request->src);
        r.bytes = mc_ld_relaxed<uint64_t>(&a.request->bytes);
        r.staging_offset = mc_ld_relaxed<uint64_t>(&a.request->staging_offset);
        // Checked as the agent checks it: another process of this uid can
        // write the page too.
        const bool valid =
            r.staging_offset <= a.staging_bytes && r.bytes <= a.staging_bytes - r.staging_offset &&
            (static_cast<Op>(r.op) == Op::kToDevice || static_cast<Op>(r.op) == Op::kFromDevice);
        if (!valid) r.op = 0;
        go = valid && (static_cast<Op>(r.op) == Op::kFromDevice || PassGate(a.gate, 0, g));
      }
    }
    __syncthreads();
    if (stop) return;
    if (go) {
      uint8_t* staged = a.staging + r.staging_offset;
      if (static_cast<Op>(r.op) == Op::kToDevice) {
        BlockCopy(reinterpret_cast<uint8_t*>(r.dst), staged, r.bytes);
      } else {
        BlockCopy(staged, reinterpret_cast<const uint8_t*>(r.src), r.bytes);
      }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      mc_fence_sc_sys();
      if (static_cast<Op>(r.op) == Op::kToDevice) mc_st_relaxed<uint32_t>(&a.gate->landed[0], seq);
      // Answered as the agent answers: busy no more, the result, then
      // done_seq (release: the bytes before it). 1: CUDA_ERROR_INVALID_VALUE.
      mc_st_relaxed<uint64_t>(a.busy_since_ns, 0);
      mc_st_relaxed<uint32_t>(reinterpret_cast<uint32_t*>(a.result), r.op == 0 ? 1u : 0u);
      mc_st_release<uint32_t>(a.done_seq, seq);
    }
    served = seq;
    last = mc_time_ns();
    __syncthreads();
  }
}
