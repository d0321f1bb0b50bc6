#include "bench_support.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "mooncake/common/fd_passing.h"

extern char** environ;

namespace mooncake::bench {

int64_t NowNs() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

void SleepUntilNs(int64_t t) {
  timespec ts{static_cast<time_t>(t / 1000000000), static_cast<long>(t % 1000000000)};
  while (::clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr) == EINTR) {
  }
}

std::string OneLine(std::string s) {
  for (char& c : s) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return s;
}

bool WriteLine(int fd, std::string line) {
  line.push_back('\n');
  size_t off = 0;
  while (off < line.size()) {
    ssize_t n = ::write(fd, line.data() + off, line.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

std::optional<std::string> LineReader::Read(int timeout_ms) {
  int64_t deadline = NowNs() + static_cast<int64_t>(timeout_ms) * 1000000;
  for (;;) {
    size_t nl = buf_.find('\n');
    if (nl != std::string::npos) {
      std::string line = buf_.substr(0, nl);
      buf_.erase(0, nl + 1);
      return line;
    }
    int left = static_cast<int>((deadline - NowNs()) / 1000000);
    if (left < 0) return std::nullopt;
    pollfd p{fd_, POLLIN, 0};
    int rc = ::poll(&p, 1, left);
    if (rc < 0 && errno == EINTR) continue;
    if (rc <= 0) return std::nullopt;
    char tmp[4096];
    ssize_t n = ::read(fd_, tmp, sizeof(tmp));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return std::nullopt;
    buf_.append(tmp, static_cast<size_t>(n));
  }
}

absl::StatusOr<pid_t> Spawn(const std::vector<std::string>& argv, const SpawnIo& io) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (io.child_fd >= 0) posix_spawn_file_actions_adddup2(&fa, io.child_fd, io.target_fd);
  if (!io.stdout_path.empty()) {
    posix_spawn_file_actions_addopen(&fa, 1, io.stdout_path.c_str(), O_WRONLY | O_CREAT | O_APPEND,
                                     0600);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
  }
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  int rc = ::posix_spawn(&pid, args[0], &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) {
    return absl::InternalError(absl::StrCat("posix_spawn(", argv[0], "): ", std::strerror(rc)));
  }
  return pid;
}

std::optional<int> WaitPid(pid_t pid, int timeout_ms) {
  int64_t deadline = NowNs() + static_cast<int64_t>(timeout_ms) * 1000000;
  for (;;) {
    int st = 0;
    pid_t r = ::waitpid(pid, &st, WNOHANG);
    if (r == pid) return st;
    if (r < 0 && errno != EINTR) return std::nullopt;
    if (NowNs() >= deadline) return std::nullopt;
    ::usleep(1000);
  }
}

std::string SelfExe() {
  std::error_code ec;
  std::filesystem::path p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : p.string();
}

absl::StatusOr<std::unique_ptr<BenchDaemon>> BenchDaemon::Start(
    const std::string& binary, const std::string& dir, const std::string& node_id,
    const std::vector<std::string>& extra_args) {
  auto d = std::unique_ptr<BenchDaemon>(new BenchDaemon());
  d->socket_ = dir + "/mooncaked.sock";
  d->log_ = dir + "/mooncaked.log";
  SpawnIo io;
  io.stdout_path = d->log_;
  std::vector<std::string> argv = {binary,  "--socket",    d->socket_, "--node-id",
                                   node_id, "--log-level", "warning"};
  argv.insert(argv.end(), extra_args.begin(), extra_args.end());
  absl::StatusOr<pid_t> pid = Spawn(argv, io);
  if (!pid.ok()) return pid.status();
  d->pid_ = *pid;
  int64_t deadline = NowNs() + 20LL * 1000000000;
  while (NowNs() < deadline) {
    if (ConnectUnix(d->socket_).ok()) return d;
    if (WaitPid(d->pid_, 0)) {
      d->pid_ = -1;
      break;
    }
    ::usleep(10000);
  }
  return absl::UnavailableError(
      absl::StrCat(binary, " did not start serving ", d->socket_, " within 20 s; see ", d->log_));
}

std::optional<int> BenchDaemon::Stop(int signal) {
  if (pid_ <= 0) return std::nullopt;
  ::kill(pid_, signal);
  std::optional<int> st = WaitPid(pid_, 10000);
  if (!st) {
    ::kill(pid_, SIGKILL);
    st = WaitPid(pid_, 10000);
  }
  pid_ = -1;
  return st;
}

Stats Summarize(std::vector<double> v) {
  Stats s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  auto pct = [&](double q) {
    size_t idx = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size())));
    return v[std::min(v.size() - 1, idx == 0 ? 0 : idx - 1)];
  };
  s.n = v.size();
  s.p50 = pct(0.50);
  s.p99 = pct(0.99);
  s.min = v.front();
  s.max = v.back();
  double sum = 0;
  for (double x : v) sum += x;
  s.mean = sum / static_cast<double>(v.size());
  return s;
}

}  // namespace mooncake::bench
