// mcctl end to end against a real gRPC server that implements the Admin
// service with known data, on a temporary UNIX socket.
#include "mooncake/mcctl/cli.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "mooncake/common/paths.h"
#include "mooncake/mcctl/json_output.h"
#include "mooncake/v1/admin.grpc.pb.h"

namespace mooncake::mcctl {
namespace {

using google::protobuf::ListValue;
using google::protobuf::Struct;
using google::protobuf::Value;

// The test double: fixed data, plus switches for failures.
class FakeAdmin final : public v1::Admin::Service {
 public:
  FakeAdmin() {
    status_.set_version("0.1.0-test");
    status_.set_protocol_version(1);
    status_.set_instance_id("inst-42");
    status_.set_node_id("node-a");
    status_.set_hostname("host-a");
    status_.set_socket_path("/run/mooncake/mooncaked.sock");
    status_.set_fd_socket_path("/run/mooncake/mooncaked.sock.fd");
    status_.set_pid(4242);
    status_.set_uptime_ms(3'723'000);
    status_.set_sessions(3);
    status_.set_groups(1);
    status_.set_gpu_count(2);
    status_.set_nic_count(0);
    status_.set_cuda_driver_version(13000);
    status_.set_nic_discovery_note("no RDMA devices under /sys/class/infiniband");

    for (int i = 0; i < 2; ++i) {
      auto* g = topo_.add_gpus();
      g->set_index(i);
      g->set_name("NVIDIA H200");
      g->set_uuid(absl::StrCat("GPU-0000000", i));
      g->set_pci_bus_id(absl::StrCat("0000:1", i, ":00.0"));
      g->set_numa_node(0);
      g->set_total_memory_bytes(150ull << 30);
      g->set_compute_capability_major(9);
      g->set_multiprocessor_count(132);
      g->set_vmm_supported(true);
    }
    for (auto [s, d] : {std::pair{0, 1}, std::pair{1, 0}}) {
      auto* p = topo_.add_gpu_pairs();
      p->set_src(s);
      p->set_dst(d);
      p->set_access_supported(true);
      p->set_native_atomics(true);
    }
    topo_.set_nic_discovery_note("no RDMA devices under /sys/class/infiniband");
    topo_.set_cuda_driver_version(13000);

    for (int i = 0; i < 3; ++i) {
      auto* s = sessions_.add_sessions();
      s->set_session_id(11 + i);
      s->set_uid(1000);
      s->set_pid(500 + i);
      s->set_client_name(absl::StrCat("worker-", i));
      s->set_age_ms(2000);
      if (i < 2) s->add_groups(absl::StrCat("moe/", i));
    }

    auto* g = groups_.add_groups();
    g->set_name("moe");
    g->set_uid(1000);
    g->set_world_size(3);
    g->set_joined(2);
    g->set_state("forming");
    g->set_epoch(4);
    const char* states[] = {"joined", "lost", "ready"};
    for (int rank : {2, 0, 1}) {  // out of order: joined_ranks must be sorted
      auto* m = g->add_members();
      m->set_rank(rank);
      m->set_state(states[rank]);
      m->set_pid(500 + rank);
      m->set_gpu_index(rank);
      m->set_handle_kind("cuda-vmm-fd");
      m->set_handle_size(1 << 30);
      m->set_session_id(11 + rank);
    }
  }

  grpc::Status GetStatus(grpc::ServerContext*, const v1::GetStatusRequest*,
                         v1::DaemonStatus* out) override {
    calls_++;
    *out = status_;
    return grpc::Status::OK;
  }
  grpc::Status GetTopology(grpc::ServerContext*, const v1::GetTopologyRequest*,
                           v1::Topology* out) override {
    calls_++;
    *out = topo_;
    return grpc::Status::OK;
  }
  grpc::Status ListSessions(grpc::ServerContext* ctx, const v1::ListSessionsRequest*,
                            v1::ListSessionsResponse* out) override {
    calls_++;
    if (stall_ms_ > 0) {
      // Longer than the client's deadline; stop early once it gave up.
      auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(stall_ms_.load());
      while (std::chrono::steady_clock::now() < until && !ctx->IsCancelled()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
    *out = sessions_;
    return grpc::Status::OK;
  }
  grpc::Status ListGroups(grpc::ServerContext*, const v1::ListGroupsRequest*,
                          v1::ListGroupsResponse* out) override {
    calls_++;
    if (deny_groups_) {
      return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                          "uid 1001 may not list\ngroups of uid 0");
    }
    *out = groups_;
    return grpc::Status::OK;
  }

  v1::DaemonStatus status_;
  v1::Topology topo_;
  v1::ListSessionsResponse sessions_;
  v1::ListGroupsResponse groups_;
  std::atomic<int> calls_{0};
  std::atomic<int> stall_ms_{0};
  std::atomic<bool> deny_groups_{false};
};

struct Result {
  int rc;
  std::string out;
  std::string err;
};

Result Mcctl(std::vector<std::string> args) {
  std::ostringstream out, err;
  int rc = RunMcctl(args, out, err);
  return {rc, out.str(), err.str()};
}

int CountLines(const std::string& s) {
  return static_cast<int>(std::count(s.begin(), s.end(), '\n'));
}

Struct ParseObject(const std::string& json) {
  Struct s;
  auto st = google::protobuf::util::JsonStringToMessage(json, &s);
  EXPECT_TRUE(st.ok()) << st.ToString() << "\n" << json;
  return s;
}

ListValue ParseArray(const std::string& json) {
  // JsonStringToMessage wants an object at the top, so wrap the array.
  Struct s = ParseObject(absl::StrCat("{\"a\":", json, "}"));
  EXPECT_TRUE(s.fields().contains("a"));
  EXPECT_EQ(s.fields().at("a").kind_case(), Value::kListValue) << json;
  return s.fields().at("a").list_value();
}

class McctlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/mcctl_test_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr) << std::strerror(errno);
    dir_ = tmpl;
    socket_ = dir_ + "/admin.sock";
    grpc::ServerBuilder builder;
    builder.AddListeningPort("unix:" + socket_, grpc::InsecureServerCredentials());
    builder.RegisterService(&fake_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr) << "cannot listen on " << socket_;
    unsetenv(kSocketEnvVar);
  }
  void TearDown() override {
    if (server_) server_->Shutdown(std::chrono::system_clock::now());
    unsetenv(kSocketEnvVar);
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  std::string Missing() const { return dir_ + "/nobody.sock"; }

  FakeAdmin fake_;
  std::unique_ptr<grpc::Server> server_;
  std::string dir_;
  std::string socket_;
};

TEST_F(McctlTest, StatusTable) {
  Result r = Mcctl({"--socket", socket_, "status"});
  ASSERT_EQ(r.rc, kExitOk) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_TRUE(absl::StartsWith(r.out, "mooncaked 0.1.0-test (protocol 1)\n")) << r.out;
  for (const char* want :
       {"  node         node-a\n", "  instance     inst-42\n", "  uptime       1h02m\n",
        "  peer listen  off\n", "  sessions     3\n", "  cuda driver  13.0\n", "NVIDIA H200",
        "GPU-00000001", "NICs:\nno RDMA NICs (no RDMA devices under /sys/class/infiniband)\n"}) {
    EXPECT_TRUE(absl::StrContains(r.out, want)) << "missing '" << want << "' in\n" << r.out;
  }
}

TEST_F(McctlTest, StatusJsonContract) {
  Result r = Mcctl({"--json", "status", "--socket=" + socket_});
  ASSERT_EQ(r.rc, kExitOk) << r.err;
  Struct s = ParseObject(r.out);
  const auto& f = s.fields();
  EXPECT_EQ(f.at("version").string_value(), "0.1.0-test");
  EXPECT_EQ(f.at("instance_id").string_value(), "inst-42");
  EXPECT_EQ(f.at("node_id").string_value(), "node-a");
  ASSERT_EQ(f.at("sessions").kind_case(), Value::kNumberValue);
  EXPECT_EQ(f.at("sessions").number_value(), 3);
  EXPECT_EQ(f.at("pid").number_value(), 4242);
  // Zero-valued fields are printed too, so scripts can rely on the keys.
  EXPECT_EQ(f.at("nic_count").number_value(), 0);
  EXPECT_EQ(f.at("peer_listen").string_value(), "");
  // 64-bit integers are JSON numbers too (proto3 JSON would quote them).
  ASSERT_EQ(f.at("uptime_ms").kind_case(), Value::kNumberValue) << r.out;
  EXPECT_EQ(f.at("uptime_ms").number_value(), 3723000);
  ASSERT_EQ(f.at("gpus").kind_case(), Value::kListValue);
  ASSERT_EQ(f.at("gpus").list_value().values_size(), 2);
  const auto& g1 = f.at("gpus").list_value().values(1).struct_value().fields();
  EXPECT_EQ(g1.at("index").number_value(), 1);
  EXPECT_EQ(g1.at("pci_bus_id").string_value(), "0000:11:00.0");
  EXPECT_TRUE(g1.at("vmm_supported").bool_value());
  EXPECT_FALSE(g1.at("dmabuf_supported").bool_value());
  ASSERT_EQ(f.at("nics").kind_case(), Value::kListValue);
  EXPECT_EQ(f.at("nics").list_value().values_size(), 0);
  EXPECT_EQ(f.at("nic_discovery_note").string_value(),
            "no RDMA devices under /sys/class/infiniband");
}

TEST_F(McctlTest, GpusAndNics) {
  Result t = Mcctl({"--socket", socket_, "gpus"});
  ASSERT_EQ(t.rc, kExitOk) << t.err;
  EXPECT_TRUE(absl::StartsWith(t.out, "IDX  NAME         PCI           NUMA     MEMORY  CC   SMS"))
      << t.out;
  EXPECT_TRUE(
      absl::StrContains(t.out, "  1  NVIDIA H200  0000:11:00.0     0  150.0 GiB  9.0  132  yes"))
      << t.out;

  Result j = Mcctl({"--socket", socket_, "--json", "gpus"});
  ASSERT_EQ(j.rc, kExitOk) << j.err;
  ListValue gpus = ParseArray(j.out);
  ASSERT_EQ(gpus.values_size(), 2);
  EXPECT_EQ(gpus.values(0).struct_value().fields().at("uuid").string_value(), "GPU-00000000");
  EXPECT_EQ(gpus.values(0).struct_value().fields().at("total_memory_bytes").number_value(),
            static_cast<double>(150ull << 30));

  Result n = Mcctl({"--socket", socket_, "nics"});
  ASSERT_EQ(n.rc, kExitOk) << n.err;
  EXPECT_EQ(n.out, "no RDMA NICs (no RDMA devices under /sys/class/infiniband)\n");
  Result nj = Mcctl({"--socket", socket_, "nics", "--json"});
  ASSERT_EQ(nj.rc, kExitOk) << nj.err;
  EXPECT_EQ(ParseArray(nj.out).values_size(), 0);

  // A NIC shows up in both forms once the daemon reports one.
  auto* nic = fake_.topo_.add_nics();
  nic->set_name("mlx5_0");
  nic->add_ports()->set_port(1);
  auto* a = fake_.topo_.add_affinity();
  a->set_gpu(0);
  a->set_nic("mlx5_0");
  a->set_distance("PIX");
  a->set_closest(true);
  Result n2 = Mcctl({"--socket", socket_, "nics"});
  EXPECT_TRUE(absl::StartsWith(n2.out, "NIC     PROVIDER  PORT  STATE")) << n2.out;
  ListValue nics = ParseArray(Mcctl({"--socket", socket_, "--json", "nics"}).out);
  ASSERT_EQ(nics.values_size(), 1);
  EXPECT_EQ(nics.values(0).struct_value().fields().at("name").string_value(), "mlx5_0");
  // What the NIC answers of atomics: a line under the table, a key in JSON.
  nic->set_atomics("fetch-add,masked-fetch-add; sizes 4,8 B");
  EXPECT_TRUE(absl::StrContains(Mcctl({"--socket", socket_, "nics"}).out,
                                "\natomics mlx5_0: fetch-add,masked-fetch-add; sizes 4,8 B\n"));
  nics = ParseArray(Mcctl({"--socket", socket_, "--json", "nics"}).out);
  EXPECT_EQ(nics.values(0).struct_value().fields().at("atomics").string_value(),
            "fetch-add,masked-fetch-add; sizes 4,8 B");
}

// `selftest rdma` without --nic: a loopback pair on every NIC the daemon
// serves (issue 24 item 10), each reported under its name, then a line for
// them all; a NIC it does not serve is left out. (This fake daemon serves
// no sessions: each NIC fails at setup, which is what shows the loop.)
TEST_F(McctlTest, SelftestRunsOnEveryNicTheDaemonServes) {
  for (const auto& [name, provider] : std::vector<std::pair<std::string, std::string>>{
           {"mlx5_0", "mlx5"}, {"mlx5_1", "mlx5"}, {"mlx5_2", ""}}) {
    auto* nic = fake_.topo_.add_nics();
    nic->set_name(name);
    nic->set_provider(provider);
  }
  Result t = Mcctl({"--socket", socket_, "--timeout-ms", "3000", "selftest", "rdma"});
  EXPECT_EQ(t.rc, kExitError) << t.out << t.err;
  EXPECT_TRUE(absl::StrContains(t.out, "selftest rdma on mlx5_0: FAIL at setup")) << t.out;
  EXPECT_TRUE(absl::StrContains(t.out, "selftest rdma on mlx5_1: FAIL at setup")) << t.out;
  EXPECT_FALSE(absl::StrContains(t.out, "mlx5_2")) << "a NIC the daemon does not serve: " << t.out;
  EXPECT_TRUE(absl::StrContains(
      t.out, "selftest rdma on 2 NICs (mlx5_0, mlx5_1): some NIC failed a step (above)"))
      << t.out;
  Result j = Mcctl({"--socket", socket_, "--timeout-ms", "3000", "--json", "selftest", "rdma"});
  EXPECT_EQ(j.rc, kExitError) << j.out << j.err;
  Struct s;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(j.out, &s).ok()) << j.out;
  EXPECT_FALSE(s.fields().at("ok").bool_value());
  const auto& each = s.fields().at("nics").list_value().values();
  ASSERT_EQ(each.size(), 2) << j.out;
  EXPECT_EQ(each[0].struct_value().fields().at("nic").string_value(), "mlx5_0");
  EXPECT_EQ(each[1].struct_value().fields().at("nic").string_value(), "mlx5_1");
  // --nic: that NIC alone, reported as one.
  Result one =
      Mcctl({"--socket", socket_, "--timeout-ms", "3000", "selftest", "rdma", "--nic", "mlx5_1"});
  EXPECT_TRUE(absl::StrContains(one.out, "selftest rdma on mlx5_1: FAIL at setup")) << one.out;
  EXPECT_FALSE(absl::StrContains(one.out, "mlx5_0")) << one.out;
  EXPECT_FALSE(absl::StrContains(one.out, "NICs (")) << one.out;
}

TEST_F(McctlTest, Topo) {
  Result t = Mcctl({"--socket", socket_, "topo"});
  ASSERT_EQ(t.rc, kExitOk) << t.err;
  EXPECT_TRUE(absl::StrContains(t.out,
                                "GPU to GPU:\n"
                                "      GPU0  GPU1  NUMA\n"
                                "GPU0  X     A0    0\n"
                                "GPU1  A0    X     0\n"))
      << t.out;
  EXPECT_TRUE(absl::StrContains(
      t.out, "GPU to NIC:\nno RDMA NICs (no RDMA devices under /sys/class/infiniband)\n"))
      << t.out;

  Result j = Mcctl({"--socket", socket_, "--json", "topo"});
  ASSERT_EQ(j.rc, kExitOk) << j.err;
  Struct s = ParseObject(j.out);
  EXPECT_EQ(s.fields().at("gpus").list_value().values_size(), 2);
  ASSERT_EQ(s.fields().at("gpu_pairs").list_value().values_size(), 2);
  EXPECT_TRUE(s.fields()
                  .at("gpu_pairs")
                  .list_value()
                  .values(0)
                  .struct_value()
                  .fields()
                  .at("native_atomics")
                  .bool_value());
  EXPECT_EQ(s.fields().at("cuda_driver_version").number_value(), 13000);
}

TEST_F(McctlTest, Sessions) {
  Result t = Mcctl({"--socket", socket_, "sessions"});
  ASSERT_EQ(t.rc, kExitOk) << t.err;
  EXPECT_TRUE(absl::StartsWith(t.out,
                               "ID   UID  GID  PID  CLIENT    AGE  FDS  TICKETS  GROUPS\n"
                               "11  1000    0  500  worker-0   2s    0        0  moe/0\n"))
      << t.out;
  EXPECT_EQ(CountLines(t.out), 4);

  Result j = Mcctl({"--socket", socket_, "--json", "sessions"});
  ASSERT_EQ(j.rc, kExitOk) << j.err;
  ListValue list = ParseArray(j.out);
  ASSERT_EQ(list.values_size(), 3);
  const auto& s2 = list.values(2).struct_value().fields();
  ASSERT_EQ(s2.at("session_id").kind_case(), Value::kNumberValue) << j.out;
  EXPECT_EQ(s2.at("session_id").number_value(), 13);
  EXPECT_EQ(s2.at("age_ms").number_value(), 2000);
  EXPECT_EQ(s2.at("client_name").string_value(), "worker-2");
  EXPECT_EQ(s2.at("groups").list_value().values_size(), 0);
}

TEST_F(McctlTest, Groups) {
  Result t = Mcctl({"--socket", socket_, "groups"});
  ASSERT_EQ(t.rc, kExitOk) << t.err;
  EXPECT_TRUE(absl::StartsWith(t.out,
                               "NAME   UID  SIZE  JOINED  STATE    EPOCH  AGE\n"
                               "moe   1000     3       2  forming      4  0ms\n"))
      << t.out;
  EXPECT_TRUE(absl::StrContains(t.out,
                                "members of moe:\n"
                                "  RANK  STATE   PID  GPU  HANDLE          SIZE  SESSION\n"
                                "     2  ready   502    2  cuda-vmm-fd  1.0 GiB       13\n"
                                "     0  joined  500    0  cuda-vmm-fd"))
      << t.out;

  Result j = Mcctl({"--socket", socket_, "--json", "groups"});
  ASSERT_EQ(j.rc, kExitOk) << j.err;
  ListValue list = ParseArray(j.out);
  ASSERT_EQ(list.values_size(), 1);
  const auto& g = list.values(0).struct_value().fields();
  EXPECT_EQ(g.at("name").string_value(), "moe");
  EXPECT_EQ(g.at("world_size").number_value(), 3);
  const auto& joined = g.at("joined_ranks").list_value();
  ASSERT_EQ(joined.values_size(), 2);  // rank 1 is "lost"
  EXPECT_EQ(joined.values(0).number_value(), 0);
  EXPECT_EQ(joined.values(1).number_value(), 2);
  ASSERT_EQ(g.at("members").list_value().values_size(), 3);
  EXPECT_EQ(
      g.at("members").list_value().values(1).struct_value().fields().at("state").string_value(),
      "joined");
}

// Every 64-bit field, at its largest, is a bare JSON number with all digits
// (a double would round it): the text is checked, not a parsed value.
TEST_F(McctlTest, SixtyFourBitFieldsAreExactJsonNumbers) {
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  fake_.sessions_.mutable_sessions(0)->set_session_id(kMax);
  fake_.sessions_.mutable_sessions(0)->set_age_ms(kMax - 1);
  auto* g = fake_.groups_.mutable_groups(0);
  g->set_epoch(kMax);
  g->set_age_ms(9007199254740993ull);  // 2^53 + 1
  g->mutable_members(0)->set_session_id(kMax);
  g->mutable_members(0)->set_handle_size(kMax);
  fake_.status_.set_uptime_ms(kMax);
  fake_.topo_.mutable_gpus(0)->set_total_memory_bytes(kMax);

  const std::string sessions = Mcctl({"--socket", socket_, "--json", "sessions"}).out;
  EXPECT_TRUE(absl::StrContains(sessions, "\"session_id\": 18446744073709551615,")) << sessions;
  EXPECT_TRUE(absl::StrContains(sessions, "\"age_ms\": 18446744073709551614,")) << sessions;
  const std::string groups = Mcctl({"--socket", socket_, "--json", "groups"}).out;
  for (const char* want : {"\"epoch\": 18446744073709551615,", "\"age_ms\": 9007199254740993,",
                           "\"session_id\": 18446744073709551615",
                           "\"handle_size\": "
                           "18446744073709551615"}) {
    EXPECT_TRUE(absl::StrContains(groups, want)) << want << " in\n" << groups;
  }
  const std::string status = Mcctl({"--socket", socket_, "--json", "status"}).out;
  EXPECT_TRUE(absl::StrContains(status, "\"uptime_ms\": 18446744073709551615,")) << status;
  EXPECT_TRUE(absl::StrContains(status, "\"total_memory_bytes\": 18446744073709551615,")) << status;
  for (const std::string* out : {&sessions, &groups, &status}) {
    EXPECT_FALSE(absl::StrContains(*out, "\"18446744073709551615\"")) << *out;
  }
}

// A client chooses its name; `mcctl sessions` is often run by root. The
// review forged a table row with "\n" and sent colour codes and a bell.
TEST_F(McctlTest, HostileClientNameCannotForgeRowsOrReachTheTerminal) {
  const std::string forged =
      "w\n99  0  0  1  root-job  1s  0  0  -\x1b[31m\a\x1b]0;pwned\a\xc2\x9b[2J";
  fake_.sessions_.mutable_sessions(0)->set_client_name(forged);
  Result t = Mcctl({"--socket", socket_, "sessions"});
  ASSERT_EQ(t.rc, kExitOk) << t.err;
  EXPECT_EQ(CountLines(t.out), 4) << t.out;  // header + 3 sessions, no forged row
  for (char c : t.out) {
    const auto u = static_cast<unsigned char>(c);
    EXPECT_TRUE(c == '\n' || (u >= 0x20 && u < 0x7f)) << "raw byte " << int{u} << " in\n" << t.out;
  }
  // Cut at 48 bytes once escaped, ending in "...".
  EXPECT_TRUE(absl::StrContains(t.out, "  w\\n99  0  0  1  root-job  1s  0  0  -\\x1b[31m...  "))
      << t.out;

  // JSON stays valid and carries the exact name, escaped the JSON way.
  Result j = Mcctl({"--socket", socket_, "--json", "sessions"});
  ASSERT_EQ(j.rc, kExitOk) << j.err;
  EXPECT_EQ(j.out.find('\x1b'), std::string::npos) << j.out;
  EXPECT_EQ(j.out.find('\a'), std::string::npos) << j.out;
  EXPECT_TRUE(
      absl::StrContains(j.out, "\"w\\n99  0  0  1  root-job  1s  0  0  -\\u001b[31m\\u0007"))
      << j.out;
  ListValue list = ParseArray(j.out);
  ASSERT_EQ(list.values_size(), 3);
  EXPECT_EQ(list.values(0).struct_value().fields().at("client_name").string_value(), forged);
}

// A path too long for a UNIX socket: one line of mcctl's own and the usage
// exit code, before any channel is made (the binary test checks that gRPC
// prints nothing).
TEST_F(McctlTest, SocketPathTooLongIsAUsageError) {
  const std::string path = "/tmp/" + std::string(120, 'a') + ".sock";
  Result r = Mcctl({"--socket", path, "status"});
  EXPECT_EQ(r.rc, kExitUsage);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, absl::StrCat("mcctl: socket path is ", path.size(),
                                " bytes, longer than the 107 a UNIX socket allows: ", path, "\n"));
  setenv(kSocketEnvVar, path.c_str(), 1);
  EXPECT_EQ(Mcctl({"groups"}).rc, kExitUsage);
  EXPECT_EQ(fake_.calls_, 0);
}

TEST_F(McctlTest, EmptyListsAreEmptyArrays) {
  fake_.sessions_.clear_sessions();
  fake_.groups_.clear_groups();
  EXPECT_EQ(Mcctl({"--socket", socket_, "sessions"}).out, "no sessions\n");
  EXPECT_EQ(Mcctl({"--socket", socket_, "groups"}).out, "no groups\n");
  EXPECT_EQ(Mcctl({"--socket", socket_, "--json", "sessions"}).out, "[]\n");
  EXPECT_EQ(Mcctl({"--socket", socket_, "--json", "groups"}).out, "[]\n");
}

TEST_F(McctlTest, UnreachableDaemonIsOneLineAndExit2) {
  Result r = Mcctl({"--socket", Missing(), "status"});
  EXPECT_EQ(r.rc, kExitUnreachable);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, absl::StrCat("mcctl: cannot reach mooncaked at ", Missing(),
                                " (No such file or directory): is the service running?\n"));
}

TEST_F(McctlTest, StaleSocketFileIsConnectionRefused) {
  // A socket file nobody listens on: what a crashed daemon leaves behind.
  const std::string stale = dir_ + "/stale.sock";
  int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, stale.c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0)
      << std::strerror(errno);
  ::close(fd);
  Result r = Mcctl({"--socket", stale, "groups"});
  EXPECT_EQ(r.rc, kExitUnreachable);
  EXPECT_EQ(r.err, absl::StrCat("mcctl: cannot reach mooncaked at ", stale,
                                " (Connection refused): is the service running?\n"));
}

TEST_F(McctlTest, SlowDaemonHitsTheDeadline) {
  fake_.stall_ms_ = 3000;
  const auto start = std::chrono::steady_clock::now();
  Result r = Mcctl({"--socket", socket_, "--timeout-ms", "200", "sessions"});
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(r.rc, kExitUnreachable);
  EXPECT_EQ(r.err, absl::StrCat("mcctl: cannot reach mooncaked at ", socket_,
                                " (no reply within 200 ms): is the service running?\n"));
  EXPECT_LT(took, std::chrono::milliseconds(2000));
}

TEST_F(McctlTest, DaemonErrorIsOneLineAndExit1) {
  fake_.deny_groups_ = true;
  Result r = Mcctl({"--socket", socket_, "groups"});
  EXPECT_EQ(r.rc, kExitError);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err,
            "mcctl: ListGroups failed: PERMISSION_DENIED: uid 1001 may not list groups of uid 0\n");
}

TEST_F(McctlTest, SocketPrecedence) {
  // $MOONCAKE_SOCKET is used without --socket.
  setenv(kSocketEnvVar, socket_.c_str(), 1);
  Result env_only = Mcctl({"status"});
  EXPECT_EQ(env_only.rc, kExitOk) << env_only.err;

  // --socket wins over the environment, both ways.
  Result flag_wins = Mcctl({"--socket", Missing(), "status"});
  EXPECT_EQ(flag_wins.rc, kExitUnreachable);
  EXPECT_TRUE(absl::StrContains(flag_wins.err, Missing())) << flag_wins.err;
  setenv(kSocketEnvVar, Missing().c_str(), 1);
  Result flag_wins2 = Mcctl({"status", "--socket", socket_});
  EXPECT_EQ(flag_wins2.rc, kExitOk) << flag_wins2.err;

  // An empty variable counts as unset: the default path.
  setenv(kSocketEnvVar, "", 1);
  struct stat st;
  if (::stat(kDefaultSocketPath, &st) == 0) {
    GTEST_SKIP() << "a daemon socket exists at " << kDefaultSocketPath
                 << "; cannot check the fallback to it";
  }
  Result fallback = Mcctl({"status", "--timeout-ms", "500"});
  EXPECT_EQ(fallback.rc, kExitUnreachable);
  EXPECT_TRUE(absl::StartsWith(
      fallback.err, absl::StrCat("mcctl: cannot reach mooncaked at ", kDefaultSocketPath, " (")))
      << fallback.err;
}

TEST_F(McctlTest, UsageHelpAndVersion) {
  for (std::vector<std::string> bad :
       {std::vector<std::string>{},
        {"frobnicate"},
        {"--bogus", "status"},
        {"status", "extra"},
        {"--socket"},
        {"--socket", ""},
        {"--timeout-ms", "0", "status"},
        {"--timeout-ms", "soon", "status"},
        {"selftest"},
        {"selftest", "gpu"},
        {"selftest", "rdma", "--nic", ""},
        {"selftest", "rdma", "--gpu", "first"},
        {"selftest", "rdma", "--gpu", "-1"},
        {"status", "--gpu", "0"},
        {"nics", "--nic", "mlx5_0"},
        {"selftest", "rdma", "--across", "g"},
        {"selftest", "rdma", "--rank", "1"},
        {"selftest", "rdma", "--across", "", "--rank", "0"},
        {"selftest", "rdma", "--across", "g", "--rank", "2"},
        {"selftest", "rdma", "--across", "g", "--rank", "-1"},
        {"selftest", "rdma", "--across", "g", "--rank", "0", "--gpu", "0"},
        {"status", "--across", "g", "--rank", "0"},
        {"selftest", "rdma", "--across", "my check", "--rank", "0"}}) {
    Result r = Mcctl(bad);
    EXPECT_EQ(r.rc, kExitUsage) << absl::StrJoin(bad, " ");
    EXPECT_TRUE(absl::StartsWith(r.err, "mcctl: ")) << r.err;
    EXPECT_TRUE(absl::StrContains(r.err, "usage: mcctl")) << r.err;
    EXPECT_EQ(r.out, "");
  }
  EXPECT_TRUE(absl::StrContains(Mcctl({"frobnicate"}).err, "unknown command 'frobnicate'"));
  EXPECT_TRUE(absl::StrContains(Mcctl({"selftest", "rdma", "--across", "g"}).err,
                                "--across GROUP and --rank R go together"));
  EXPECT_TRUE(absl::StrContains(Mcctl({"selftest", "rdma", "--across", "a/b", "--rank", "1"}).err,
                                "[A-Za-z0-9._:-]"));
  EXPECT_TRUE(absl::StrContains(
      Mcctl({"selftest", "rdma", "--across", "g", "--rank", "1", "--gpu", "0"}).err,
      "--across runs the steps from a CPU thread"));

  Result help = Mcctl({"help"});
  EXPECT_EQ(help.rc, kExitOk);
  EXPECT_TRUE(absl::StartsWith(help.out, "usage: mcctl")) << help.out;
  EXPECT_EQ(Mcctl({"--help"}).out, help.out);
  EXPECT_EQ(Mcctl({"help", "groups"}).out, help.out);

  Result version = Mcctl({"--version"});
  EXPECT_EQ(version.rc, kExitOk);
  EXPECT_TRUE(absl::StartsWith(version.out, "mcctl ")) << version.out;
  EXPECT_EQ(fake_.calls_, 0) << "help, version and usage errors must not contact the daemon";
}

TEST(PrettyJsonTest, IndentsAndLeavesStringsAlone) {
  EXPECT_EQ(PrettyJson(R"({"a":[1,2],"b":"x, {y}: \"z\"","c":{},"d":[]})"),
            "{\n"
            "  \"a\": [\n"
            "    1,\n"
            "    2\n"
            "  ],\n"
            "  \"b\": \"x, {y}: \\\"z\\\"\",\n"
            "  \"c\": {},\n"
            "  \"d\": []\n"
            "}");
}

// `qps --json` / `mrs --json` entries name their owner session as
// "session" (issue 8's acceptance keys) and still as "session_id".
TEST(JsonOutputTest, QueuePairsAndRegionsNameTheirSession) {
  constexpr uint64_t kBig = (uint64_t{1} << 40) + 3;  // exact as a JSON number
  v1::ListQueuePairsResponse qps;
  qps.add_qps()->set_session_id(kBig);
  auto* q = qps.add_qps();
  q->set_qpn(4660);
  q->set_state("RTS");
  q->set_session_id(7);
  absl::StatusOr<std::string> qj = QueuePairsJson(qps);
  ASSERT_TRUE(qj.ok()) << qj.status();
  ListValue ql = ParseArray(*qj);
  ASSERT_EQ(ql.values_size(), 2) << *qj;
  EXPECT_EQ(ql.values(0).struct_value().fields().at("session").number_value(),
            static_cast<double>(kBig))
      << *qj;
  const auto& qf = ql.values(1).struct_value().fields();
  EXPECT_EQ(qf.at("qpn").number_value(), 4660) << *qj;
  EXPECT_EQ(qf.at("state").string_value(), "RTS") << *qj;
  EXPECT_EQ(qf.at("session").number_value(), 7) << *qj;
  EXPECT_EQ(qf.at("session_id").number_value(), 7) << *qj;
  EXPECT_TRUE(absl::StrContains(*qj, absl::StrCat("\"session\":", kBig))) << *qj;

  v1::ListMemoryRegionsResponse mrs;
  auto* m = mrs.add_regions();
  m->set_size(1 << 20);
  m->set_session_id(9);
  absl::StatusOr<std::string> mj = MemoryRegionsJson(mrs);
  ASSERT_TRUE(mj.ok()) << mj.status();
  ListValue ml = ParseArray(*mj);
  ASSERT_EQ(ml.values_size(), 1) << *mj;
  const auto& mf = ml.values(0).struct_value().fields();
  EXPECT_EQ(mf.at("size").number_value(), 1 << 20) << *mj;
  EXPECT_EQ(mf.at("session").number_value(), 9) << *mj;
  EXPECT_EQ(mf.at("session_id").number_value(), 9) << *mj;
  EXPECT_EQ(QueuePairsJson(v1::ListQueuePairsResponse()).value(), "[]");
  EXPECT_EQ(MemoryRegionsJson(v1::ListMemoryRegionsResponse()).value(), "[]");
}

// The installed binary, run as a separate process: exactly one line on
// stderr when the daemon is missing (no gRPC log noise), and the exit code.
TEST(McctlBinaryTest, UnreachableFromTheRealBinary) {
  const char* bin_dir = std::getenv("MOONCAKE_BIN_DIR");
  ASSERT_NE(bin_dir, nullptr) << "run through ctest, which sets MOONCAKE_BIN_DIR";
  const std::string bin = absl::StrCat(bin_dir, "/mcctl");
  ASSERT_EQ(::access(bin.c_str(), X_OK), 0) << bin << ": " << std::strerror(errno);

  char tmpl[] = "/tmp/mcctl_bin_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  const std::string missing = dir + "/gone.sock";
  const std::string err_file = dir + "/stderr";
  const std::string cmd = absl::StrCat("MOONCAKE_SOCKET=", missing, " ", bin, " status --json >",
                                       dir, "/stdout 2>", err_file);
  const int status = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(status)) << cmd;
  EXPECT_EQ(WEXITSTATUS(status), kExitUnreachable);

  std::string err;
  if (FILE* f = std::fopen(err_file.c_str(), "r")) {
    char buf[4096];
    std::size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) err.append(buf, n);
    std::fclose(f);
  }
  EXPECT_EQ(err, absl::StrCat("mcctl: cannot reach mooncaked at ", missing,
                              " (No such file or directory): is the service running?\n"));
  std::error_code ec;
  EXPECT_EQ(std::filesystem::file_size(dir + "/stdout", ec), 0u);
  std::filesystem::remove_all(dir, ec);
}

// The real binary with a socket path too long for sun_path: exactly one
// line on stderr (no gRPC "parse_address.cc" lines) and the usage exit code.
TEST(McctlBinaryTest, SocketPathTooLongIsOneLineFromTheRealBinary) {
  const char* bin_dir = std::getenv("MOONCAKE_BIN_DIR");
  ASSERT_NE(bin_dir, nullptr) << "run through ctest, which sets MOONCAKE_BIN_DIR";
  char tmpl[] = "/tmp/mcctl_bin_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  const std::string path = "/tmp/" + std::string(120, 'a') + ".sock";
  const std::string err_file = dir + "/stderr";
  const std::string cmd =
      absl::StrCat(bin_dir, "/mcctl --socket ", path, " status >", dir, "/stdout 2>", err_file);
  const int status = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(status)) << cmd;
  EXPECT_EQ(WEXITSTATUS(status), kExitUsage);
  std::string err;
  if (FILE* f = std::fopen(err_file.c_str(), "r")) {
    char buf[4096];
    std::size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) err.append(buf, n);
    std::fclose(f);
  }
  EXPECT_EQ(err, absl::StrCat("mcctl: socket path is ", path.size(),
                              " bytes, longer than the 107 a UNIX socket allows: ", path, "\n"));
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

}  // namespace
}  // namespace mooncake::mcctl
