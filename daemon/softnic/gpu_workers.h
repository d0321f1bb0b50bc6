// GpuWorkers: the threads that run softnic's WQEs that touch GPU memory, so
// that the engine thread never waits on CUDA or on a copy agent.
//
// Why: a copy into GPU memory waits for a GPU time slice while the owner's
// kernel spins (2.4 ms on an H200, softnic/cuda_memory.h), and a copy agent
// may sit in a CUDA call up to its stall bound (20 ms) or not answer at all
// (2 s, copy_agent_link.h). On the engine thread that time was every
// tenant's: one session's GPU WQEs held up the host-memory WQEs of every
// other session on the node.
//
//   GpuWorkers workers(4);
//   workers.Submit(pd, owner, [] { ... });  // after pd's earlier jobs, never beside one
//   workers.Drain();                        // every job submitted so far has run
//
// Jobs of one protection domain (one session) run one at a time, in the
// order submitted; jobs of different domains run side by side on up to
// `threads` threads, taken round-robin by domain, so a domain with many
// queued jobs delays another by one job at most while a thread is free. A
// thread is started whenever more domains are ready than threads are idle
// or starting (an engine that never touches GPU memory has none); they end
// with Drain or the destructor. A
// thread that finds no job spins for kSpin before it sleeps, as the engine
// thread does: the next WQE of a QP usually follows within microseconds.
//
// Owners: each domain belongs to an owner (the daemon's user: uid and
// tenant). One owner's jobs run on at most threads - 1 threads at once, so
// however many sessions a user opens, and however long their GPU work
// stalls, it never holds every thread: the others' sessions share what it
// leaves (with three owners stalling at once, the third can find none
// free; the bound is per owner, not a share each). With one thread the
// bound is that thread.
//
// Thread-safety: every method may be called from any thread, jobs included
// (a job may submit the next one).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "softnic/types.h"

namespace mooncake::softnic {

class GpuWorkers {
 public:
  explicit GpuWorkers(size_t threads);
  ~GpuWorkers();  // Drain()
  GpuWorkers(const GpuWorkers&) = delete;
  GpuWorkers& operator=(const GpuWorkers&) = delete;

  // `owner`: who the domain belongs to (the same for all of pd's jobs).
  void Submit(PdId pd, uint64_t owner, std::function<void()> job);
  // Returns once every job submitted before it, and every job those
  // submitted, has run; the threads are then ended (Submit starts new ones).
  void Drain();
  // Threads running now (tests and metrics).
  size_t threads() const;
  // Jobs submitted and not yet started (tests and metrics).
  size_t waiting() const;

 private:
  void Work();
  // The first ready domain whose owner may run one more job, or ready_.end().
  std::deque<PdId>::iterator TakeableLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ready domains TakeableLocked could hand out one after another (an
  // estimate for starting threads: owners at their bound excluded).
  size_t TakeableCountLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StartThreadLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  static constexpr std::chrono::microseconds kSpin{200};

  const size_t max_threads_;
  const size_t per_owner_;  // jobs of one owner running at once, at most
  mutable absl::Mutex mu_;
  absl::flat_hash_map<PdId, std::deque<std::function<void()>>> queued_ ABSL_GUARDED_BY(mu_);
  // Domains with a queued job and none running, oldest first.
  std::deque<PdId> ready_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<PdId> busy_ ABSL_GUARDED_BY(mu_);                // domains with a job running
  absl::flat_hash_map<PdId, uint64_t> owner_of_ ABSL_GUARDED_BY(mu_);  // domains with jobs
  absl::flat_hash_map<uint64_t, size_t> running_of_ ABSL_GUARDED_BY(mu_);  // by owner, nonzero
  std::atomic<size_t> ready_count_{0};        // ready_.size(), for spinning threads
  size_t running_ ABSL_GUARDED_BY(mu_) = 0;   // jobs being run now
  size_t idle_ ABSL_GUARDED_BY(mu_) = 0;      // threads waiting for a job
  size_t starting_ ABSL_GUARDED_BY(mu_) = 0;  // threads made, not yet in Work
  bool ending_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
  absl::Mutex drain_mu_;  // one Drain at a time
};

}  // namespace mooncake::softnic
