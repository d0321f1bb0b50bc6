// DaemonConfig: the config file grammar, every key, validation messages, and
// how flags and --config combine.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "config/daemon_config.h"
#include "gtest/gtest.h"

namespace mooncake::daemon {
namespace {

bool Contains(absl::string_view haystack, const std::string& needle) {
  return haystack.find(needle) != absl::string_view::npos;
}

TEST(ParseConfigTextTest, DefaultsWhenEmpty) {
  DaemonConfig c;
  ASSERT_TRUE(ParseConfigText("", "test.conf", &c).ok());
  EXPECT_EQ(c.socket, "/run/mooncake/mooncaked.sock");
  EXPECT_EQ(c.socket_mode, 0660u);
  EXPECT_EQ(c.socket_group, "");
  EXPECT_EQ(c.node_id, "");
  EXPECT_EQ(c.log_level, LogLevel::kInfo);
  EXPECT_EQ(c.peer_listen, "");
  EXPECT_EQ(c.sysfs_root, "/sys");
  EXPECT_EQ(c.cuda_library, "libcuda.so.1");
  EXPECT_EQ(c.join_timeout_ms, 30000u);
  EXPECT_EQ(c.max_world_size, 65536u);
  EXPECT_EQ(c.ticket_ttl_ms, 30000u);
  EXPECT_EQ(c.max_sessions_per_uid, 4096u);
}

TEST(ParseConfigTextTest, EveryKey) {
  const char* text =
      "socket = /tmp/mc/test.sock\n"
      "socket_mode = 0600\n"
      "socket_group = mooncake\n"
      "node_id = node-7\n"
      "log_level = debug\n"
      "peer_listen = 0.0.0.0:7000\n"
      "sysfs_root = /tmp/fake-sys\n"
      "cuda_library = /opt/cuda/libcuda.so\n"
      "join_timeout_ms = 1234\n"
      "max_world_size = 8\n"
      "ticket_ttl_ms = 500\n"
      "max_sessions_per_uid = 3\n";
  DaemonConfig c;
  absl::Status s = ParseConfigText(text, "test.conf", &c);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(c.socket, "/tmp/mc/test.sock");
  EXPECT_EQ(c.socket_mode, 0600u);
  EXPECT_EQ(c.socket_group, "mooncake");
  EXPECT_EQ(c.node_id, "node-7");
  EXPECT_EQ(c.log_level, LogLevel::kDebug);
  EXPECT_EQ(c.peer_listen, "0.0.0.0:7000");
  EXPECT_EQ(c.sysfs_root, "/tmp/fake-sys");
  EXPECT_EQ(c.cuda_library, "/opt/cuda/libcuda.so");
  EXPECT_EQ(c.join_timeout_ms, 1234u);
  EXPECT_EQ(c.max_world_size, 8u);
  EXPECT_EQ(c.ticket_ttl_ms, 500u);
  EXPECT_EQ(c.max_sessions_per_uid, 3u);
}

TEST(ParseConfigTextTest, EveryLimitKeyAndItsRange) {
  DaemonConfig c;
  ASSERT_TRUE(ParseConfigText("handshake_timeout_ms = 700\n"
                              "max_connections_per_uid = 11\n"
                              "max_connections = 12\n"
                              "fd_channel_connections_per_uid = 13\n"
                              "fd_channel_connections = 14\n"
                              "max_fds_per_uid = 15\n"
                              "max_fds = 16\n"
                              "max_ranks_per_uid = 17\n"
                              "max_waiting_joins_per_uid = 18\n"
                              "max_view_bytes_per_uid = 8192\n"
                              "max_join_timeout_ms = 2000\n",
                              "t", &c)
                  .ok());
  EXPECT_EQ(c.handshake_timeout_ms, 700u);
  EXPECT_EQ(c.max_connections_per_uid, 11u);
  EXPECT_EQ(c.max_connections, 12u);
  EXPECT_EQ(c.fd_channel_connections_per_uid, 13u);
  EXPECT_EQ(c.fd_channel_connections, 14u);
  EXPECT_EQ(c.max_fds_per_uid, 15u);
  EXPECT_EQ(c.max_fds, 16u);
  EXPECT_EQ(c.max_ranks_per_uid, 17u);
  EXPECT_EQ(c.max_waiting_joins_per_uid, 18u);
  EXPECT_EQ(c.max_view_bytes_per_uid, 8192u);
  EXPECT_EQ(c.max_join_timeout_ms, 2000u);
  // The handshake deadline is "a few seconds" at most by default, and can
  // be neither 0 (every connection closed) nor unbounded.
  EXPECT_LE(DaemonConfig{}.handshake_timeout_ms, 5000u);
  for (const char* bad :
       {"handshake_timeout_ms = 0", "handshake_timeout_ms = 60001", "max_connections = 0",
        "max_join_timeout_ms = 999", "max_view_bytes_per_uid = 10"}) {
    DaemonConfig d;
    EXPECT_EQ(ParseConfigText(bad, "t", &d).code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

// The RDMA limits: per session and per uid, byte budgets as 64-bit values.
TEST(ParseConfigTextTest, RdmaLimitKeysAndTheirRange) {
  DaemonConfig c;
  ASSERT_TRUE(ParseConfigText("max_qps_per_session = 21\n"
                              "max_mrs_per_session = 22\n"
                              "max_registered_bytes_per_session = 137438953472\n"
                              "max_qps_per_uid = 23\n"
                              "max_mrs_per_uid = 24\n"
                              "max_registered_bytes_per_uid = 1099511627776\n"
                              "max_registered_bytes_total = 4398046511104\n",
                              "t", &c)
                  .ok());
  EXPECT_EQ(c.max_qps_per_session, 21u);
  EXPECT_EQ(c.max_mrs_per_session, 22u);
  EXPECT_EQ(c.max_registered_bytes_per_session, 128ull << 30);
  EXPECT_EQ(c.max_qps_per_uid, 23u);
  EXPECT_EQ(c.max_mrs_per_uid, 24u);
  EXPECT_EQ(c.max_registered_bytes_per_uid, 1ull << 40);
  EXPECT_EQ(c.max_registered_bytes_total, 4ull << 40);
  // The per-uid defaults are at least the per-session ones.
  const DaemonConfig d;
  EXPECT_GE(d.max_qps_per_uid, d.max_qps_per_session);
  EXPECT_GE(d.max_mrs_per_uid, d.max_mrs_per_session);
  EXPECT_GE(d.max_registered_bytes_per_uid, d.max_registered_bytes_per_session);
  for (const char* bad :
       {"max_qps_per_uid = 0", "max_mrs_per_uid = 0", "max_registered_bytes_per_uid = 100",
        "max_registered_bytes_per_uid = -1", "max_registered_bytes_total = 1",
        "max_registered_bytes_per_session = 18446744073709551616"}) {
    DaemonConfig e;
    absl::Status s = ParseConfigText(bad, "t", &e);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find(std::string(bad).substr(0, std::string(bad).find(' '))),
              std::string::npos)
        << s;
  }
}

TEST(ParseConfigTextTest, ClusterAndPeerTlsKeys) {
  DaemonConfig c;
  ASSERT_TRUE(ParseConfigText("etcd_endpoints = http://a:2379,http://b:2379\n"
                              "etcd_prefix = /mc\netcd_lease_ttl_s = 3\n"
                              "peer_tls_ca_file = /ca.pem\npeer_tls_cert_file = /n.pem\n"
                              "peer_tls_key_file = /n.key\npeer_insecure = true\n"
                              "peer_advertise = node1:7450\n"
                              "tenant_policy_file = /etc/mooncake/tenants.policy\n"
                              "max_doorbell_handoffs_per_uid = 9\n"
                              "softnic_atomics = hca\nsoftnic_hca_atomic_window_us = 50\n"
                              "softnic_hca_round_trip_us = 7\nsoftnic_gpu_workers = 9\n",
                              "t", &c)
                  .ok());
  EXPECT_EQ(c.softnic_atomics, "hca");
  EXPECT_EQ(c.softnic_hca_atomic_window_us, 50u);
  EXPECT_EQ(c.softnic_hca_round_trip_us, 7u);
  EXPECT_EQ(c.softnic_gpu_workers, 9u);
  EXPECT_EQ(c.tenant_policy_file, "/etc/mooncake/tenants.policy");
  EXPECT_EQ(c.max_doorbell_handoffs_per_uid, 9u);
  EXPECT_EQ(c.etcd_endpoints, "http://a:2379,http://b:2379");
  EXPECT_EQ(c.etcd_prefix, "/mc");
  EXPECT_EQ(c.etcd_lease_ttl_s, 3u);
  EXPECT_EQ(c.peer_tls_key_file, "/n.key");
  EXPECT_TRUE(c.peer_insecure);
  EXPECT_EQ(c.peer_advertise, "node1:7450");
  for (const char* bad :
       {"etcd_prefix = mc\n", "etcd_prefix = /mc/\n", "etcd_lease_ttl_s = 1\n",
        "peer_insecure = yes\n", "tenant_policy_file = tenants.policy\n",
        "max_doorbell_handoffs_per_uid = 0\n", "softnic_atomics = nic\n",
        "softnic_hca_atomic_window_us = 1000001\n", "softnic_hca_round_trip_us = -1\n",
        "softnic_gpu_workers = 0\n", "softnic_gpu_workers = 65\n"}) {
    DaemonConfig d;
    EXPECT_EQ(ParseConfigText(bad, "t", &d).code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(ParseConfigTextTest, RdmaDevicesIsAListOfNicNames) {
  DaemonConfig c;
  ASSERT_TRUE(ParseConfigText("rdma_devices = mlx5_0, mlx5_3 ,mlx5_bond_0\n", "t", &c).ok());
  EXPECT_EQ(c.rdma_devices, (std::vector<std::string>{"mlx5_0", "mlx5_3", "mlx5_bond_0"}));
  ASSERT_TRUE(ParseConfigText("rdma_devices =\n", "t", &c).ok());
  EXPECT_TRUE(c.rdma_devices.empty());
  for (const char* bad : {"rdma_devices = mlx5_0;rm\n", "rdma_devices = ../x\n"}) {
    DaemonConfig d;
    absl::Status s = ParseConfigText(bad, "t", &d);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("rdma_devices"), std::string::npos) << s;
  }
}

TEST(ParseConfigTextTest, RdmaGidIndexTrafficClassAndServiceLevel) {
  DaemonConfig c;
  EXPECT_FALSE(c.rdma_gid_index.has_value());  // auto by default
  EXPECT_EQ(c.rdma_traffic_class, 0u);
  EXPECT_EQ(c.rdma_service_level, 0u);
  ASSERT_TRUE(
      ParseConfigText("rdma_gid_index = 3\nrdma_traffic_class = 106\nrdma_service_level = 15\n",
                      "t", &c)
          .ok());
  EXPECT_EQ(c.rdma_gid_index, std::optional<uint32_t>(3));
  EXPECT_EQ(c.rdma_traffic_class, 106u);
  EXPECT_EQ(c.rdma_service_level, 15u);
  ASSERT_TRUE(ParseConfigText("rdma_gid_index = 0\n", "t", &c).ok());
  EXPECT_EQ(c.rdma_gid_index, std::optional<uint32_t>(0));  // 0 is an index, not auto
  ASSERT_TRUE(ParseConfigText("rdma_gid_index = 255\nrdma_gid_index = auto\n", "t", &c).ok());
  EXPECT_FALSE(c.rdma_gid_index.has_value());
  for (const char* bad :
       {"rdma_gid_index = 256\n", "rdma_gid_index = -1\n", "rdma_gid_index = v2\n",
        "rdma_gid_index =\n", "rdma_traffic_class = 256\n", "rdma_traffic_class = x\n",
        "rdma_service_level = 16\n", "rdma_service_level = -1\n"}) {
    DaemonConfig d;
    absl::Status s = ParseConfigText(bad, "t", &d);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    const std::string key(bad, std::string(bad).find(' '));
    EXPECT_NE(s.message().find(key), std::string::npos) << s;
    EXPECT_FALSE(d.rdma_gid_index.has_value()) << bad;
  }
}

TEST(ParseConfigTextTest, CommentsBlankLinesAndWhitespace) {
  const char* text =
      "# a full-line comment\n"
      "\n"
      "   \t  \n"
      "  node_id   =   spaced   # trailing comment\n"
      "log_level=warning\n"
      "\tmax_world_size\t=\t16\t\r\n"  // CRLF files from other editors
      "#socket = /should/not/apply\n";
  DaemonConfig c;
  absl::Status s = ParseConfigText(text, "test.conf", &c);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(c.node_id, "spaced");
  EXPECT_EQ(c.log_level, LogLevel::kWarning);
  EXPECT_EQ(c.max_world_size, 16u);
  EXPECT_EQ(c.socket, "/run/mooncake/mooncaked.sock");
}

TEST(ParseConfigTextTest, KeysNotPresentKeepTheirValue) {
  DaemonConfig c;
  c.node_id = "kept";
  c.join_timeout_ms = 77;
  ASSERT_TRUE(ParseConfigText("log_level = error\n", "x", &c).ok());
  EXPECT_EQ(c.node_id, "kept");
  EXPECT_EQ(c.join_timeout_ms, 77u);
  EXPECT_EQ(c.log_level, LogLevel::kError);
}

TEST(ParseConfigTextTest, LaterLinesWin) {
  DaemonConfig c;
  ASSERT_TRUE(ParseConfigText("node_id = a\nnode_id = b\n", "x", &c).ok());
  EXPECT_EQ(c.node_id, "b");
}

struct BadLine {
  const char* text;
  int line;
  const char* must_mention;
};

TEST(ParseConfigTextTest, BadValuesNameFileLineAndKey) {
  const BadLine cases[] = {
      {"join_timeout_ms = abc\n", 1, "join_timeout_ms"},
      {"\n# c\njoin_timeout_ms = 0\n", 3, "join_timeout_ms"},
      {"join_timeout_ms = 3600001\n", 1, "[1, 3600000]"},
      {"max_world_size = -1\n", 1, "max_world_size"},
      {"max_world_size = 1048577\n", 1, "max_world_size"},
      {"ticket_ttl_ms = 99\n", 1, "ticket_ttl_ms"},
      {"max_sessions_per_uid = 0\n", 1, "max_sessions_per_uid"},
      {"node_id = x\nlog_level = loud\n", 2, "log_level = 'loud'"},
      {"socket =\n", 1, "socket: empty path"},
      {"node_id = a\n\nthis line has no equals sign\n", 3, "expected 'key = value'"},
      {"max_world_size = 12abc\n", 1, "'12abc'"},
  };
  for (const BadLine& b : cases) {
    DaemonConfig c;
    absl::Status s = ParseConfigText(b.text, "/etc/mooncake/mooncaked.conf", &c);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << b.text;
    EXPECT_TRUE(
        Contains(s.message(), "/etc/mooncake/mooncaked.conf:" + std::to_string(b.line) + ":"))
        << b.text << " -> " << s;
    EXPECT_TRUE(Contains(s.message(), b.must_mention)) << b.text << " -> " << s;
  }
}

TEST(ParseConfigTextTest, UnknownKey) {
  DaemonConfig c;
  absl::Status s = ParseConfigText("node_id = a\nsocket_path = /x\n", "f.conf", &c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(s.message(), "f.conf:2:")) << s;
  EXPECT_TRUE(Contains(s.message(), "unknown key 'socket_path'")) << s;
}

TEST(ParseConfigTextTest, BoundaryValuesAccepted) {
  DaemonConfig c;
  absl::Status s = ParseConfigText(
      "join_timeout_ms = 1\nmax_world_size = 1048576\nticket_ttl_ms = 100\n"
      "max_sessions_per_uid = 1\n",
      "x", &c);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(c.join_timeout_ms, 1u);
  EXPECT_EQ(c.max_world_size, 1048576u);
  EXPECT_EQ(c.ticket_ttl_ms, 100u);
  EXPECT_EQ(c.max_sessions_per_uid, 1u);
}

TEST(ParseConfigTextTest, SocketModeValidation) {
  struct Case {
    const char* value;
    bool ok;
    uint32_t mode;
  };
  const Case cases[] = {
      {"0660", true, 0660},    {"660", true, 0660},  {"0600", true, 0600}, {"0777", true, 0777},
      {"600", true, 0600},     {"0640", true, 0640}, {"0400", false, 0},  // owner cannot write
      {"0200", false, 0},                                                 // owner cannot read
      {"0066", false, 0},      {"0680", false, 0},                        // 8 is not octal
      {"rw-rw----", false, 0}, {"06600", false, 0},                       // too long
      {"", false, 0},          {"-660", false, 0},
  };
  for (const Case& k : cases) {
    DaemonConfig c;
    absl::Status s = ParseConfigText(absl::StrCat("socket_mode = ", k.value, "\n"), "m.conf", &c);
    EXPECT_EQ(s.ok(), k.ok) << "'" << k.value << "' -> " << s;
    if (k.ok) {
      EXPECT_EQ(c.socket_mode, k.mode) << k.value;
    } else {
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << k.value;
      EXPECT_TRUE(Contains(s.message(), "socket_mode")) << s;
      EXPECT_EQ(c.socket_mode, 0660u) << "a rejected mode must not be applied";
    }
  }
}

class TempFile {
 public:
  explicit TempFile(const std::string& contents) {
    char tmpl[] = "/tmp/mc_config_test_XXXXXX";
    int fd = ::mkstemp(tmpl);
    EXPECT_GE(fd, 0);
    if (fd >= 0) ::close(fd);
    path_ = tmpl;
    std::ofstream(path_) << contents;
  }
  ~TempFile() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(LoadConfigFileTest, ReadsFileAndNamesItInErrors) {
  TempFile good("node_id = from-file\nmax_world_size = 9\n");
  DaemonConfig c;
  ASSERT_TRUE(LoadConfigFile(good.path(), &c).ok());
  EXPECT_EQ(c.node_id, "from-file");
  EXPECT_EQ(c.max_world_size, 9u);

  TempFile bad("node_id = x\nbogus = 1\n");
  absl::Status s = LoadConfigFile(bad.path(), &c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(s.message(), bad.path() + ":2:")) << s;
}

TEST(LoadConfigFileTest, MissingFileIsNotFound) {
  DaemonConfig c;
  absl::Status s = LoadConfigFile("/nonexistent/dir/mooncaked.conf", &c);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_TRUE(Contains(s.message(), "/nonexistent/dir/mooncaked.conf")) << s;
}

// `--config DIR` once started the daemon on its defaults: an ifstream opens
// a directory and reads nothing.
TEST(LoadConfigFileTest, DirectoryIsRefusedNamingIt) {
  char tmpl[] = "/tmp/mooncaked_conf_dir_XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  DaemonConfig c;
  absl::Status s = LoadConfigFile(dir, &c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(s.message(), "config file " + dir +
                             " is a directory; --config wants a file such as "
                             "/etc/mooncake/mooncaked.conf");
  const char* args[] = {"mooncaked", "--config", tmpl, nullptr};
  bool help = false, version = false;
  absl::StatusOr<DaemonConfig> parsed =
      ParseCommandLine(3, const_cast<char**>(args), &help, &version);
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << parsed.status();
  EXPECT_TRUE(Contains(parsed.status().message(), dir)) << parsed.status();
  ::rmdir(tmpl);
}

// peer_listen is checked before gRPC sees it (gRPC would log its own error
// lines first): HOST:PORT or [IPv6]:PORT, PORT in 1..65535.
TEST(ParseConfigTextTest, PeerListenForms) {
  for (const char* good : {"0.0.0.0:7450", "127.0.0.1:1", "[::]:7450", "[fe80::1]:65535",
                           "node-a.example.com:7450", "localhost:9"}) {
    DaemonConfig c;
    absl::Status s = ParseConfigText(absl::StrCat("peer_listen = ", good), "f.conf", &c);
    EXPECT_TRUE(s.ok()) << good << ": " << s;
    EXPECT_EQ(c.peer_listen, good);
  }
  DaemonConfig off;
  off.peer_listen = "0.0.0.0:1";
  ASSERT_TRUE(ParseConfigText("peer_listen =", "f.conf", &off).ok());
  EXPECT_EQ(off.peer_listen, "") << "empty turns the peer API off";

  struct Bad {
    const char* value;
    const char* why;
  };
  const Bad cases[] = {
      {"7450", "no port"},
      {":7450", "no host"},
      {"0.0.0.0", "no port"},
      {"0.0.0.0:", "port '' is not a number in 1..65535"},
      {"0.0.0.0:0", "port '0' is not a number in 1..65535"},
      {"0.0.0.0:65536", "port '65536' is not a number in 1..65535"},
      {"0.0.0.0:99999", "port '99999'"},
      {"0.0.0.0:+80", "port '+80'"},
      {"0.0.0.0:http", "port 'http'"},
      {"300.1.2.3:7450", "'300.1.2.3' is not an IPv4 address"},
      {"::1:7450", "an IPv6 address needs brackets"},
      {"[::1]", "no ']:' after the IPv6 address"},
      {"[nope]:7450", "'nope' is not an IPv6 address"},
      {"bad_host:7450", "'bad_host' is neither an IPv4 address nor a host name"},
      {"unix:/tmp/x", "port '/tmp/x'"},
  };
  for (const Bad& b : cases) {
    DaemonConfig c;
    absl::Status s = ParseConfigText(absl::StrCat("peer_listen = ", b.value), "f.conf", &c);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << b.value;
    EXPECT_TRUE(Contains(s.message(), absl::StrCat("f.conf:1: peer_listen = '", b.value, "': ")))
        << s;
    EXPECT_TRUE(Contains(s.message(), b.why)) << b.value << " -> " << s;
    EXPECT_TRUE(Contains(s.message(), "expected HOST:PORT or [IPv6]:PORT")) << s;
    EXPECT_EQ(c.peer_listen, "");
  }
}

// Builds a mutable argv for ParseCommandLine.
class Argv {
 public:
  Argv(std::initializer_list<std::string> args) : storage_(args) {
    storage_.insert(storage_.begin(), "mooncaked");
    for (std::string& s : storage_) ptrs_.push_back(s.data());
    ptrs_.push_back(nullptr);
  }
  // ptrs_ points into storage_: a copy would dangle.
  Argv(const Argv&) = delete;
  Argv& operator=(const Argv&) = delete;
  int argc() const { return static_cast<int>(storage_.size()); }
  char** argv() { return ptrs_.data(); }

 private:
  std::vector<std::string> storage_;
  std::vector<char*> ptrs_;
};

absl::StatusOr<DaemonConfig> Parse(Argv args, bool* help = nullptr, bool* version = nullptr) {
  bool h = false, v = false;
  auto r = ParseCommandLine(args.argc(), args.argv(), help ? help : &h, version ? version : &v);
  return r;
}

TEST(ParseCommandLineTest, NoArgumentsGiveDefaults) {
  bool help = true, version = true;
  absl::StatusOr<DaemonConfig> c = Parse({}, &help, &version);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(help);
  EXPECT_FALSE(version);
  EXPECT_EQ(c->socket, "/run/mooncake/mooncaked.sock");
}

TEST(ParseCommandLineTest, EveryFlagSeparateValue) {
  absl::StatusOr<DaemonConfig> c =
      Parse({"--socket", "/tmp/a.sock", "--node-id", "n1", "--log-level", "error", "--peer-listen",
             "127.0.0.1:9", "--sysfs-root", "/tmp/sys", "--socket-mode", "0600", "--cuda-library",
             "/x/libcuda.so"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->socket, "/tmp/a.sock");
  EXPECT_EQ(c->node_id, "n1");
  EXPECT_EQ(c->log_level, LogLevel::kError);
  EXPECT_EQ(c->peer_listen, "127.0.0.1:9");
  EXPECT_EQ(c->sysfs_root, "/tmp/sys");
  EXPECT_EQ(c->socket_mode, 0600u);
  EXPECT_EQ(c->cuda_library, "/x/libcuda.so");
}

TEST(ParseCommandLineTest, KeyEqualsValueForm) {
  absl::StatusOr<DaemonConfig> c =
      Parse({"--socket=/tmp/b.sock", "--node-id=with=equals", "--log-level=debug"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->socket, "/tmp/b.sock");
  EXPECT_EQ(c->node_id, "with=equals") << "only the first '=' separates the value";
  EXPECT_EQ(c->log_level, LogLevel::kDebug);
}

TEST(ParseCommandLineTest, FlagsOverrideTheFileWhateverTheOrder) {
  TempFile f("node_id = file-node\nsocket = /tmp/file.sock\nmax_world_size = 5\n");
  // --config comes last but is applied first.
  absl::StatusOr<DaemonConfig> c = Parse({"--node-id", "flag-node", "--config", f.path()});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->node_id, "flag-node");
  EXPECT_EQ(c->socket, "/tmp/file.sock");
  EXPECT_EQ(c->max_world_size, 5u);

  absl::StatusOr<DaemonConfig> d = Parse({"--config=" + f.path(), "--socket=/tmp/flag.sock"});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->socket, "/tmp/flag.sock");
  EXPECT_EQ(d->node_id, "file-node");
}

TEST(ParseCommandLineTest, BadConfigFileFails) {
  TempFile f("log_level = chatty\n");
  absl::StatusOr<DaemonConfig> c = Parse({"--config", f.path()});
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(c.status().message(), f.path() + ":1:")) << c.status();
  EXPECT_EQ(Parse({"--config", "/nonexistent/x.conf"}).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(ParseCommandLineTest, HelpAndVersion) {
  for (const char* flag : {"--help", "-h"}) {
    bool help = false, version = false;
    absl::StatusOr<DaemonConfig> c = Parse({flag}, &help, &version);
    EXPECT_TRUE(c.ok()) << flag;
    EXPECT_TRUE(help) << flag;
    EXPECT_FALSE(version) << flag;
  }
  bool help = false, version = false;
  // --version wins even after bad-looking flags would have been read later.
  absl::StatusOr<DaemonConfig> c = Parse({"--version", "--bogus"}, &help, &version);
  EXPECT_TRUE(c.ok());
  EXPECT_TRUE(version);
  EXPECT_FALSE(help);
}

TEST(ParseCommandLineTest, UnknownArgumentShowsUsage) {
  absl::StatusOr<DaemonConfig> c = Parse({"--sockets", "/x"});
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(c.status().message(), "unknown argument '--sockets'")) << c.status();
  EXPECT_TRUE(Contains(c.status().message(), "usage: mooncaked")) << c.status();
  EXPECT_EQ(Parse({"positional"}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ParseCommandLineTest, MissingValue) {
  absl::StatusOr<DaemonConfig> c = Parse({"--node-id", "n", "--socket"});
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(c.status().message(), "--socket needs a value")) << c.status();
  EXPECT_TRUE(Contains(c.status().message(), "usage: mooncaked")) << c.status();
}

TEST(ParseCommandLineTest, BadFlagValues) {
  absl::StatusOr<DaemonConfig> c = Parse({"--socket-mode", "0444"});
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(c.status().message(), "flag: socket_mode")) << c.status();
  EXPECT_EQ(Parse({"--log-level=noisy"}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Parse({"--socket="}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(UsageTextTest, MentionsEveryFlag) {
  std::string u = UsageText();
  for (const char* flag : {"--config", "--socket", "--node-id", "--log-level", "--peer-listen",
                           "--sysfs-root", "--socket-mode", "--version", "--help"}) {
    EXPECT_TRUE(Contains(u, flag)) << flag;
  }
}

// metrics_listen (and --metrics-listen): the same HOST:PORT forms as
// peer_listen, empty = off (the default), errors naming the key.
TEST(ParseConfigTextTest, MetricsListen) {
  DaemonConfig c;
  EXPECT_EQ(c.metrics_listen, "") << "metrics are off unless configured";
  for (const char* good : {"127.0.0.1:9400", "0.0.0.0:1", "[::1]:9400", "localhost:65535"}) {
    absl::Status s = ParseConfigText(absl::StrCat("metrics_listen = ", good), "f.conf", &c);
    EXPECT_TRUE(s.ok()) << good << ": " << s;
    EXPECT_EQ(c.metrics_listen, good);
  }
  ASSERT_TRUE(ParseConfigText("metrics_listen =", "f.conf", &c).ok());
  EXPECT_EQ(c.metrics_listen, "");
  for (const char* bad : {"9400", "127.0.0.1", "127.0.0.1:0", "127.0.0.1:70000", ":9400",
                          "::1:9400", "300.0.0.1:9400"}) {
    DaemonConfig d;
    absl::Status s = ParseConfigText(absl::StrCat("metrics_listen = ", bad), "f.conf", &d);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_TRUE(Contains(s.message(), "f.conf:1: metrics_listen = '")) << s;
    EXPECT_EQ(d.metrics_listen, "") << bad;
  }
  absl::StatusOr<DaemonConfig> flag = Parse({"--metrics-listen", "127.0.0.1:9401"});
  ASSERT_TRUE(flag.ok()) << flag.status();
  EXPECT_EQ(flag->metrics_listen, "127.0.0.1:9401");
  EXPECT_EQ(Parse({"--metrics-listen=nope"}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(UsageText(), "--metrics-listen"));
}

}  // namespace
}  // namespace mooncake::daemon
