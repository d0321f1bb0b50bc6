// Test support: a real mooncaked process on a temporary socket, and child
// processes of helper binaries. Everything is cleaned up in destructors
// (children killed and reaped, temp dirs removed) so a failing test never
// leaves a daemon behind or hangs CI.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace mooncake::testing {

// Folder with the built binaries (mooncaked, mcctl, test helpers).
std::string BinDir();

// A copy of `binary` (one of the build's) that any uid can execute, for
// command lines another uid runs through a shell. Child::Spawn stages
// argv[0] by itself.
std::string StagedForOtherUids(const std::string& binary);

class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A child process with its stdout captured through a pipe.
class Child {
 public:
  Child() = default;
  // argv[0] is a path. `uid` >= 0: drop to that uid/gid before exec, and
  // run a copy of argv[0] staged where any uid can reach it (so the test
  // passes wherever the tree is cloned).
  static Child Spawn(const std::vector<std::string>& argv, int uid = -1,
                     const std::vector<std::string>& env = {});
  Child(Child&& o) noexcept;
  Child& operator=(Child&& o) noexcept;
  ~Child();

  pid_t pid() const { return pid_; }
  // Reads stdout until a line containing `needle` appears (returns that
  // line) or the timeout passes (returns ""). Everything read is kept.
  std::string WaitForLine(const std::string& needle, int timeout_ms);
  const std::string& output() const { return out_; }
  // Waits for exit; returns the exit code, 128+signal, or -1 on timeout.
  int Wait(int timeout_ms);
  void Kill(int sig);
  void CloseStdin();

 private:
  void Drain(int timeout_ms);
  pid_t pid_ = -1;
  int out_fd_ = -1;
  int in_fd_ = -1;
  std::string out_;
  size_t scanned_ = 0;
  int status_ = -1;
};

class DaemonProcess {
 public:
  // Starts mooncaked on <dir>/mooncaked.sock and waits until it answers.
  // `log_to_output`: the daemon's log (stderr) goes to child().output()
  // too, for tests that read what it logged.
  explicit DaemonProcess(const std::string& dir, std::vector<std::string> extra_args = {},
                         bool log_to_output = false);
  ~DaemonProcess();
  const std::string& socket() const { return socket_; }
  bool running() const;
  // SIGTERM and wait; returns the exit code.
  int Stop(int sig = 15);
  Child& child() { return child_; }

 private:
  std::string socket_;
  Child child_;
};

}  // namespace mooncake::testing
