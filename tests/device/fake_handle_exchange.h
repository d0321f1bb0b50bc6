// HandleExchange fakes for the device tests: they really move file
// descriptors (dup within a process, SCM_RIGHTS between processes), so the
// transports under test map what they would map in production.
#pragma once

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "mooncake/common/fd_passing.h"
#include "mooncake/common/status.h"
#include "mooncake/common/unique_fd.h"
#include "mooncake/device/device_transport.h"

namespace mooncake {
namespace device {
namespace testing {

inline absl::StatusOr<UniqueFd> DupFd(int fd) {
  int d = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (d < 0) return ErrnoStatus(errno, "fcntl(F_DUPFD_CLOEXEC)");
  return UniqueFd(d);
}

// Shared by every "rank" of one process: export keeps duplicates of the fds,
// import hands out fresh duplicates, as the daemon would.
class InProcessHandleExchange final : public HandleExchange {
 public:
  absl::StatusOr<std::string> exportFds(const std::vector<int>& fds, std::string_view kind,
                                        uint64_t size) override {
    if (fds.empty()) return absl::InvalidArgumentError("exportFds: no fds");
    std::vector<UniqueFd> kept;
    for (int fd : fds) {
      MC_ASSIGN_OR_RETURN(UniqueFd d, DupFd(fd));
      kept.push_back(std::move(d));
    }
    std::lock_guard<std::mutex> lock(mu_);
    std::string name = absl::StrCat("inproc:", next_++, ":", std::string(kind), ":", size);
    exports_[name] = std::move(kept);
    ++export_calls;
    return name;
  }

  absl::StatusOr<std::vector<UniqueFd>> importFds(std::string_view exported) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = exports_.find(std::string(exported));
    if (it == exports_.end()) {
      return absl::NotFoundError(
          absl::StrCat("importFds: no export named '", std::string(exported), "'"));
    }
    std::vector<UniqueFd> out;
    for (const auto& fd : it->second) {
      MC_ASSIGN_OR_RETURN(UniqueFd d, DupFd(fd.get()));
      out.push_back(std::move(d));
    }
    ++import_calls;
    return out;
  }

  std::atomic<int> export_calls{0};
  std::atomic<int> import_calls{0};

 private:
  std::mutex mu_;
  uint64_t next_ = 1;
  std::map<std::string, std::vector<UniqueFd>> exports_;
};

// One end of a two-process exchange over socketpairs. Exports stay in this
// process; a server thread answers the other process's requests on
// `serve_sock` with SCM_RIGHTS; importFds asks the other process over
// `request_sock`. Built after fork(), one per process.
class SocketHandleExchange final : public HandleExchange {
 public:
  SocketHandleExchange(UniqueFd serve_sock, UniqueFd request_sock)
      : serve_(std::move(serve_sock)), request_(std::move(request_sock)) {
    server_ = std::thread([this] { Serve(); });
  }
  ~SocketHandleExchange() override {
    ::shutdown(serve_.get(), SHUT_RDWR);
    server_.join();
  }

  absl::StatusOr<std::string> exportFds(const std::vector<int>& fds, std::string_view kind,
                                        uint64_t size) override {
    if (fds.empty()) return absl::InvalidArgumentError("exportFds: no fds");
    std::vector<UniqueFd> kept;
    for (int fd : fds) {
      MC_ASSIGN_OR_RETURN(UniqueFd d, DupFd(fd));
      kept.push_back(std::move(d));
    }
    std::lock_guard<std::mutex> lock(mu_);
    std::string name =
        absl::StrCat("sock:", ::getpid(), ":", next_++, ":", std::string(kind), ":", size);
    exports_[name] = std::move(kept);
    return name;
  }

  absl::StatusOr<std::vector<UniqueFd>> importFds(std::string_view exported) override {
    std::lock_guard<std::mutex> lock(request_mu_);
    MC_RETURN_IF_ERROR(SendFrame(request_.get(), std::string(exported), {}));
    MC_ASSIGN_OR_RETURN(Frame reply, RecvFrame(request_.get()));
    if (reply.payload != "ok") return absl::NotFoundError(reply.payload);
    return std::move(reply.fds);
  }

 private:
  void Serve() {
    for (;;) {
      auto req = RecvFrame(serve_.get(), absl::Hours(1));
      if (!req.ok()) return;  // peer gone or we are shutting down
      std::vector<int> fds;
      std::string answer = "ok";
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = exports_.find(req->payload);
        if (it == exports_.end()) {
          answer =
              absl::StrCat("importFds: no export named '", req->payload, "' in pid ", ::getpid());
        } else {
          for (const auto& fd : it->second) fds.push_back(fd.get());
        }
      }
      if (!SendFrame(serve_.get(), answer, fds).ok()) return;
    }
  }

  UniqueFd serve_;
  UniqueFd request_;
  std::thread server_;
  std::mutex mu_;
  std::mutex request_mu_;
  uint64_t next_ = 1;
  std::map<std::string, std::vector<UniqueFd>> exports_;
};

}  // namespace testing
}  // namespace device
}  // namespace mooncake
