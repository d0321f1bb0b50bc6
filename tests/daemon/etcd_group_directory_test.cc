// EtcdGroupDirectory (daemon/peering/etcd_group_directory.h) against a real
// etcd: what other nodes' records reach the broker, and what is ignored.
// A key in another spelling of a rank or uid ("01", "+1000") must not alias
// the real member's entry, and a record with impossible fields must not
// reach a view. A missing etcd binary fails the tests; it is never a skip.
#include "peering/etcd_group_directory.h"

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "etcd/etcd_client.h"
#include "etcd/etcd_options.h"
#include "etcd_test_server.h"
#include "gtest/gtest.h"

namespace mooncake::daemon::peering {
namespace {

constexpr char kPrefix[] = "/mctest";

// What the directory told the broker, as "uid/tenant/group/rank=node|gone".
class Deliveries {
 public:
  void Add(uint32_t uid, const std::string& tenant, const std::string& group, uint32_t rank,
           const std::optional<ClusterMember>& m) {
    absl::MutexLock lock(&mu_);
    lines_.push_back(absl::StrCat(uid, "/", tenant, "/", group, "/", rank, "=",
                                  m ? absl::StrCat(m->node_id, ":", m->pid) : "gone"));
  }
  // Waits until `line` was delivered; returns every line so far.
  std::vector<std::string> WaitFor(const std::string& line) {
    absl::MutexLock lock(&mu_);
    auto seen = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return std::find(lines_.begin(), lines_.end(), line) != lines_.end();
    };
    mu_.AwaitWithTimeout(absl::Condition(&seen), absl::Seconds(10));
    return lines_;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::string> lines_ ABSL_GUARDED_BY(mu_);
};

std::string Record(const std::string& node, int pid, uint32_t world_size, int gpu_index = 0) {
  return absl::StrCat("{\"node_id\":\"", node, "\",\"pid\":", pid, ",\"world_size\":", world_size,
                      ",\"gpu_index\":", gpu_index, "}");
}

class EtcdGroupDirectoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(server_.Start().ok()) << server_.LogTail();
    etcd::EtcdOptions o;
    o.endpoints = {server_.client_url()};
    o.dial_timeout = absl::Seconds(2);
    o.request_timeout = absl::Seconds(3);
    absl::StatusOr<std::unique_ptr<etcd::EtcdClient>> c = etcd::EtcdClient::Connect(o);
    ASSERT_TRUE(c.ok()) << c.status();
    etcd_ = *std::move(c);
    GroupDirectoryOptions go;
    go.prefix = kPrefix;
    go.node_id = "self";
    go.instance_id = "i";
    go.lease = [] { return int64_t{0}; };  // this test claims nothing
    go.sink = [this](uint32_t uid, const std::string& tenant, const std::string& group,
                     uint32_t rank, std::optional<ClusterMember> m) {
      deliveries_.Add(uid, tenant, group, rank, m);
    };
    absl::StatusOr<std::unique_ptr<EtcdGroupDirectory>> d =
        EtcdGroupDirectory::Start(etcd_.get(), std::move(go));
    ASSERT_TRUE(d.ok()) << d.status();
    directory_ = *std::move(d);
  }
  void TearDown() override {
    if (directory_) directory_->Stop();
  }
  void Put(const std::string& rest, const std::string& value) {
    ASSERT_TRUE(etcd_->Put(absl::StrCat(kPrefix, "/groups/", rest), value).ok());
  }

  etcd::testing::EtcdTestServer server_;
  std::unique_ptr<etcd::EtcdClient> etcd_;
  Deliveries deliveries_;
  std::unique_ptr<EtcdGroupDirectory> directory_;
};

TEST_F(EtcdGroupDirectoryTest, OtherSpellingsOfAKeyDoNotAliasTheMember) {
  Put("1000/g/ranks/1", Record("node-b", 41, 4));
  deliveries_.WaitFor("1000//g/1=node-b:41");
  // Another spelling of rank 1, of uid 1000, and a signed rank: ignored,
  // so that deleting them cannot report the real rank 1 gone.
  Put("1000/g/ranks/01", Record("node-c", 666, 4));
  Put("+1000/g/ranks/2", Record("node-c", 667, 4));
  Put("01000/g/ranks/3", Record("node-c", 668, 4));
  Put("1000/g/ranks/+3", Record("node-c", 669, 4));
  ASSERT_TRUE(etcd_->Delete(absl::StrCat(kPrefix, "/groups/1000/g/ranks/01")).ok());
  Put("1000@team-a/g/ranks/0", Record("node-b", 40, 4));  // a sentinel: the watch is in order
  std::vector<std::string> seen = deliveries_.WaitFor("1000/team-a/g/0=node-b:40");
  EXPECT_EQ(seen, (std::vector<std::string>{"1000//g/1=node-b:41", "1000/team-a/g/0=node-b:40"}));
  std::vector<ClusterMember> remote = directory_->RemoteMembers(1000, "", "g");
  ASSERT_EQ(remote.size(), 1u);
  EXPECT_EQ(remote[0].rank, 1u);
  EXPECT_EQ(remote[0].pid, 41);
}

TEST_F(EtcdGroupDirectoryTest, RecordsWithImpossibleFieldsAreIgnored) {
  Put("1000/g/ranks/0", Record("node-b", 40, 4, /*gpu_index=*/-7));
  Put("1000/g/ranks/1", Record("node-b", -1, 4));
  Put("1000/g/ranks/2", Record("node-b", 42, 2));                    // rank past its own world size
  Put("1000/g/ranks/3", Record("node-b", 43, 4, /*gpu_index=*/-1));  // the host platform: fine
  std::vector<std::string> seen = deliveries_.WaitFor("1000//g/3=node-b:43");
  EXPECT_EQ(seen, (std::vector<std::string>{"1000//g/3=node-b:43"}));
}

}  // namespace
}  // namespace mooncake::daemon::peering
