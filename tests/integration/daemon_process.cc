#include "daemon_process.h"

#include <fcntl.h>
#include <grp.h>
#include <grpcpp/grpcpp.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <thread>

#include "mooncake/common/fd_passing.h"
#include "mooncake/v1/local.grpc.pb.h"

namespace mooncake::testing {

std::string BinDir() {
  const char* d = std::getenv("MOONCAKE_BIN_DIR");
  if (d != nullptr && *d != '\0') return d;
  return MOONCAKE_TEST_BIN_DIR;
}

TempDir::TempDir() {
  char tmpl[] = "/tmp/mctest-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = tmpl;
  // Other uids (the permission test's "nobody") must reach the socket.
  ::chmod(path_.c_str(), 0755);
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

namespace {

// Binaries another uid runs, copied where that uid can reach them: the
// checkout may sit under a directory only its owner can traverse (a clone
// in a `mktemp -d` folder). The build's shared libraries come along, found
// through LD_LIBRARY_PATH when the binary's RPATH is unreachable. Removed
// when the test process exits.
class StagingDir {
 public:
  StagingDir() {
    char tmpl[] = "/tmp/mcstage-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
    ::chmod(path_.c_str(), 0755);
    std::error_code ec;
    std::filesystem::path lib = std::filesystem::path(BinDir()).parent_path() / "lib";
    std::filesystem::create_directory(path_ + "/lib", ec);
    ::chmod((path_ + "/lib").c_str(), 0755);
    if (std::filesystem::is_directory(lib, ec)) {
      for (const auto& e : std::filesystem::directory_iterator(lib, ec)) {
        if (e.path().filename().string().find(".so") == std::string::npos) continue;
        std::filesystem::copy(e.path(), path_ + "/lib/" + e.path().filename().string(),
                              std::filesystem::copy_options::copy_symlinks |
                                  std::filesystem::copy_options::overwrite_existing,
                              ec);
      }
    }
  }
  ~StagingDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  // The staged copy of `binary` (made once), world-executable.
  std::string Stage(const std::string& binary) {
    std::string dst = path_ + "/" + std::filesystem::path(binary).filename().string();
    std::error_code ec;
    if (!std::filesystem::exists(dst, ec)) {
      std::filesystem::copy_file(binary, dst, ec);
      ::chmod(dst.c_str(), 0755);
    }
    return dst;
  }
  std::string lib() const { return path_ + "/lib"; }

 private:
  std::string path_;
};

StagingDir& Staging() {
  static StagingDir dir;
  return dir;
}

}  // namespace

std::string StagedForOtherUids(const std::string& binary) { return Staging().Stage(binary); }

Child Child::Spawn(const std::vector<std::string>& original_argv, int uid,
                   const std::vector<std::string>& original_env) {
  std::vector<std::string> argv = original_argv;
  std::vector<std::string> env = original_env;
  if (uid >= 0 && !argv.empty()) {
    // Only the build's own binaries; system ones (/bin/sh) are reachable.
    if (argv[0].rfind(BinDir() + "/", 0) == 0) argv[0] = Staging().Stage(argv[0]);
    env.push_back("LD_LIBRARY_PATH=" + Staging().lib());
  }
  int out[2], in[2];
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(in, O_CLOEXEC) != 0) {
    throw std::runtime_error("pipe2 failed");
  }
  pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    // Child: only async-signal-safe calls until exec.
    ::dup2(out[1], 1);
    ::dup2(in[0], 0);
    if (uid >= 0) {
      gid_t gid = static_cast<gid_t>(uid);
      if (::setgroups(0, nullptr) != 0 || ::setgid(gid) != 0 ||
          ::setuid(static_cast<uid_t>(uid)) != 0) {
        ::_exit(126);
      }
    }
    for (const std::string& e : env) ::putenv(const_cast<char*>(e.c_str()));
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  ::close(out[1]);
  ::close(in[0]);
  Child c;
  c.pid_ = pid;
  c.out_fd_ = out[0];
  c.in_fd_ = in[1];
  return c;
}

Child::Child(Child&& o) noexcept { *this = std::move(o); }

Child& Child::operator=(Child&& o) noexcept {
  std::swap(pid_, o.pid_);
  std::swap(out_fd_, o.out_fd_);
  std::swap(in_fd_, o.in_fd_);
  std::swap(out_, o.out_);
  std::swap(scanned_, o.scanned_);
  std::swap(status_, o.status_);
  return *this;
}

Child::~Child() {
  if (pid_ > 0 && status_ < 0) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  if (out_fd_ >= 0) ::close(out_fd_);
  if (in_fd_ >= 0) ::close(in_fd_);
}

void Child::Drain(int timeout_ms) {
  if (out_fd_ < 0) return;
  pollfd p{out_fd_, POLLIN, 0};
  if (::poll(&p, 1, timeout_ms) <= 0) return;
  char buf[4096];
  ssize_t n = ::read(out_fd_, buf, sizeof(buf));
  if (n > 0) {
    out_.append(buf, static_cast<size_t>(n));
  } else {
    ::close(out_fd_);
    out_fd_ = -1;
  }
}

std::string Child::WaitForLine(const std::string& needle, int timeout_ms) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    size_t pos = out_.find(needle, scanned_);
    if (pos != std::string::npos) {
      size_t start = out_.rfind('\n', pos);
      start = start == std::string::npos ? 0 : start + 1;
      size_t end = out_.find('\n', pos);
      if (end != std::string::npos) {
        scanned_ = end + 1;
        return out_.substr(start, end - start);
      }
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0 || out_fd_ < 0) {
      // One last look: the line may have arrived with the final read.
      size_t p2 = out_.find(needle, scanned_);
      if (p2 != std::string::npos) {
        scanned_ = out_.size();
        return out_.substr(p2);
      }
      return "";
    }
    Drain(static_cast<int>(left.count()));
  }
}

int Child::Wait(int timeout_ms) {
  if (pid_ <= 0) return -1;
  if (status_ >= 0) return status_;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    int st = 0;
    pid_t r = ::waitpid(pid_, &st, WNOHANG);
    if (r == pid_) {
      status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      while (out_fd_ >= 0) Drain(100);
      return status_;
    }
    if (std::chrono::steady_clock::now() >= deadline) return -1;
    Drain(20);
  }
}

void Child::Kill(int sig) {
  if (pid_ > 0 && status_ < 0) ::kill(pid_, sig);
}

void Child::CloseStdin() {
  if (in_fd_ >= 0) {
    ::close(in_fd_);
    in_fd_ = -1;
  }
}

DaemonProcess::DaemonProcess(const std::string& dir, std::vector<std::string> extra_args,
                             bool log_to_output)
    : socket_(dir + "/mooncaked.sock") {
  std::vector<std::string> argv = {
      BinDir() + "/mooncaked", "--socket", socket_, "--node-id", "testnode",
      "--log-level",           "warning"};
  argv.insert(argv.end(), extra_args.begin(), extra_args.end());
  if (log_to_output) {
    // exec: the shell becomes the daemon, so signals and the pid are its.
    argv.insert(argv.begin(), {"/bin/sh", "-c", "exec \"$0\" \"$@\" 2>&1"});
  }
  child_ = Child::Spawn(argv);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline) {
    // The socket is bound before the daemon serves (and before its peer
    // port opens): wait for an answered RPC, not a connect.
    if (ConnectUnix(socket_).ok()) {
      auto stub = v1::Local::NewStub(
          grpc::CreateChannel("unix:" + socket_, grpc::InsecureChannelCredentials()));
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
      v1::HelloResponse resp;
      if (stub->Hello(&ctx, v1::HelloRequest(), &resp).ok()) return;
    }
    if (child_.Wait(0) >= 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  throw std::runtime_error("mooncaked did not start on " + socket_ + ": " + child_.output());
}

DaemonProcess::~DaemonProcess() { Stop(SIGKILL); }

bool DaemonProcess::running() const { return ConnectUnix(socket_).ok(); }

int DaemonProcess::Stop(int sig) {
  child_.Kill(sig);
  return child_.Wait(10000);
}

}  // namespace mooncake::testing
