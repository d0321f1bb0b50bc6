// rendezvous_bench: group rendezvous latency through mooncaked versus the
// file-in-a-temp-dir rendezvous, the whole mooncake::Communicator::Create
// (connect, allocate, join, map every peer, verify, ready) on the join route
// and on the upstream export/import route, the LOST-event latency for a
// SIGKILLed member, and the `mcctl status` round trip. CPU only.
//
// Rank setup. Every rank is its own mooncake::Client (own connection, own
// session), so the daemon sees exactly what it sees with real ranks. By
// default each rank is driven by its own thread in this process: that is
// the only way to put 256 ranks on a 2-core machine without 256 process
// start-ups per rank count. --processes adds the same measurement with one
// process per rank for 2 and 8 ranks (this binary re-executed in --worker
// mode, so no process forks after gRPC started), which shows what the
// thread harness costs or hides, and measures LOST latency by SIGKILLing a
// worker.
//
// Both harnesses drive every rank through the same line protocol on a
// socketpair (RunWorker), so threads and processes are timed identically:
// the coordinator sends "join at T" (T = CLOCK_MONOTONIC, a little in the
// future), every rank sleeps until T and calls joinGroup (or the file
// rendezvous), and reports when its call started and returned. Rendezvous
// latency = last return - T; per-rank latency = return - own call start.
// Leaves happen only after every rank returned, so they never compete with
// the measured joins, and the membership events they cause are drained
// before the next iteration.
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "bench_support.h"
#include "mooncake/client/client.h"
#include "mooncake/client/communicator.h"
#include "mooncake/common/fd_passing.h"
#include "mooncake/common/status.h"
#include "mooncake/v1/admin.grpc.pb.h"
#include "mooncake/v1/local.pb.h"

extern char** environ;

namespace mooncake::bench {
namespace {

// ---------------------------------------------------------------- worker

struct WorkerConfig {
  std::string socket;
  uint32_t rank = 0;
  uint32_t world = 0;
  std::string file_dir;  // parent of the file-rendezvous group folders
  int poll_us = 1000;
};

// What every rank publishes: small, rank-specific, checked by every peer so
// a rendezvous that returns the wrong handles cannot pass as fast.
std::string HandleFor(uint32_t rank) {
  return absl::StrFormat("bench-handle-rank-%06u-%s", rank, std::string(40, 'x'));
}

absl::Status FileRendezvous(const WorkerConfig& cfg, const std::string& group) {
  const std::string dir = cfg.file_dir + "/" + group;
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::InternalError(absl::StrCat("mkdir(", dir, "): ", std::strerror(errno)));
  }
  const std::string mine = HandleFor(cfg.rank);
  const std::string tmp = absl::StrCat(dir, "/.", cfg.rank, ".tmp");
  const std::string final_path = absl::StrCat(dir, "/", cfg.rank);
  {
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return absl::InternalError(absl::StrCat("open(", tmp, "): ", std::strerror(errno)));
    ssize_t n = ::write(fd, mine.data(), mine.size());
    ::close(fd);
    if (n != static_cast<ssize_t>(mine.size())) {
      return absl::InternalError(absl::StrCat("write(", tmp, ") short"));
    }
  }
  // rename() makes the handle appear complete or not at all to the pollers.
  if (::rename(tmp.c_str(), final_path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("rename(", tmp, "): ", std::strerror(errno)));
  }
  std::vector<bool> seen(cfg.world, false);
  uint32_t have = 0;
  int64_t deadline = NowNs() + 30LL * 1000000000;
  char buf[256];
  for (;;) {
    for (uint32_t r = 0; r < cfg.world; ++r) {
      if (seen[r]) continue;
      std::string path = absl::StrCat(dir, "/", r);
      int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) continue;  // not published yet
      ssize_t n = ::read(fd, buf, sizeof(buf));
      ::close(fd);
      if (n < 0 || std::string(buf, static_cast<size_t>(n)) != HandleFor(r)) {
        return absl::DataLossError(absl::StrCat("file rendezvous: wrong handle in ", path));
      }
      seen[r] = true;
      ++have;
    }
    if (have == cfg.world) return absl::OkStatus();
    if (NowNs() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("file rendezvous ", group, ": ", have, " of ", cfg.world, " in 30 s"));
    }
    ::usleep(static_cast<useconds_t>(cfg.poll_us));
  }
}

absl::Status DaemonRendezvous(Client& client, const WorkerConfig& cfg,
                              const std::vector<std::string>& expected, const std::string& group) {
  JoinOptions join;
  join.group = group;
  join.rank = cfg.rank;
  join.world_size = cfg.world;
  join.handle_kind = "bench";
  join.handle_data = HandleFor(cfg.rank);
  join.handle_size = join.handle_data.size();
  absl::StatusOr<GroupView> view = client.joinGroup(join);
  if (!view.ok()) return view.status();
  if (view->members.size() != cfg.world) {
    return absl::DataLossError(absl::StrCat("group ", group, ": view has ", view->members.size(),
                                            " members, expected ", cfg.world));
  }
  for (uint32_t r = 0; r < cfg.world; ++r) {
    if (view->members[r].rank != r || view->members[r].handle_data != expected[r]) {
      return absl::DataLossError(absl::StrCat("group ", group, ": wrong handle for rank ", r));
    }
  }
  return absl::OkStatus();
}

// One whole Communicator::Create on the host platform; the communicator is
// kept (and the group held) until the coordinator's leave command.
absl::Status CommunicatorRendezvous(const WorkerConfig& cfg, const std::string& group,
                                    HandleRoute route,
                                    std::map<std::string, std::unique_ptr<Communicator>>* comms) {
  CommunicatorOptions o;
  o.socket_path = cfg.socket;
  o.group = group;
  o.rank = cfg.rank;
  o.world_size = cfg.world;
  o.buffer_bytes = 64 << 10;
  o.platform = Platform::kHost;
  o.handle_route = route;
  o.timeout = absl::Seconds(60);
  absl::StatusOr<std::unique_ptr<Communicator>> c = Communicator::Create(o);
  if (!c.ok()) return c.status();
  if (!(*c)->transport().allPeersAccessible()) {
    return absl::DataLossError(absl::StrCat("group ", group, ": not every peer is mapped"));
  }
  (*comms)[group] = *std::move(c);
  return absl::OkStatus();
}

// Drains membership events until `quiet` passes without one, so the events
// caused by this iteration's leaves are delivered before the next one.
int DrainEvents(Client& client, absl::Duration quiet, absl::Duration max) {
  int count = 0;
  int64_t deadline = NowNs() + absl::ToInt64Nanoseconds(max);
  while (NowNs() < deadline) {
    if (!client.nextEvent(quiet)) break;
    ++count;
  }
  return count;
}

// One rank's command loop (see the file comment). Returns the exit code.
int RunWorker(int fd, const WorkerConfig& cfg) {
  ClientOptions opts;
  opts.socket_path = cfg.socket;
  opts.client_name = absl::StrCat("rendezvous_bench rank ", cfg.rank, "/", cfg.world);
  opts.call_timeout = absl::Seconds(30);
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(opts);
  if (!client.ok()) {
    WriteLine(fd, absl::StrCat("H 0 ", OneLine(std::string(client.status().ToString()))));
    return 1;
  }
  // Built once: formatting 256 handles per join would bill the harness's
  // own work to the rendezvous.
  std::vector<std::string> expected;
  for (uint32_t r = 0; r < cfg.world; ++r) expected.push_back(HandleFor(r));
  WriteLine(fd, "H 1 connected");
  std::map<std::string, std::unique_ptr<Communicator>> comms;
  LineReader in(fd);
  for (;;) {
    std::optional<std::string> line = in.Read(600 * 1000);
    if (!line) return 2;  // coordinator gone
    std::vector<std::string> f = absl::StrSplit(*line, ' ');
    if (f.empty() || f[0] == "Q") return 0;
    if (f[0] == "J" && f.size() == 4) {
      // J <group> <release_ns> <d|f>
      const std::string& group = f[1];
      int64_t release = std::stoll(f[2]);
      SleepUntilNs(release);
      int64_t start = NowNs();
      absl::Status s =
          f[3] == "f"   ? FileRendezvous(cfg, group)
          : f[3] == "c" ? CommunicatorRendezvous(cfg, group, HandleRoute::kJoin, &comms)
          : f[3] == "e" ? CommunicatorRendezvous(cfg, group, HandleRoute::kExportImport, &comms)
                        : DaemonRendezvous(**client, cfg, expected, group);
      int64_t end = NowNs();
      WriteLine(fd, absl::StrCat("R ", start, " ", end, " ", s.ok() ? 1 : 0, " ",
                                 OneLine(std::string(s.ToString()))));
    } else if (f[0] == "L" && f.size() == 3) {
      // L <group> <d|f>
      absl::Status s;
      int events = 0;
      if (f[2] == "c" || f[2] == "e") {
        comms.erase(f[1]);  // leaves the group, unmaps, frees, closes its session
      } else if (f[2] == "f") {
        std::string path = absl::StrCat(cfg.file_dir, "/", f[1], "/", cfg.rank);
        if (::unlink(path.c_str()) != 0) {
          s = absl::InternalError(absl::StrCat("unlink(", path, "): ", std::strerror(errno)));
        }
      } else {
        s = (*client)->leaveGroup(f[1], cfg.rank);
        if (s.ok()) events = DrainEvents(**client, absl::Milliseconds(5), absl::Seconds(3));
      }
      WriteLine(fd, absl::StrCat("D ", events, " ", s.ok() ? 1 : 0, " ",
                                 OneLine(std::string(s.ToString()))));
    } else if (f[0] == "W" && f.size() == 2) {
      // W <group>: wait for a LOST event about a member of <group>.
      int64_t deadline = NowNs() + 5LL * 1000000000;
      bool got = false;
      int64_t at = 0;
      uint32_t lost_rank = 0;
      while (!got && NowNs() < deadline) {
        std::optional<SessionEvent> ev = (*client)->nextEvent(absl::Milliseconds(100));
        if (ev && ev->kind == SessionEvent::Kind::kLost && ev->group == f[1]) {
          at = NowNs();
          lost_rank = ev->rank;
          got = true;
        }
      }
      WriteLine(fd, absl::StrCat("W ", got ? 1 : 0, " ", at, " ", lost_rank));
    } else {
      WriteLine(fd, absl::StrCat("E unknown command '", OneLine(*line), "'"));
    }
  }
}

// ---------------------------------------------------------------- rank sets

struct Options {
  std::string mooncaked;
  std::string mcctl;
  std::string socket;
  std::string out;
  std::string file_dir;
  std::vector<uint32_t> ranks = {2, 8, 64, 256};
  bool processes = false;
  double iters_scale = 1.0;
  int poll_us = 1000;
  int lost_trials = 10;
  bool run_daemon = true;  // --methods
  bool run_file = true;
  bool run_comm = false;         // Communicator::Create, join route
  bool run_comm_export = false;  // Communicator::Create, export/import route
  // perf record --control fifo: the join phase alone is profiled when set
  // (perf record -D -1 --control fifo:CTL ... -- rendezvous_bench --perf-ctl CTL).
  std::string perf_ctl;
  bool deadlock_detection = true;  // absl::Mutex's, in this process and its workers
  double idle_s = 1.0;             // idle window for the session-polling cost
};

// n ranks, each a Client driven by a thread or a worker process.
class RankSet {
 public:
  static absl::StatusOr<std::unique_ptr<RankSet>> Start(const Options& o, const std::string& socket,
                                                        uint32_t n, bool processes) {
    auto set = std::unique_ptr<RankSet>(new RankSet());
    set->processes_ = processes;
    set->killed_.assign(n, false);
    for (uint32_t r = 0; r < n; ++r) {
      int sv[2];
      if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "socketpair for rank ", r, ": ", std::strerror(errno), " (raise `ulimit -n`)"));
      }
      set->fds_.push_back(sv[0]);
      set->readers_.emplace_back(sv[0]);
      WorkerConfig cfg{socket, r, n, o.file_dir, o.poll_us};
      if (processes) {
        SpawnIo io;
        io.child_fd = sv[1];
        std::vector<std::string> argv = {SelfExe(),  "--worker",        "--socket",
                                         socket,     "--rank",          std::to_string(r),
                                         "--world",  std::to_string(n), "--file-dir",
                                         o.file_dir, "--poll-us",       std::to_string(o.poll_us)};
        if (!o.deadlock_detection) argv.push_back("--no-deadlock-detection");
        absl::StatusOr<pid_t> pid = Spawn(argv, io);
        ::close(sv[1]);
        if (!pid.ok()) return pid.status();
        set->pids_.push_back(*pid);
      } else {
        set->threads_.emplace_back([fd = sv[1], cfg] {
          RunWorker(fd, cfg);
          ::close(fd);
        });
      }
    }
    for (uint32_t r = 0; r < n; ++r) {
      std::optional<std::string> hello = set->readers_[r].Read(60000);
      if (!hello || hello->rfind("H 1", 0) != 0) {
        return absl::UnavailableError(absl::StrCat(
            "rank ", r, " of ", n, " did not connect: ", hello ? *hello : "no answer in 60 s"));
      }
    }
    return set;
  }

  ~RankSet() {
    for (size_t r = 0; r < fds_.size(); ++r) {
      if (!killed_[r]) WriteLine(fds_[r], "Q");
    }
    for (std::thread& t : threads_) t.join();
    for (size_t r = 0; r < pids_.size(); ++r) {
      if (killed_[r]) continue;
      if (!WaitPid(pids_[r], 10000)) {
        ::kill(pids_[r], SIGKILL);
        WaitPid(pids_[r], 5000);
      }
    }
    for (int fd : fds_) ::close(fd);
  }

  size_t size() const { return fds_.size(); }
  bool processes() const { return processes_; }
  const std::vector<pid_t>& pids() const { return pids_; }
  bool Send(size_t r, const std::string& line) { return WriteLine(fds_[r], line); }
  std::optional<std::string> Read(size_t r, int timeout_ms) { return readers_[r].Read(timeout_ms); }
  void KillRank(size_t r) {
    ::kill(pids_[r], SIGKILL);
    WaitPid(pids_[r], 5000);
    killed_[r] = true;
  }

 private:
  RankSet() = default;
  bool processes_ = false;
  std::vector<int> fds_;
  std::vector<LineReader> readers_;
  std::vector<std::thread> threads_;
  std::vector<pid_t> pids_;
  std::vector<bool> killed_;
};

// What one measured rendezvous is: the worker command letter and the name
// the report uses.
struct Method {
  char mode;
  const char* name;
};
constexpr Method kJoinMethod{'d', "mooncaked"};
constexpr Method kFileMethod{'f', "file"};
constexpr Method kCommMethod{'c', "communicator"};
constexpr Method kCommExportMethod{'e', "communicator-export"};

struct RunResult {
  std::string method;   // Method::name
  std::string harness;  // "threads" or "processes"
  uint32_t ranks = 0;
  int iters = 0;
  std::vector<double> last_ms;      // release -> last rank returned
  std::vector<double> per_rank_ms;  // one rank's call
  std::vector<double> skew_ms;      // release -> last rank's call start
  std::vector<double> first_ms;     // release -> first rank returned
  double daemon_cpu_ms = -1;        // mooncaked CPU per measured iteration
  double ranks_cpu_ms = -1;         // CPU of all ranks per measured iteration
  double events_per_iter = 0;       // membership events drained after leaves
};

// CPU time (user + system) of process `pid` in ms, from /proc (10 ms ticks:
// only averages over many iterations mean anything); -1 if unreadable.
double ProcessCpuMs(pid_t pid) {
  std::ifstream f(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  size_t paren = stat.rfind(')');
  if (paren == std::string::npos) return -1;
  std::vector<std::string> fields = absl::StrSplit(stat.substr(paren + 2), ' ');
  // After "pid (comm) ": field 3 is index 0, so utime (14) and stime (15)
  // are at 11 and 12.
  if (fields.size() < 13) return -1;
  double ticks = std::stod(fields[11]) + std::stod(fields[12]);
  return ticks * 1000.0 / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

double SelfCpuMs() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  return (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e3 +
         (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e3;
}

absl::StatusOr<RunResult> Measure(RankSet& set, const Options& o, Method method, int warmup,
                                  int iters, const std::string& prefix, pid_t daemon_pid) {
  const size_t n = set.size();
  const bool file = method.mode == 'f';
  RunResult res;
  res.method = method.name;
  res.ranks = static_cast<uint32_t>(n);
  res.iters = iters;
  const std::string mode(1, method.mode);
  // Lead time so every rank has its command before the release instant.
  const int64_t lead_ns = (2 + static_cast<int64_t>(n) / 16) * 1000000;
  uint64_t events = 0;
  int perf_fd = o.perf_ctl.empty() ? -1 : ::open(o.perf_ctl.c_str(), O_WRONLY | O_CLOEXEC);
  double daemon_cpu = 0, ranks_cpu = 0;
  auto ranks_cpu_now = [&set] {
    if (!set.processes()) return SelfCpuMs();
    double sum = 0;
    for (pid_t p : set.pids()) sum += ProcessCpuMs(p);
    return sum;
  };
  for (int it = 0; it < warmup + iters; ++it) {
    if (perf_fd >= 0 && it >= warmup) WriteLine(perf_fd, "enable");
    const double daemon_cpu0 = daemon_pid > 0 ? ProcessCpuMs(daemon_pid) : 0;
    const double ranks_cpu0 = ranks_cpu_now();
    const std::string group = absl::StrCat(prefix, mode, "-", n, "-", it);
    const int64_t release = NowNs() + lead_ns;
    for (size_t r = 0; r < n; ++r) {
      if (!set.Send(r, absl::StrCat("J ", group, " ", release, " ", mode))) {
        return absl::UnavailableError(absl::StrCat("rank ", r, " is gone"));
      }
    }
    int64_t last_end = 0, last_start = 0, first_end = INT64_MAX;
    std::vector<double> per_rank;
    for (size_t r = 0; r < n; ++r) {
      std::optional<std::string> line = set.Read(r, 120000);
      if (!line) return absl::DeadlineExceededError(absl::StrCat("rank ", r, " did not answer"));
      std::vector<std::string> f = absl::StrSplit(*line, absl::MaxSplits(' ', 4));
      if (f.size() < 4 || f[0] != "R") {
        return absl::InternalError(absl::StrCat("rank ", r, ": bad reply '", *line, "'"));
      }
      if (f[3] != "1") {
        return absl::InternalError(absl::StrCat(res.method, " rendezvous ", group, " rank ", r,
                                                " failed: ", f.size() > 4 ? f[4] : ""));
      }
      int64_t start = std::stoll(f[1]), end = std::stoll(f[2]);
      last_end = std::max(last_end, end);
      first_end = std::min(first_end, end);
      last_start = std::max(last_start, start);
      per_rank.push_back(Ms(end - start));
    }
    if (perf_fd >= 0 && it >= warmup) WriteLine(perf_fd, "disable");
    if (it >= warmup) {
      if (daemon_pid > 0) daemon_cpu += ProcessCpuMs(daemon_pid) - daemon_cpu0;
      ranks_cpu += ranks_cpu_now() - ranks_cpu0;
    }
    for (size_t r = 0; r < n; ++r) set.Send(r, absl::StrCat("L ", group, " ", mode));
    for (size_t r = 0; r < n; ++r) {
      std::optional<std::string> line = set.Read(r, 60000);
      std::vector<std::string> f;
      if (line) f = absl::StrSplit(*line, absl::MaxSplits(' ', 3));
      if (f.size() < 3 || f[0] != "D" || f[2] != "1") {
        return absl::InternalError(
            absl::StrCat("leave of ", group, " rank ", r, " failed: ", line ? *line : "no answer"));
      }
      events += std::stoull(f[1]);
    }
    if (file) ::rmdir(absl::StrCat(o.file_dir, "/", group).c_str());
    if (it < warmup) {
      events = 0;
      continue;
    }
    res.last_ms.push_back(Ms(last_end - release));
    res.skew_ms.push_back(Ms(last_start - release));
    res.first_ms.push_back(Ms(first_end - release));
    res.per_rank_ms.insert(res.per_rank_ms.end(), per_rank.begin(), per_rank.end());
  }
  if (perf_fd >= 0) ::close(perf_fd);
  if (daemon_pid > 0) res.daemon_cpu_ms = daemon_cpu / std::max(1, iters);
  res.ranks_cpu_ms = ranks_cpu / std::max(1, iters);
  res.events_per_iter = static_cast<double>(events) / std::max(1, iters);
  return res;
}

// ---------------------------------------------------------------- LOST

struct LostResult {
  uint32_t ranks = 0;
  std::vector<double> ms;  // SIGKILL -> last survivor saw LOST
};

absl::StatusOr<LostResult> MeasureLost(const Options& o, const std::string& socket, uint32_t n,
                                       int trials) {
  LostResult res;
  res.ranks = n;
  std::mt19937 rng(12345);
  for (int t = 0; t < trials; ++t) {
    MC_ASSIGN_OR_RETURN(std::unique_ptr<RankSet> set, RankSet::Start(o, socket, n, true));
    const std::string group = absl::StrCat("lost-", n, "-", t);
    const int64_t release = NowNs() + 5000000;
    for (size_t r = 0; r < n; ++r) set->Send(r, absl::StrCat("J ", group, " ", release, " d"));
    for (size_t r = 0; r < n; ++r) {
      std::optional<std::string> line = set->Read(r, 60000);
      if (!line || line->rfind("R ", 0) != 0 || line->find(" 1 ") == std::string::npos) {
        return absl::InternalError(
            absl::StrCat("LOST trial ", t, ": join failed: ", line ? *line : "no answer"));
      }
    }
    for (size_t r = 0; r + 1 < n; ++r) set->Send(r, absl::StrCat("W ", group));
    // The daemon notices a dead session at its next 100 ms poll: kill at a
    // random phase so the samples cover the whole poll period.
    ::usleep(static_cast<useconds_t>(20000 + rng() % 100000));
    const int64_t killed_at = NowNs();
    set->KillRank(n - 1);
    int64_t last = 0;
    for (size_t r = 0; r + 1 < n; ++r) {
      std::optional<std::string> line = set->Read(r, 10000);
      std::vector<std::string> f;
      if (line) f = absl::StrSplit(*line, ' ');
      if (f.size() != 4 || f[0] != "W" || f[1] != "1" ||
          std::stoul(f[3]) != static_cast<unsigned long>(n - 1)) {
        return absl::InternalError(absl::StrCat("LOST trial ", t, ": rank ", r,
                                                " saw no LOST event for rank ", n - 1, ": ",
                                                line ? *line : "no answer"));
      }
      last = std::max<int64_t>(last, std::stoll(f[2]));
    }
    res.ms.push_back(Ms(last - killed_at));
  }
  return res;
}

// ---------------------------------------------------------------- view cost

// The O(n^2) part of a rendezvous, measured without the daemon: n views of
// n members are built (the fields GroupBroker::BuildView fills), serialized
// (daemon), parsed (client), on one thread. Returns CPU ms per rendezvous.
// Thread CPU time, so other load on the machine does not inflate it.
double ViewCostMs(uint32_t n, int reps) {
  auto NowNs = [] {
    timespec ts{};
    ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
  };
  std::vector<std::string> handles;
  for (uint32_t r = 0; r < n; ++r) handles.push_back(HandleFor(r));
  int64_t build = 0, ser = 0, parse = 0;
  size_t bytes = 0;
  for (int rep = 0; rep < reps; ++rep) {
    for (uint32_t me = 0; me < n; ++me) {
      int64_t t0 = NowNs();
      v1::JoinGroupResponse resp;
      resp.set_group("bench-view");
      resp.set_rank(me);
      resp.set_world_size(n);
      resp.set_epoch(1);
      for (uint32_t r = 0; r < n; ++r) {
        v1::MemberView* v = resp.add_members();
        v->set_rank(r);
        v->set_node_id("benchnode");
        v->set_pid(100000 + static_cast<int>(r));
        v->set_gpu_index(-1);
        v->set_handle_kind("bench");
        v->set_handle_data(handles[r]);
        v->set_handle_size(handles[r].size());
        v->set_same_node(true);
        v->set_p2p_reachable(true);
        v->set_native_atomics(true);
      }
      int64_t t1 = NowNs();
      std::string wire = resp.SerializeAsString();
      int64_t t2 = NowNs();
      v1::JoinGroupResponse back;
      back.ParseFromString(wire);
      int64_t t3 = NowNs();
      build += t1 - t0;
      ser += t2 - t1;
      parse += t3 - t2;
      bytes = wire.size();
    }
  }
  std::cerr << absl::StrFormat(
      "  view cost %u ranks: build %.2f ms, serialize %.2f ms, parse %.2f ms per rendezvous "
      "(%zu-byte response per rank)\n",
      n, Ms(build) / reps, Ms(ser) / reps, Ms(parse) / reps, bytes);
  return Ms(build + ser + parse) / reps;
}

// ---------------------------------------------------------------- mcctl

absl::StatusOr<std::vector<double>> MeasureAdminRpc(const std::string& socket, int calls) {
  auto channel =
      grpc::CreateChannel(absl::StrCat("unix:", socket), grpc::InsecureChannelCredentials());
  std::unique_ptr<v1::Admin::Stub> stub = v1::Admin::NewStub(channel);
  std::vector<double> ms;
  for (int i = 0; i < calls + 20; ++i) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::GetStatusRequest req;
    v1::DaemonStatus resp;
    int64_t t0 = NowNs();
    grpc::Status s = stub->GetStatus(&ctx, req, &resp);
    int64_t t1 = NowNs();
    if (!s.ok()) {
      return absl::UnavailableError(
          absl::StrCat("Admin.GetStatus on unix:", socket, ": ", s.error_message()));
    }
    if (i >= 20) ms.push_back(Ms(t1 - t0));  // the first calls connect and warm up
  }
  return ms;
}

absl::StatusOr<std::vector<double>> MeasureMcctl(const std::string& mcctl,
                                                 const std::string& socket, int runs) {
  std::vector<double> ms;
  for (int i = 0; i < runs + 2; ++i) {
    SpawnIo io;
    io.stdout_path = "/dev/null";
    int64_t t0 = NowNs();
    absl::StatusOr<pid_t> pid = Spawn({mcctl, "--socket", socket, "status", "--json"}, io);
    if (!pid.ok()) return pid.status();
    int st = 0;
    while (::waitpid(*pid, &st, 0) < 0 && errno == EINTR) {
    }
    int64_t t1 = NowNs();
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      return absl::InternalError(
          absl::StrCat(mcctl, " --socket ", socket, " status --json exited with status ", st));
    }
    if (i >= 2) ms.push_back(Ms(t1 - t0));  // first runs fill the page cache
  }
  return ms;
}

// ---------------------------------------------------------------- main

int IterationsFor(uint32_t n, double scale) {
  int base = n <= 2 ? 200 : n <= 8 ? 100 : n <= 64 ? 30 : 15;
  return std::max(3, static_cast<int>(base * scale));
}

std::string Fmt(double v) { return absl::StrFormat("%.3f", v); }

absl::Status ParseArgs(int argc, char** argv, Options* o, bool* worker, WorkerConfig* w) {
  std::string bin_dir = std::filesystem::path(SelfExe()).parent_path().string();
  o->mooncaked = bin_dir + "/mooncaked";
  o->mcctl = bin_dir + "/mcctl";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> absl::StatusOr<std::string> {
      if (i + 1 >= argc) return absl::InvalidArgumentError(absl::StrCat(a, " needs a value"));
      return std::string(argv[++i]);
    };
    if (a == "--no-deadlock-detection") {
      o->deadlock_detection = false;
    } else if (a == "--worker") {
      *worker = true;
    } else if (a == "--processes") {
      o->processes = true;
    } else if (a == "--mooncaked" || a == "--mcctl" || a == "--socket" || a == "--out" ||
               a == "--file-dir" || a == "--ranks" || a == "--iters-scale" || a == "--poll-us" ||
               a == "--rank" || a == "--world" || a == "--lost-trials" || a == "--methods" ||
               a == "--perf-ctl") {
      MC_ASSIGN_OR_RETURN(std::string v, value());
      if (a == "--mooncaked") o->mooncaked = v;
      if (a == "--mcctl") o->mcctl = v;
      if (a == "--socket") o->socket = w->socket = v;
      if (a == "--out") o->out = v;
      if (a == "--file-dir") o->file_dir = w->file_dir = v;
      if (a == "--iters-scale") o->iters_scale = std::stod(v);
      if (a == "--poll-us") o->poll_us = w->poll_us = std::stoi(v);
      if (a == "--rank") w->rank = static_cast<uint32_t>(std::stoul(v));
      if (a == "--world") w->world = static_cast<uint32_t>(std::stoul(v));
      if (a == "--lost-trials") o->lost_trials = std::stoi(v);
      if (a == "--perf-ctl") o->perf_ctl = v;
      if (a == "--methods") {
        o->run_daemon = o->run_file = false;
        for (absl::string_view m : absl::StrSplit(v, ',')) {
          if (m == "mooncaked") o->run_daemon = true;
          if (m == "file") o->run_file = true;
          if (m == "communicator") o->run_comm = true;
          if (m == "communicator-export") o->run_comm_export = true;
        }
        if (!o->run_daemon && !o->run_file && !o->run_comm && !o->run_comm_export) {
          return absl::InvalidArgumentError(
              "--methods takes a comma list of mooncaked, file, communicator, communicator-export");
        }
      }
      if (a == "--ranks") {
        o->ranks.clear();
        for (absl::string_view r : absl::StrSplit(v, ',')) {
          o->ranks.push_back(static_cast<uint32_t>(std::stoul(std::string(r))));
        }
      }
    } else if (a == "--help" || a == "-h") {
      return absl::CancelledError("help");
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown argument '", a, "'"));
    }
  }
  return absl::OkStatus();
}

constexpr char kUsage[] =
    "usage: rendezvous_bench [--mooncaked PATH] [--mcctl PATH] [--socket S] [--out FILE]\n"
    "                        [--processes] [--ranks 2,8,64,256] [--iters-scale F]\n"
    "                        [--poll-us US] [--file-dir DIR] [--lost-trials N]\n"
    "                        [--methods mooncaked,file,communicator,communicator-export]\n"
    "                        [--perf-ctl FIFO]\n"
    "                        [--no-deadlock-detection]\n"
    "  Without --socket a private mooncaked (default: next to this binary) is started on a\n"
    "  temporary socket and stopped at the end. --processes adds one-process-per-rank runs\n"
    "  for 2 and 8 ranks and the LOST-event latency of a SIGKILLed rank. The communicator\n"
    "  methods time a whole Communicator::Create per rank (one process per rank) on the\n"
    "  join route and on the export/import route; default methods: mooncaked,file.\n";

int Main(int argc, char** argv) {
  Options o;
  bool worker = false;
  WorkerConfig wcfg;
  if (absl::Status s = ParseArgs(argc, argv, &o, &worker, &wcfg); !s.ok()) {
    if (s.code() != absl::StatusCode::kCancelled)
      std::cerr << "rendezvous_bench: " << s.message() << "\n";
    std::cerr << kUsage;
    return s.code() == absl::StatusCode::kCancelled ? 0 : 64;
  }
  // Debian's Abseil is built without NDEBUG, so every absl::Mutex (gRPC's
  // included) runs the deadlock detector unless it is switched off.
  if (!o.deadlock_detection) absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  if (worker) return RunWorker(3, wcfg);

  // 256 ranks need ~4 fds each in this process.
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &rl);
  }
  char tmpl[] = "/tmp/mc-rdvbench-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) {
    std::cerr << "rendezvous_bench: mkdtemp(/tmp/mc-rdvbench-XXXXXX): " << std::strerror(errno)
              << "\n";
    return 1;
  }
  const std::string tmp = tmpl;
  if (o.file_dir.empty()) o.file_dir = tmp + "/files";
  std::filesystem::create_directories(o.file_dir);

  std::unique_ptr<BenchDaemon> daemon;
  std::string socket = o.socket;
  if (socket.empty()) {
    absl::StatusOr<std::unique_ptr<BenchDaemon>> d =
        BenchDaemon::Start(o.mooncaked, tmp, "benchnode");
    if (!d.ok()) {
      std::cerr << "rendezvous_bench: " << d.status().message()
                << " (pass --mooncaked PATH or --socket S)\n";
      std::error_code ec;
      std::filesystem::remove_all(tmp, ec);
      return 1;
    }
    daemon = *std::move(d);
    socket = daemon->socket();
  }
  std::cerr << "rendezvous_bench: mooncaked on " << socket << ", file rendezvous in " << o.file_dir
            << " (poll " << o.poll_us << " us)\n";

  auto loadavg = [] {
    std::ifstream f("/proc/loadavg");
    std::string a, b, c;
    f >> a >> b >> c;
    return absl::StrCat(a, " ", b, " ", c);
  };
  const std::string load_start = loadavg();
  std::vector<RunResult> results;
  std::vector<std::string> errors;
  std::vector<std::pair<uint32_t, double>> idle;  // sessions, daemon CPU % of one core
  auto run_set = [&](uint32_t n, bool processes) {
    int64_t t0 = NowNs();
    absl::StatusOr<std::unique_ptr<RankSet>> set = RankSet::Start(o, socket, n, processes);
    if (!set.ok()) {
      errors.push_back(std::string(set.status().message()));
      return;
    }
    std::cerr << absl::StrFormat("  %u ranks (%s) connected in %.1f ms\n", n,
                                 processes ? "processes" : "threads", Ms(NowNs() - t0));
    if (daemon && !processes) {
      // What n idle sessions cost the daemon: each session's stream thread
      // wakes every 100 ms to look for a cancelled client.
      double c0 = ProcessCpuMs(daemon->pid());
      int64_t w0 = NowNs();
      ::usleep(static_cast<useconds_t>(o.idle_s * 1e6));
      idle.push_back({n, (ProcessCpuMs(daemon->pid()) - c0) / Ms(NowNs() - w0) * 100.0});
    }
    const int iters = IterationsFor(n, o.iters_scale);
    const int warmup = n >= 64 ? 2 : 5;
    std::vector<Method> methods;
    // A Communicator per rank maps every peer: 256 of them in one process
    // would pass the kernel's 65530-mapping limit, and a real job runs one
    // process per rank anyway, so they are measured with processes only.
    if (!processes && o.run_daemon) methods.push_back(kJoinMethod);
    if (!processes && o.run_file) methods.push_back(kFileMethod);
    const bool small_processes = processes && o.processes && n <= 8;
    if (small_processes && o.run_daemon) methods.push_back(kJoinMethod);
    if (small_processes && o.run_file) methods.push_back(kFileMethod);
    if (processes && o.run_comm) methods.push_back(kCommMethod);
    if (processes && o.run_comm_export) methods.push_back(kCommExportMethod);
    for (Method method : methods) {
      int64_t m0 = NowNs();
      absl::StatusOr<RunResult> r =
          Measure(**set, o, method, warmup, iters, processes ? "benchp" : "bench",
                  daemon ? daemon->pid() : -1);
      if (!r.ok()) {
        errors.push_back(std::string(r.status().message()));
        continue;
      }
      r->harness = processes ? "processes" : "threads";
      Stats s = Summarize(r->last_ms);
      std::cerr << absl::StrFormat(
          "    %-9s %3u ranks: p50 %.3f ms p99 %.3f ms (%d iters, %.1f s)\n", r->method, n, s.p50,
          s.p99, iters, Ms(NowNs() - m0) / 1000);
      results.push_back(*std::move(r));
    }
  };
  if (o.run_daemon || o.run_file) {
    for (uint32_t n : o.ranks) run_set(n, false);
  }
  std::vector<LostResult> lost;
  for (uint32_t n : o.ranks) {
    if ((o.processes && n <= 8) || o.run_comm || o.run_comm_export) run_set(n, true);
  }
  if (o.processes) {
    for (uint32_t n : {2u, 8u}) {
      absl::StatusOr<LostResult> l =
          MeasureLost(o, socket, n, n == 2 ? o.lost_trials : o.lost_trials / 2);
      if (!l.ok()) {
        errors.push_back(std::string(l.status().message()));
      } else {
        lost.push_back(*std::move(l));
      }
    }
  }

  std::vector<std::pair<uint32_t, double>> view_cost;
  for (uint32_t n : o.ranks) view_cost.push_back({n, ViewCostMs(n, n >= 64 ? 3 : 100)});
  absl::StatusOr<std::vector<double>> admin = MeasureAdminRpc(socket, 1000);
  std::optional<absl::StatusOr<std::vector<double>>> mcctl;
  std::string mcctl_note;
  if (::access(o.mcctl.c_str(), X_OK) == 0) {
    mcctl = MeasureMcctl(o.mcctl, socket, 50);
  } else {
    mcctl_note = absl::StrCat("skipped: no executable mcctl at ", o.mcctl);
  }
  if (daemon) daemon->Stop();
  const std::string load_end = loadavg();

  // ------------------------------------------------------------ report
  std::ostringstream md;
  md << "### Group rendezvous latency (release of all ranks -> last rank returns)\n\n"
     << "| ranks | harness | method | iters | p50 ms | p99 ms | min ms | max ms | per-rank p50 ms "
        "| per-rank p99 ms | release->last call start p50 ms | release->first return p50 ms "
        "| mooncaked CPU ms/iter | ranks CPU ms/iter |\n"
     << "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const RunResult& r : results) {
    Stats s = Summarize(r.last_ms), pr = Summarize(r.per_rank_ms), sk = Summarize(r.skew_ms),
          fi = Summarize(r.first_ms);
    auto cpu = [](double v) { return v < 0 ? std::string("n/a") : absl::StrFormat("%.1f", v); };
    std::string method =
        r.method == "file" ? absl::StrCat("file rendezvous (", o.poll_us / 1000.0, " ms poll)")
        : r.method == "communicator" ? "Communicator::Create, join route (fds with the join)"
        : r.method == "communicator-export"
            ? "Communicator::Create, export/import route (ExportFds + ImportFds per peer)"
            : "mooncaked joinGroup";
    md << "| " << r.ranks << " | " << r.harness << " | " << method << " | " << r.iters << " | "
       << Fmt(s.p50) << " | " << Fmt(s.p99) << " | " << Fmt(s.min) << " | " << Fmt(s.max) << " | "
       << Fmt(pr.p50) << " | " << Fmt(pr.p99) << " | " << Fmt(sk.p50) << " | " << Fmt(fi.p50)
       << " | " << cpu(r.daemon_cpu_ms) << " | " << cpu(r.ranks_cpu_ms) << " |\n";
  }
  md << "\n### Targets (mooncaked joinGroup, threads harness, p50)\n\n"
     << "| target | measured p50 ms | limit ms | factor | verdict |\n|---|---:|---:|---:|---|\n";
  // 256 ranks: issue 7's target with the shared view (was 100 ms before it).
  for (auto [n, limit] : {std::pair<uint32_t, double>{256, 30.0}, {2, 2.0}}) {
    auto it = std::find_if(results.begin(), results.end(), [n = n](const RunResult& r) {
      return r.ranks == n && r.method == "mooncaked" && r.harness == "threads";
    });
    if (it == results.end()) {
      md << "| " << n << "-rank rendezvous <= " << limit << " ms | not run | " << limit
         << " | | n/a |\n";
      continue;
    }
    double p50 = Summarize(it->last_ms).p50;
    md << "| " << n << "-rank rendezvous <= " << limit << " ms | " << Fmt(p50) << " | " << limit
       << " | " << absl::StrFormat("%.2fx", p50 / limit) << " | "
       << (p50 <= limit ? "PASS" : "MISS") << " |\n";
  }
  if (!lost.empty()) {
    md << "\n### LOST-event latency (SIGKILL of the last rank -> last survivor's nextEvent "
          "returns LOST)\n\n| ranks | trials | p50 ms | p99 ms | min ms | max ms | mean ms |\n"
          "|---:|---:|---:|---:|---:|---:|---:|\n";
    for (const LostResult& l : lost) {
      Stats s = Summarize(l.ms);
      md << "| " << l.ranks << " | " << s.n << " | " << Fmt(s.p50) << " | " << Fmt(s.p99) << " | "
         << Fmt(s.min) << " | " << Fmt(s.max) << " | " << Fmt(s.mean) << " |\n";
    }
  }
  md << "\n### mcctl status round trip\n\n| what | runs | p50 ms | p99 ms | min ms | max ms |\n"
        "|---|---:|---:|---:|---:|---:|\n";
  if (admin.ok()) {
    Stats s = Summarize(*admin);
    md << "| Admin.GetStatus RPC, in process, one unix: channel reused | " << s.n << " | "
       << Fmt(s.p50) << " | " << Fmt(s.p99) << " | " << Fmt(s.min) << " | " << Fmt(s.max) << " |\n";
  } else {
    md << "| Admin.GetStatus RPC | failed: " << admin.status().message() << " | | | | |\n";
  }
  if (mcctl && mcctl->ok()) {
    Stats s = Summarize(**mcctl);
    md << "| `mcctl --socket S status --json` (posix_spawn + waitpid) | " << s.n << " | "
       << Fmt(s.p50) << " | " << Fmt(s.p99) << " | " << Fmt(s.min) << " | " << Fmt(s.max) << " |\n";
  } else if (mcctl) {
    md << "| `mcctl status --json` | failed: " << mcctl->status().message() << " | | | | |\n";
  } else {
    md << "| `mcctl status --json` | " << mcctl_note << " | | | | |\n";
  }
  for (const RunResult& r : results) {
    if (r.method == "mooncaked") {
      md << "\nmembership events drained after the leaves, " << r.ranks << " ranks (" << r.harness
         << "): " << absl::StrFormat("%.0f", r.events_per_iter) << " per iteration";
    }
  }
  md << "\n";
  for (auto [n, pct] : idle) {
    md << "\nmooncaked CPU with " << n << " idle sessions (threads harness, " << o.idle_s
       << " s window): " << absl::StrFormat("%.1f", pct) << "% of one core";
  }
  for (auto [n, ms] : view_cost) {
    md << "\nbuild + serialize + parse of all " << n << " views of " << n
       << " members (protobuf only, one thread): " << absl::StrFormat("%.2f", ms) << " CPU ms";
  }
  md << "\n\nabsl::Mutex deadlock detection in the bench process: "
     << (o.deadlock_detection ? "on (Debian default)" : "off (--no-deadlock-detection)")
     << "; mooncaked: on (Debian default)\n"
     << "\nload average (1/5/15 min) at start: " << load_start << "; at end: " << load_end
     << " (other work on the machine shares its " << std::thread::hardware_concurrency()
     << " cores)\n";
  for (const std::string& e : errors) md << "\nERROR: " << e << "\n";

  std::cout << md.str();
  if (!o.out.empty()) {
    std::ofstream f(o.out);
    f << md.str();
    if (!f) std::cerr << "rendezvous_bench: cannot write " << o.out << "\n";
  }
  std::error_code ec;
  std::filesystem::remove_all(tmp, ec);
  return errors.empty() ? 0 : 1;
}

}  // namespace
}  // namespace mooncake::bench

int main(int argc, char** argv) { return mooncake::bench::Main(argc, argv); }
