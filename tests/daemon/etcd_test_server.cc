#include "etcd_test_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "etcdserverpb/rpc.grpc.pb.h"

namespace mooncake::daemon::etcd::testing {
namespace {

sockaddr_in Loopback(int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

// Reset (not FIN) on close, so the other side sees the connection die.
void CloseWithReset(int fd) {
  linger l{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
  ::close(fd);
}

bool WriteAll(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

}  // namespace

std::string EtcdBinary() {
  const char* env = std::getenv("MOONCAKE_ETCD_BIN");
  if (env != nullptr && *env != '\0') return env;
  return "/usr/bin/etcd";
}

int PickFreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::runtime_error("socket failed");
  sockaddr_in a = Loopback(0);
  socklen_t len = sizeof(a);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    ::close(fd);
    throw std::runtime_error("bind/getsockname failed");
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

// ---- EtcdTestServer ----

EtcdTestServer::EtcdTestServer() {
  char tmpl[] = "/tmp/mc-etcd-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp failed");
  dir_ = tmpl;
  client_port_ = PickFreePort();
  do {
    peer_port_ = PickFreePort();
  } while (peer_port_ == client_port_);
}

EtcdTestServer::~EtcdTestServer() {
  Stop(SIGKILL);
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

std::string EtcdTestServer::client_url() const {
  return absl::StrCat(tls() ? "https" : "http", "://127.0.0.1:", client_port_);
}

std::string EtcdTestServer::LogTail(size_t bytes) const {
  std::ifstream in(dir_ + "/etcd.log");
  std::stringstream ss;
  ss << in.rdbuf();
  std::string all = ss.str();
  return all.size() > bytes ? all.substr(all.size() - bytes) : all;
}

absl::Status EtcdTestServer::Start() {
  if (running()) return absl::FailedPreconditionError("etcd is already running");
  const std::string bin = EtcdBinary();
  if (::access(bin.c_str(), X_OK) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("etcd binary ", bin,
                     " not found: these tests need a real etcd; run deploy/install-deps.sh "
                     "(it installs Debian's etcd-server package)"));
  }
  // The first start may lose a race for its ports: pick others and retry.
  // A restart must keep them (the data directory names the peer URL).
  const int attempts = ever_started_ ? 1 : 3;
  absl::Status status;
  for (int i = 0; i < attempts; ++i) {
    if (i > 0) {
      client_port_ = PickFreePort();
      peer_port_ = PickFreePort();
      std::error_code ec;
      std::filesystem::remove_all(dir_ + "/data", ec);
    }
    status = Spawn();
    if (status.ok()) status = AwaitReady();
    if (status.ok()) {
      ever_started_ = true;
      return status;
    }
    Stop(SIGKILL);
  }
  return status;
}

absl::Status EtcdTestServer::Spawn() {
  const std::string peer = absl::StrCat("http://127.0.0.1:", peer_port_);
  const std::string client = client_url();
  const std::string name = "mc-test";
  std::vector<std::string> args = {
      EtcdBinary(),
      "--name=" + name,
      "--data-dir=" + dir_ + "/data",
      "--listen-client-urls=" + client,
      "--advertise-client-urls=" + client,
      "--listen-peer-urls=" + peer,
      "--initial-advertise-peer-urls=" + peer,
      "--initial-cluster=" + name + "=" + peer,
      "--initial-cluster-state=new",
      absl::StrCat("--initial-cluster-token=mc-test-", ::getpid(), "-", client_port_),
      "--logger=zap",
      "--log-outputs=stderr",
      "--log-level=info",
  };
  if (tls()) {
    args.insert(args.end(), {"--cert-file=" + tls_.cert_file, "--key-file=" + tls_.key_file,
                             "--trusted-ca-file=" + tls_.ca_file, "--client-cert-auth"});
  }
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const std::string log = dir_ + "/etcd.log";
  const int log_fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) return absl::InternalError("cannot create " + log);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(log_fd);
    return absl::InternalError("fork failed");
  }
  if (pid == 0) {
    // Child: async-signal-safe calls only until exec.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(1);
    ::dup2(log_fd, 1);
    ::dup2(log_fd, 2);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(log_fd);
  pid_ = pid;
  return absl::OkStatus();
}

absl::Status EtcdTestServer::AwaitReady() {
  // etcd listens a moment after it starts: retry connecting every 100 ms,
  // not on gRPC's default backoff (1 s, growing).
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 100);
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (tls()) {
    grpc::SslCredentialsOptions ssl;
    for (auto [path, pem] : {std::pair{&tls_.ca_file, &ssl.pem_root_certs},
                             std::pair{&tls_.cert_file, &ssl.pem_cert_chain},
                             std::pair{&tls_.key_file, &ssl.pem_private_key}}) {
      std::ifstream in(*path);
      std::stringstream text;
      text << in.rdbuf();
      *pem = text.str();
      if (pem->empty()) return absl::FailedPreconditionError("cannot read TLS file " + *path);
    }
    credentials = grpc::SslCredentials(ssl);
  }
  auto channel =
      grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", client_port_), credentials, args);
  auto stub = etcdserverpb::Maintenance::NewStub(channel);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  std::string last = "no answer";
  while (absl::Now() < deadline) {
    int wstatus = 0;
    if (::waitpid(pid_, &wstatus, WNOHANG) == pid_) {
      pid_ = -1;
      return absl::UnavailableError(absl::StrCat("etcd exited (status ", wstatus,
                                                 ") before answering; its log:\n", LogTail()));
    }
    grpc::ClientContext ctx;
    // Waiting for the connection (not failing on the last refusal) is
    // also what makes gRPC retry it.
    ctx.set_wait_for_ready(true);
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Milliseconds(300)));
    etcdserverpb::StatusResponse response;
    const grpc::Status s = stub->Status(&ctx, etcdserverpb::StatusRequest(), &response);
    if (s.ok() && response.leader() != 0) return absl::OkStatus();
    last = s.ok() ? "answers, but has no leader yet" : s.error_message();
    if (s.ok()) absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::UnavailableError(absl::StrCat(
      "etcd on ", client_url(), " did not answer within 10 s (", last, "); its log:\n", LogTail()));
}

void EtcdTestServer::Stop(int signal) {
  if (pid_ <= 0) return;
  ::kill(pid_, signal);
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  for (;;) {
    const pid_t r = ::waitpid(pid_, nullptr, WNOHANG);
    if (r == pid_ || (r < 0 && errno != EINTR)) break;
    if (absl::Now() >= deadline) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
      break;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  pid_ = -1;
}

absl::Status EtcdTestServer::Restart() {
  Stop();
  return Start();
}

// ---- TcpProxy ----

TcpProxy::TcpProxy(int upstream_port, int listen_port) : upstream_port_(upstream_port) {
  if (::pipe2(wake_, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in a = Loopback(listen_port);
  socklen_t len = sizeof(a);
  if (listen_fd_ < 0 || ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::listen(listen_fd_, 64) != 0 ||
      ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    throw std::runtime_error("proxy listen failed");
  }
  port_ = ntohs(a.sin_port);
  acceptor_ = std::thread([this] { AcceptLoop(); });
}

TcpProxy::~TcpProxy() {
  Close();
  ::close(wake_[0]);
  ::close(wake_[1]);
}

std::string TcpProxy::url() const { return absl::StrCat("http://127.0.0.1:", port_); }

void TcpProxy::Close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    closed_ = true;
  }
  // The pipe stays readable: every loop sees it and ends.
  const char b = 1;
  (void)!::write(wake_[1], &b, 1);
  acceptor_.join();
  ::close(listen_fd_);
  std::vector<std::thread> pumps;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pumps.swap(pumps_);
  }
  for (std::thread& t : pumps) t.join();
}

void TcpProxy::AcceptLoop() {
  for (;;) {
    pollfd p[2] = {{listen_fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
    if (::poll(p, 2, -1) < 0) continue;
    if (p[1].revents != 0) return;
    const int in = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (in < 0) continue;
    const int out = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in up = Loopback(upstream_port_);
    if (out < 0 || ::connect(out, reinterpret_cast<sockaddr*>(&up), sizeof(up)) != 0) {
      if (out >= 0) ::close(out);
      CloseWithReset(in);
      continue;
    }
    std::lock_guard<std::mutex> lock(mu_);
    pumps_.emplace_back([this, in, out] { Pump(in, out); });
  }
}

void TcpProxy::Pump(int a, int b) {
  char buf[65536];
  for (bool open = true; open;) {
    pollfd p[3] = {{a, POLLIN, 0}, {b, POLLIN, 0}, {wake_[0], POLLIN, 0}};
    if (::poll(p, 3, -1) < 0) continue;
    if (p[2].revents != 0) break;
    for (int i = 0; i < 2 && open; ++i) {
      if (p[i].revents == 0) continue;
      const ssize_t n = ::read(p[i].fd, buf, sizeof(buf));
      open = n > 0 && WriteAll(i == 0 ? b : a, buf, static_cast<size_t>(n));
    }
  }
  CloseWithReset(a);
  CloseWithReset(b);
}

}  // namespace mooncake::daemon::etcd::testing
