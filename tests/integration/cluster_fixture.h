// A cluster for integration tests: a real etcd on 127.0.0.1 (Debian's
// etcd-server, tests/daemon/etcd_test_server.h) and real mooncaked
// processes as its nodes, each with its own node id, socket and peer port,
// talking mutual TLS with a certificate for its node id that
// deploy/make-cluster-certs.sh made (test_certs.h).
#pragma once

#include <sys/stat.h>

#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon_process.h"
#include "etcd_test_server.h"
#include "gtest/gtest.h"
#include "test_certs.h"

namespace mooncake::testing {

// Leases short enough that a lost node shows within the test's patience.
constexpr int kClusterLeaseTtlS = 2;

class ClusterFixture : public ::testing::Test {
 protected:
  explicit ClusterFixture(std::string etcd_prefix) : etcd_prefix_(std::move(etcd_prefix)) {}

  void SetUp() override {
    absl::Status s = etcd_.Start();
    ASSERT_TRUE(s.ok()) << s;
    std::ofstream(dir_.path() + "/cluster.conf")
        << "etcd_lease_ttl_s = " << kClusterLeaseTtlS << "\netcd_prefix = " << etcd_prefix_ << "\n";
  }
  // A node of the cluster, started and serving; `log_to_output`: its log
  // is read through child().output(); `extra_config`: lines added to its
  // config file.
  std::unique_ptr<DaemonProcess> Node(const std::string& id, bool log_to_output = false,
                                      const std::string& extra_config = "") {
    const std::string sub = dir_.path() + "/" + id;
    ::mkdir(sub.c_str(), 0700);
    const absl::StatusOr<TestCertificates> certs = MakeNodeCertificate(dir_.path() + "/tls", id);
    EXPECT_TRUE(certs.ok()) << certs.status();
    std::ofstream(sub + "/node.conf")
        << "etcd_lease_ttl_s = " << kClusterLeaseTtlS << "\netcd_prefix = " << etcd_prefix_ << "\n"
        << (certs.ok() ? PeerTlsConfig(*certs) : std::string()) << extra_config;
    return std::make_unique<DaemonProcess>(
        sub,
        std::vector<std::string>{"--config", sub + "/node.conf", "--node-id", id, "--peer-listen",
                                 absl::StrCat("127.0.0.1:", daemon::etcd::testing::PickFreePort()),
                                 "--etcd", etcd_.client_url()},
        log_to_output);
  }

  const std::string etcd_prefix_;
  TempDir dir_;
  daemon::etcd::testing::EtcdTestServer etcd_;
};

}  // namespace mooncake::testing
