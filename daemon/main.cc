// mooncaked: the per-node broker for GPU-initiated communication.
#include <malloc.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>

#include "absl/synchronization/mutex.h"
#include "admission/rate_limited_log.h"
#include "config/daemon_config.h"
#include "google/protobuf/stubs/logging.h"
#include "mooncake/common/log.h"
#include "mooncake/common/version.h"
#include "server/daemon.h"
#include "server/systemd_watchdog.h"

namespace {

// protobuf logs each unparsable string field (invalid UTF-8) to stderr as
// it rejects the request; a client sending them in a loop would flood the
// journal. The request itself is answered INVALID_ARGUMENT (RpcInterceptor).
void LogProtobufRateLimited(google::protobuf::LogLevel level, const char*, int,
                            const std::string& message) {
  static mooncake::daemon::RateLimitedLog limited(absl::Seconds(10));
  limited.Log(level >= google::protobuf::LOGLEVEL_ERROR ? mooncake::LogLevel::kWarning
                                                        : mooncake::LogLevel::kDebug,
              absl::StrCat("protobuf: ", message));
}

}  // namespace

int main(int argc, char** argv) {
  using namespace mooncake::daemon;
  // softnic's cross-node batches (up to 8 MiB each, in 1 MiB pieces) come
  // and go all the time: with glibc's defaults each one was mmapped or
  // grown at the heap's top and given back, and refaulted page by page
  // (most of the daemon's CPU in a long WRITE). Keep up to 8 MiB of freed
  // heap per arena for reuse, in at most 4 arenas (gRPC's threads would
  // each take one): heap growth stays within 64 MiB (peer_forgery_test's
  // 2 GiB WRITE); HeapTrimmer returns the rest once traffic stops.
  ::mallopt(M_MMAP_THRESHOLD, 8 << 20);
  ::mallopt(M_TRIM_THRESHOLD, 8 << 20);
  ::mallopt(M_ARENA_MAX, 4);
  bool help = false, version = false;
  absl::StatusOr<DaemonConfig> config = ParseCommandLine(argc, argv, &help, &version);
  if (!config.ok()) {
    std::cerr << "mooncaked: " << config.status().message() << "\n";
    return 64;
  }
  if (help) {
    std::cout << UsageText();
    return 0;
  }
  if (version) {
    std::cout << "mooncaked " << mooncake::kMooncakeVersion << " (protocol "
              << mooncake::kProtocolVersion << ")\n";
    return 0;
  }
  mooncake::SetLogLevel(config->log_level);
  google::protobuf::SetLogHandler(&LogProtobufRateLimited);
  // Debian's Abseil checks lock order on every mutex operation (gRPC's
  // too); the daemon's locks are simple and covered by tests, so skip it.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);

  // Block the stop signals in every thread; the main thread waits for them.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  const std::string socket_path = config->socket;
  absl::StatusOr<std::unique_ptr<Daemon>> daemon = Daemon::Create(*std::move(config));
  if (!daemon.ok()) {
    std::cerr << "mooncaked: " << daemon.status().message() << "\n";
    return 1;
  }
  if (absl::Status s = (*daemon)->Start(); !s.ok()) {
    std::cerr << "mooncaked: " << s.message() << "\n";
    (*daemon)->Shutdown("start failed");
    return 1;
  }
  // WatchdogSec= in the unit: ping systemd while a self-check through our
  // own socket passes (server/systemd_watchdog.h).
  std::unique_ptr<WatchdogPinger> watchdog;
  if (absl::Duration interval = WatchdogInterval(); interval > absl::ZeroDuration()) {
    auto check = std::make_shared<SelfCheck>(socket_path, (*daemon)->node().instance_id,
                                             std::max(interval / 4, absl::Milliseconds(100)));
    watchdog = std::make_unique<WatchdogPinger>(interval, [check] { return check->Run(); });
    MC_LOG(kInfo, "systemd watchdog every ", absl::FormatDuration(interval),
           ": self-check and ping every ", absl::FormatDuration(interval / 2));
  }
  int sig = 0;
  for (;;) {
    sigwait(&stop, &sig);
    if (sig != SIGHUP) break;
    // SIGHUP re-reads the tenant span policy, the one setting that changes
    // in place (a restart would end every session on the node).
    if (absl::Status s = (*daemon)->ReloadTenantPolicy(); !s.ok()) {
      MC_LOG(kError, "SIGHUP: the tenant policy in force stays: ", s.message());
    }
  }
  watchdog.reset();  // no self-check against a daemon that is shutting down
  (*daemon)->Shutdown(sig == SIGTERM ? "SIGTERM" : "SIGINT");
  return 0;
}
