// Platform ops for the host platform: CPU threads (of one or several
// processes) sharing memory, standing in for GPU threads sharing NVLink
// memory. The protocol code in comm_device.h runs unchanged on top of these,
// so CI without a GPU exercises the same ordering logic the GPU runs.
//
// Mapping of the GPU notions:
//   ld.acquire.sys / st.release.sys  -> std::atomic_ref acquire / release
//   st.relaxed.sys / ld.relaxed.sys  -> std::atomic_ref relaxed
//   atom.add.release.sys             -> fetch_add(release)
//   fence.acq_rel.sys                -> atomic_thread_fence(acq_rel)
//   16-byte vector load/store        -> plain 16-byte memcpy
//   warp / block                     -> a group of std::threads set up by
//                                       mooncake/device/host_coop.h; a thread
//                                       outside any group is a warp (and a
//                                       block) of one.
// Atomics are lock-free for 4- and 8-byte words (checked below), hence
// address-free: they work across processes over a shared mapping.
//
// Plain C++20; never includes CUDA headers. Do not include directly: include
// mooncake/device/platform.h, which picks the ops of the platform.
#pragma once

#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <type_traits>

#include "mooncake/device/detail/macros.h"
#include "mooncake/device/types_device.h"

namespace mooncake {
namespace device {

// Lane width of a CUDA warp; the host platform's warps may be narrower (see
// mc_warp_size()).
inline constexpr unsigned kMcCudaWarpSize = 32;

namespace host_detail {

// A group of threads that behaves as one warp or one block. The barrier
// gives mc_syncwarp()/mc_syncthreads() both their rendezvous and their
// memory ordering (arrive happens-before the return of every waiter).
// `shared` holds the words the collectives (mc_warp_bcast_u64,
// mc_warp_rank, and their block forms) exchange.
struct CoopShared {
  std::atomic<uint64_t> word[3] = {};
};
struct CoopGroup {
  unsigned size = 1;
  std::barrier<>* barrier = nullptr;
  CoopShared* shared = nullptr;
};

// What this thread is inside its emulated warp and block. Set by
// host_coop.h; default-constructed means "a lone thread".
struct CoopState {
  const CoopGroup* warp = nullptr;
  unsigned lane = 0;
  const CoopGroup* block = nullptr;
  unsigned thread_index = 0;
  unsigned collective_calls = 0;        // this lane's count of warp collectives
  unsigned block_collective_calls = 0;  // and of block collectives
};

inline thread_local CoopState tls_coop{};

template <class T>
inline constexpr bool kIsWord =
    std::is_integral_v<T> && !std::is_same_v<T, bool> && (sizeof(T) == 4 || sizeof(T) == 8);

// The GPU traps on a misaligned atomic or vector access; x86 would quietly
// allow it. Failing the same way here lets CI catch layout bugs that would
// otherwise first show up on the GPU.
[[noreturn]] inline void Misaligned(const void* p, size_t align, const char* op) {
  std::fprintf(stderr, "mooncake device (host platform): %s on %p, which is not %zu-byte aligned\n",
               op, p, align);
  std::abort();
}
inline void CheckAligned(const void* p, size_t align, const char* op) {
  if ((reinterpret_cast<uintptr_t>(p) & (align - 1)) != 0) Misaligned(p, align, op);
}

template <class T>
std::atomic_ref<T> Ref(const T* p) {
  static_assert(kIsWord<T>, "Device API atomics take 4- or 8-byte integers");
  static_assert(std::atomic_ref<T>::is_always_lock_free,
                "host-platform atomics must be lock-free to work across processes");
  CheckAligned(p, sizeof(T), "atomic access");
  return std::atomic_ref<T>(*const_cast<T*>(p));
}

}  // namespace host_detail

// ---- loads and stores with ordering (system scope) ------------------------

template <class T>
MC_DEVICE T mc_ld_acquire(const T* p) {
  return host_detail::Ref(p).load(std::memory_order_acquire);
}

template <class T>
MC_DEVICE T mc_ld_relaxed(const T* p) {
  return host_detail::Ref(p).load(std::memory_order_relaxed);
}

// GPU-scope forms (ld.acquire.gpu / st.release.gpu on CUDA): for words only
// the threads of this device touch (a queue pair's posting state), where a
// system-scope release would wait for PCIe. Threads of one process here.
template <class T>
MC_DEVICE T mc_ld_acquire_gpu(const T* p) {
  return mc_ld_acquire(p);
}
// An acquire load here: on CUDA the caller's later release store (a
// fence.acq_rel) completes the acquire of a relaxed load; a C++ release
// store does not, so the host keeps the pattern with the load itself (a
// plain load on x86).
template <class T>
MC_DEVICE T mc_ld_relaxed_gpu(const T* p) {
  return mc_ld_acquire(p);
}

template <class T>
MC_DEVICE void mc_st_release(T* p, T v) {
  host_detail::Ref(p).store(v, std::memory_order_release);
}

template <class T>
MC_DEVICE void mc_st_release_gpu(T* p, T v) {
  mc_st_release(p, v);
}

template <class T>
MC_DEVICE void mc_st_relaxed(T* p, T v) {
  host_detail::Ref(p).store(v, std::memory_order_relaxed);
}

// Returns the value before the add.
template <class T>
MC_DEVICE T mc_atomic_add_release(T* p, T v) {
  return host_detail::Ref(p).fetch_add(v, std::memory_order_release);
}

template <class T>
MC_DEVICE T mc_atomic_add_relaxed(T* p, T v) {
  return host_detail::Ref(p).fetch_add(v, std::memory_order_relaxed);
}

// Add without a result (PTX `red`); same ordering as mc_atomic_add_release.
template <class T>
MC_DEVICE void mc_red_add_release(T* p, T v) {
  host_detail::Ref(p).fetch_add(v, std::memory_order_release);
}

// Compare-and-swap of a 32-bit word with acquire ordering; returns the value
// found (== expected when it swapped).
MC_DEVICE uint64_t mc_atomic_add_relaxed_gpu(uint64_t* p, uint64_t v) {
  return host_detail::Ref(p).fetch_add(v, std::memory_order_relaxed);
}
MC_DEVICE uint32_t mc_atomic_cas_acquire_gpu(uint32_t* p, uint32_t expected, uint32_t desired) {
  host_detail::Ref(p).compare_exchange_strong(expected, desired, std::memory_order_acquire,
                                              std::memory_order_acquire);
  return expected;
}

MC_DEVICE uint32_t mc_atomic_cas_acquire(uint32_t* p, uint32_t expected, uint32_t desired) {
  host_detail::Ref(p).compare_exchange_strong(expected, desired, std::memory_order_acquire,
                                              std::memory_order_acquire);
  return expected;
}

// An 8-byte store to a device register (a NIC doorbell): after a full fence.
MC_DEVICE void mc_st_mmio64(uint64_t* p, uint64_t v) {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  host_detail::Ref(p).store(v, std::memory_order_relaxed);
}
// Ordered by the caller's release store just before (ops_cuda.cuh).
MC_DEVICE void mc_st_mmio64_after_release(uint64_t* p, uint64_t v) {
  host_detail::Ref(p).store(v, std::memory_order_relaxed);
}

// ---- 16-byte vector accesses ----------------------------------------------
// `p` must be 16-byte aligned. The host has no non-coherent cache to bypass,
// so the "nc"/"no_allocate" variants are ordinary accesses; they exist so the
// same copy code compiles on both platforms.

MC_DEVICE McVec16 mc_ld_v4(const void* p) {
  host_detail::CheckAligned(p, 16, "16-byte vector load");
  McVec16 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
MC_DEVICE McVec16 mc_ld_nc_v4(const void* p) { return mc_ld_v4(p); }
MC_DEVICE void mc_st_v4(void* p, McVec16 v) {
  host_detail::CheckAligned(p, 16, "16-byte vector store");
  std::memcpy(p, &v, sizeof(v));
}
MC_DEVICE void mc_st_na_v4(void* p, McVec16 v) { mc_st_v4(p, v); }

// The LL slot pair: two 8-byte words, each stored atomically (the pair as a
// whole need not be; see McLLSlot). Relaxed: LL orders nothing else.
MC_DEVICE void mc_st_relaxed_v2u64(void* p, uint64_t a, uint64_t b) {
  host_detail::CheckAligned(p, 16, "16-byte LL store");
  auto* w = static_cast<uint64_t*>(p);
  host_detail::Ref(&w[0]).store(a, std::memory_order_relaxed);
  host_detail::Ref(&w[1]).store(b, std::memory_order_relaxed);
}
MC_DEVICE void mc_ld_relaxed_v2u64(const void* p, uint64_t* a, uint64_t* b) {
  host_detail::CheckAligned(p, 16, "16-byte LL load");
  const auto* w = static_cast<const uint64_t*>(p);
  *a = host_detail::Ref(&w[0]).load(std::memory_order_relaxed);
  *b = host_detail::Ref(&w[1]).load(std::memory_order_relaxed);
}

// ---- byte swaps (WQE fields are big-endian) -------------------------------

MC_HOST_DEVICE uint16_t mc_bswap16(uint16_t x) { return __builtin_bswap16(x); }
MC_HOST_DEVICE uint32_t mc_bswap32(uint32_t x) { return __builtin_bswap32(x); }
MC_HOST_DEVICE uint64_t mc_bswap64(uint64_t x) { return __builtin_bswap64(x); }

// ---- fences and barriers --------------------------------------------------

// Keeps the compiler from moving memory accesses across this point; emits
// no instruction.
MC_DEVICE void mc_compiler_barrier() { std::atomic_signal_fence(std::memory_order_seq_cst); }

// fence.acq_rel.sys: earlier accesses of this thread are ordered before its
// later strong (atomic) writes as seen by an acquiring reader.
MC_DEVICE void mc_fence_acq_rel_sys() { std::atomic_thread_fence(std::memory_order_acq_rel); }

// fence.sc.sys (__threadfence_system).
MC_DEVICE void mc_fence_sc_sys() { std::atomic_thread_fence(std::memory_order_seq_cst); }

MC_DEVICE unsigned mc_warp_size() {
  const auto* g = host_detail::tls_coop.warp;
  return g ? g->size : 1u;
}
MC_DEVICE unsigned mc_lane_id() { return host_detail::tls_coop.lane; }
MC_DEVICE unsigned mc_block_size() {
  const auto* g = host_detail::tls_coop.block;
  return g ? g->size : 1u;
}
MC_DEVICE unsigned mc_block_thread_index() { return host_detail::tls_coop.thread_index; }

// Every thread of the emulated warp must call it the same number of times
// (as with __syncwarp()); a lone thread returns at once.
MC_DEVICE void mc_syncwarp() {
  const auto* g = host_detail::tls_coop.warp;
  if (g != nullptr && g->barrier != nullptr) g->barrier->arrive_and_wait();
}
MC_DEVICE void mc_syncthreads() {
  const auto* g = host_detail::tls_coop.block;
  if (g != nullptr && g->barrier != nullptr) g->barrier->arrive_and_wait();
}

// ---- warp collectives ---------------------------------------------------------
// Every lane of the emulated warp must make the same sequence of collective
// calls (as every lane of a CUDA warp must reach __shfl_sync with a full
// mask). Each call is one barrier. Three rotating words: the word of call p
// is written only after the barrier of call p - 1, by which time every lane
// has read it for call p - 3, and lane 0 clears the word of call p - 1 after
// the barrier of call p, when every lane is done with it.
namespace host_detail {
// One collective call of this thread in `g` (its warp or its block), whose
// calls it counts in `*calls`; `first`: whether this thread is the group's
// first (it clears words).
class Collective {
 public:
  Collective(const CoopGroup* g, unsigned* calls, bool first)
      : g_(g), slot_(*calls % 3u), first_(first) {
    ++*calls;
  }
  static bool Usable(const CoopGroup* g) {
    return g != nullptr && g->barrier != nullptr && g->shared != nullptr;
  }
  std::atomic<uint64_t>& word() const { return g_->shared->word[slot_]; }
  void Wait() const { g_->barrier->arrive_and_wait(); }
  ~Collective() {
    if (first_) g_->shared->word[(slot_ + 2u) % 3u].store(0, std::memory_order_relaxed);
  }

 private:
  const CoopGroup* g_;
  unsigned slot_;
  bool first_;
};
inline Collective WarpCollective() {
  return Collective(tls_coop.warp, &tls_coop.collective_calls, tls_coop.lane == 0);
}
inline Collective BlockCollective() {
  return Collective(tls_coop.block, &tls_coop.block_collective_calls, tls_coop.thread_index == 0);
}
// Every member gets the v of the member with `from_me`.
inline uint64_t Bcast(const Collective& c, uint64_t v, bool from_me) {
  if (from_me) c.word().store(v, std::memory_order_relaxed);
  c.Wait();
  return c.word().load(std::memory_order_relaxed);
}
inline unsigned Rank(const Collective& c, bool pred, unsigned* total) {
  const unsigned mine =
      pred ? static_cast<unsigned>(c.word().fetch_add(1, std::memory_order_relaxed)) : 0u;
  c.Wait();
  *total = static_cast<unsigned>(c.word().load(std::memory_order_relaxed));
  return mine;
}
}  // namespace host_detail

// __shfl_sync(full mask, v, src_lane): every lane gets lane src_lane's v.
MC_DEVICE uint64_t mc_warp_bcast_u64(uint64_t v, unsigned src_lane) {
  if (!host_detail::Collective::Usable(host_detail::tls_coop.warp)) return v;
  return host_detail::Bcast(host_detail::WarpCollective(), v,
                            host_detail::tls_coop.lane == src_lane);
}

// Numbers the lanes whose `pred` holds: each gets a distinct index in
// [0, *total) (in lane order on CUDA; in arrival order here, which is all a
// caller may rely on); *total is the same on every lane.
MC_DEVICE unsigned mc_warp_rank(bool pred, unsigned* total) {
  if (!host_detail::Collective::Usable(host_detail::tls_coop.warp)) {
    *total = pred ? 1u : 0u;
    return 0;
  }
  return host_detail::Rank(host_detail::WarpCollective(), pred, total);
}

// ---- block collectives: the same, over every thread of the block ---------

MC_DEVICE uint64_t mc_block_bcast_u64(uint64_t v, unsigned src_thread) {
  if (!host_detail::Collective::Usable(host_detail::tls_coop.block)) return v;
  return host_detail::Bcast(host_detail::BlockCollective(), v,
                            host_detail::tls_coop.thread_index == src_thread);
}

MC_DEVICE unsigned mc_block_rank(bool pred, unsigned* total) {
  if (!host_detail::Collective::Usable(host_detail::tls_coop.block)) {
    *total = pred ? 1u : 0u;
    return 0;
  }
  return host_detail::Rank(host_detail::BlockCollective(), pred, total);
}

// ---- lane groups (ops_cuda.cuh): a host thread is a group of one ------------
// Emulated warps run their lanes as threads that never execute in lockstep,
// so no two lanes are ever "converged" on a call.
struct McLaneGroup {
  unsigned mask;
  unsigned leader;
  unsigned rank;
  unsigned size;
};
MC_DEVICE McLaneGroup mc_lanes_with_key(uint64_t) {
  const unsigned lane = host_detail::tls_coop.lane;
  return McLaneGroup{1u << (lane & 31u), lane, 0u, 1u};
}
MC_DEVICE bool mc_group_leader(const McLaneGroup& g) { return g.rank == 0; }
MC_DEVICE uint64_t mc_group_bcast_u64(const McLaneGroup&, uint64_t v) { return v; }
MC_DEVICE void mc_group_sync(const McLaneGroup&) { mc_compiler_barrier(); }

// ---- spinning, time, abort ------------------------------------------------

// One step of a polite spin: a CPU pause hint, and every 64th call a yield,
// so a waiting host "kernel" does not starve the thread it waits for when
// threads outnumber cores (CI runs on two).
MC_DEVICE void mc_spin_backoff(uint32_t* spins) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
  if ((++*spins & 63u) == 0) std::this_thread::yield();
}

// Monotonic nanoseconds (%globaltimer on the GPU).
MC_DEVICE uint64_t mc_time_ns() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

// Unrecoverable device-side error (__trap() on the GPU).
[[noreturn]] inline void mc_trap() { std::abort(); }

}  // namespace device
}  // namespace mooncake
