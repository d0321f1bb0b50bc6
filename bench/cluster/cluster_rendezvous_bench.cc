// cluster_rendezvous_bench: groups across nodes (issue 9 "Benchmark").
//
//   1. Rendezvous latency of a group whose ranks join on 1, 2 or 4 daemons
//      of one cluster (a real etcd, real mooncaked processes as nodes),
//      beside the same rank count on one standalone daemon (no etcd), all
//      in one run on the same machine.
//   2. Detection time of a lost node: a 2-rank group over two nodes, the
//      node of rank 1 SIGKILLed, time until rank 0's nextEvent returns LOST,
//      for each lease TTL asked for.
//
// Rank setup. Every rank is its own mooncake::Client (own connection, own
// session) driven by its own thread in this process; rank r joins on daemon
// r % D. Each round: the coordinator picks a release time T a little in the
// future, every rank sleeps until T and calls joinGroup on a fresh group
// name, and reports when its call returned. Rendezvous latency = last
// return - T. Every rank checks its view (world size, ranks in order, each
// member on the node it joined on, same-node handles byte for byte), so a
// wrong view cannot pass as fast. Leaves happen after every rank returned;
// the next round starts only when the group's keys are gone from etcd and
// the leave events are drained, so rounds never overlap.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench_support.h"
#include "etcd/etcd_client.h"
#include "etcd/etcd_options.h"
#include "etcd/etcd_watch.h"
#include "etcd_test_server.h"
#include "mooncake/client/client.h"

namespace mooncake::bench {
namespace {

using daemon::etcd::EtcdClient;
using daemon::etcd::testing::EtcdTestServer;
using daemon::etcd::testing::PickFreePort;

constexpr char kPrefix[] = "/mcbench";

std::string HandleFor(uint32_t rank) {
  return absl::StrFormat("bench-handle-rank-%06u-%s", rank, std::string(40, 'x'));
}

// ---------------------------------------------------------------- ranks

struct RoundResult {
  int64_t end = 0;  // CLOCK_MONOTONIC of the return
  absl::Status status;
};

// n ranks, each a Client on sockets[r % sockets.size()], each driven by a
// thread that waits for the coordinator's next command.
class RankSet {
 public:
  RankSet(std::vector<std::string> sockets, std::vector<std::string> node_ids, uint32_t n)
      : sockets_(std::move(sockets)), node_ids_(std::move(node_ids)), n_(n), results_(n) {}
  ~RankSet() {
    {
      std::lock_guard<std::mutex> l(mu_);
      cmd_ = Cmd::kQuit;
      ++generation_;
    }
    cv_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

  absl::Status Start() {
    std::vector<absl::Status> connected(n_);
    clients_.resize(n_);
    for (uint32_t r = 0; r < n_; ++r) {
      ClientOptions o;
      o.socket_path = sockets_[r % sockets_.size()];
      o.client_name = absl::StrCat("cluster_rendezvous_bench rank ", r, "/", n_);
      o.call_timeout = absl::Seconds(60);
      absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(o);
      if (!c.ok())
        return absl::Status(c.status().code(),
                            absl::StrCat("rank ", r, ": ", c.status().message()));
      clients_[r] = *std::move(c);
    }
    for (uint32_t r = 0; r < n_; ++r) threads_.emplace_back([this, r] { Loop(r); });
    return absl::OkStatus();
  }

  // Every rank joins `group` at `release`; waits for all. The results.
  std::vector<RoundResult> Join(const std::string& group, int64_t release) {
    return Run(Cmd::kJoin, group, release);
  }
  // Every rank leaves `group` and drains its events (quiet for 20 ms).
  std::vector<RoundResult> Leave(const std::string& group) { return Run(Cmd::kLeave, group, 0); }

 private:
  enum class Cmd { kNone, kJoin, kLeave, kQuit };

  std::vector<RoundResult> Run(Cmd cmd, const std::string& group, int64_t release) {
    {
      std::lock_guard<std::mutex> l(mu_);
      cmd_ = cmd;
      group_ = group;
      release_ = release;
      done_ = 0;
      ++generation_;
    }
    cv_.notify_all();
    std::unique_lock<std::mutex> l(mu_);
    done_cv_.wait(l, [&] { return done_ == n_; });
    return results_;
  }

  void Loop(uint32_t r) {
    Client& c = *clients_[r];
    const uint32_t d = static_cast<uint32_t>(sockets_.size());
    std::vector<std::string> expected;
    for (uint32_t p = 0; p < n_; ++p) expected.push_back(HandleFor(p));
    uint64_t seen = 0;
    for (;;) {
      Cmd cmd;
      std::string group;
      int64_t release;
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [&] { return generation_ != seen; });
        seen = generation_;
        cmd = cmd_;
        group = group_;
        release = release_;
      }
      if (cmd == Cmd::kQuit) return;
      RoundResult res;
      if (cmd == Cmd::kJoin) {
        SleepUntilNs(release);
        JoinOptions j;
        j.group = group;
        j.rank = r;
        j.world_size = n_;
        j.timeout = absl::Seconds(30);
        j.handle_kind = "bench";
        j.handle_data = expected[r];
        j.handle_size = j.handle_data.size();
        absl::StatusOr<GroupView> v = c.joinGroup(j);
        res.end = NowNs();
        res.status = v.status();
        if (v.ok()) res.status = Check(*v, r, d, expected);
      } else {
        res.status = c.leaveGroup(group, r);
        // The others' leaves arrive as events: drain them so they never
        // land in the next round.
        while (c.nextEvent(absl::Milliseconds(20))) {
        }
        res.end = NowNs();
      }
      {
        std::lock_guard<std::mutex> l(mu_);
        results_[r] = std::move(res);
        if (++done_ == n_) done_cv_.notify_all();
      }
    }
  }

  absl::Status Check(const GroupView& v, uint32_t r, uint32_t d,
                     const std::vector<std::string>& expected) const {
    if (v.members.size() != n_) {
      return absl::DataLossError(
          absl::StrCat("rank ", r, ": view of ", v.members.size(), " members, expected ", n_));
    }
    for (uint32_t p = 0; p < n_; ++p) {
      const GroupMember& m = v.members[p];
      if (m.rank != p)
        return absl::DataLossError(absl::StrCat("rank ", r, ": member ", p, " out of order"));
      const bool same = p % d == r % d;
      if (!node_ids_.empty() && m.node_id != node_ids_[p % d]) {
        return absl::DataLossError(absl::StrCat("rank ", r, ": rank ", p, " on node '", m.node_id,
                                                "', expected '", node_ids_[p % d], "'"));
      }
      if (same && m.handle_data != expected[p]) {
        return absl::DataLossError(absl::StrCat("rank ", r, ": wrong handle for rank ", p));
      }
      if (!same && m.handle_kind != "bench") {
        return absl::DataLossError(absl::StrCat("rank ", r, ": remote rank ", p,
                                                " has handle kind '", m.handle_kind, "'"));
      }
    }
    return absl::OkStatus();
  }

  const std::vector<std::string> sockets_;
  const std::vector<std::string> node_ids_;  // empty: a standalone daemon
  const uint32_t n_;
  std::vector<std::unique_ptr<Client>> clients_;
  std::vector<std::thread> threads_;

  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  uint64_t generation_ = 0;
  Cmd cmd_ = Cmd::kNone;
  std::string group_;
  int64_t release_ = 0;
  uint32_t done_ = 0;
  std::vector<RoundResult> results_;
};

// ---------------------------------------------------------------- options

struct Options {
  std::string mooncaked;
  std::string out;
  std::vector<uint32_t> ranks = {2, 8, 64, 256};
  std::vector<uint32_t> daemons = {1, 2, 4};  // cluster nodes a group spreads over
  std::vector<uint32_t> ttls = {2, 5};
  double iters_scale = 1.0;
  int lost_trials = 5;
  bool single = true;  // the standalone-daemon figure
  bool rendezvous = true;
  bool lost = true;
};

int ItersFor(uint32_t n, double scale) {
  const int base = n <= 8 ? 40 : n <= 64 ? 20 : 12;
  return std::max(3, static_cast<int>(base * scale));
}

struct Figure {
  std::string setup;  // "standalone daemon" / "cluster, D nodes"
  uint32_t nodes = 0;
  uint32_t ranks = 0;
  std::vector<double> last_ms, first_ms;
  // Cluster only: release -> the last rank's claim is in etcd (as a watch
  // of the bench's own sees it).
  std::vector<double> claimed_ms;
  double settle_ms = 0;  // mean time for the leaves to clear between rounds
  // CPU ms per round, release -> last return (-1: not measured).
  double etcd_cpu = -1, daemons_cpu = -1, bench_cpu = -1;
};

// Which processes' CPU a round is billed to.
struct CpuTargets {
  pid_t etcd = -1;
  std::vector<pid_t> daemons;
};

// utime + stime of `pid` (0: this process), ms; -1 when unreadable.
double ProcessCpuMs(pid_t pid) {
  std::ifstream f(pid == 0 ? std::string("/proc/self/stat") : absl::StrCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos) return -1;
  std::vector<std::string> fields = absl::StrSplit(stat.substr(paren + 2), ' ');
  // fields[0] is field 3 (state): utime and stime are fields 14 and 15.
  if (fields.size() < 13) return -1;
  double ticks = std::stod(fields[11]) + std::stod(fields[12]);
  return ticks * 1000.0 / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

// The etcd this process started (its child named "etcd"), or -1.
pid_t ChildNamed(const std::string& comm) {
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    pid_t pid = 0;
    if (!absl::SimpleAtoi(e.path().filename().string(), &pid)) continue;
    std::ifstream f(e.path() / "stat");
    std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const size_t open = stat.find('('), close = stat.rfind(')');
    if (open == std::string::npos || close == std::string::npos) continue;
    std::vector<std::string> fields = absl::StrSplit(stat.substr(close + 2), ' ');
    if (fields.size() > 1 && stat.substr(open + 1, close - open - 1) == comm &&
        fields[1] == std::to_string(::getpid())) {
      return pid;
    }
  }
  return -1;
}

absl::StatusOr<std::unique_ptr<EtcdClient>> EtcdAt(const std::string& url) {
  absl::StatusOr<daemon::etcd::EtcdOptions> o = daemon::etcd::ParseEtcdEndpoints(url, {});
  if (!o.ok()) return o.status();
  return EtcdClient::Connect(*o);
}

// Waits until `count` nodes are registered under `prefix`/nodes/.
absl::Status AwaitNodes(EtcdClient& etcd, const std::string& prefix, size_t count) {
  const int64_t deadline = NowNs() + 20LL * 1000000000;
  size_t have = 0;
  while (NowNs() < deadline) {
    absl::StatusOr<daemon::etcd::RangeResult> r = etcd.GetPrefix(prefix + "/nodes/");
    if (r.ok() && (have = r->kvs.size()) >= count) return absl::OkStatus();
    ::usleep(10000);
  }
  return absl::DeadlineExceededError(
      absl::StrCat(have, " of ", count, " nodes registered under ", prefix, " in 20 s"));
}

// Waits until no rank key of `group` is left in etcd.
absl::Status AwaitGroupGone(EtcdClient& etcd, const std::string& prefix, const std::string& group) {
  const std::string key = absl::StrCat(prefix, "/groups/", ::getuid(), "/", group, "/ranks/");
  const int64_t deadline = NowNs() + 20LL * 1000000000;
  while (NowNs() < deadline) {
    absl::StatusOr<daemon::etcd::RangeResult> r = etcd.GetPrefix(key);
    if (r.ok() && r->kvs.empty()) return absl::OkStatus();
    ::usleep(2000);
  }
  return absl::DeadlineExceededError(
      absl::StrCat("group ", group, ": ranks still in etcd after 20 s"));
}

absl::StatusOr<Figure> MeasureRendezvous(const Options& o, const std::string& setup,
                                         const std::vector<std::string>& sockets,
                                         const std::vector<std::string>& node_ids, uint32_t n,
                                         EtcdClient* etcd, const CpuTargets& cpu) {
  RankSet set(sockets, node_ids, n);
  if (absl::Status s = set.Start(); !s.ok()) return s;
  Figure f;
  f.setup = setup;
  f.nodes = static_cast<uint32_t>(sockets.size());
  f.ranks = n;
  const int iters = ItersFor(n, o.iters_scale);
  const int warmup = 2;
  // Every thread must be asleep in SleepUntilNs before T: 256 threads on
  // 2 cores need a few ms to get there.
  const int64_t lead_ns = (5 + n / 8) * 1000000LL;
  static int round = 0;
  double settle = 0;
  double etcd_cpu = 0, daemons_cpu = 0, bench_cpu = 0;
  auto daemons_now = [&] {
    double sum = 0;
    for (pid_t p : cpu.daemons) sum += ProcessCpuMs(p);
    return sum;
  };
  for (int i = 0; i < warmup + iters; ++i) {
    const std::string group = absl::StrCat("rdv", n, "x", sockets.size(), "-", ++round);
    // When the n-th rank's claim (a create of its key) is seen in etcd.
    std::atomic<int64_t> claimed_at{0};
    std::unique_ptr<daemon::etcd::Watcher> watch;
    if (etcd != nullptr) {
      auto created = std::make_shared<uint32_t>(0);
      absl::StatusOr<std::unique_ptr<daemon::etcd::Watcher>> w = daemon::etcd::Watcher::Start(
          etcd, absl::StrCat(kPrefix, "/groups/", ::getuid(), "/", group, "/ranks/"), 0,
          [created, n, &claimed_at](const std::vector<daemon::etcd::WatchEvent>& events) {
            for (const daemon::etcd::WatchEvent& e : events) {
              if (e.type == daemon::etcd::WatchEvent::Type::kPut && e.kv.version == 1 &&
                  ++*created == n) {
                claimed_at = NowNs();
              }
            }
          },
          [](const absl::Status&) {});
      if (!w.ok()) return w.status();
      watch = *std::move(w);
    }
    const int64_t release = NowNs() + lead_ns;
    const double e0 = cpu.etcd > 0 ? ProcessCpuMs(cpu.etcd) : 0, d0 = daemons_now(),
                 b0 = ProcessCpuMs(0);
    std::vector<RoundResult> res = set.Join(group, release);
    const double e1 = cpu.etcd > 0 ? ProcessCpuMs(cpu.etcd) : 0, d1 = daemons_now(),
                 b1 = ProcessCpuMs(0);
    int64_t last = 0, first = INT64_MAX;
    for (uint32_t r = 0; r < n; ++r) {
      if (!res[r].status.ok()) {
        return absl::Status(res[r].status.code(),
                            absl::StrCat(setup, ", ", n, " ranks, round ", i, ", rank ", r, ": ",
                                         res[r].status.message()));
      }
      last = std::max(last, res[r].end);
      first = std::min(first, res[r].end);
    }
    if (watch) {
      // The watch may trail the joins a little.
      for (int w = 0; w < 1000 && claimed_at == 0; ++w) ::usleep(1000);
      watch->Cancel();
    }
    const int64_t s0 = NowNs();
    std::vector<RoundResult> left = set.Leave(group);
    for (uint32_t r = 0; r < n; ++r) {
      if (!left[r].status.ok()) {
        return absl::Status(left[r].status.code(), absl::StrCat(setup, ", leave of rank ", r, ": ",
                                                                left[r].status.message()));
      }
    }
    if (etcd != nullptr) {
      if (absl::Status s = AwaitGroupGone(*etcd, kPrefix, group); !s.ok()) return s;
    }
    if (i >= warmup) {
      f.last_ms.push_back(Ms(last - release));
      f.first_ms.push_back(Ms(first - release));
      if (claimed_at != 0) f.claimed_ms.push_back(Ms(claimed_at - release));
      settle += Ms(NowNs() - s0);
      etcd_cpu += e1 - e0;
      daemons_cpu += d1 - d0;
      bench_cpu += b1 - b0;
    }
  }
  f.settle_ms = settle / iters;
  if (cpu.etcd > 0) f.etcd_cpu = etcd_cpu / iters;
  f.daemons_cpu = daemons_cpu / iters;
  f.bench_cpu = bench_cpu / iters;
  Stats s = Summarize(f.last_ms);
  std::cerr << absl::StrFormat("  %-22s %3u ranks: p50 %8.2f ms  p99 %8.2f ms  (%d rounds)\n",
                               setup, n, s.p50, s.p99, iters);
  return f;
}

// ---------------------------------------------------------------- lost node

struct LostFigure {
  uint32_t ttl = 0;
  std::vector<double> ms;
};

absl::StatusOr<LostFigure> MeasureLost(const Options& o, const std::string& tmp,
                                       const std::string& etcd_url, uint32_t ttl) {
  const std::string dir = absl::StrCat(tmp, "/lost-ttl", ttl);
  std::filesystem::create_directories(dir);
  const std::string prefix = absl::StrCat("/mclost", ttl);
  const std::string conf = dir + "/cluster.conf";
  std::ofstream(conf) << "etcd_lease_ttl_s = " << ttl << "\netcd_prefix = " << prefix << "\n";
  auto node = [&](const std::string& id) {
    std::filesystem::create_directories(dir + "/" + id);
    return BenchDaemon::Start(o.mooncaked, dir + "/" + id, id,
                              {"--config", conf, "--etcd", etcd_url, "--peer-listen",
                               absl::StrCat("127.0.0.1:", PickFreePort())});
  };
  absl::StatusOr<std::unique_ptr<EtcdClient>> etcd = EtcdAt(etcd_url);
  if (!etcd.ok()) return etcd.status();
  absl::StatusOr<std::unique_ptr<BenchDaemon>> survivor = node("survivor");
  if (!survivor.ok()) return survivor.status();
  LostFigure f;
  f.ttl = ttl;
  std::mt19937 rng(ttl);
  for (int t = 0; t < o.lost_trials; ++t) {
    absl::StatusOr<std::unique_ptr<BenchDaemon>> victim = node(absl::StrCat("victim", t));
    if (!victim.ok()) return victim.status();
    // The survivor and this victim (earlier victims' keys went with their
    // leases before their LOST came).
    if (absl::Status s = AwaitNodes(**etcd, prefix, 2); !s.ok()) return s;
    ClientOptions co;
    co.socket_path = (*survivor)->socket();
    co.client_name = "lost rank 0";
    absl::StatusOr<std::unique_ptr<Client>> c0 = Client::Connect(co);
    co.socket_path = (*victim)->socket();
    co.client_name = "lost rank 1";
    absl::StatusOr<std::unique_ptr<Client>> c1 = Client::Connect(co);
    if (!c0.ok()) return c0.status();
    if (!c1.ok()) return c1.status();
    const std::string group = absl::StrCat("lost", ttl, "-", t);
    auto join = [&](Client& c, uint32_t r) {
      JoinOptions j;
      j.group = group;
      j.rank = r;
      j.world_size = 2;
      j.timeout = absl::Seconds(30);
      j.handle_kind = "bench";
      return c.joinGroup(j).status();
    };
    absl::Status s1;
    std::thread other([&] { s1 = join(**c1, 1); });
    absl::Status s0 = join(**c0, 0);
    other.join();
    if (!s0.ok()) return s0;
    if (!s1.ok()) return s1;
    // The kill lands anywhere in the keep-alive period (TTL/3).
    std::uniform_int_distribution<int> phase(0, static_cast<int>(ttl * 1000 / 3));
    ::usleep(static_cast<useconds_t>(phase(rng)) * 1000);
    const int64_t t0 = NowNs();
    (*victim)->Stop(SIGKILL);
    int64_t at = 0;
    const int64_t deadline = t0 + (ttl + 10) * 1000000000LL;
    while (at == 0 && NowNs() < deadline) {
      std::optional<SessionEvent> ev = (*c0)->nextEvent(absl::Milliseconds(100));
      if (ev && ev->kind == SessionEvent::Kind::kLost && ev->group == group && ev->rank == 1) {
        at = NowNs();
      }
    }
    if (at == 0) {
      return absl::DeadlineExceededError(
          absl::StrCat("TTL ", ttl, " s, trial ", t, ": no LOST within TTL + 10 s"));
    }
    f.ms.push_back(Ms(at - t0));
    std::cerr << absl::StrFormat("  lease TTL %u s, trial %d: LOST after %.0f ms\n", ttl, t,
                                 f.ms.back());
    (void)(*c0)->leaveGroup(group, 0);
  }
  return f;
}

// ---------------------------------------------------------------- main

absl::StatusOr<std::vector<uint32_t>> List(absl::string_view v) {
  std::vector<uint32_t> out;
  for (absl::string_view x : absl::StrSplit(v, ',')) {
    uint32_t n = 0;
    if (!absl::SimpleAtoi(x, &n) || n == 0) {
      return absl::InvalidArgumentError(absl::StrCat("'", x, "' is not a positive number"));
    }
    out.push_back(n);
  }
  return out;
}

absl::Status ParseArgs(int argc, char** argv, Options* o) {
  o->mooncaked = std::filesystem::path(SelfExe()).parent_path().string() + "/mooncaked";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") return absl::CancelledError("help");
    if (a == "--no-single") {
      o->single = false;
      continue;
    }
    if (a == "--no-rendezvous") {
      o->rendezvous = false;
      continue;
    }
    if (a == "--no-lost") {
      o->lost = false;
      continue;
    }
    if (i + 1 >= argc) return absl::InvalidArgumentError(absl::StrCat(a, " needs a value"));
    const std::string v = argv[++i];
    if (a == "--mooncaked") {
      o->mooncaked = v;
    } else if (a == "--out") {
      o->out = v;
    } else if (a == "--iters-scale") {
      if (!absl::SimpleAtod(v, &o->iters_scale) || o->iters_scale <= 0) {
        return absl::InvalidArgumentError("--iters-scale takes a positive number");
      }
    } else if (a == "--lost-trials") {
      if (!absl::SimpleAtoi(v, &o->lost_trials) || o->lost_trials < 1) {
        return absl::InvalidArgumentError("--lost-trials takes a positive number");
      }
    } else if (a == "--ranks" || a == "--daemons" || a == "--ttls") {
      absl::StatusOr<std::vector<uint32_t>> l = List(v);
      if (!l.ok()) return absl::InvalidArgumentError(absl::StrCat(a, ": ", l.status().message()));
      if (a == "--ranks") o->ranks = *l;
      if (a == "--daemons") o->daemons = *l;
      if (a == "--ttls") o->ttls = *l;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown argument '", a, "'"));
    }
  }
  for (uint32_t d : o->daemons) {
    if (d > 16) return absl::InvalidArgumentError("--daemons: at most 16");
  }
  return absl::OkStatus();
}

constexpr char kUsage[] =
    "usage: cluster_rendezvous_bench [--mooncaked PATH] [--out FILE] [--ranks 2,8,64,256]\n"
    "                                [--daemons 1,2,4] [--ttls 2,5] [--iters-scale F]\n"
    "                                [--lost-trials N] [--no-single] [--no-rendezvous]\n"
    "                                [--no-lost]\n"
    "  Starts a private etcd ($MOONCAKE_ETCD_BIN, else /usr/bin/etcd) and mooncaked\n"
    "  processes (default: next to this binary). Rendezvous: rank r joins on node r % D of\n"
    "  the cluster (lease TTL 5 s), beside a standalone daemon without etcd. Lost node:\n"
    "  for each TTL, a 2-rank group over two nodes, rank 1's node SIGKILLed, time to LOST.\n";

int Main(int argc, char** argv) {
  Options o;
  if (absl::Status s = ParseArgs(argc, argv, &o); !s.ok()) {
    if (s.code() != absl::StatusCode::kCancelled) {
      std::cerr << "cluster_rendezvous_bench: " << s.message() << "\n";
    }
    std::cerr << kUsage;
    return s.code() == absl::StatusCode::kCancelled ? 0 : 64;
  }
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &rl);
  }
  char tmpl[] = "/tmp/mc-clusterbench-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) {
    std::perror("mkdtemp");
    return 1;
  }
  const std::string tmp = tmpl;
  std::vector<std::string> errors;
  std::vector<Figure> figures;
  std::vector<LostFigure> lost;
  std::string leftover;
  uint32_t max_nodes = 0;
  for (uint32_t d : o.daemons) max_nodes = std::max(max_nodes, d);
  {
    EtcdTestServer etcd;
    if (absl::Status s = etcd.Start(); !s.ok()) {
      std::cerr << "cluster_rendezvous_bench: etcd: " << s.message() << "\n";
      return 1;
    }
    std::cerr << "cluster_rendezvous_bench: etcd at " << etcd.client_url() << "\n";
    if (o.rendezvous) {
      std::unique_ptr<BenchDaemon> single;
      if (o.single) {
        std::filesystem::create_directories(tmp + "/single");
        absl::StatusOr<std::unique_ptr<BenchDaemon>> d =
            BenchDaemon::Start(o.mooncaked, tmp + "/single", "single");
        if (!d.ok()) {
          errors.push_back(std::string(d.status().message()));
        } else {
          single = *std::move(d);
        }
      }
      // The cluster: max_nodes daemons, lease TTL 5 s (the default).
      const std::string conf = tmp + "/cluster.conf";
      std::ofstream(conf) << "etcd_lease_ttl_s = 5\netcd_prefix = " << kPrefix << "\n";
      std::vector<std::unique_ptr<BenchDaemon>> nodes;
      std::vector<std::string> sockets, ids;
      for (uint32_t i = 0; i < max_nodes && errors.empty(); ++i) {
        const std::string id = absl::StrCat("node", i);
        std::filesystem::create_directories(tmp + "/" + id);
        absl::StatusOr<std::unique_ptr<BenchDaemon>> d =
            BenchDaemon::Start(o.mooncaked, tmp + "/" + id, id,
                               {"--config", conf, "--etcd", etcd.client_url(), "--peer-listen",
                                absl::StrCat("127.0.0.1:", PickFreePort())});
        if (!d.ok()) {
          errors.push_back(std::string(d.status().message()));
          break;
        }
        sockets.push_back((*d)->socket());
        ids.push_back(id);
        nodes.push_back(*std::move(d));
      }
      absl::StatusOr<std::unique_ptr<EtcdClient>> client = EtcdAt(etcd.client_url());
      if (!client.ok()) errors.push_back(std::string(client.status().message()));
      if (errors.empty()) {
        if (absl::Status s = AwaitNodes(**client, kPrefix, max_nodes); !s.ok()) {
          errors.push_back(std::string(s.message()));
        }
      }
      CpuTargets cluster_cpu;
      cluster_cpu.etcd = ChildNamed("etcd");
      for (const auto& d : nodes) cluster_cpu.daemons.push_back(d->pid());
      for (uint32_t n : o.ranks) {
        if (!errors.empty()) break;
        if (single) {
          absl::StatusOr<Figure> f =
              MeasureRendezvous(o, "standalone daemon", {single->socket()}, {}, n, nullptr,
                                CpuTargets{-1, {single->pid()}});
          if (f.ok()) {
            figures.push_back(*std::move(f));
          } else {
            errors.push_back(std::string(f.status().message()));
          }
        }
        for (uint32_t d : o.daemons) {
          std::vector<std::string> s(sockets.begin(), sockets.begin() + d);
          std::vector<std::string> id(ids.begin(), ids.begin() + d);
          absl::StatusOr<Figure> f =
              MeasureRendezvous(o, absl::StrCat("cluster, ", d, d == 1 ? " node" : " nodes"), s, id,
                                n, client->get(), cluster_cpu);
          if (f.ok()) {
            figures.push_back(*std::move(f));
          } else {
            errors.push_back(std::string(f.status().message()));
          }
        }
      }
      // What the rounds left in etcd (every group's ranks were withdrawn).
      if (client.ok()) {
        absl::StatusOr<daemon::etcd::RangeResult> left =
            (*client)->GetPrefix(absl::StrCat(kPrefix, "/groups/"));
        absl::StatusOr<daemon::etcd::EtcdStatus> st = (*client)->Status();
        if (left.ok()) {
          size_t meta = 0;
          for (const auto& kv : left->kvs) meta += absl::EndsWith(kv.key, "/meta");
          leftover = absl::StrCat(left->kvs.size(), " keys under ", kPrefix, "/groups/ (", meta,
                                  " of them groups' meta keys), store revision ", left->revision);
        }
        if (st.ok()) absl::StrAppend(&leftover, ", etcd db ", st->db_size / 1024, " KiB");
      }
    }
    if (o.lost && errors.empty()) {
      for (uint32_t ttl : o.ttls) {
        absl::StatusOr<LostFigure> f = MeasureLost(o, tmp, etcd.client_url(), ttl);
        if (f.ok()) {
          lost.push_back(*std::move(f));
        } else {
          errors.push_back(std::string(f.status().message()));
        }
      }
    }
  }

  std::ostringstream md;
  auto fmt = [](double v) { return absl::StrFormat("%.2f", v); };
  if (!figures.empty()) {
    md << "### Rendezvous latency (release of all ranks -> last rank's joinGroup returns)\n\n"
       << "| ranks | setup | rounds | p50 ms | p99 ms | min ms | max ms | release->all claims in "
          "etcd p50 ms | release->first return p50 ms | CPU ms/round: etcd | daemons | ranks "
          "(bench) | leaves settled, mean ms |\n"
          "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
    auto cpu = [](double v) { return v < 0 ? std::string("-") : absl::StrFormat("%.1f", v); };
    for (const Figure& f : figures) {
      Stats s = Summarize(f.last_ms), fi = Summarize(f.first_ms), cl = Summarize(f.claimed_ms);
      md << "| " << f.ranks << " | " << f.setup << " | " << s.n << " | " << fmt(s.p50) << " | "
         << fmt(s.p99) << " | " << fmt(s.min) << " | " << fmt(s.max) << " | "
         << (f.claimed_ms.empty() ? std::string("-") : fmt(cl.p50)) << " | " << fmt(fi.p50) << " | "
         << cpu(f.etcd_cpu) << " | " << cpu(f.daemons_cpu) << " | " << cpu(f.bench_cpu) << " | "
         << absl::StrFormat("%.0f", f.settle_ms) << " |\n";
    }
    for (const Figure& f : figures) {
      if (f.ranks != 256 || f.nodes != 4 || f.setup == "standalone daemon") continue;
      const double p50 = Summarize(f.last_ms).p50;
      md << "\nTarget: 256 ranks over 4 nodes <= 200 ms p50: measured " << fmt(p50) << " ms, "
         << (p50 <= 200 ? "PASS" : "MISS") << "\n";
    }
  }
  if (!lost.empty()) {
    md << "\n### Lost node (SIGKILL of rank 1's daemon -> rank 0's nextEvent returns LOST)\n\n"
       << "| lease TTL s | trials | p50 ms | p99 ms | min ms | max ms | target <= TTL + 1 s |\n"
          "|---:|---:|---:|---:|---:|---:|---|\n";
    for (const LostFigure& f : lost) {
      Stats s = Summarize(f.ms);
      md << "| " << f.ttl << " | " << s.n << " | " << absl::StrFormat("%.0f", s.p50) << " | "
         << absl::StrFormat("%.0f", s.p99) << " | " << absl::StrFormat("%.0f", s.min) << " | "
         << absl::StrFormat("%.0f", s.max) << " | "
         << (s.max <= (f.ttl + 1) * 1000.0 ? "PASS (max)" : "MISS") << " |\n";
    }
  }
  if (!leftover.empty()) md << "\nLeft in etcd after the rendezvous rounds: " << leftover << "\n";
  std::ifstream la("/proc/loadavg");
  std::string l1, l5, l15;
  la >> l1 >> l5 >> l15;
  md << "\nload average at the end: " << l1 << " " << l5 << " " << l15 << " ("
     << std::thread::hardware_concurrency() << " cores)\n";
  for (const std::string& e : errors) md << "\nERROR: " << e << "\n";
  std::cout << md.str();
  if (!o.out.empty()) {
    std::ofstream f(o.out);
    f << md.str();
  }
  std::error_code ec;
  std::filesystem::remove_all(tmp, ec);
  return errors.empty() ? 0 : 1;
}

}  // namespace
}  // namespace mooncake::bench

int main(int argc, char** argv) { return mooncake::bench::Main(argc, argv); }
