// softnic: a software provider that honours the device-visible contract of
// an mlx5 NIC driven by IBGDA (device/include/mooncake/device/mlx5/): it
// watches each QP's doorbell record, reads WQEs from the send queue in
// client memory, executes RDMA WRITE / WRITE_IMM / 64-bit fetch-add / 32-bit
// masked fetch-add against registered regions, and writes CQEs with owner
// bits, WQE counters and error syndromes. Kernels cannot tell it from a NIC.
//
// Trust: everything in client memory is hostile and may change while being
// read. A WQE is copied out before it is parsed; every index is masked;
// every key, address and length is checked against a region of the right
// protection domain before a byte moves. A bad WQE produces an error CQE
// (with the syndrome a ConnectX would give) and moves that QP to the error
// state, after which its later WQEs complete with WR_FLUSH_ERR; nothing else
// is touched and the engine keeps serving every other QP.
//
//   syndrome                   when
//   LOCAL_QP_OP_ERR (0x02)     unknown opcode, wrong ds for the opcode, WQE
//                              index or qpn in the ctrl segment not this WQE's,
//                              doorbell ahead by more than the ring
//   LOCAL_PROT_ERR (0x04)      lkey unknown / not this PD / source out of range
//   LOCAL_LENGTH_ERR (0x01)    zero or oversized length, inline length > ds room
//   REMOTE_ACCESS_ERR (0x13)   rkey unknown / not the responder's PD / range
//                              outside the region / access right missing
//   REMOTE_INVAL_REQ_ERR (0x12) misaligned atomic address
//   TRANSPORT_RETRY_EXC_ERR (0x15) the connected responder QP no longer exists
//                              (a ConnectX retries until it gives up)
//   WR_FLUSH_ERR (0x05)        WQEs after the QP entered the error state
//
// Completion queue: a CQE is written for every WQE carrying kCtrlCqUpdate and
// for every error. Before taking a WQE the engine checks the consumer index
// the client wrote to the CQ doorbell record; while the CQ is full it leaves
// the WQE in the ring and retries later, so it never overwrites a CQE the
// client has not consumed (a client that never consumes only stalls itself).
//
// Atomics on host memory execute as real CPU atomics (the client's own
// threads update the same words). The fetched old value lands
// in the requester's data segment as a ConnectX writes it: host order for
// the 64-bit fetch-add (mlx5_core selects the host-endian atomic mode),
// big-endian for the 32-bit masked fetch-add (extended atomics). RDMA WRITE
// payloads of up to 64 bytes that are whole aligned words are stored word by
// word with release stores, so a flag written by one WQE publishes the data
// of the earlier WQEs of its QP, as PCIe ordering does on a real NIC.
//
// GPU memory (kCuda regions, imported by CudaMemory from the client's cuMem
// VMM fd): WRITE sources and destinations, inline payloads, fetch
// destinations and atomic targets may all be GPU memory. Copies are
// synchronous CUDA copies, each complete before the next WQE (and before
// its CQE), which keeps the ordering above; atomics run on the GPU (a
// one-thread kernel), atomic with the client's kernels. A CUDA error turns
// the WQE into an error CQE (REMOTE_ACCESS_ERR for the responder's memory,
// LOCAL_PROT_ERR when only the requester's GPU source failed); a kCuda
// region registered without a buffer is unreachable and fails the same
// way. See cuda_memory.h. When the process that owns the GPU memory runs a
// copy agent (AttachCopyAgent), the copies run there instead, on its own
// stream (copy_agent_link.h), with the same completion order.
//
// Use (the daemon; tests do the same with SharedMapping::Anonymous):
//
//   Engine engine;
//   engine.Start();
//   auto key = engine.RegisterRegion({.pd = session, .iova = client_addr, .length = n,
//                                     .access = kLocalWrite | kRemoteWrite | kRemoteAtomic,
//                                     .mapping = data_mapping});
//   auto qpn = engine.CreateQp(rings);        // rings: a QpSpec into the control mapping
//   engine.Connect(session, *qpn, peer_qpn);  // RTS: the doorbell is watched from now on
//   ...
//   engine.DestroyPd(session);                // session over: nothing of it is touched again
//
// Threads: one engine thread polls every QP (spinning while there is work,
// then backing off to short sleeps) and executes the WQEs that touch only
// host memory, with the engine's lock held. A WQE that touches GPU memory
// (a WRITE from or into it, an atomic on it or fetching into it; across
// nodes, reading a batch's GPU payload or landing an old value into GPU
// memory) goes to the GpuWorkers (softnic/gpu_workers.h), which run it
// without the lock: CUDA and copy agents can take milliseconds, and on the
// engine thread that time was every session's. Its QP waits, so a QP's WQEs still run one
// after another; the regions it touches are pinned, so a method that
// removes a region (or a PD) returns only once no thread touches it any
// more. The public methods may be called from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "softnic/gpu_workers.h"
#include "softnic/remote_link.h"
#include "softnic/responder_op.h"
#include "softnic/types.h"

namespace mooncake::softnic {

class CopyAgentLink;  // softnic/copy_agent_link.h

// How softnic runs NIC atomics (fetch-add, masked fetch-add).
//   kDevice  as real atomics of the memory they target (CPU atomics on host
//            memory, a GPU atomic on GPU memory): atomic against everything,
//            which is more than a NIC promises, and hides counters that mix
//            routes.
//   kHca     as a ConnectX does: a read, then the add, then a write, with
//            hca_atomic_window_us in between. Atomic only against other
//            atomics of this engine (it runs them one at a time), not
//            against CPU, SM or NVLink atomics on the same word: a counter
//            that mixes routes loses updates here as on a NIC (they keep the
//            engine's lock, on the engine thread, GPU words too). A WQE with
//            the fence bit also waits, in the ring, until the responses of
//            its QP's earlier atomics are back (hca_round_trip_us after
//            each ran), as a NIC's fence does. The window is slept on the
//            engine thread with the engine's lock held, so it stalls every
//            QP of the engine (a NIC would go on with the others): a knob
//            for tests that must land an SM atomic inside it, 0 otherwise.
enum class AtomicsModel { kDevice, kHca };

struct EngineOptions {
  // Complete every WQE successfully without moving data (benchmarks of the
  // posting path: only the GPU side is measured).
  bool sink = false;
  AtomicsModel atomics = AtomicsModel::kDevice;
  uint32_t hca_atomic_window_us = 0;  // kHca: between an atomic's read and write
  uint32_t hca_round_trip_us = 0;     // kHca: what a fence after an atomic waits
  // Longest sleep of the idle engine thread between polls. After the last
  // work it found it spins for a window that adapts to the gaps between
  // work (four times their running average, at least spin_us, at most
  // Engine::kMaxSpinWindowUs), then sleeps, doubling from 1 us. With no QP
  // connected the thread sleeps until one is (no wakeups at all).
  uint32_t max_idle_sleep_us = 1000;
  uint32_t spin_us = 200;
  // Threads that run WQEs touching GPU memory (GpuWorkers), started as
  // needed. One session's WQEs use one at a time, so a session whose GPU
  // copies stall holds up at most one.
  uint32_t gpu_workers = 4;
};

class Engine {
 public:
  explicit Engine(EngineOptions options = {});
  ~Engine();  // stops the thread
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Starts the engine thread. Idempotent.
  void Start();
  void Stop();

  // Regions. The key is both lkey and rkey, 32 random bits from the
  // kernel's CSPRNG (getrandom), nonzero, unique among live regions and
  // not one of the last kRetiredKeys keys deregistered (an rkey a peer
  // still holds reaches no later region): a key cannot be guessed from
  // another one.
  static constexpr size_t kRetiredKeys = 16384;
  // The longest the engine thread spins after work before it sleeps
  // (EngineOptions::spin_us adapts up to this).
  static constexpr uint32_t kMaxSpinWindowUs = 10000;
  // InvalidArgument: length 0, iova + length past 2^64, a kHost region
  // without a mapping or not inside it, a kCuda region not inside its
  // buffer. The engine keeps the mapping (or buffer) alive until the region
  // is deregistered.
  absl::StatusOr<uint32_t> RegisterRegion(RegionSpec spec);
  // NotFound unless `key` is a region of `pd`.
  absl::Status DeregisterRegion(PdId pd, uint32_t key);

  // Queue pairs: created in RESET (the engine ignores its doorbell), moved
  // to RTS by Connect, destroyed explicitly or with their PD. QPNs are
  // 24-bit, nonzero. InvalidArgument: counts not powers of two,
  // sq_wqe_cnt outside 1..kMaxSqWqeCnt, cq_cqe_cnt outside
  // sq_wqe_cnt..kMaxCqCqeCnt, a misaligned offset, rings outside the mapping
  // or overlapping each other. The client zeroes both doorbell records and
  // fills the CQ with 0xff bytes before handing the rings over.
  static constexpr uint32_t kMaxSqWqeCnt = 32768;
  static constexpr uint32_t kMaxCqCqeCnt = 65536;
  absl::StatusOr<uint32_t> CreateQp(QpSpec spec);
  // Connects `qpn` (of `pd`) to `remote_qpn`, a QP of this engine, and
  // moves it to RTS. `remote_qpn` may be any QP this engine knows, of any
  // PD: deciding who may connect to whom is the daemon's job (the broker
  // connects only QPs of one group). NotFound: either QP unknown (or `qpn`
  // not of `pd`); FailedPrecondition: `qpn` is not in RESET.
  // remote_pd: the responder's pd, checked when nonzero.
  absl::Status Connect(PdId pd, uint32_t qpn, uint32_t remote_qpn, PdId remote_pd = 0);
  // Connects `qpn` (of `pd`) to QP `remote_qpn` of another node's softnic,
  // reached through the remote link (SetRemoteLink), and moves it to RTS.
  // Its WQEs then go to that node in batches of up to kMaxRemoteBatch (or
  // kMaxRemoteBatchBytes of payload), one batch in flight per QP, so they
  // execute there in order; their CQEs are written when the answers come
  // back. FailedPrecondition without a link or when `qpn` is not in RESET.
  //
  // Connection secrets (issue 23): `expect_secret` (kSecretBytes, from a
  // CSPRNG) is what every batch from the peer QP must carry; the daemon
  // hands it to the peer's node over the authenticated peer channel
  // (Peer.OfferConnection) before calling this. This QP's own batches carry
  // what the peer's node offered it (AcceptConnectionSecret); until an
  // offer arrives its WQEs wait in the ring, for at most kOfferWait, then
  // complete with TRANSPORT_RETRY_EXC_ERR.
  static constexpr uint32_t kMaxRemoteBatch = 64;
  static constexpr uint64_t kMaxRemoteBatchBytes = 8u << 20;
  static constexpr size_t kSecretBytes = 16;
  static constexpr absl::Duration kOfferWait = absl::Seconds(2);
  absl::Status ConnectRemote(PdId pd, uint32_t qpn, const std::string& node, uint32_t remote_qpn,
                             std::string expect_secret);
  // Another node's QP `peer_qpn` offers the secret that `qpn`'s batches to
  // it must carry. `node` is the authenticated caller. While `qpn` is in
  // RESET every offer is kept apart, one per (node, peer_qpn), at most
  // kOffersPerNode per node (its oldest goes) and kMaxOffers in all
  // (ResourceExhausted past it), and ConnectRemote takes its peer's: an
  // offer from elsewhere, before or after, displaces nothing. Once `qpn` is
  // connected, only to exactly (node, peer_qpn) and only once
  // (AlreadyExists after: a QPN reused on that node cannot replace its
  // predecessor's connection). NotFound: no such QP, or connected
  // elsewhere. InvalidArgument: the secret is not kSecretBytes.
  static constexpr size_t kOffersPerNode = 4;
  static constexpr size_t kMaxOffers = 64;
  absl::Status AcceptConnectionSecret(const std::string& node, uint32_t peer_qpn, uint32_t qpn,
                                      std::string secret);
  // The copy agent of `pd`'s process (copy_agent_link.h): from now on the
  // GPU regions of `pd`, those registered already and later ones, move
  // their bytes through it while it is usable. One per PD (AlreadyExists);
  // it goes with DestroyPd.
  absl::Status AttachCopyAgent(PdId pd, std::shared_ptr<CopyAgentLink> agent);
  // Whether `pd` has a copy agent that is still used.
  bool HasCopyAgent(PdId pd) const;
  // NotFound unless `qpn` is a QP of `pd`. QPs connected to it complete
  // their later WQEs with TRANSPORT_RETRY_EXC_ERR.
  absl::Status DestroyQp(PdId pd, uint32_t qpn);
  // Tests: the number the next QP gets if free (QPNs are handed out in
  // sequence from a random start; reaching one again takes 2^24 creates).
  void set_next_qpn_for_testing(uint32_t qpn) {
    CallerLock lock(this);
    next_qpn_ = qpn;
  }

  // Who `pd` belongs to (the daemon's user of the session: uid and tenant,
  // as one number). One owner's GPU WQEs run on all but one GPU worker at
  // most (gpu_workers.h). A domain never named here is its own owner.
  void SetPdOwner(PdId pd, uint64_t owner);

  // Everything of `pd` (session end). Returns once no thread of the engine
  // touches any of it (a GPU WQE of another session's into one of its
  // regions runs to its end first): the mappings may then be released.
  void DestroyPd(PdId pd);

  std::vector<QpInfo> ListQps() const;
  std::vector<RegionInfo> ListRegions() const;
  // Payload bytes of the RDMA WRITEs executed so far (metrics; the sink
  // mode moves none). One relaxed atomic, added per successful WRITE.
  uint64_t bytes_written() const { return bytes_written_.load(std::memory_order_relaxed); }
  const EngineOptions& options() const { return options_; }
  // WQEs that waited for a fence (kHca; metrics and benchmarks).
  uint64_t fence_waits() const { return fence_waits_.load(std::memory_order_relaxed); }

  // The responder side of op.remote_qpn, one of this engine's QPs: checks
  // the rkey against that QP's PD and executes. For callers outside the
  // engine thread (tests; ExecuteForPeer for another node's requests).
  ResponderResult ExecuteAsResponder(const ResponderOp& op);
  // The responder side for another node's requester: op.remote_qpn must be
  // a QP of this engine connected to exactly (requester_node,
  // requester_qpn), and `secret` must be the one it expects (ConnectRemote),
  // else TRANSPORT_RETRY_EXC_ERR (as a NIC drops packets for a QP that is
  // not its peer's; `refused` marks a wrong or missing secret) and nothing
  // is touched.
  ResponderResult ExecuteForPeer(const std::string& requester_node, uint32_t requester_qpn,
                                 const std::string& secret, const ResponderOp& op);
  // Where QPs connected to other nodes send their WQEs (null: none; then
  // ConnectRemote fails). Set before serving.
  void SetRemoteLink(std::shared_ptr<RemoteLink> link);
  // GPU worker threads running now (tests).
  size_t gpu_worker_threads() const { return workers_.threads(); }
  // GPU jobs waiting for a worker (not running yet).
  size_t gpu_jobs_waiting() const { return workers_.waiting(); }

 private:
  struct Region;
  struct Qp;
  struct Offload;

  // Executes `op` for a responder QP of this engine. Called with mu_ held;
  // lets go of it while GPU memory is copied or added to (the region
  // pinned), so the caller must hold no reference into qps_ or regions_
  // across the call.
  ResponderResult ExecuteAsResponderLocked(const ResponderOp& op)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The responder's checks: op.remote_qpn's region under op.rkey, with the
  // rights and alignment `op` needs. Returns a syndrome (0: ok) and, when
  // ok, the region and the bytes as the daemon reaches them.
  uint8_t ResolveResponder(const ResponderOp& op, const Region** target, ByteSpan* span) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs `op` on bytes ResolveResponder found. Needs mu_ only for host
  // memory in kHca mode; otherwise the region must stay pinned.
  ResponderResult RunResponder(const ByteSpan& target, const ResponderOp& op);
  // Whether an op on `target` from `source` touches GPU memory, and so runs
  // without mu_ (atomics in kHca mode excepted: they run one at a time).
  bool Offloads(const ByteSpan& target, const ByteSpan& source, bool atomic) const;
  // Runs an offloaded WQE on a GPU worker, then completes it.
  void RunOffloaded(Offload& o);
  // SetPdOwner's owner of `pd`, or one of its own.
  uint64_t OwnerLocked(PdId pd) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether QP `qpn` is still the one numbered so when `serial` was taken.
  bool QpAliveLocked(uint32_t qpn, uint64_t serial) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Called where a CQE was written off the engine thread (a GPU worker,
  // another node's answer): the client's next doorbell follows within
  // microseconds, so the engine thread wakes and spins again.
  void Kick();
  // Ends the WQE at sq_ci: its CQE (when signaled or failed) and the QP's
  // state.
  void FinishWqe(Qp& qp, uint16_t index, uint8_t opcode, uint8_t syndrome, bool signaled,
                 uint32_t byte_count) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Pins keep a region registered while a thread works on it without mu_.
  void Pin(const Region* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Unpin(const Region* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // True when the CQ of `qp` has room for one more CQE.
  bool CqHasRoom(const Qp& qp) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes the next CQE of `qp` (syndrome 0: success).
  void WriteCqe(Qp& qp, uint16_t wqe_counter, uint8_t wqe_opcode, uint8_t syndrome,
                uint32_t byte_count) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  void Run();
  // Processes what the doorbell of `qp` announces; true if it did anything.
  bool Poll(Qp& qp) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether the next `wqes` send-queue slots and `cqes` CQ slots of `qp`
  // are in memory (the client's pages: SharedMapping::resident); if not,
  // LoseRings.
  bool RingsResident(Qp& qp, uint32_t wqes, uint32_t cqes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fails `qp` for good without touching its memory again (logged, rate
  // limited): a page of `what` was punched out of the client's memfd.
  void LoseRings(Qp& qp, const char* what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A QP connected to another node: sends the next batch of its WQEs.
  struct RemoteWqe;
  bool PollRemote(Qp& qp, uint16_t pending) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Parses one WQE for the remote path and copies out its payload (a
  // WRITE's from byte `from`, at most `budget` bytes of it); returns a
  // local syndrome (0 = ok). A payload in GPU memory is not copied: its
  // pieces go in `fills`, for a GPU worker (SendAfterFills).
  struct RemoteFill;
  uint8_t PrepareRemote(Qp& qp, const uint8_t (&wqe)[64], uint16_t index, uint64_t from,
                        uint64_t budget, RemoteWqe* out, std::vector<RemoteOp>* ops,
                        std::vector<RemoteFill>* fills) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // On a GPU worker: copies the GPU payloads of a batch in, then sends it
  // (up to the WQE whose copy failed, which then fails on its own).
  void SendAfterFills(uint32_t qpn, uint64_t serial, std::vector<RemoteWqe> wqes, RemoteBatch batch,
                      const std::vector<RemoteFill>& fills);
  // Sends a batch of `qp` and marks it out; its answers go to FinishRemote.
  void SendRemote(Qp& qp, std::vector<RemoteWqe> wqes, RemoteBatch batch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The answers to a batch: CQEs, fetched values, and the next batch may go.
  // Old values that go to GPU memory are landed first, by a GPU worker,
  // which then calls again with `landed`: per WQE of the batch, the
  // syndrome of its landing, or kNotLanded.
  static constexpr uint8_t kNotLanded = 0xff;
  void FinishRemote(uint32_t qpn, uint64_t serial, const std::vector<RemoteWqe>& wqes,
                    const absl::StatusOr<std::vector<ResponderResult>>& results,
                    const std::vector<uint8_t>* landed = nullptr);
  // Executes one WQE copied out of the ring; returns the syndrome (0 = ok)
  // and sets the opcode the CQE reports and, for writes, the byte count. A
  // long WRITE runs one piece per call (qp.wqe_offset): `more` says the
  // WQE is not done yet.
  // A WQE that touches GPU memory is not run when `offload` is given: it is
  // described there (offload->set) for a GPU worker, its regions pinned.
  uint8_t ExecuteWqe(Qp& qp, const uint8_t (&wqe)[64], uint16_t index, uint8_t* cqe_opcode,
                     uint32_t* byte_count, bool* more, Offload* offload)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a local WRITE copies host memory to host memory (done in
  // pieces; a copy with GPU memory on either side goes whole).
  bool HostToHostLocked(const ResponderOp& op) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // kHca: the read-add-write of one atomic on `word` (width 8: fetch-add;
  // 4: masked fetch-add), sleeping hca_atomic_window_us between read and
  // write. Returns the old value; false when GPU memory failed.
  bool HcaAtomic(const ByteSpan& word, const ResponderOp& op, uint64_t* old);
  // Resolves [addr, addr+len) under `key` in `pd` with `need` rights.
  const Region* Resolve(PdId pd, uint32_t key, uint64_t addr, uint64_t len, uint32_t need) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const EngineOptions options_;
  mutable absl::Mutex mu_;
  // mu_ for every caller but the engine thread's visits (the API, the peer
  // port, GPU workers): it counts itself in `waiting_` while it waits, and
  // the engine thread lets such callers go first between visits (50 us a
  // round at most, engine.cc). An
  // absl::Mutex lets the unlocking thread take it again before a woken
  // waiter runs: a busy engine, relocking at once, kept those callers
  // waiting for tens of milliseconds on two cores.
  class ABSL_SCOPED_LOCKABLE CallerLock {
   public:
    explicit CallerLock(const Engine* e) ABSL_EXCLUSIVE_LOCK_FUNCTION(e->mu_) : e_(e) {
      e_->waiting_.fetch_add(1, std::memory_order_relaxed);
      e_->mu_.Lock();
      e_->waiting_.fetch_sub(1, std::memory_order_relaxed);
    }
    ~CallerLock() ABSL_UNLOCK_FUNCTION() { e_->mu_.Unlock(); }
    CallerLock(const CallerLock&) = delete;
    CallerLock& operator=(const CallerLock&) = delete;

   private:
    const Engine* const e_;
  };
  mutable std::atomic<int> waiting_{0};
  uint64_t rings_lost_ ABSL_GUARDED_BY(mu_) = 0;  // LoseRings so far (logged at powers of two)
  absl::flat_hash_map<uint32_t, std::unique_ptr<Region>> regions_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint32_t, std::unique_ptr<Qp>> qps_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<PdId, std::shared_ptr<CopyAgentLink>> agents_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<PdId, uint64_t> owners_ ABSL_GUARDED_BY(mu_);
  // The last kRetiredKeys keys deregistered, oldest first (RegisterRegion).
  std::deque<uint32_t> retired_order_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<uint32_t> retired_ ABSL_GUARDED_BY(mu_);
  void RetireKeyLocked(uint32_t key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::shared_ptr<RemoteLink> link_ ABSL_GUARDED_BY(mu_);
  uint64_t next_serial_ ABSL_GUARDED_BY(mu_) = 1;
  uint32_t next_qpn_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> stop_{false};
  std::atomic<bool> kicked_{false};  // Kick() since the engine thread last looked
  absl::Mutex kick_mu_;              // wakes the engine thread from its sleep
  bool kicked_flag_ ABSL_GUARDED_BY(kick_mu_) = false;
  std::atomic<uint64_t> bytes_written_{0};
  std::atomic<uint64_t> fence_waits_{0};
  absl::Mutex thread_mu_;  // serialises Start/Stop
  std::thread thread_ ABSL_GUARDED_BY(thread_mu_);
  // Last: its threads end before anything they use goes.
  GpuWorkers workers_;
};

}  // namespace mooncake::softnic
