// mcctl against a real mooncaked started from the build tree with the
// shipped example config (deploy/mooncaked.conf.example), so this also
// checks that every documented key parses.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace {

using google::protobuf::Struct;
using google::protobuf::Value;

struct Output {
  int rc = -1;
  std::string out;
};

// Runs a shell command and collects its stdout.
Output Capture(const std::string& cmd) {
  Output o;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return o;
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) o.out.append(buf, n);
  const int status = ::pclose(p);
  o.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return o;
}

class McctlDaemonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* bin_dir = std::getenv("MOONCAKE_BIN_DIR");
    ASSERT_NE(bin_dir, nullptr) << "run through ctest, which sets MOONCAKE_BIN_DIR";
    bin_ = bin_dir;
    for (const char* exe : {"mooncaked", "mcctl"}) {
      const std::string path = bin_ + "/" + exe;
      ASSERT_EQ(::access(path.c_str(), X_OK), 0) << path << ": " << std::strerror(errno);
    }
    char tmpl[] = "/tmp/mcctl_daemon_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    socket_ = dir_ + "/mooncaked.sock";
    const std::string config = std::string(MOONCAKE_SOURCE_DIR) + "/deploy/mooncaked.conf.example";
    const std::string daemon = bin_ + "/mooncaked";
    const std::string log = dir_ + "/mooncaked.log";

    pid_ = ::fork();
    ASSERT_GE(pid_, 0) << std::strerror(errno);
    if (pid_ == 0) {
      std::freopen(log.c_str(), "w", stderr);
      std::freopen(log.c_str(), "a", stdout);
      // Flags after --config override the file.
      ::execl(daemon.c_str(), daemon.c_str(), "--config", config.c_str(), "--socket",
              socket_.c_str(), "--node-id", "mcctl-test-node", static_cast<char*>(nullptr));
      std::_Exit(127);
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
    struct stat st;
    while (::stat(socket_.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode)) {
      int status = 0;
      ASSERT_EQ(::waitpid(pid_, &status, WNOHANG), 0)
          << "mooncaked exited early; its log: " << Capture("cat " + log).out;
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "no socket at " << socket_;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }

  void TearDown() override {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      int status = 0;
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      pid_t r = 0;
      while ((r = ::waitpid(pid_, &status, WNOHANG)) == 0 &&
             std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      if (r == 0) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
        ADD_FAILURE() << "mooncaked ignored SIGTERM for 10 s";
      } else {
        EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "mooncaked status " << status;
      }
    }
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  std::string Mcctl(const std::string& args) const {
    return absl::StrCat(bin_, "/mcctl --socket ", socket_, " ", args, " 2>&1");
  }

  std::string bin_;
  std::string dir_;
  std::string socket_;
  pid_t pid_ = -1;
};

TEST_F(McctlDaemonTest, StatusJsonFromTheRealDaemon) {
  Output o = Capture(Mcctl("status --json"));
  ASSERT_EQ(o.rc, 0) << o.out;
  Struct s;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(o.out, &s).ok()) << o.out;
  const auto& f = s.fields();
  EXPECT_EQ(f.at("node_id").string_value(), "mcctl-test-node");
  EXPECT_EQ(f.at("socket_path").string_value(), socket_);
  EXPECT_FALSE(f.at("version").string_value().empty());
  EXPECT_FALSE(f.at("instance_id").string_value().empty());
  EXPECT_EQ(f.at("sessions").kind_case(), Value::kNumberValue);
  ASSERT_EQ(f.at("gpus").kind_case(), Value::kListValue);
  ASSERT_EQ(f.at("nics").kind_case(), Value::kListValue);
  EXPECT_EQ(static_cast<double>(f.at("gpus").list_value().values_size()),
            f.at("gpu_count").number_value());
  EXPECT_EQ(static_cast<double>(f.at("nics").list_value().values_size()),
            f.at("nic_count").number_value());
}

TEST_F(McctlDaemonTest, EveryCommandAnswers) {
  for (const char* cmd : {"status", "gpus", "nics", "topo", "sessions", "groups"}) {
    Output table = Capture(Mcctl(cmd));
    EXPECT_EQ(table.rc, 0) << cmd << ": " << table.out;
    EXPECT_FALSE(table.out.empty()) << cmd;
    Output json = Capture(Mcctl(absl::StrCat("--json ", cmd)));
    EXPECT_EQ(json.rc, 0) << cmd << ": " << json.out;
    // Wrapped, since JsonStringToMessage wants an object at the top.
    Struct s;
    EXPECT_TRUE(
        google::protobuf::util::JsonStringToMessage(absl::StrCat("{\"v\":", json.out, "}"), &s)
            .ok())
        << cmd << ": " << json.out;
  }
}

// `mcctl selftest rdma` through the daemon's softnic: every step passes,
// each with what it measured, and nothing of the pair stays behind. A NIC
// the daemon does not serve fails at setup, saying what to check.
TEST_F(McctlDaemonTest, SelftestRdmaPassesEveryStepOnSoftnic) {
  Output o = Capture(Mcctl("--json selftest rdma"));
  ASSERT_EQ(o.rc, 0) << o.out;
  Struct s;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(o.out, &s).ok()) << o.out;
  const auto& f = s.fields();
  EXPECT_TRUE(f.at("ok").bool_value());
  EXPECT_EQ(f.at("provider").string_value(), "softnic");
  EXPECT_EQ(f.at("nic").string_value(), "softnic0");
  std::vector<std::string> names;
  for (const Value& v : f.at("steps").list_value().values()) {
    const auto& step = v.struct_value().fields();
    names.push_back(step.at("name").string_value());
    EXPECT_TRUE(step.at("pass").bool_value()) << o.out;
    if (names.back() != "bad-rkey") {
      EXPECT_GT(step.at("rate_per_s").number_value(), 0) << names.back();
    }
  }
  EXPECT_EQ(names, (std::vector<std::string>{"write-inline", "write", "fetch-add-8", "masked-fa-4",
                                             "ring-wrap", "loopback-atomic", "bad-rkey"}));

  Output table = Capture(Mcctl("selftest rdma"));
  EXPECT_EQ(table.rc, 0) << table.out;
  EXPECT_NE(table.out.find("selftest rdma: all steps passed"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("remote access error"), std::string::npos) << table.out;

  Output wrong = Capture(Mcctl("selftest rdma --nic mlx5_7"));
  EXPECT_EQ(wrong.rc, 1) << wrong.out;
  EXPECT_NE(wrong.out.find("FAIL at setup"), std::string::npos) << wrong.out;
  EXPECT_NE(wrong.out.find("NIC \"mlx5_7\" is not served"), std::string::npos) << wrong.out;

  Output qps = Capture(Mcctl("qps"));
  EXPECT_EQ(qps.out, "no queue pairs\n");
}

// `selftest rdma --gpu G` runs mcctl-selftest-gpu from mcctl's folder, its
// output and exit code passed through; a build without it says so.
TEST_F(McctlDaemonTest, SelftestRdmaOnAGpuRunsTheHelperNextToMcctl) {
  const std::string helper = bin_ + "/mcctl-selftest-gpu";
  Output o = Capture(Mcctl("selftest rdma --gpu 0"));
  if (::access(helper.c_str(), X_OK) != 0) {
    EXPECT_EQ(o.rc, 1) << o.out;
    EXPECT_NE(o.out.find("mcctl-selftest-gpu is not there"), std::string::npos) << o.out;
    return;
  }
  if (o.out.find("this process sees 0 GPU(s)") != std::string::npos) {
    EXPECT_EQ(o.rc, 2) << o.out;  // this machine has no GPU: the helper's own answer
    return;
  }
  // A GPU: both placements reported (GPU rings may be unsupported here).
  EXPECT_NE(o.out.find("from CUDA kernels on GPU 0, rings in host memory"), std::string::npos)
      << o.out;
  EXPECT_NE(o.out.find("rings in GPU memory"), std::string::npos) << o.out;
  EXPECT_EQ(o.rc, 0) << o.out;
}

}  // namespace
