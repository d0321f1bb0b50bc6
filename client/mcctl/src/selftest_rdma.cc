#include "mooncake/mcctl/selftest_rdma.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "mooncake/client/communicator.h"
#include "mooncake/common/escape.h"
#include "mooncake/device/comm_device.h"
#include "mooncake/device/mlx5/prm.h"
#include "mooncake/device/qp_error.h"
#include "mooncake/mcctl/table.h"
#include "selftest_across.h"

namespace mooncake::mcctl {
namespace {

using device::McPeer;
using device::McStatus;
using Clock = std::chrono::steady_clock;

using namespace selftest;  // the buffer layout and step sizes (selftest_rdma.h)

const char* kLinkHint =
    "no completion, or an error completion, for a plain WRITE: check the port state and link "
    "(mcctl nics), the GID index and MTU of the link, and on RoCE the PFC/ECN setup of the "
    "priority (docs/rdma.md, \"First run\")";
const char* kAtomicsHint =
    "NIC atomics: mcctl nics shows what the NIC answers; the firmware must allow PCI atomics "
    "(mlxconfig ... set PCI_ATOMIC_MODE=...; docs/rdma.md, \"First run\")";

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + static_cast<long>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// A rank's Communicator as the selftest sets it up: a group of two, RDMA
// between them, on the NIC asked for.
CommunicatorOptions RankOptions(const SelftestOptions& o, const std::string& group, uint32_t rank,
                                AtomicsRoute atomics) {
  CommunicatorOptions c;
  c.socket_path = o.socket;
  c.group = group;
  c.rank = rank;
  c.world_size = 2;
  c.buffer_bytes = kBufferBytes;
  c.platform = Platform::kHost;
  c.route = Route::kRdma;
  // NIC atomics: every rank also gets a loopback queue pair, which the
  // loopback-atomic step tries.
  c.atomics_route = atomics;
  c.rdma_sq_depth = 256;
  c.timeout = absl::Milliseconds(o.timeout_ms);
  c.client_name = "mcctl selftest rdma";
  if (!o.nic.empty()) c.rdma_nics = {o.nic};
  return c;
}

// The two ranks, each set up by its own Communicator (Create blocks for the
// rendezvous, so rank 1's runs on a thread).
struct Pair {
  std::unique_ptr<Communicator> rank[2];
};

absl::StatusOr<Pair> SetUp(const SelftestOptions& o, AtomicsRoute atomics) {
  std::mt19937_64 rng(static_cast<uint64_t>(Clock::now().time_since_epoch().count()) ^
                      static_cast<uint64_t>(::getpid()));
  const std::string group =
      absl::StrFormat("mcctl-selftest-%d-%08x", ::getpid(), static_cast<uint32_t>(rng()));
  absl::StatusOr<std::unique_ptr<Communicator>> second = absl::UnknownError("not run");
  std::thread t([&] { second = Communicator::Create(RankOptions(o, group, 1, atomics)); });
  absl::StatusOr<std::unique_ptr<Communicator>> first =
      Communicator::Create(RankOptions(o, group, 0, atomics));
  t.join();
  if (!first.ok()) return first.status();
  if (!second.ok()) return second.status();
  Pair p;
  p.rank[0] = *std::move(first);
  p.rank[1] = *std::move(second);
  return p;
}

template <class T>
T* At(Communicator& c, uint64_t off) {
  return reinterpret_cast<T*>(static_cast<uint8_t*>(c.buffer()) + off);
}

template <class T>
T Load(const T* p) {
  return std::atomic_ref<T>(*const_cast<T*>(p)).load(std::memory_order_acquire);
}

// Where a step runs: this rank (`self`) posts toward rank `peer`, and reads
// the peer's buffer back with `read_peer` once its operations completed:
// straight from the other Communicator in this process, or, across nodes,
// by asking the other rank (selftest_across.h).
struct Ends {
  Communicator* self = nullptr;
  uint32_t peer = 1;
  std::function<absl::StatusOr<std::string>(uint64_t offset, uint64_t length)> read_peer;
};

const char* kReadBackHint =
    "the other rank did not send its memory back: its own report (on its node) says why";

const char* kAcrossPeerHint =
    "the other rank stopped taking part: its own report (on its node) says why; a queue pair "
    "that failed here names its cause above";
const char* kDaemonGoneHint =
    "this node's mooncaked went away during the selftest: `systemctl status mooncaked` and its "
    "log say why";

// What to check when reading the peer's memory back failed: this rank's
// own queue pair (the request could not be posted), this node's daemon,
// else the other rank.
const char* ReadBackHint(const absl::Status& s) {
  if (absl::IsUnavailable(s)) return kLinkHint;
  if (absl::IsFailedPrecondition(s)) return kDaemonGoneHint;
  return kReadBackHint;
}

// A word of the peer's buffer, read back.
template <class T>
absl::StatusOr<T> PeerWord(const Ends& e, uint64_t off) {
  absl::StatusOr<std::string> bytes = e.read_peer(off, sizeof(T));
  if (!bytes.ok()) return bytes.status();
  T v{};
  std::memcpy(&v, bytes->data(), sizeof(T));
  return v;
}

std::string ReadBackFailure(const absl::Status& s) {
  return absl::StrCat("could not read the peer's memory back: ", s.message());
}

// Times `post` (one operation, then mc_quiet) kLatencyOps times, then posts
// kRateOps back to back and waits once. `post(v)` posts with value v
// (*next, counted up per call) and returns its status.
struct Timing {
  McStatus status = McStatus::kOk;
  double latency_us = 0;
  double rate = 0;
};
// `quiet` waits for what was posted: mc_quiet(ctx), every queue pair of the
// context, unless the step has a queue pair of its own (loopback-atomic,
// which must not fail because the pair toward the peer did).
Timing Measure(const device::CommCtx& ctx, const std::function<McStatus(uint64_t)>& post,
               uint64_t* next, const std::function<McStatus()>& quiet = {}) {
  auto wait = [&] { return quiet ? quiet() : device::mc_quiet(ctx); };
  Timing t;
  std::vector<double> lat;
  lat.reserve(kLatencyOps);
  for (int i = 0; i < kLatencyOps && t.status == McStatus::kOk; ++i) {
    const auto t0 = Clock::now();
    t.status = post((*next)++);
    if (t.status == McStatus::kOk) t.status = wait();
    lat.push_back(Seconds(Clock::now() - t0) * 1e6);
  }
  if (t.status != McStatus::kOk) return t;
  t.latency_us = Median(std::move(lat));
  const auto t0 = Clock::now();
  for (int i = 0; i < kRateOps && t.status == McStatus::kOk; ++i) t.status = post((*next)++);
  if (t.status == McStatus::kOk) t.status = wait();
  t.rate = kRateOps / std::max(Seconds(Clock::now() - t0), 1e-9);
  return t;
}

SelftestStep WriteInline(const Ends& e) {
  SelftestStep s{.name = "write-inline"};
  const device::CommCtx& ctx = e.self->ctx();
  const McPeer peer = device::mc_peer(ctx, static_cast<int>(e.peer));
  auto* word = At<uint64_t>(*e.self, kWordOff);
  uint64_t next = 1;
  const Timing t = Measure(
      ctx, [&](uint64_t v) { return device::mc_put_thread(peer, word, &v, sizeof(v)); }, &next);
  s.latency_us = t.latency_us;
  s.rate = t.rate;
  if (t.status != McStatus::kOk) {
    s.detail = QpFailure(t.status, peer.qp);
    s.hint = kLinkHint;
    return s;
  }
  const absl::StatusOr<uint64_t> seen = PeerWord<uint64_t>(e, kWordOff);
  if (!seen.ok()) {
    s.detail = ReadBackFailure(seen.status());
    s.hint = ReadBackHint(seen.status());
  } else if (*seen != next - 1) {
    s.detail = absl::StrCat("the peer's word holds ", *seen, ", not the last value written (",
                            next - 1, ")");
    s.hint = "completions arrive but data does not land: report this with `mcctl qps`";
  } else {
    s.pass = true;
    s.detail = absl::StrCat(next - 1, " inline WRITEs of 8 B, the last value landed");
  }
  return s;
}

SelftestStep Write(const Ends& e) {
  SelftestStep s{.name = "write"};
  const device::CommCtx& ctx = e.self->ctx();
  const McPeer peer = device::mc_peer(ctx, static_cast<int>(e.peer));
  uint8_t* src = At<uint8_t>(*e.self, kSrcOff);
  void* dst = At<uint8_t>(*e.self, kDstOff);
  uint64_t next = 1;
  // Filled once: every WRITE sends the same bytes, so the source never
  // changes under a WRITE in flight.
  for (uint64_t i = 0; i < kWriteBytes; ++i) src[i] = static_cast<uint8_t>(i * 131 + 7);
  const Timing t = Measure(
      ctx, [&](uint64_t) { return device::mc_put_thread(peer, dst, src, kWriteBytes); }, &next);
  s.latency_us = t.latency_us;
  s.rate = t.rate;
  if (t.status != McStatus::kOk) {
    s.detail = QpFailure(t.status, peer.qp);
    s.hint = absl::StrCat(kLinkHint,
                          "; a WRITE from memory (not inline) also needs the buffer's "
                          "registration: host memory pinned, RLIMIT_MEMLOCK");
    return s;
  }
  const absl::StatusOr<std::string> got = e.read_peer(kDstOff, kWriteBytes);
  if (!got.ok()) {
    s.detail = ReadBackFailure(got.status());
    s.hint = ReadBackHint(got.status());
    return s;
  }
  size_t bad = 0;
  for (uint64_t i = 0; i < kWriteBytes; ++i) {
    bad += static_cast<uint8_t>((*got)[i]) != static_cast<uint8_t>(i * 131 + 7);
  }
  if (bad != 0) {
    s.detail = absl::StrCat(bad, " of ", kWriteBytes, " bytes wrong at the peer");
    s.hint = "completions arrive but data does not land: report this with `mcctl mrs`";
    return s;
  }
  s.pass = true;
  s.detail = absl::StrCat(next - 1, " WRITEs of 64 KiB (",
                          absl::StrFormat("%.2f", s.rate * kWriteBytes / 1e9),
                          " GB/s back to back), every byte checked");
  return s;
}

// fetch-add-8 and masked-fa-4: the counter's total, and the old value the
// last add fetched (its byte order is the NIC's atomic mode).
template <class T>
SelftestStep FetchAdd(const Ends& e) {
  constexpr bool k64 = sizeof(T) == 8;
  SelftestStep s{.name = k64 ? "fetch-add-8" : "masked-fa-4"};
  const device::CommCtx& ctx = e.self->ctx();
  const McPeer peer = device::mc_peer(ctx, static_cast<int>(e.peer));
  const uint64_t off = k64 ? kCounter64Off : kCounter32Off;
  T* counter = At<T>(*e.self, off);
  uint64_t next = 0;
  const Timing t = Measure(
      ctx, [&](uint64_t) { return device::mc_red_add(peer, counter, T{1}); }, &next);
  s.latency_us = t.latency_us;
  s.rate = t.rate;
  if (t.status != McStatus::kOk) {
    s.detail = QpFailure(t.status, peer.qp);
    s.hint = kAtomicsHint;
    return s;
  }
  const absl::StatusOr<T> read = PeerWord<T>(e, off);
  if (!read.ok()) {
    s.detail = ReadBackFailure(read.status());
    s.hint = ReadBackHint(read.status());
    return s;
  }
  const uint64_t total = *read;
  uint64_t raw = 0;
  std::memcpy(&raw, peer.qp->fetch_scratch, sizeof(raw));
  // What the last add fetched: the counter before it, next - 1. The 8-byte
  // standard atomic answers in host order (mlx5_core's atomic mode), the
  // extended 4-byte one big-endian.
  const uint64_t fetched = k64 ? raw : device::mlx5::be32(static_cast<uint32_t>(raw & 0xffffffffu));
  if (total != next) {
    s.detail = absl::StrCat("the counter holds ", total, " after ", next, " adds");
    s.hint = kAtomicsHint;
  } else if (fetched != next - 1) {
    s.detail = absl::StrCat("the last add fetched ", fetched, ", expected ", next - 1);
    s.hint = k64 ? "the 8-byte fetch-add's reply is not in host order: the NIC's atomic mode "
                   "(set by mlx5_core at probe) is not what kernels assume; check the driver "
                   "and firmware versions"
                 : "the 4-byte masked fetch-add's reply is not big-endian: report this with "
                   "`mcctl nics`";
  } else {
    s.pass = true;
    s.detail = absl::StrCat(next, " adds, the total and the fetched old value right (",
                            k64 ? "host order" : "big-endian", ")");
  }
  return s;
}

SelftestStep RingWrap(const Ends& e) {
  SelftestStep s{.name = "ring-wrap"};
  const device::CommCtx& ctx = e.self->ctx();
  const McPeer peer = device::mc_peer(ctx, static_cast<int>(e.peer));
  auto* word = At<uint64_t>(*e.self, kWordOff);
  const uint64_t before = peer.qp->resv_head;
  const auto t0 = Clock::now();
  McStatus st = McStatus::kOk;
  for (uint64_t i = 1; i <= kWrapWqes && st == McStatus::kOk; ++i) {
    st = device::mc_put_thread(peer, word, &i, sizeof(i));
  }
  if (st == McStatus::kOk) st = device::mc_quiet(ctx);
  const double secs = Seconds(Clock::now() - t0);
  if (st == McStatus::kOk) s.rate = kWrapWqes / std::max(secs, 1e-9);
  const uint64_t posted = peer.qp->resv_head - before;
  if (st != McStatus::kOk) {
    s.detail = absl::StrCat(QpFailure(st, peer.qp), " after ", posted, " WQEs");
    s.hint =
        "the ring failed while wrapping: owner bits or the 16-bit WQE counter disagree with "
        "the NIC's; report this with `mcctl qps`";
    return s;
  }
  const absl::StatusOr<uint64_t> seen = PeerWord<uint64_t>(e, kWordOff);
  if (!seen.ok()) {
    s.detail = ReadBackFailure(seen.status());
    s.hint = ReadBackHint(seen.status());
  } else if (*seen != kWrapWqes) {
    s.detail = absl::StrCat("the peer's word holds ", *seen, " after ", kWrapWqes, " WRITEs");
    s.hint = "WQEs completed but the last one did not land last: report this with `mcctl qps`";
  } else {
    s.pass = true;
    s.detail = absl::StrCat(kWrapWqes, " WQEs through a ", peer.qp->sq_wqe_cnt,
                            "-deep ring (the 16-bit counter wrapped), the last landed last");
  }
  return s;
}

const char* kLoopbackHint =
    "a queue pair connected to itself failed: NIC atomics to a rank's own words need it "
    "(docs/rdma.md \"Atomics across routes\"); set atomics_route device where no word takes "
    "adds over both routes, and report this with `mcctl qps`";

SelftestStep LoopbackAtomic(const Ends& e) {
  SelftestStep s{.name = "loopback-atomic"};
  const device::CommCtx& ctx = e.self->ctx();
  const McPeer self = device::mc_peer(ctx, e.self->rank());
  auto* counter = At<uint64_t>(*e.self, kLoopbackOff);
  if (!self.nic_atomics || self.atomic_qp == nullptr) {
    s.detail = "no loopback queue pair in the context";
    s.hint = "report this: the Communicator was asked for NIC atomics";
    return s;
  }
  uint64_t next = 0;
  const Timing t = Measure(
      ctx, [&](uint64_t) { return device::mc_red_add(self, counter, uint64_t{1}); }, &next,
      [&] { return device::mc_qp_quiet(self.atomic_qp); });
  s.latency_us = t.latency_us;
  s.rate = t.rate;
  const uint64_t total = Load(counter);
  if (t.status != McStatus::kOk) {
    s.detail = QpFailure(t.status, self.atomic_qp);
    s.hint = kLoopbackHint;
  } else if (total != next) {
    s.detail = absl::StrCat("the counter holds ", total, " after ", next, " adds");
    s.hint = kAtomicsHint;
  } else {
    s.pass = true;
    s.detail = absl::StrCat(next, " adds to this rank's own word through its NIC");
  }
  return s;
}

// On `channel`: it leaves that queue pair (and the other rank's end of it)
// in error.
SelftestStep BadRkey(const Ends& e, int channel) {
  SelftestStep s{.name = "bad-rkey"};
  const device::CommCtx& ctx = e.self->ctx();
  const McPeer peer = device::mc_peer(ctx, static_cast<int>(e.peer), channel);
  // A key the peer never gave: every bit of the low byte (the mkey's
  // variant) and more flipped, so it names no region of any session.
  McPeer forged = peer;
  forged.rkey = peer.rkey ^ 0x00a5a5ffu;
  const uint64_t v = 1;
  McStatus st = device::mc_put_thread(forged, At<uint64_t>(*e.self, kBadKeyOff), &v, sizeof(v));
  if (st == McStatus::kOk) st = device::mc_qp_quiet(peer.qp);
  const uint8_t syndrome = static_cast<uint8_t>(peer.qp->error & 0xffu);
  if (st == McStatus::kRdmaError && (peer.qp->error & device::kQpErrCqe) != 0 &&
      syndrome == device::mlx5::kSyndRemoteAccessErr) {
    s.pass = true;
    s.detail = absl::StrCat("refused: ", device::DescribeQpError(peer.qp->error));
  } else if (st == McStatus::kOk) {
    s.detail = "a WRITE with a forged key completed: the peer's memory is not protected by its key";
    s.hint = "report this at once, with `mcctl mrs`";
  } else {
    s.detail = absl::StrCat("expected the remote access error, got ", QpFailure(st, peer.qp));
    s.hint = kLinkHint;
  }
  return s;
}

// Runs the steps that need the queue pair toward the peer (channel 0) in
// order. Once a step leaves that pair unusable (an error completion, or
// WQEs it rang that never completed: a timeout), or, across nodes, the
// other rank stopped answering reads, the later steps are not run: each
// would fail the same way (or wait out another timeout) under a hint of its
// own (atomics, ring format) that points away from the cause, which the
// first failure names.
class StepRunner {
 public:
  // Across nodes: `reader` (whether the other rank stopped answering) and
  // `watch` (whether it is gone, which explains a failure better than the
  // link hint).
  StepRunner(const Ends& e, std::vector<SelftestStep>* out,
             const selftest::PeerReader* reader = nullptr, selftest::PeerWatch* watch = nullptr)
      : qp_(device::mc_peer(e.self->ctx(), static_cast<int>(e.peer)).qp),
        peer_(e.peer),
        reader_(reader),
        watch_(watch),
        out_(out) {}
  template <class Step>
  void Run(const char* name, Step step) {
    if (!stopped_by_.empty()) {
      out_->push_back(SelftestStep{.name = name, .detail = "not run: " + stopped_by_});
      return;
    }
    out_->push_back(step());
    if (!out_->back().pass && watch_ != nullptr) {
      const absl::Status gone = watch_->GoneWithin(absl::Seconds(1));
      if (!gone.ok()) {
        SelftestStep& failed = out_->back();
        absl::StrAppend(&failed.detail, "; meanwhile ", gone.message());
        failed.hint = absl::IsFailedPrecondition(gone) ? kDaemonGoneHint : kAcrossPeerHint;
        stopped_by_ = std::string(gone.message());
        return;
      }
    }
    if (QpUnusable()) {
      stopped_by_ = absl::StrCat("the queue pair to the peer failed in ", name);
    } else if (reader_ != nullptr && reader_->stopped()) {
      stopped_by_ = absl::StrCat("rank ", peer_, " stopped answering in ", name);
    }
  }
  // Why the later steps are not run; empty while they are.
  const std::string& stopped_by() const { return stopped_by_; }

 private:
  bool QpUnusable() const {
    // Read on the thread that polls it (the host platform's kernels are
    // this thread), as the steps read it.
    return qp_ != nullptr && (qp_->error != 0 || qp_->ready_head != qp_->cons_tail);
  }
  const device::IbgdaQpDevCtx* qp_;
  uint32_t peer_;
  const selftest::PeerReader* reader_;
  selftest::PeerWatch* watch_;
  std::vector<SelftestStep>* out_;
  std::string stopped_by_;
};

// The steps toward the peer that both modes run, in order.
void RunPeerSteps(const Ends& e, StepRunner* run) {
  run->Run("write-inline", [&] { return WriteInline(e); });
  run->Run("write", [&] { return Write(e); });
  run->Run("fetch-add-8", [&] { return FetchAdd<uint64_t>(e); });
  run->Run("masked-fa-4", [&] { return FetchAdd<uint32_t>(e); });
  run->Run("ring-wrap", [&] { return RingWrap(e); });
}

std::string Number(double v, const char* unit) {
  if (v <= 0) return "-";
  if (v >= 1e6) return absl::StrFormat("%.2f M%s", v / 1e6, unit);
  if (v >= 1e3) return absl::StrFormat("%.1f k%s", v / 1e3, unit);
  return absl::StrFormat("%.0f %s", v, unit);
}

}  // namespace

bool SelftestReport::ok() const {
  if (!setup_error.empty() || steps.empty()) return false;
  for (const SelftestStep& s : steps) {
    if (!s.pass) return false;
  }
  return true;
}

namespace {

void DescribeNic(Communicator& c, SelftestReport* r) {
  if (DaemonRdmaTransport* t = c.rdmaTransport()) {
    r->nic = t->nic();
    r->provider = t->nodeInfo().provider;
    r->doorbell_mode = t->doorbellMode();
  }
}

// Both ranks in this process: a loopback pair through the local daemon.
SelftestReport RunLocal(const SelftestOptions& options) {
  SelftestReport r;
  r.nic = options.nic;  // the NIC asked for; the one used once the pair is up
  absl::StatusOr<Pair> pair = SetUp(options, AtomicsRoute::kNic);
  // A setup that fails only with the loopback queue pairs is the loopback's
  // failure: the other steps run on a pair without them.
  std::string loopback_setup;
  if (!pair.ok()) {
    absl::StatusOr<Pair> plain = SetUp(options, AtomicsRoute::kDevice);
    if (plain.ok()) {
      loopback_setup = std::string(pair.status().message());
      pair = std::move(plain);
    }
  }
  if (!pair.ok()) {
    // Never empty: an empty setup_error reads as a setup that worked (a
    // daemon that does not implement the session calls answers a bare
    // UNIMPLEMENTED).
    r.setup_error = pair.status().message().empty() ? pair.status().ToString()
                                                    : std::string(pair.status().message());
    r.setup_hint =
        "two ranks of this process could not form an RDMA pair through mooncaked: check that it "
        "serves RDMA (`mcctl nics`: a provider mlx5 or softnic, rdma_provider not off) and that "
        "--nic names a NIC it serves; `mcctl doctor` checks the node";
    return r;
  }
  Pair& p = *pair;
  DescribeNic(*p.rank[0], &r);
  Communicator* other = p.rank[1].get();
  const Ends e{
      p.rank[0].get(), 1, [other](uint64_t offset, uint64_t length) {
        // After mc_quiet saw the completions: the bytes are in place.
        std::atomic_thread_fence(std::memory_order_acquire);
        return absl::StatusOr<std::string>(std::string(At<const char>(*other, offset), length));
      }};
  StepRunner run(e, &r.steps);
  RunPeerSteps(e, &run);
  // Its own queue pair (connected to itself): run whatever the pair did.
  if (loopback_setup.empty()) {
    r.steps.push_back(LoopbackAtomic(e));
  } else {
    r.steps.push_back(SelftestStep{.name = "loopback-atomic",
                                   .detail = "setup with loopback queue pairs failed (without "
                                             "them it worked): " +
                                             loopback_setup,
                                   .hint = kLoopbackHint});
  }
  // Last: it leaves the queue pair toward rank 1 in error.
  run.Run("bad-rkey", [&] { return BadRkey(e, 0); });
  return r;
}

const char* kAcrossSetupHint =
    "the group of two across nodes did not form: run `mcctl selftest rdma --across GROUP --rank "
    "R` on both nodes (R 0 on one, 1 on the other) within --timeout-ms of each other, with the "
    "same $MC_GROUP_SECRET; both daemons must be in one cluster (`mcctl peers` lists the other "
    "node) and serve RDMA; run `mcctl selftest rdma` on each node first";

// One rank of a group of two across nodes: rank 0 runs the steps toward
// rank 1 while rank 1 answers its reads, then the other way round, then
// rank 0 the bad key on channel 1 (channel 0 carries the last hand-over).
SelftestReport RunAcross(const SelftestOptions& o) {
  SelftestReport r;
  r.nic = o.nic;
  const auto me = static_cast<uint32_t>(o.across_rank);
  const uint32_t other = 1 - me;
  // A name of the selftest's own, so a pair never joins (and writes into)
  // a job's group of two that happens to have the same name.
  CommunicatorOptions c =
      RankOptions(o, absl::StrCat(kAcrossGroupPrefix, o.across_group), me, AtomicsRoute::kDevice);
  c.qps_per_peer = 2;
  absl::StatusOr<std::unique_ptr<Communicator>> comm = Communicator::Create(c);
  r.where = absl::StrCat("rank ", me, " of group ", EscapeForDisplay(o.across_group, 64),
                         " across nodes, from a CPU thread");
  if (!comm.ok()) {
    r.setup_error = comm.status().message().empty() ? comm.status().ToString()
                                                    : std::string(comm.status().message());
    r.setup_hint = kAcrossSetupHint;
    return r;
  }
  Communicator* self = comm->get();
  DescribeNic(*self, &r);
  const std::vector<GroupMember>& members = self->view().members;
  const std::string my_node = me < members.size() ? members[me].node_id : "";
  const std::string other_node = other < members.size() ? members[other].node_id : "";
  r.where = absl::StrCat("rank ", me, " of group ", EscapeForDisplay(o.across_group, 64),
                         " on node ", EscapeForDisplay(my_node, 64), ", to rank ", other,
                         " on node ", EscapeForDisplay(other_node, 64), ", from a CPU thread");
  if (other >= members.size() || members[other].same_node || other_node == my_node) {
    // RDMA between two ranks of one node loops back through its NIC: the
    // fabric this is run for would not be touched.
    r.setup_error = absl::StrCat("both ranks are on node ", EscapeForDisplay(my_node, 64),
                                 ": --across checks the path between two nodes");
    r.setup_hint =
        "run --rank 1 on the other node (its mcctl talks to that node's mooncaked); for this "
        "node alone, `mcctl selftest rdma` without --across";
    return r;
  }
  const absl::Duration patience = selftest::Patience();
  selftest::PeerWatch watch(self, other);
  selftest::PeerReader reader(self, other, patience, &watch);
  selftest::PeerAnswerer answerer(self, other, patience, &watch);
  const Ends e{self, other,
               [&reader](uint64_t offset, uint64_t length) { return reader.Read(offset, length); }};
  // Serves the other rank's reads until it hands over; one step saying so.
  auto answer = [&](const char* while_it) {
    const uint64_t before = answerer.served();
    const absl::Status a = answerer.ServeUntilHandOver();
    SelftestStep s{.name = "answer", .pass = a.ok()};
    s.detail = a.ok() ? absl::StrCat("sent rank ", other, " its ", answerer.served() - before,
                                     " reads back while it ", while_it)
                      : absl::StrCat("while rank ", other, " ", while_it, ": ", a.message());
    // Unavailable: this rank's own WRITE back failed (its queue pair),
    // unless the other rank is gone, which explains it better;
    // FailedPrecondition: this node's daemon went away.
    if (!a.ok()) {
      s.hint = absl::IsUnavailable(a)          ? kLinkHint
               : absl::IsFailedPrecondition(a) ? kDaemonGoneHint
                                               : kAcrossPeerHint;
      if (absl::IsUnavailable(a)) {
        if (const absl::Status gone = watch.GoneWithin(absl::Seconds(1)); !gone.ok()) {
          absl::StrAppend(&s.detail, "; meanwhile ", gone.message());
          s.hint = absl::IsFailedPrecondition(gone) ? kDaemonGoneHint : kAcrossPeerHint;
        }
      }
    }
    r.steps.push_back(std::move(s));
    return a.ok();
  };
  auto drive = [&] {
    StepRunner run(e, &r.steps, &reader, &watch);
    RunPeerSteps(e, &run);
    // Over a failed queue pair nothing reaches the other rank, and after a
    // read that got no answer this rank asks nothing more (the step that
    // read says why): either way the other learns of it when this process
    // ends and its session with it (the session's events).
    if (!run.stopped_by().empty() || reader.stopped()) return false;
    const absl::Status h = reader.HandOver();
    if (!h.ok()) {
      r.steps.push_back(
          SelftestStep{.name = "hand-over", .detail = std::string(h.message()), .hint = kLinkHint});
    }
    return h.ok();
  };
  if (me == 0) {
    if (drive() && answer("ran its steps")) {
      r.steps.push_back(BadRkey(e, 1));
      // The end: rank 1 waits for it, so its session outlives the bad key.
      if (absl::Status h = reader.HandOver(); !h.ok()) {
        r.steps.push_back(SelftestStep{
            .name = "hand-over", .detail = std::string(h.message()), .hint = kLinkHint});
      }
    }
  } else if (answer("ran its steps") && drive()) {
    const absl::Status end = answerer.ServeUntilHandOver();
    // A moment before the session (and its queue pairs) goes: a hand-over
    // whose acknowledgement was lost is sent again, and must still land.
    if (end.ok()) std::this_thread::sleep_for(std::chrono::seconds(1));
    if (!end.ok()) {
      r.steps.push_back(SelftestStep{
          .name = "end",
          .detail = absl::StrCat("while rank ", other, " tried the bad key: ", end.message()),
          .hint = absl::IsFailedPrecondition(end) ? kDaemonGoneHint : kAcrossPeerHint});
    }
  }
  return r;
}

}  // namespace

SelftestReport RunRdmaSelftest(const SelftestOptions& options) {
  return options.across_group.empty() ? RunLocal(options) : RunAcross(options);
}

std::string FormatSelftest(const SelftestReport& r) {
  if (!r.setup_error.empty()) {
    return absl::StrCat("selftest rdma",
                        r.nic.empty() ? "" : absl::StrCat(" on ", EscapeForDisplay(r.nic, 64)),
                        ": FAIL at setup: ", EscapeForDisplay(r.setup_error, 1024),
                        "\n  check: ", r.setup_hint, "\n");
  }
  std::string out = absl::StrCat("selftest rdma on ", EscapeForDisplay(r.nic, 64), " (",
                                 EscapeForDisplay(r.provider, 32), ", doorbells ",
                                 EscapeForDisplay(r.doorbell_mode, 32), "), ", r.where, "\n");
  TextTable t({"STEP", "RESULT", "LATENCY", "RATE", "DETAIL"});
  t.SetAlignment(2, TextTable::Align::kRight);
  t.SetAlignment(3, TextTable::Align::kRight);
  for (const SelftestStep& s : r.steps) {
    t.AddRow({s.name, s.pass ? "pass" : "FAIL",
              s.latency_us > 0 ? absl::StrFormat("%.1f us", s.latency_us) : "-",
              Number(s.rate, "op/s"), s.detail});
  }
  absl::StrAppend(&out, t.Render());
  for (const SelftestStep& s : r.steps) {
    if (!s.pass && !s.hint.empty()) absl::StrAppend(&out, "  ", s.name, ": check: ", s.hint, "\n");
  }
  absl::StrAppend(&out, r.ok() ? "selftest rdma: all steps passed\n"
                               : "selftest rdma: FAILED (docs/rdma.md, \"First run\")\n");
  return out;
}

std::string SelftestJson(const SelftestReport& r) {
  std::string out = absl::StrCat(
      "{\"ok\":", r.ok() ? "true" : "false", ",\"nic\":", EscapeForJson(r.nic),
      ",\"provider\":", EscapeForJson(r.provider),
      ",\"doorbell_mode\":", EscapeForJson(r.doorbell_mode), ",\"where\":", EscapeForJson(r.where));
  if (!r.setup_error.empty()) {
    absl::StrAppend(&out, ",\"setup_error\":", EscapeForJson(r.setup_error),
                    ",\"hint\":", EscapeForJson(r.setup_hint));
  }
  absl::StrAppend(&out, ",\"steps\":[");
  bool first = true;
  for (const SelftestStep& s : r.steps) {
    absl::StrAppend(
        &out, first ? "" : ",", "{\"name\":", EscapeForJson(s.name),
        ",\"pass\":", s.pass ? "true" : "false",
        absl::StrFormat(",\"latency_us\":%.3f,\"rate_per_s\":%.0f", s.latency_us, s.rate),
        ",\"detail\":", EscapeForJson(s.detail), ",\"hint\":", EscapeForJson(s.hint), "}");
    first = false;
  }
  absl::StrAppend(&out, "]}");
  return out;
}

}  // namespace mooncake::mcctl
