// The systemd service watchdog (WatchdogSec= in mooncaked.service): while
// the daemon is healthy it sends WATCHDOG=1 to $NOTIFY_SOCKET at half the
// interval systemd asked for; when it stops, systemd kills the daemon
// (SIGABRT) and Restart=on-failure starts a new one.
//
// "Healthy" is proven, not assumed: before each ping, a SelfCheck connects
// to the daemon's own socket as any client would — a new connection, so the
// accept loop, the SO_PEERCRED handshake and admission are exercised — and
// calls Admin/GetStatus, which takes the connection table, session
// registry and group broker locks. It checks the answer came from this
// process (pid and instance id), not from another daemon on the same path.
// A daemon whose accept thread died, whose gRPC threads are stuck, or which
// deadlocked on one of those locks, or whose socket was removed, stops
// pinging.
//
//   absl::Duration interval = WatchdogInterval();          // 0: not asked
//   SelfCheck check(socket_path, instance_id);
//   WatchdogPinger pinger(interval, [&] { return check.Run(); });
//
// Thread-safety: WatchdogPinger runs the check and the pings on its own
// thread; destroy it before the daemon shuts down.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace mooncake::daemon {

// The watchdog interval systemd set for this process: $WATCHDOG_USEC, when
// $WATCHDOG_PID is unset or names this process (as sd_watchdog_enabled(3)
// reads them). Zero when there is none or the values are malformed.
absl::Duration WatchdogInterval();

// One health check through the daemon's own socket (see above). `timeout`
// bounds the whole call.
class SelfCheck {
 public:
  SelfCheck(std::string socket_path, std::string instance_id, absl::Duration timeout);
  absl::Status Run() const;

 private:
  const std::string socket_path_;
  const std::string instance_id_;
  const absl::Duration timeout_;
};

// Every interval / 2: runs `check`, and sends WATCHDOG=1 when it succeeds.
// A failure is logged once per run of failures (a warning, with the check's
// message), and no ping is sent.
class WatchdogPinger {
 public:
  WatchdogPinger(absl::Duration interval, std::function<absl::Status()> check);
  ~WatchdogPinger();
  WatchdogPinger(const WatchdogPinger&) = delete;
  WatchdogPinger& operator=(const WatchdogPinger&) = delete;

 private:
  void Loop();

  const absl::Duration period_;
  const std::function<absl::Status()> check_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace mooncake::daemon
