// Test support for the etcd client: a real etcd server (Debian's
// etcd-server package) on 127.0.0.1 at free ports, in a temporary data
// directory, and a TCP proxy that can be cut to make an endpoint die.
// Plaintext by default; UseTls before Start makes it serve TLS and require
// client certificates (etcd --client-cert-auth).
//
// The server is always cleaned up: the destructor kills and reaps etcd and
// removes its directory, and etcd gets SIGKILL if the test process dies
// first (PR_SET_PDEATHSIG), so a failing test never leaves one behind.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace mooncake::daemon::etcd::testing {

// The etcd binary: $MOONCAKE_ETCD_BIN, else /usr/bin/etcd.
std::string EtcdBinary();

// A TCP port on 127.0.0.1 that nothing listened on a moment ago.
int PickFreePort();

// PEM files for EtcdTestServer::UseTls (tests/daemon/test_certs.h makes them).
struct EtcdTlsFiles {
  std::string ca_file;    // signed cert_file; client certificates must be of this CA
  std::string cert_file;  // the server's certificate, for IP:127.0.0.1
  std::string key_file;
};

class EtcdTestServer {
 public:
  // Makes the data directory and picks ports; starts nothing.
  EtcdTestServer();
  ~EtcdTestServer();
  EtcdTestServer(const EtcdTestServer&) = delete;
  EtcdTestServer& operator=(const EtcdTestServer&) = delete;

  // Starts etcd and waits (10 s at most) until Maintenance/Status answers
  // with a leader. FailedPrecondition when the binary is missing (the
  // message says to run deploy/install-deps.sh); Unavailable with the tail
  // of etcd's log when it exits or never answers.
  absl::Status Start();
  // Before the first Start: serve the client URL over TLS with
  // files.cert_file and refuse clients without a certificate of
  // files.ca_file (--client-cert-auth). Start's readiness probe connects
  // with files.cert_file as its client certificate (it has no extended key
  // usage, so it is both).
  void UseTls(EtcdTlsFiles files) { tls_ = std::move(files); }
  bool tls() const { return !tls_.cert_file.empty(); }
  // Sends `signal`, waits (5 s, then SIGKILL) and reaps.
  void Stop(int signal = SIGTERM);
  // Stop, then Start on the same ports and data directory.
  absl::Status Restart();
  bool running() const { return pid_ > 0; }

  int client_port() const { return client_port_; }
  std::string client_url() const;  // http://127.0.0.1:<port>; https:// with UseTls
  // The end of etcd's log (stdout and stderr), for failure messages.
  std::string LogTail(size_t bytes = 3000) const;

 private:
  absl::Status Spawn();
  absl::Status AwaitReady();

  std::string dir_;
  int client_port_ = 0;
  int peer_port_ = 0;
  pid_t pid_ = -1;
  bool ever_started_ = false;
  EtcdTlsFiles tls_;
};

// Forwards connections from 127.0.0.1:port() to 127.0.0.1:<upstream>, one
// thread per connection, until Close().
class TcpProxy {
 public:
  // listen_port 0: a free one. A port given may be one a closed proxy had,
  // to bring an endpoint back.
  explicit TcpProxy(int upstream_port, int listen_port = 0);
  ~TcpProxy();
  TcpProxy(const TcpProxy&) = delete;
  TcpProxy& operator=(const TcpProxy&) = delete;

  int port() const { return port_; }
  std::string url() const;  // http://127.0.0.1:<port>
  // Stops listening (new connections are refused) and resets every open
  // connection, so the client sees them break at once. Idempotent.
  void Close();

 private:
  void AcceptLoop();
  void Pump(int a, int b);

  int upstream_port_;
  int port_ = 0;
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};
  std::mutex mu_;
  std::vector<std::thread> pumps_;
  std::thread acceptor_;
  bool closed_ = false;
};

}  // namespace mooncake::daemon::etcd::testing
