// What the CPU benchmarks share: a monotonic clock, line I/O with child
// processes, posix_spawn (the benches run gRPC threads, so they never
// fork), a private mooncaked for the run, and nearest-rank statistics.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace mooncake::bench {

int64_t NowNs();  // CLOCK_MONOTONIC
void SleepUntilNs(int64_t t);
inline double Ms(int64_t ns) { return static_cast<double>(ns) / 1e6; }
// `s` with newlines turned into spaces, for one-line reports.
std::string OneLine(std::string s);

// Writes `line` and '\n' in full; false on error.
bool WriteLine(int fd, std::string line);

class LineReader {
 public:
  explicit LineReader(int fd) : fd_(fd) {}
  // Next line without '\n'; nullopt on EOF, error or timeout.
  std::optional<std::string> Read(int timeout_ms);

 private:
  int fd_;
  std::string buf_;
};

struct SpawnIo {
  int child_fd = -1;  // dup2'ed to target_fd in the child
  int target_fd = 3;
  std::string stdout_path;  // stdout and stderr appended there; "" = inherit
};
absl::StatusOr<pid_t> Spawn(const std::vector<std::string>& argv, const SpawnIo& io);
// Waits for `pid` up to timeout_ms; returns the wait status, or nullopt.
std::optional<int> WaitPid(pid_t pid, int timeout_ms);
std::string SelfExe();

// mooncaked started for the run on <dir>/mooncaked.sock (log level warning,
// log in <dir>/mooncaked.log); stopped (SIGTERM, then SIGKILL) on exit.
class BenchDaemon {
 public:
  // `extra_args` go after the daemon's own (e.g. --etcd URL --peer-listen A).
  static absl::StatusOr<std::unique_ptr<BenchDaemon>> Start(
      const std::string& binary, const std::string& dir, const std::string& node_id,
      const std::vector<std::string>& extra_args = {});
  ~BenchDaemon() { Stop(); }
  const std::string& socket() const { return socket_; }
  const std::string& log() const { return log_; }
  pid_t pid() const { return pid_; }
  // Sends `signal` (SIGTERM, then SIGKILL after 10 s) and reaps; the
  // daemon's wait status (nullopt when it was not running).
  std::optional<int> Stop(int signal = SIGTERM);

 private:
  BenchDaemon() = default;
  std::string socket_, log_;
  pid_t pid_ = -1;
};

struct Stats {
  double p50 = 0, p99 = 0, min = 0, max = 0, mean = 0;
  size_t n = 0;
};
// Nearest-rank percentiles: with 15 samples p99 is the maximum, which is
// the honest reading of so few samples.
Stats Summarize(std::vector<double> v);

}  // namespace mooncake::bench
