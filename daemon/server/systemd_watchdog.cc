#include "server/systemd_watchdog.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "mooncake/common/log.h"
#include "mooncake/v1/admin.grpc.pb.h"
#include "server/daemon.h"

namespace mooncake::daemon {

absl::Duration WatchdogInterval() {
  const char* usec = std::getenv("WATCHDOG_USEC");
  uint64_t value = 0;
  if (usec == nullptr || !absl::SimpleAtoi(usec, &value) || value == 0) return absl::ZeroDuration();
  if (const char* pid = std::getenv("WATCHDOG_PID"); pid != nullptr) {
    int64_t p = 0;
    // Meant for another process (e.g. inherited from the service's main
    // process by a child).
    if (!absl::SimpleAtoi(pid, &p) || p != static_cast<int64_t>(::getpid())) {
      return absl::ZeroDuration();
    }
  }
  return absl::Microseconds(static_cast<int64_t>(value));
}

SelfCheck::SelfCheck(std::string socket_path, std::string instance_id, absl::Duration timeout)
    : socket_path_(std::move(socket_path)),
      instance_id_(std::move(instance_id)),
      timeout_(timeout) {}

absl::Status SelfCheck::Run() const {
  // A channel of its own (local subchannel pool): every check makes a new
  // connection, through the accept path clients take.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  auto channel =
      grpc::CreateCustomChannel("unix:" + socket_path_, grpc::InsecureChannelCredentials(), args);
  auto stub = v1::Admin::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout_));
  ctx.set_wait_for_ready(false);
  v1::DaemonStatus status;
  grpc::Status s = stub->GetStatus(&ctx, v1::GetStatusRequest(), &status);
  if (!s.ok()) {
    return absl::UnavailableError(absl::StrCat("self-check: Admin/GetStatus over ", socket_path_,
                                               " failed: ", s.error_message()));
  }
  if (status.pid() != static_cast<int32_t>(::getpid()) || status.instance_id() != instance_id_) {
    return absl::FailedPreconditionError(
        absl::StrCat("self-check: ", socket_path_, " is served by another daemon (pid ",
                     status.pid(), ", instance ", status.instance_id(), ")"));
  }
  return absl::OkStatus();
}

WatchdogPinger::WatchdogPinger(absl::Duration interval, std::function<absl::Status()> check)
    : period_(interval / 2), check_(std::move(check)) {
  thread_ = std::thread([this] { Loop(); });
}

WatchdogPinger::~WatchdogPinger() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void WatchdogPinger::Loop() {
  bool failing = false;
  for (;;) {
    // Periods are counted from the start of each check, so a slow check
    // does not stretch the interval between pings.
    const auto next = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(period_);
    absl::Status s = check_();
    if (s.ok()) {
      if (failing) MC_LOG(kInfo, "watchdog: self-check passes again");
      failing = false;
      NotifySystemd("WATCHDOG=1");
    } else if (!failing) {
      failing = true;
      MC_LOG(kWarning, "watchdog: ", s.message(),
             "; not pinging systemd, which restarts the daemon when WatchdogSec= passes");
    }
    std::unique_lock<std::mutex> lock(mu_);
    if (cv_.wait_until(lock, next, [this] { return stop_; })) return;
  }
}

}  // namespace mooncake::daemon
