// soak_bench: what holding many sessions under load, and losing clients to
// SIGKILL, does to mooncaked over time. CPU only.
//
// Against a private mooncaked started on a temporary socket (default: the
// one next to this binary), in phases:
//   idle      the daemon with no session (the baseline RSS and fd count);
//   open      S sessions opened, each a real mooncake::Client (its own
//             connection, session stream and reader thread);
//   sessions  the S sessions held, idle;
//   load      D seconds of closed-loop load from W worker threads: Hello,
//             GetNodeInfo, and 2-rank group cycles (join both ranks, report
//             ready, wait for READY on both, leave, LEFT seen by the other,
//             leave) between two sessions of the worker, a new group name
//             each cycle; every call is timed, every view and event checked;
//   kills     K times: a child process (this binary, --child) opens a
//             session and joins a 2-rank group with one of the S sessions;
//             once both joins returned the child is SIGKILLed, and the time
//             from kill() to the partner's LOST event is measured; the
//             partner leaves and the daemon's session count (Admin
//             GetStatus) must come back to S, and its groups to 0;
//   close     the S sessions closed;
//   closed    the daemon with no session again.
// A sampler thread reads the daemon's VmRSS, VmHWM, fd count, threads and
// CPU from /proc, and sessions/groups from Admin GetStatus, every second
// throughout. Workers own disjoint sets of sessions, so each session's
// events are read by one thread and any unexpected event is an error.
//
// Exit status: 0 only when no call failed, no check failed, and the
// daemon's RSS and fd count came back to within --rss-margin-mib and
// --fd-margin of the idle figures after every session closed.
#include <dirent.h>
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <iostream>
#include <iterator>
#include <map>
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
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "bench_support.h"
#include "mooncake/client/client.h"
#include "mooncake/common/fd_passing.h"
#include "mooncake/common/status.h"
#include "mooncake/v1/admin.grpc.pb.h"

extern char** environ;

namespace mooncake::bench {
namespace {

void SleepMs(int64_t ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

// ---------------------------------------------------------------- /proc

// One reading of a process from /proc.
struct ProcReading {
  int64_t rss_kb = -1;  // VmRSS
  int64_t hwm_kb = -1;  // VmHWM: the kernel's own peak of VmRSS
  int fds = -1;         // entries in /proc/PID/fd
  int threads = -1;
  double cpu_ms = -1;  // user + system since start
};

ProcReading ReadProc(pid_t pid) {
  ProcReading r;
  {
    std::ifstream f(absl::StrCat("/proc/", pid, "/status"));
    std::string line;
    while (std::getline(f, line)) {
      auto field = [&line](const char* key, int64_t* out) {
        const size_t n = std::strlen(key);
        if (line.compare(0, n, key) == 0) *out = std::strtoll(line.c_str() + n, nullptr, 10);
      };
      int64_t threads = -1;
      field("VmRSS:", &r.rss_kb);
      field("VmHWM:", &r.hwm_kb);
      field("Threads:", &threads);
      if (threads >= 0) r.threads = static_cast<int>(threads);
    }
  }
  if (DIR* d = ::opendir(absl::StrCat("/proc/", pid, "/fd").c_str())) {
    int n = 0;
    while (dirent* e = ::readdir(d)) {
      if (e->d_name[0] != '.') ++n;
    }
    ::closedir(d);
    r.fds = n;
  }
  {
    std::ifstream f(absl::StrCat("/proc/", pid, "/stat"));
    std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    size_t paren = stat.rfind(')');
    if (paren != std::string::npos && paren + 2 < stat.size()) {
      std::vector<std::string> fields = absl::StrSplit(stat.substr(paren + 2), ' ');
      // After "pid (comm) " field 3 is index 0: utime (14), stime (15).
      if (fields.size() > 12) {
        double ticks = std::stod(fields[11]) + std::stod(fields[12]);
        r.cpu_ms = ticks * 1000.0 / static_cast<double>(::sysconf(_SC_CLK_TCK));
      }
    }
  }
  return r;
}

double Mib(int64_t kb) { return static_cast<double>(kb) / 1024.0; }

// ---------------------------------------------------------------- admin

// The daemon's own count of sessions and groups (all of them: this bench
// runs as the daemon's uid or root), over one Admin channel kept open for
// the whole run so it costs the same fd at every measuring point.
class AdminProbe {
 public:
  explicit AdminProbe(const std::string& socket)
      : stub_(v1::Admin::NewStub(grpc::CreateChannel(absl::StrCat("unix:", socket),
                                                     grpc::InsecureChannelCredentials()))) {}

  struct Counts {
    uint32_t sessions = 0;
    uint32_t groups = 0;
  };
  absl::StatusOr<Counts> Get() {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::DaemonStatus resp;
    grpc::Status s = stub_->GetStatus(&ctx, v1::GetStatusRequest(), &resp);
    if (!s.ok())
      return absl::UnavailableError(absl::StrCat("Admin.GetStatus: ", s.error_message()));
    return Counts{resp.sessions(), resp.groups()};
  }
  // Polls until the daemon reports `sessions` sessions and `groups` groups;
  // returns how long that took, or DeadlineExceeded with the last counts.
  absl::StatusOr<int64_t> WaitFor(uint32_t sessions, uint32_t groups, int timeout_ms) {
    const int64_t t0 = NowNs();
    Counts last;
    for (;;) {
      MC_ASSIGN_OR_RETURN(last, Get());
      if (last.sessions == sessions && last.groups == groups) return NowNs() - t0;
      if (NowNs() - t0 > static_cast<int64_t>(timeout_ms) * 1000000) break;
      ::usleep(1000);
    }
    return absl::DeadlineExceededError(
        absl::StrCat("daemon reports ", last.sessions, " sessions and ", last.groups,
                     " groups after ", timeout_ms, " ms, expected ", sessions, " and ", groups));
  }

 private:
  std::unique_ptr<v1::Admin::Stub> stub_;
};

// ---------------------------------------------------------------- sampler

struct Sample {
  double t_s = 0;  // since the daemon started serving
  std::string phase;
  ProcReading proc;
  double cpu_pct = -1;  // of one core, over the interval since the previous sample
  int sessions = -1;
  int groups = -1;
};

// Samples the daemon every second on its own thread until destroyed.
class Sampler {
 public:
  Sampler(pid_t pid, AdminProbe* admin) : pid_(pid), admin_(admin), t0_(NowNs()) {
    thread_ = std::thread([this] { Run(); });
  }
  ~Sampler() { Stop(); }
  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  void SetPhase(std::string phase) {
    std::lock_guard<std::mutex> lock(mu_);
    phase_ = std::move(phase);
  }
  std::vector<Sample> series() {
    std::lock_guard<std::mutex> lock(mu_);
    return series_;
  }

 private:
  void Run() {
    ProcReading prev = ReadProc(pid_);
    int64_t prev_t = NowNs();
    int64_t next = prev_t + 1000000000;
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      if (cv_.wait_for(lock, std::chrono::nanoseconds(next - NowNs()), [this] { return stop_; })) {
        return;
      }
      next += 1000000000;
      std::string phase = phase_;
      lock.unlock();
      Sample s;
      s.phase = std::move(phase);
      s.proc = ReadProc(pid_);
      const int64_t now = NowNs();
      s.t_s = static_cast<double>(now - t0_) / 1e9;
      if (s.proc.cpu_ms >= 0 && prev.cpu_ms >= 0) {
        s.cpu_pct = (s.proc.cpu_ms - prev.cpu_ms) / Ms(now - prev_t) * 100.0;
      }
      prev = s.proc;
      prev_t = now;
      if (absl::StatusOr<AdminProbe::Counts> c = admin_->Get(); c.ok()) {
        s.sessions = static_cast<int>(c->sessions);
        s.groups = static_cast<int>(c->groups);
      }
      lock.lock();
      series_.push_back(std::move(s));
    }
  }

  const pid_t pid_;
  AdminProbe* const admin_;
  const int64_t t0_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::string phase_ = "idle";
  std::vector<Sample> series_;
  std::thread thread_;
};

// ---------------------------------------------------------------- stats

// Every failed call or check; the first few are kept verbatim.
class Errors {
 public:
  void Add(const std::string& what) {
    absl::MutexLock lock(&mu_);
    ++count_;
    if (first_.size() < 20) first_.push_back(OneLine(what));
    if (count_ <= 5) std::cerr << "soak_bench: ERROR " << OneLine(what) << "\n";
  }
  uint64_t count() const {
    absl::MutexLock lock(&mu_);
    return count_;
  }
  std::vector<std::string> first() const {
    absl::MutexLock lock(&mu_);
    return first_;
  }

 private:
  mutable absl::Mutex mu_;
  uint64_t count_ = 0;
  std::vector<std::string> first_;
};

// Latencies in ms by operation kind; one per thread, merged at the end.
using Latencies = std::map<std::string, std::vector<double>>;

void Merge(const Latencies& from, Latencies* into) {
  for (const auto& [k, v] : from) {
    std::vector<double>& dst = (*into)[k];
    dst.insert(dst.end(), v.begin(), v.end());
  }
}

// The report's order of operation kinds, with what each one times.
const std::vector<std::pair<std::string, std::string>>& OpKinds() {
  static const auto* kinds = new std::vector<std::pair<std::string, std::string>>{
      {"connect", "Client::Connect (connect, Hello, OpenSession)"},
      {"hello", "Client::hello"},
      {"node_info", "Client::nodeInfo"},
      {"join", "joinGroup, 2 ranks (each rank's call)"},
      {"report_ready", "reportReady"},
      {"ready_event", "last reportReady returned -> READY seen by both ranks"},
      {"leave", "leaveGroup"},
      {"left_event", "rank 0 leaveGroup returned -> LEFT seen by rank 1"},
      {"group_cycle", "whole 2-rank cycle: join x2, ready x2, events, leave x2"},
      {"kill_join", "kill cycle: spawn child + both joins returned"},
      {"close", "~Client (session closed)"},
  };
  return *kinds;
}

// ---------------------------------------------------------------- events

// Waits for the next event of `client`, which must be `kind` about `rank`
// of `group`; anything else is an error.
absl::Status ExpectEvent(Client& client, SessionEvent::Kind kind, const std::string& group,
                         uint32_t rank, absl::Duration timeout) {
  std::optional<SessionEvent> ev = client.nextEvent(timeout);
  if (!ev) {
    return absl::DeadlineExceededError(absl::StrCat("no ", SessionEventKindName(kind),
                                                    " event for ", group, " rank ", rank, " in ",
                                                    absl::FormatDuration(timeout)));
  }
  if (ev->kind != kind || ev->group != group || ev->rank != rank) {
    return absl::InternalError(absl::StrCat("expected ", SessionEventKindName(kind), " for ", group,
                                            " rank ", rank, ", got ",
                                            SessionEventKindName(ev->kind), " for ", ev->group,
                                            " rank ", ev->rank, " (", ev->detail, ")"));
  }
  return absl::OkStatus();
}

// No event may be waiting: a session only hears about its own groups.
absl::Status ExpectNoEvent(Client& client, const std::string& who) {
  std::optional<SessionEvent> ev = client.nextEvent(absl::ZeroDuration());
  if (!ev) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("unexpected ", SessionEventKindName(ev->kind),
                                          " event on ", who, " for ", ev->group, " rank ", ev->rank,
                                          " (", ev->detail, ")"));
}

std::string HandleFor(const std::string& group, uint32_t rank) {
  return absl::StrCat("soak-", group, "-rank-", rank);
}

JoinOptions JoinFor(const std::string& group, uint32_t rank) {
  JoinOptions j;
  j.group = group;
  j.rank = rank;
  j.world_size = 2;
  j.timeout = absl::Seconds(30);
  j.handle_kind = "soak";
  j.handle_data = HandleFor(group, rank);
  j.handle_size = j.handle_data.size();
  return j;
}

// The view must hold both ranks with the handles they published.
absl::Status CheckView(const absl::StatusOr<GroupView>& view, const std::string& group,
                       uint32_t rank) {
  if (!view.ok()) return view.status();
  if (view->rank != rank || view->world_size != 2 || view->members.size() != 2) {
    return absl::DataLossError(absl::StrCat("group ", group, " rank ", rank, ": view of rank ",
                                            view->rank, " with ", view->members.size(),
                                            " members"));
  }
  for (uint32_t r = 0; r < 2; ++r) {
    if (view->members[r].rank != r || view->members[r].handle_data != HandleFor(group, r)) {
      return absl::DataLossError(
          absl::StrCat("group ", group, " rank ", rank, ": wrong handle for rank ", r));
    }
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------- child

// --child: one session that joins `group` as rank 1 of 2, says so on fd 3,
// then waits (to be SIGKILLed; it leaves cleanly if fd 3 closes first).
int RunChild(const std::string& socket, const std::string& group) {
  ClientOptions opts;
  opts.socket_path = socket;
  opts.client_name = absl::StrCat("soak_bench child ", group);
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(opts);
  if (!client.ok()) {
    WriteLine(3, absl::StrCat("J 0 connect: ", OneLine(std::string(client.status().ToString()))));
    return 1;
  }
  absl::Status s = CheckView((*client)->joinGroup(JoinFor(group, 1)), group, 1);
  WriteLine(3, absl::StrCat("J ", s.ok() ? 1 : 0, " ", OneLine(std::string(s.ToString()))));
  char c;
  while (::read(3, &c, 1) < 0 && errno == EINTR) {
  }
  return s.ok() ? 0 : 1;
}

// ---------------------------------------------------------------- load

// Runs one task at a time on its own thread: the second rank of a worker's
// group cycle, whose joinGroup blocks until the first rank joins too.
class Companion {
 public:
  Companion() : thread_([this] { Run(); }) {}
  ~Companion() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void Start(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      task_ = std::move(task);
      done_ = false;
    }
    cv_.notify_all();
  }
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return done_; });
  }

 private:
  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [this] { return stop_ || task_ != nullptr; });
      if (stop_) return;
      std::function<void()> task = std::move(task_);
      task_ = nullptr;
      lock.unlock();
      task();
      lock.lock();
      done_ = true;
      cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::function<void()> task_;
  bool done_ = true;
  bool stop_ = false;
  std::thread thread_;
};

struct WorkerResult {
  Latencies ms;
  uint64_t ops = 0;  // RPCs issued (a group cycle counts its 6)
  uint64_t cycles = 0;
};

// One 2-rank cycle between sessions a (rank 0) and b (rank 1).
absl::Status GroupCycle(Client& a, Client& b, const std::string& group, Companion& companion,
                        WorkerResult* res) {
  const absl::Duration kEventWait = absl::Seconds(5);
  const int64_t t0 = NowNs();
  absl::StatusOr<GroupView> view_b = absl::UnknownError("not run");
  int64_t b_ns = 0;
  companion.Start([&] {
    const int64_t s = NowNs();
    view_b = b.joinGroup(JoinFor(group, 1));
    b_ns = NowNs() - s;
  });
  absl::StatusOr<GroupView> view_a = a.joinGroup(JoinFor(group, 0));
  const int64_t a_ns = NowNs() - t0;
  companion.Wait();
  res->ops += 2;
  MC_RETURN_IF_ERROR(CheckView(view_a, group, 0));
  MC_RETURN_IF_ERROR(CheckView(view_b, group, 1));
  res->ms["join"].push_back(Ms(a_ns));
  res->ms["join"].push_back(Ms(b_ns));

  int64_t t = NowNs();
  MC_RETURN_IF_ERROR(a.reportReady(group, 0, true));
  int64_t t2 = NowNs();
  res->ms["report_ready"].push_back(Ms(t2 - t));
  MC_RETURN_IF_ERROR(b.reportReady(group, 1, true));
  t = NowNs();
  res->ms["report_ready"].push_back(Ms(t - t2));
  res->ops += 2;
  MC_RETURN_IF_ERROR(ExpectEvent(a, SessionEvent::Kind::kReady, group, 0, kEventWait));
  MC_RETURN_IF_ERROR(ExpectEvent(b, SessionEvent::Kind::kReady, group, 1, kEventWait));
  res->ms["ready_event"].push_back(Ms(NowNs() - t));

  t = NowNs();
  MC_RETURN_IF_ERROR(a.leaveGroup(group, 0));
  t2 = NowNs();
  res->ms["leave"].push_back(Ms(t2 - t));
  MC_RETURN_IF_ERROR(ExpectEvent(b, SessionEvent::Kind::kLeft, group, 0, kEventWait));
  res->ms["left_event"].push_back(Ms(NowNs() - t2));
  t = NowNs();
  MC_RETURN_IF_ERROR(b.leaveGroup(group, 1));
  res->ms["leave"].push_back(Ms(NowNs() - t));
  res->ops += 2;
  res->ms["group_cycle"].push_back(Ms(NowNs() - t0));
  ++res->cycles;
  return absl::OkStatus();
}

// Closed-loop load on the sessions `mine` until `end_ns`: half Hello, a
// quarter GetNodeInfo, a quarter group cycles.
WorkerResult RunLoadWorker(int w, const std::vector<Client*>& mine, const std::string& instance,
                           int64_t end_ns, Errors* errors) {
  WorkerResult res;
  Companion companion;
  std::mt19937 rng(static_cast<uint32_t>(1000 + w));
  uint64_t seq = 0;
  while (NowNs() < end_ns) {
    const uint32_t dice = rng() % 4;
    const size_t ia = rng() % mine.size();
    Client& a = *mine[ia];
    if (dice <= 1) {
      const int64_t t = NowNs();
      absl::StatusOr<HelloInfo> h = a.hello();
      res.ms["hello"].push_back(Ms(NowNs() - t));
      ++res.ops;
      if (!h.ok()) {
        errors->Add(absl::StrCat("hello: ", h.status().ToString()));
      } else if (h->instance_id != instance) {
        errors->Add(absl::StrCat("hello: instance ", h->instance_id, ", expected ", instance));
      }
    } else if (dice == 2) {
      const int64_t t = NowNs();
      absl::StatusOr<NodeInfo> n = a.nodeInfo();
      res.ms["node_info"].push_back(Ms(NowNs() - t));
      ++res.ops;
      if (!n.ok()) {
        errors->Add(absl::StrCat("nodeInfo: ", n.status().ToString()));
      } else if (n->node_id != "soaknode") {
        errors->Add(absl::StrCat("nodeInfo: node id '", n->node_id, "', expected soaknode"));
      }
    } else {
      size_t ib = rng() % (mine.size() - 1);
      if (ib >= ia) ++ib;
      Client& b = *mine[ib];
      const std::string group = absl::StrCat("soak-w", w, "-", seq++);
      absl::Status s = GroupCycle(a, b, group, companion, &res);
      if (!s.ok()) {
        errors->Add(absl::StrCat("group cycle ", group, ": ", s.ToString()));
        // Best effort, so one failure does not leave the pair's later
        // cycles to trip over this group's leftovers.
        (void)a.leaveGroup(group, 0);
        (void)b.leaveGroup(group, 1);
        while (a.nextEvent(absl::Milliseconds(50))) {
        }
        while (b.nextEvent(absl::Milliseconds(50))) {
        }
        continue;
      }
      for (Client* c : {&a, &b}) {
        if (absl::Status e = ExpectNoEvent(*c, group); !e.ok()) errors->Add(e.ToString());
      }
    }
  }
  return res;
}

// ---------------------------------------------------------------- kills

struct KillResult {
  std::vector<double> lost_ms;      // kill() -> partner's nextEvent returned LOST
  std::vector<double> sessions_ms;  // kill() -> GetStatus shows S sessions and 0 groups
  std::vector<double> join_ms;      // spawn -> both joins returned
};

// One kill cycle with `partner` (rank 0); errors go to `errors`.
void KillCycle(int k, Client& partner, uint32_t sessions, const std::string& socket,
               AdminProbe& admin, std::mt19937& rng, KillResult* res, Errors* errors) {
  const std::string group = absl::StrCat("soak-kill-", k);
  auto fail = [&](const std::string& what) {
    errors->Add(absl::StrCat("kill cycle ", k, ": ", what));
  };
  if (absl::Status e = ExpectNoEvent(partner, "the partner before the kill"); !e.ok()) {
    fail(std::string(e.message()));
  }
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    return fail(absl::StrCat("socketpair: ", std::strerror(errno)));
  }
  const int64_t t0 = NowNs();
  absl::StatusOr<pid_t> pid =
      Spawn({SelfExe(), "--child", "--socket", socket, "--group", group}, SpawnIo{sv[1], 3, ""});
  ::close(sv[1]);
  if (!pid.ok()) {
    ::close(sv[0]);
    return fail(std::string(pid.status().message()));
  }
  absl::Status joined = CheckView(partner.joinGroup(JoinFor(group, 0)), group, 0);
  std::optional<std::string> line = LineReader(sv[0]).Read(30000);
  const int64_t t1 = NowNs();
  bool ok = joined.ok() && line && line->rfind("J 1", 0) == 0;
  if (!ok) {
    fail(absl::StrCat("group did not form: partner ", joined.ToString(), ", child ",
                      line ? *line : "no answer in 30 s"));
  } else {
    res->join_ms.push_back(Ms(t1 - t0));
    // The child's session must be counted before it is killed.
    absl::StatusOr<AdminProbe::Counts> c = admin.Get();
    if (!c.ok() || c->sessions != sessions + 1 || c->groups != 1) {
      fail(c.ok()
               ? absl::StrCat("before the kill the daemon reports ", c->sessions, " sessions and ",
                              c->groups, " groups, expected ", sessions + 1, " and 1")
               : std::string(c.status().message()));
    }
  }
  // A random phase, so no periodic work in the daemon lines up with kills.
  SleepMs(rng() % 20);
  const int64_t killed = NowNs();
  ::kill(*pid, SIGKILL);
  if (ok) {
    absl::Status lost = ExpectEvent(partner, SessionEvent::Kind::kLost, group, 1, absl::Seconds(5));
    if (lost.ok()) {
      res->lost_ms.push_back(Ms(NowNs() - killed));
    } else {
      fail(std::string(lost.message()));
    }
  }
  std::optional<int> st = WaitPid(*pid, 10000);
  ::close(sv[0]);
  if (!st || !WIFSIGNALED(*st) || WTERMSIG(*st) != SIGKILL) {
    fail(st ? absl::StrCat("child exited before the kill (status ", *st, ")")
            : "child not reaped in 10 s");
  }
  if (joined.ok()) {
    if (absl::Status s = partner.leaveGroup(group, 0); !s.ok()) {
      fail(absl::StrCat("partner leaveGroup: ", s.ToString()));
    }
  }
  absl::StatusOr<int64_t> back = admin.WaitFor(sessions, 0, 10000);
  if (back.ok()) {
    res->sessions_ms.push_back(Ms(NowNs() - killed));
  } else {
    fail(std::string(back.status().message()));
  }
}

// ---------------------------------------------------------------- sessions

// Opens `n` sessions one after the other, timing each Client::Connect; stops
// at the first failure (the caller sees fewer than n).
std::vector<std::unique_ptr<Client>> OpenSessions(const std::string& socket, uint32_t n,
                                                  Latencies* ms, Errors* errors) {
  std::vector<std::unique_ptr<Client>> clients;
  clients.reserve(n);
  for (uint32_t i = 0; i < n; ++i) {
    ClientOptions co;
    co.socket_path = socket;
    co.client_name = absl::StrCat("soak_bench session ", i);
    const int64_t t = NowNs();
    absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(co);
    (*ms)["connect"].push_back(Ms(NowNs() - t));
    if (!c.ok()) {
      errors->Add(absl::StrCat("session ", i, " of ", n, ": ", c.status().ToString()));
      break;
    }
    clients.push_back(*std::move(c));
  }
  return clients;
}

void CloseSessions(std::vector<std::unique_ptr<Client>>* clients, Latencies* ms) {
  for (std::unique_ptr<Client>& c : *clients) {
    const int64_t t = NowNs();
    c.reset();
    (*ms)["close"].push_back(Ms(NowNs() - t));
  }
  clients->clear();
}

// ---------------------------------------------------------------- main

struct Options {
  std::string mooncaked;
  std::string out;
  uint32_t sessions = 1000;
  int seconds = 60;
  int workers = 8;
  int kills = 100;
  bool smoke = false;
  // What the daemon keeps after 1000 sessions closed, once its heap is
  // trimmed: gRPC's grown thread pool (stacks, per-thread arenas) and
  // caches, about 8 MiB; a per-session leak would be ~36 KiB x sessions.
  double rss_margin_mib = 10.0;
  int fd_margin = 2;
  // Before the idle, with-sessions and closed readings; the daemon trims its
  // heap about 3 s after it shrank and went quiet (HeapTrimmer).
  int settle_ms = 4000;
  int rounds = 1;  // of open S / hold / close; the first one carries the load and kills
  bool deadlock_detection = false;
};

constexpr char kUsage[] =
    "usage: soak_bench [--sessions S] [--seconds D] [--workers W] [--kills K] [--smoke]\n"
    "                  [--mooncaked PATH] [--out FILE] [--rss-margin-mib M] [--fd-margin N]\n"
    "                  [--rounds R] [--settle-ms MS] [--deadlock-detection]\n"
    "  Starts a private mooncaked (default: next to this binary) on a temporary socket,\n"
    "  opens S sessions (1000), runs D seconds (60) of Hello / GetNodeInfo / 2-rank group\n"
    "  cycles from W threads (8), SIGKILLs K child clients (100) in 2-rank groups with a\n"
    "  held session, closes everything, and samples the daemon's RSS, fds, threads and CPU\n"
    "  every second. --smoke: 50 sessions, 3 s, 5 kills. Exits non-zero on any error or\n"
    "  when RSS (+M MiB, default 4) or fds (+N, default 2) do not return to the idle figures\n"
    "  after the first close. --rounds R adds R-1 rounds of open S / hold / close (a leak\n"
    "  grows with every round); --settle-ms (2000) is the wait before each reading.\n";

absl::Status ParseArgs(int argc, char** argv, Options* o, std::string* child_socket,
                       std::string* child_group, bool* child) {
  o->mooncaked = std::filesystem::path(SelfExe()).parent_path().string() + "/mooncaked";
  bool explicit_size[4] = {false, false, false, false};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> absl::StatusOr<std::string> {
      if (i + 1 >= argc) return absl::InvalidArgumentError(absl::StrCat(a, " needs a value"));
      return std::string(argv[++i]);
    };
    auto number = [&](int64_t lo, int64_t hi) -> absl::StatusOr<int64_t> {
      MC_ASSIGN_OR_RETURN(std::string v, value());
      char* end = nullptr;
      long long n = std::strtoll(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || n < lo || n > hi) {
        return absl::InvalidArgumentError(
            absl::StrCat(a, " takes a number from ", lo, " to ", hi, ", not '", v, "'"));
      }
      return static_cast<int64_t>(n);
    };
    if (a == "--child") {
      *child = true;
    } else if (a == "--smoke") {
      o->smoke = true;
    } else if (a == "--deadlock-detection") {
      o->deadlock_detection = true;
    } else if (a == "--socket") {
      MC_ASSIGN_OR_RETURN(*child_socket, value());
    } else if (a == "--group") {
      MC_ASSIGN_OR_RETURN(*child_group, value());
    } else if (a == "--mooncaked") {
      MC_ASSIGN_OR_RETURN(o->mooncaked, value());
    } else if (a == "--out") {
      MC_ASSIGN_OR_RETURN(o->out, value());
    } else if (a == "--sessions") {
      MC_ASSIGN_OR_RETURN(int64_t n, number(2, 100000));
      o->sessions = static_cast<uint32_t>(n);
      explicit_size[0] = true;
    } else if (a == "--seconds") {
      MC_ASSIGN_OR_RETURN(int64_t n, number(0, 86400));
      o->seconds = static_cast<int>(n);
      explicit_size[1] = true;
    } else if (a == "--workers") {
      MC_ASSIGN_OR_RETURN(int64_t n, number(1, 1024));
      o->workers = static_cast<int>(n);
      explicit_size[2] = true;
    } else if (a == "--kills") {
      MC_ASSIGN_OR_RETURN(int64_t n, number(0, 1000000));
      o->kills = static_cast<int>(n);
      explicit_size[3] = true;
    } else if (a == "--settle-ms") {
      MC_ASSIGN_OR_RETURN(int64_t n, number(0, 3600000));
      o->settle_ms = static_cast<int>(n);
    } else if (a == "--rounds") {
      MC_ASSIGN_OR_RETURN(int64_t n, number(1, 1000));
      o->rounds = static_cast<int>(n);
    } else if (a == "--fd-margin") {
      MC_ASSIGN_OR_RETURN(int64_t n, number(0, 100000));
      o->fd_margin = static_cast<int>(n);
    } else if (a == "--rss-margin-mib") {
      MC_ASSIGN_OR_RETURN(std::string v, value());
      o->rss_margin_mib = std::stod(v);
    } else if (a == "--help" || a == "-h") {
      return absl::CancelledError("help");
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown argument '", a, "'"));
    }
  }
  // --smoke sets the sizes its flags do not.
  if (o->smoke) {
    if (!explicit_size[0]) o->sessions = 50;
    if (!explicit_size[1]) o->seconds = 3;
    if (!explicit_size[3]) o->kills = 5;
  }
  if (o->sessions < 2 * static_cast<uint32_t>(o->workers)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--sessions ", o->sessions, " gives ", o->workers, " workers fewer than 2 sessions each"));
  }
  if (*child && (child_socket->empty() || child_group->empty())) {
    return absl::InvalidArgumentError("--child needs --socket and --group");
  }
  return absl::OkStatus();
}

std::string F1(double v) { return absl::StrFormat("%.1f", v); }
std::string F3(double v) { return absl::StrFormat("%.3f", v); }

int Main(int argc, char** argv) {
  Options o;
  std::string child_socket, child_group;
  bool child = false;
  if (absl::Status s = ParseArgs(argc, argv, &o, &child_socket, &child_group, &child); !s.ok()) {
    if (s.code() != absl::StatusCode::kCancelled)
      std::cerr << "soak_bench: " << s.message() << "\n";
    std::cerr << kUsage;
    return s.code() == absl::StatusCode::kCancelled ? 0 : 64;
  }
  // Debian's Abseil runs the deadlock detector on every absl::Mutex (gRPC's
  // included); with a thousand clients in one process that is the bench's
  // CPU, not the daemon's, so it is off unless asked for (the daemon turns
  // it off for itself).
  if (!o.deadlock_detection) absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  if (child) return RunChild(child_socket, child_group);

  // Each session costs this process one fd (its connection) and gRPC's
  // per-channel wakeup fds.
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &rl);
  }
  ::getrlimit(RLIMIT_NOFILE, &rl);

  char tmpl[] = "/tmp/mc-soak-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) {
    std::cerr << "soak_bench: mkdtemp(/tmp/mc-soak-XXXXXX): " << std::strerror(errno) << "\n";
    return 1;
  }
  const std::string tmp = tmpl;
  auto cleanup = [&tmp] {
    std::error_code ec;
    std::filesystem::remove_all(tmp, ec);
  };
  absl::StatusOr<std::unique_ptr<BenchDaemon>> started =
      BenchDaemon::Start(o.mooncaked, tmp, "soaknode");
  if (!started.ok()) {
    std::cerr << "soak_bench: ERROR " << started.status().message() << " (pass --mooncaked PATH)\n";
    cleanup();
    return 1;
  }
  std::unique_ptr<BenchDaemon> daemon = *std::move(started);
  const pid_t dpid = daemon->pid();
  const std::string socket = daemon->socket();
  std::cerr << absl::StrFormat(
      "soak_bench: mooncaked pid %d on %s; %u sessions, %d s of load from %d workers, %d kills "
      "(RLIMIT_NOFILE %llu)\n",
      dpid, socket, o.sessions, o.seconds, o.workers, o.kills,
      static_cast<unsigned long long>(rl.rlim_cur));

  auto loadavg = [] {
    std::ifstream f("/proc/loadavg");
    std::string a, b, c;
    f >> a >> b >> c;
    return absl::StrCat(a, " ", b, " ", c);
  };
  const std::string load_start = loadavg();
  Errors errors;
  AdminProbe admin(socket);
  if (absl::StatusOr<AdminProbe::Counts> c = admin.Get(); !c.ok()) {
    errors.Add(std::string(c.status().message()));
  }
  Sampler sampler(dpid, &admin);
  Latencies ms;
  auto phase = [&](const std::string& name) {
    sampler.SetPhase(name);
    std::cerr << "soak_bench: phase " << name << "\n";
  };

  // ---- idle
  SleepMs(o.settle_ms);
  const ProcReading idle = ReadProc(dpid);

  // ---- open
  phase("open");
  const int64_t open0 = NowNs();
  std::vector<std::unique_ptr<Client>> clients = OpenSessions(socket, o.sessions, &ms, &errors);
  const double open_s = Ms(NowNs() - open0) / 1000;
  const bool all_open = clients.size() == o.sessions;
  std::string instance;
  if (all_open) {
    instance = clients[0]->instanceId();
    if (absl::StatusOr<int64_t> w = admin.WaitFor(o.sessions, 0, 10000); !w.ok()) {
      errors.Add(absl::StrCat("after opening: ", w.status().message()));
    }
  }

  // ---- sessions (held, idle)
  phase("sessions");
  SleepMs(o.settle_ms);
  const ProcReading with_sessions = ReadProc(dpid);

  // ---- load
  std::vector<WorkerResult> worker_results(static_cast<size_t>(o.workers));
  double load_s = 0;
  ProcReading after_load;
  if (all_open && o.seconds > 0) {
    phase("load");
    const double cpu0 = ReadProc(dpid).cpu_ms;
    const int64_t t0 = NowNs();
    const int64_t end = t0 + static_cast<int64_t>(o.seconds) * 1000000000;
    std::vector<std::thread> threads;
    for (int w = 0; w < o.workers; ++w) {
      std::vector<Client*> mine;
      for (uint32_t i = static_cast<uint32_t>(w); i < o.sessions;
           i += static_cast<uint32_t>(o.workers)) {
        mine.push_back(clients[i].get());
      }
      threads.emplace_back([&, w, mine] {
        worker_results[static_cast<size_t>(w)] = RunLoadWorker(w, mine, instance, end, &errors);
      });
    }
    for (std::thread& t : threads) t.join();
    load_s = Ms(NowNs() - t0) / 1000;
    after_load = ReadProc(dpid);
    after_load.cpu_ms -= cpu0;  // the load phase's daemon CPU
    if (absl::StatusOr<int64_t> w = admin.WaitFor(o.sessions, 0, 10000); !w.ok()) {
      errors.Add(absl::StrCat("after the load: ", w.status().message()));
    }
  }
  uint64_t load_ops = 0, cycles = 0;
  for (const WorkerResult& r : worker_results) {
    Merge(r.ms, &ms);
    load_ops += r.ops;
    cycles += r.cycles;
  }

  // ---- kills
  KillResult kills;
  ProcReading before_kills = ReadProc(dpid), after_kills;
  if (all_open && o.kills > 0) {
    phase("kills");
    std::mt19937 rng(4242);
    for (int k = 0; k < o.kills; ++k) {
      // Spread the partners over the sessions, so that all kinds of
      // neighbours in the daemon's tables are exercised.
      Client& partner = *clients[(static_cast<uint64_t>(k) * 7919) % o.sessions];
      KillCycle(k, partner, o.sessions, socket, admin, rng, &kills, &errors);
    }
    SleepMs(o.settle_ms);
    after_kills = ReadProc(dpid);
  }
  ms["kill_join"] = kills.join_ms;

  // ---- close
  phase("close");
  CloseSessions(&clients, &ms);
  if (absl::StatusOr<int64_t> w = admin.WaitFor(0, 0, 10000); !w.ok()) {
    errors.Add(absl::StrCat("after closing: ", w.status().message()));
  }
  phase("closed");
  SleepMs(o.settle_ms);
  const ProcReading closed = ReadProc(dpid);

  // ---- more rounds of open S, hold, close: memory a leak holds grows with
  // every round, memory the allocator keeps for reuse does not.
  struct Round {
    ProcReading open, closed;
  };
  std::vector<Round> rounds = {{with_sessions, closed}};
  for (int r = 2; r <= o.rounds; ++r) {
    phase(absl::StrCat("round ", r));
    std::vector<std::unique_ptr<Client>> again = OpenSessions(socket, o.sessions, &ms, &errors);
    if (absl::StatusOr<int64_t> w = admin.WaitFor(o.sessions, 0, 10000); !w.ok()) {
      errors.Add(absl::StrCat("round ", r, " after opening: ", w.status().message()));
    }
    SleepMs(o.settle_ms);
    Round round;
    round.open = ReadProc(dpid);
    CloseSessions(&again, &ms);
    if (absl::StatusOr<int64_t> w = admin.WaitFor(0, 0, 10000); !w.ok()) {
      errors.Add(absl::StrCat("round ", r, " after closing: ", w.status().message()));
    }
    phase("closed");
    SleepMs(o.settle_ms);
    round.closed = ReadProc(dpid);
    rounds.push_back(round);
  }
  SleepMs(1100);  // one more sample of the closed daemon
  sampler.Stop();
  std::vector<Sample> series = sampler.series();
  const ProcReading final_reading = ReadProc(dpid);
  const std::string load_end = loadavg();
  std::optional<int> daemon_status = daemon->Stop();
  if (!daemon_status || !WIFEXITED(*daemon_status) || WEXITSTATUS(*daemon_status) != 0) {
    errors.Add(absl::StrCat("mooncaked did not exit cleanly on SIGTERM (wait status ",
                            daemon_status ? std::to_string(*daemon_status) : "none", ")"));
  }
  std::vector<std::string> log_lines;
  {
    std::ifstream f(daemon->log());
    std::string line;
    while (std::getline(f, line)) log_lines.push_back(line);
  }

  // ------------------------------------------------------------ checks
  int64_t peak_kb = 0;
  for (const Sample& s : series) peak_kb = std::max(peak_kb, s.proc.rss_kb);
  for (const ProcReading* r : std::initializer_list<const ProcReading*>{
           &idle, &with_sessions, &after_load, &after_kills, &closed}) {
    peak_kb = std::max(peak_kb, r->rss_kb);
  }
  for (const Round& r : rounds) peak_kb = std::max({peak_kb, r.open.rss_kb, r.closed.rss_kb});
  int peak_fds = 0;
  for (const Sample& s : series) peak_fds = std::max(peak_fds, s.proc.fds);
  std::vector<std::string> failures;
  if (closed.rss_kb > idle.rss_kb + static_cast<int64_t>(o.rss_margin_mib * 1024)) {
    failures.push_back(absl::StrFormat(
        "daemon RSS after every session closed is %.1f MiB, idle was %.1f MiB (margin %.1f MiB)",
        Mib(closed.rss_kb), Mib(idle.rss_kb), o.rss_margin_mib));
  }
  if (closed.fds > idle.fds + o.fd_margin) {
    failures.push_back(
        absl::StrFormat("daemon holds %d fds after every session closed, %d when idle (margin %d)",
                        closed.fds, idle.fds, o.fd_margin));
  }
  if (o.kills > 0 && after_kills.fds > before_kills.fds + o.fd_margin) {
    failures.push_back(absl::StrFormat("daemon holds %d fds after %d kills, %d before (margin %d)",
                                       after_kills.fds, o.kills, before_kills.fds, o.fd_margin));
  }
  if (static_cast<int>(kills.lost_ms.size()) != (all_open ? o.kills : 0)) {
    failures.push_back(
        absl::StrFormat("LOST seen for %zu of %d kills", kills.lost_ms.size(), o.kills));
  }

  // ------------------------------------------------------------ report
  std::ostringstream md;
  md << "### Setup\n\n"
     << o.sessions << " sessions (each a mooncake::Client: own connection and session stream), "
     << o.seconds << " s of load from " << o.workers << " worker threads, " << o.kills
     << " kill cycles; private mooncaked (log level warning), this bench's absl::Mutex deadlock "
        "detection "
     << (o.deadlock_detection ? "on" : "off") << ", " << std::thread::hardware_concurrency()
     << " cores.\n"
     << "Sessions opened in " << F1(open_s) << " s. ";
  if (load_s > 0) {
    md << "Load: " << load_ops << " RPCs (" << F1(static_cast<double>(load_ops) / load_s)
       << "/s) including " << cycles << " group cycles in " << F1(load_s)
       << " s; daemon CPU during the load " << F1(after_load.cpu_ms / (load_s * 1000) * 100)
       << "% of one core.\n\n";
  } else {
    md << "No load phase.\n\n";
  }

  md << "### Latency by operation (ms)\n\n"
     << "| operation | what is timed | count | p50 | p99 | max | mean |\n"
     << "|---|---|---:|---:|---:|---:|---:|\n";
  for (const auto& [kind, what] : OpKinds()) {
    auto it = ms.find(kind);
    if (it == ms.end() || it->second.empty()) continue;
    Stats s = Summarize(it->second);
    md << "| " << kind << " | " << what << " | " << s.n << " | " << F3(s.p50) << " | " << F3(s.p99)
       << " | " << F3(s.max) << " | " << F3(s.mean) << " |\n";
  }
  md << "\n### Kill cycles (SIGKILL of a child in a formed 2-rank group)\n\n"
     << "| what | count | p50 ms | p99 ms | max ms | mean ms |\n|---|---:|---:|---:|---:|---:|\n";
  for (const auto& [what, v] :
       {std::pair<std::string, const std::vector<double>*>{
            "kill() -> partner's nextEvent returns LOST", &kills.lost_ms},
        {"kill() -> GetStatus shows S sessions, 0 groups (partner left first)",
         &kills.sessions_ms}}) {
    Stats s = Summarize(*v);
    md << "| " << what << " | " << s.n << " | " << F3(s.p50) << " | " << F3(s.p99) << " | "
       << F3(s.max) << " | " << F3(s.mean) << " |\n";
  }

  auto row = [&](const std::string& what, const ProcReading& r) {
    md << "| " << what << " | " << (r.rss_kb >= 0 ? F1(Mib(r.rss_kb)) : "n/a") << " | "
       << (r.fds >= 0 ? std::to_string(r.fds) : "n/a") << " | "
       << (r.threads >= 0 ? std::to_string(r.threads) : "n/a") << " |\n";
  };
  md << "\n### Daemon resources\n\n| point | RSS MiB | fds | threads |\n|---|---:|---:|---:|\n";
  row("idle (no session)", idle);
  row(absl::StrCat("with ", o.sessions, " sessions, idle"), with_sessions);
  if (o.seconds > 0) row(absl::StrCat("end of the load (", o.sessions, " sessions)"), after_load);
  if (o.kills > 0) {
    row("before the kills", before_kills);
    row(absl::StrCat("after ", o.kills, " kills"), after_kills);
  }
  row("after every session closed", closed);
  md << "| peak of the 1 s samples | " << F1(Mib(peak_kb)) << " | " << peak_fds << " | |\n"
     << "| VmHWM at the end (kernel's peak RSS) | " << F1(Mib(final_reading.hwm_kb)) << " | | |\n";

  if (rounds.size() > 1) {
    md << "\n### Rounds of open " << o.sessions << " sessions, hold, close (round 1 is the run "
       << "above)\n\n| round | RSS MiB with sessions | RSS MiB after close | fds after close |\n"
       << "|---:|---:|---:|---:|\n";
    for (size_t r = 0; r < rounds.size(); ++r) {
      md << "| " << r + 1 << " | " << F1(Mib(rounds[r].open.rss_kb)) << " | "
         << F1(Mib(rounds[r].closed.rss_kb)) << " | " << rounds[r].closed.fds << " |\n";
    }
  }
  // The targets are in MB (10^6 bytes), the stricter reading.
  auto mb = [](int64_t kb) { return static_cast<double>(kb) * 1024.0 / 1e6; };
  const double idle_mb = mb(idle.rss_kb), peak_mb = mb(peak_kb);
  md << "\n### Targets\n\n| target | measured | verdict |\n|---|---:|---|\n"
     << "| daemon RSS idle <= 30 MB | " << F1(idle_mb) << " MB (" << F1(Mib(idle.rss_kb))
     << " MiB) | " << (idle_mb <= 30 ? "PASS" : "MISS") << " |\n"
     << "| daemon RSS with " << o.sessions << " sessions (peak of the run) <= 64 MB | "
     << F1(peak_mb) << " MB (" << F1(Mib(peak_kb)) << " MiB) | "
     << (peak_mb <= 64 ? "PASS" : "MISS") << " |\n"
     << "| errors = 0 | " << errors.count() << " | " << (errors.count() == 0 ? "PASS" : "FAIL")
     << " |\n"
     << "| RSS after close <= idle + " << F1(o.rss_margin_mib) << " MiB, fds <= idle + "
     << o.fd_margin << " | " << F1(Mib(closed.rss_kb)) << " MiB, " << closed.fds << " fds | "
     << (failures.empty() ? "PASS" : "FAIL") << " |\n";

  md << "\n### Time series (one sample a second; CPU in % of one core over the second)\n\n"
     << "| t s | phase | RSS MiB | fds | threads | CPU % | sessions | groups |\n"
     << "|---:|---|---:|---:|---:|---:|---:|---:|\n";
  for (const Sample& s : series) {
    md << "| " << F1(s.t_s) << " | " << s.phase << " | " << F1(Mib(s.proc.rss_kb)) << " | "
       << s.proc.fds << " | " << s.proc.threads << " | " << (s.cpu_pct >= 0 ? F1(s.cpu_pct) : "n/a")
       << " | " << s.sessions << " | " << s.groups << " |\n";
  }
  md << "\nload average (1/5/15 min) at start: " << load_start << "; at end: " << load_end
     << " (other work on the machine shares its cores)\n";
  md << "\nmooncaked log (level warning): " << log_lines.size() << " lines";
  for (size_t i = 0; i < log_lines.size() && i < 10; ++i) md << "\n    " << log_lines[i];
  md << "\n";
  const uint64_t error_count = errors.count();
  if (error_count > 0) {
    md << "\nERROR: " << error_count << " failed calls or checks; the first ones:\n";
    for (const std::string& e : errors.first()) md << "    " << e << "\n";
  }
  for (const std::string& f : failures) md << "\nERROR: " << f << "\n";

  std::cout << md.str();
  if (!o.out.empty()) {
    std::ofstream f(o.out);
    f << md.str();
    if (!f) std::cerr << "soak_bench: cannot write " << o.out << "\n";
  }
  cleanup();
  return error_count == 0 && failures.empty() ? 0 : 1;
}

}  // namespace
}  // namespace mooncake::bench

int main(int argc, char** argv) { return mooncake::bench::Main(argc, argv); }
