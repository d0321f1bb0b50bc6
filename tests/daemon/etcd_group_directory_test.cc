// EtcdGroupDirectory (daemon/peering/etcd_group_directory.h) against a real
// etcd: what other nodes' records reach the broker, and what is ignored.
// A key in another spelling of a rank or uid ("01", "+1000") must not alias
// the real member's entry, and a record with impossible fields must not
// reach a view. A missing etcd binary fails the tests; it is never a skip.
#include "peering/etcd_group_directory.h"

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <thread>
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
    go.lease = [this] { return lease_.load(); };  // 0: not registered
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

  // Claims `rank` of `group` (uid 1000, world size 2) as `pid`; the future
  // holds the first answer that is not kUnreachable (with
  // `unreachable_counts`, the first answer of any kind).
  std::future<ClaimOutcome> StartClaim(const std::string& group, uint32_t rank, int pid,
                                       bool unreachable_counts = false) {
    ClusterMember me;
    me.rank = rank;
    me.world_size = 2;
    me.pid = pid;
    auto answer = std::make_shared<std::promise<ClaimOutcome>>();
    auto told = std::make_shared<std::atomic<bool>>(false);
    directory_->Claim(
        1000, "", group, me,
        [answer, told, unreachable_counts](ClaimOutcome o, const absl::Status&) {
          if ((unreachable_counts || o != ClaimOutcome::kUnreachable) && !told->exchange(true)) {
            answer->set_value(o);
          }
        });
    return answer->get_future();
  }
  // Claims rank `rank` of group "g" as pid 500+rank and waits (10 s) for
  // the answer that is not kUnreachable.
  ClaimOutcome ClaimAndWait(uint32_t rank) {
    std::future<ClaimOutcome> f = StartClaim("g", rank, 500 + static_cast<int>(rank));
    if (f.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
      return ClaimOutcome::kUnreachable;
    }
    return f.get();
  }
  // A replacement's claim of `rank` of `group` (uid 1000, world size 2,
  // epoch 1) as `pid`; waits (10 s) for the answer that is not
  // kUnreachable and puts its status in `why`.
  ClaimOutcome ClaimVacantAndWait(const std::string& group, uint32_t rank, int pid,
                                  absl::Status* why) {
    ClusterMember me;
    me.rank = rank;
    me.world_size = 2;
    me.pid = pid;
    me.epoch = 1;
    auto answer = std::make_shared<std::promise<std::pair<ClaimOutcome, absl::Status>>>();
    auto told = std::make_shared<std::atomic<bool>>(false);
    directory_->ClaimVacant(1000, "", group, me,
                            [answer, told](ClaimOutcome o, const absl::Status& s) {
                              if (o != ClaimOutcome::kUnreachable && !told->exchange(true)) {
                                answer->set_value({o, s});
                              }
                            });
    std::future<std::pair<ClaimOutcome, absl::Status>> f = answer->get_future();
    if (f.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
      return ClaimOutcome::kUnreachable;
    }
    auto [o, s] = f.get();
    *why = s;
    return o;
  }
  // The lease of group g's rank key, 0 when absent.
  int64_t RankLease(uint32_t rank) {
    absl::StatusOr<std::optional<etcd::KeyValue>> kv =
        etcd_->Get(GroupRankKey(kPrefix, 1000, "", "g", rank));
    return kv.ok() && kv->has_value() ? (*kv)->lease : 0;
  }
  // Polls `what` until it returns `want` (10 s at most).
  template <typename F>
  bool Await(F what, int64_t want) {
    for (int i = 0; i < 1000; ++i) {
      if (what() == want) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }
  int64_t Grant() {
    absl::StatusOr<etcd::Lease> l = etcd_->GrantLease(30);
    return l.ok() ? l->id : 0;
  }

  etcd::testing::EtcdTestServer server_;
  std::unique_ptr<etcd::EtcdClient> etcd_;
  std::atomic<int64_t> lease_{0};
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
  Put("1000/g/ranks/2", Record("node-b", 42, 2));  // rank past its own world size
  // An epoch that would wrap, a rank released twice, a rank releasing itself.
  Put("1000/h/ranks/0",
      R"({"node_id":"node-b","pid":44,"world_size":4,"epoch":"18446744073709551615"})");
  Put("1000/h/ranks/1", R"({"node_id":"node-b","pid":45,"world_size":4,"epoch":"2",)"
                        R"("released":[{"rank":2,"epoch":"2"},{"rank":2,"epoch":"1"}]})");
  Put("1000/h/ranks/2",
      R"({"node_id":"node-b","pid":46,"world_size":4,"released":[{"rank":2,"epoch":"1"}]})");
  Put("1000/g/ranks/3", Record("node-b", 43, 4, /*gpu_index=*/-1));  // the host platform: fine
  std::vector<std::string> seen = deliveries_.WaitFor("1000//g/3=node-b:43");
  EXPECT_EQ(seen, (std::vector<std::string>{"1000//g/3=node-b:43"}));
}

// The node's lease expired while etcd was out of reach and the registry got
// a new one: the ranks this node holds are written again under it (the old
// lease took them with it), the world size included.
TEST_F(EtcdGroupDirectoryTest, ARankIsPublishedAgainUnderANewLease) {
  const int64_t a = Grant();
  ASSERT_NE(a, 0);
  lease_ = a;
  ASSERT_EQ(ClaimAndWait(0), ClaimOutcome::kClaimed);
  EXPECT_EQ(RankLease(0), a);
  const int64_t b = Grant();
  ASSERT_NE(b, 0);
  lease_ = 0;  // lost ...
  ASSERT_TRUE(etcd_->RevokeLease(a).ok());
  ASSERT_TRUE(Await([&] { return RankLease(0); }, 0));
  lease_ = b;  // ... and registered again under another lease
  EXPECT_TRUE(Await([&] { return RankLease(0); }, b)) << "lease now " << RankLease(0);
  absl::StatusOr<std::optional<etcd::KeyValue>> meta =
      etcd_->Get(GroupMetaKey(kPrefix, 1000, "", "g"));
  ASSERT_TRUE(meta.ok() && meta->has_value());
  EXPECT_EQ((*meta)->value, "2");
  EXPECT_EQ((*meta)->lease, b);
}

// A rank that leaves while the node is not registered (etcd out of reach,
// the lease's fate unknown) is deleted once it is: a lease that etcd kept
// would otherwise hold the record, and the rank, for good.
TEST_F(EtcdGroupDirectoryTest, AWithdrawalWhileUnregisteredIsDoneOnceRegistered) {
  const int64_t a = Grant();
  ASSERT_NE(a, 0);
  lease_ = a;
  ASSERT_EQ(ClaimAndWait(1), ClaimOutcome::kClaimed);
  lease_ = 0;
  directory_->Withdraw(1000, "", "g", 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  EXPECT_EQ(RankLease(1), a) << "deleted without a lease to delete it under";
  lease_ = a;  // etcd had kept it: the registry resumed the same lease
  EXPECT_TRUE(Await([&] { return RankLease(1); }, 0)) << "the record outlived its withdrawal";
  // (own_ is updated just after the delete's answer.)
  EXPECT_TRUE(Await([&] { return static_cast<int64_t>(directory_->own_ranks()); }, 0));
}

// A new process claims a rank whose old holder's withdrawal is still
// waiting (the node was not registered): the withdrawal goes first, and it
// never deletes the newcomer's record.
TEST_F(EtcdGroupDirectoryTest, ANewClaimWaitsForThePendingWithdrawalOfItsRank) {
  const int64_t a = Grant();
  ASSERT_NE(a, 0);
  lease_ = a;
  ASSERT_EQ(ClaimAndWait(1), ClaimOutcome::kClaimed);  // pid 501
  lease_ = 0;
  directory_->Withdraw(1000, "", "g", 1);
  std::future<ClaimOutcome> f = StartClaim("g", 1, 601);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  lease_ = a;
  ASSERT_EQ(f.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_EQ(f.get(), ClaimOutcome::kClaimed);
  // Well past any retry: the newcomer's record is there, and it is the only one.
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  absl::StatusOr<std::optional<etcd::KeyValue>> kv =
      etcd_->Get(GroupRankKey(kPrefix, 1000, "", "g", 1));
  ASSERT_TRUE(kv.ok() && kv->has_value()) << "the withdrawal deleted the newcomer's record";
  EXPECT_NE((*kv)->value.find("\"pid\":601"), std::string::npos) << (*kv)->value;
  EXPECT_EQ(directory_->own_ranks(), 1u);
}

// A claim that meets etcd down and is withdrawn (its join timed out) never
// lands later: whether the withdrawal found it queued or running.
TEST_F(EtcdGroupDirectoryTest, AClaimWithdrawnWhileEtcdWasDownNeverLands) {
  const int64_t a = Grant();
  ASSERT_NE(a, 0);
  lease_ = a;
  server_.Stop(SIGKILL);
  std::future<ClaimOutcome> first = StartClaim("z", 0, 700, /*unreachable_counts=*/true);
  ASSERT_EQ(first.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  ASSERT_EQ(first.get(), ClaimOutcome::kUnreachable);
  directory_->Withdraw(1000, "", "z", 0);
  ASSERT_TRUE(server_.Restart().ok()) << server_.LogTail();
  // The lease survived the restart (etcd restores leases); wait out the
  // backoff (1 s at most) and a retry.
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  absl::StatusOr<std::optional<etcd::KeyValue>> kv =
      etcd_->Get(GroupRankKey(kPrefix, 1000, "", "z", 0));
  ASSERT_TRUE(kv.ok()) << kv.status();
  EXPECT_FALSE(kv->has_value()) << "a withdrawn claim was written after etcd came back";
}

// Elastic groups across nodes: a replacement's claim of a vacant rank.
// It takes the rank over a LOST or LEFT record, or where its node's lease
// took the record, never from a live holder, and only while the group is
// still in the cluster.
TEST_F(EtcdGroupDirectoryTest, AVacantRankIsTakenOverOnlyFromALostOrDepartedHolder) {
  const int64_t a = Grant();
  ASSERT_NE(a, 0);
  lease_ = a;
  auto claim_vacant = [&](uint32_t rank, int pid, absl::Status* why) {
    return ClaimVacantAndWait("v", rank, pid, why);
  };
  absl::Status why;
  // No group in the cluster any more (no meta key): refused.
  EXPECT_EQ(claim_vacant(1, 801, &why), ClaimOutcome::kFailed);
  EXPECT_TRUE(absl::IsFailedPrecondition(why)) << why;
  Put("1000/v/meta", "2");
  // A live holder on another node: refused, naming it.
  Put("1000/v/ranks/1", Record("node-b", 41, 2));
  EXPECT_EQ(claim_vacant(1, 801, &why), ClaimOutcome::kFailed);
  EXPECT_TRUE(absl::IsAlreadyExists(why)) << why;
  EXPECT_NE(why.message().find("pid 41 on node node-b"), std::string::npos) << why;
  // Lost: taken over, as a JOINING record of this node under its lease.
  Put("1000/v/ranks/1",
      R"({"node_id":"node-b","pid":41,"world_size":2,"state":"LOST","epoch":"1"})");
  EXPECT_EQ(claim_vacant(1, 801, &why), ClaimOutcome::kClaimed) << why;
  absl::StatusOr<std::optional<etcd::KeyValue>> kv =
      etcd_->Get(GroupRankKey(kPrefix, 1000, "", "v", 1));
  ASSERT_TRUE(kv.ok() && kv->has_value());
  EXPECT_EQ((*kv)->lease, a);
  EXPECT_NE((*kv)->value.find("\"state\":\"JOINING\""), std::string::npos) << (*kv)->value;
  EXPECT_NE((*kv)->value.find("\"pid\":801"), std::string::npos) << (*kv)->value;
  // A second replacement finds the first one there.
  EXPECT_EQ(claim_vacant(1, 802, &why), ClaimOutcome::kFailed);
  EXPECT_TRUE(absl::IsAlreadyExists(why)) << why;
  EXPECT_NE(why.message().find("another replacement"), std::string::npos) << why;
  // No record at all (its node's lease expired): taken.
  EXPECT_EQ(claim_vacant(0, 900, &why), ClaimOutcome::kClaimed) << why;
}

// The world size went with its writer's lease (that node died) while
// another rank's record stayed: the replacement writes it again under its
// own lease; with no other rank left, the group is gone.
TEST_F(EtcdGroupDirectoryTest, AReplacementRestoresTheWorldSizeThatWentWithItsWritersNode) {
  const int64_t a = Grant();
  ASSERT_NE(a, 0);
  lease_ = a;
  auto claim_vacant = [&](const std::string& group, uint32_t rank, absl::Status* why) {
    return ClaimVacantAndWait(group, rank, 700, why);
  };
  absl::Status why;
  Put("1000/w/ranks/0", Record("node-c", 50, 2));
  EXPECT_EQ(claim_vacant("w", 1, &why), ClaimOutcome::kClaimed) << why;
  absl::StatusOr<std::optional<etcd::KeyValue>> meta =
      etcd_->Get(GroupMetaKey(kPrefix, 1000, "", "w"));
  ASSERT_TRUE(meta.ok() && meta->has_value());
  EXPECT_EQ((*meta)->value, "2");
  EXPECT_EQ((*meta)->lease, a);
  // The only other record has another world size: not this group.
  Put("1000/x/ranks/0", Record("node-c", 51, 4));
  EXPECT_EQ(claim_vacant("x", 1, &why), ClaimOutcome::kFailed);
  EXPECT_TRUE(absl::IsFailedPrecondition(why)) << why;
  EXPECT_NE(why.message().find("every other rank left it"), std::string::npos) << why;
  // A world size in the cluster other than the replacement's: refused, naming both.
  Put("1000/y/meta", "3");
  Put("1000/y/ranks/0", Record("node-c", 52, 3));
  EXPECT_EQ(claim_vacant("y", 1, &why), ClaimOutcome::kFailed);
  EXPECT_TRUE(absl::IsFailedPrecondition(why)) << why;
  EXPECT_NE(why.message().find("world size 3"), std::string::npos) << why;
  // A holder's record this daemon cannot read (a newer daemon's?) is never
  // taken over.
  Put("1000/z/meta", "2");
  Put("1000/z/ranks/1", R"({"node_id":"node-c","pid":53,"world_size":1})");
  EXPECT_EQ(claim_vacant("z", 1, &why), ClaimOutcome::kFailed);
  EXPECT_TRUE(absl::IsFailedPrecondition(why)) << why;
  EXPECT_NE(why.message().find("cannot read"), std::string::npos) << why;
}

// A survivor's release goes into its record with a new endpoint
// generation (never the endpoint: issue 23 item 2), another node reads it
// back, fetches the endpoint from this node once it holds a rank of the
// group itself, and the next epoch's state drops the release.
TEST_F(EtcdGroupDirectoryTest, AReleaseIsPublishedInTheRecordAndSettledByTheNextEpoch) {
  const int64_t a = Grant();
  ASSERT_NE(a, 0);
  lease_ = a;
  ASSERT_EQ(ClaimAndWait(0), ClaimOutcome::kClaimed);
  auto endpoint = std::make_shared<v1::RdmaEndpoint>();
  endpoint->set_qps_per_peer(1);
  endpoint->add_qpns(0);
  endpoint->add_qpns(4242);
  endpoint->set_raddr(0x7f0012345000);
  endpoint->set_rkey(0x5eed);
  directory_->MarkState(1000, "", "g", 0, MemberState::kReady, 1);
  directory_->Release(1000, "", "g", 0, 1, 1, endpoint);
  auto record = [&]() -> std::string {
    absl::StatusOr<std::optional<etcd::KeyValue>> kv =
        etcd_->Get(GroupRankKey(kPrefix, 1000, "", "g", 0));
    return kv.ok() && kv->has_value() ? (*kv)->value : "";
  };
  auto has = [&](const std::string& needle) {
    for (int i = 0; i < 500; ++i) {
      if (record().find(needle) != std::string::npos) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  };
  EXPECT_TRUE(has(R"("released":[{"rank":1,"epoch":"1"}])")) << record();
  EXPECT_TRUE(has(R"("rdma_generation":")")) << record();
  for (const char* secret : {"4242", "rkey", "raddr", "qpns", "24301", "139638282145792"}) {
    EXPECT_EQ(record().find(secret), std::string::npos) << secret << " in " << record();
  }
  EXPECT_NE(record().find("\"state\":\"READY\""), std::string::npos) << record();
  // As another node reads it (a second directory over the same etcd),
  // fetching endpoints from this one (the peer channel's part is the
  // integration tests'; here the fetch asks this directory directly).
  std::atomic<int> fetches{0};
  GroupDirectoryOptions go;
  go.prefix = kPrefix;
  go.node_id = "other";
  go.instance_id = "j";
  go.lease = [a] { return a; };
  go.fetch_endpoints =
      [this, &fetches](
          const std::string& node, uint32_t uid, const std::string& tenant,
          const std::string& group, uint32_t,
          const std::vector<uint32_t>& ranks) -> absl::StatusOr<std::vector<FetchedEndpoint>> {
    ++fetches;
    EXPECT_EQ(node, "self");
    return directory_->OwnEndpoints(uid, tenant, group, ranks);
  };
  absl::StatusOr<std::unique_ptr<EtcdGroupDirectory>> other =
      EtcdGroupDirectory::Start(etcd_.get(), std::move(go));
  ASSERT_TRUE(other.ok()) << other.status();
  std::vector<ClusterMember> seen = (*other)->RemoteMembers(1000, "", "g");
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_TRUE(seen[0].Released(1, 1));
  EXPECT_FALSE(seen[0].Released(1, 2));
  EXPECT_EQ(seen[0].epoch, 1u);
  // Pending, and not asked for: "other" holds no rank of the group.
  EXPECT_EQ(seen[0].rdma, nullptr);
  EXPECT_TRUE(seen[0].endpoint_pending);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(fetches.load(), 0);
  // Once it claims a rank, the endpoint comes, as this node holds it.
  ClusterMember me;
  me.rank = 1;
  me.world_size = 2;
  me.pid = 900;
  std::promise<ClaimOutcome> claimed;
  (*other)->Claim(1000, "", "g", me, [&claimed](ClaimOutcome o, const absl::Status&) {
    if (o != ClaimOutcome::kUnreachable) claimed.set_value(o);
  });
  ASSERT_EQ(claimed.get_future().get(), ClaimOutcome::kClaimed);
  for (int i = 0; i < 500; ++i) {
    seen = (*other)->RemoteMembers(1000, "", "g");
    if (seen.size() == 1 && seen[0].rdma != nullptr) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(seen.size(), 1u);
  ASSERT_NE(seen[0].rdma, nullptr);
  EXPECT_FALSE(seen[0].endpoint_pending);
  EXPECT_EQ(seen[0].rdma->qpns(1), 4242u);
  EXPECT_EQ(seen[0].rdma->rkey(), 0x5eedu);
  EXPECT_GE(fetches.load(), 1);
  (*other)->Withdraw(1000, "", "g", 1);
  (*other)->Stop();
  // Re-formed at epoch 2: the release is settled and goes.
  directory_->MarkState(1000, "", "g", 0, MemberState::kJoined, 2);
  EXPECT_TRUE(has(R"("epoch":"2")")) << record();
  EXPECT_EQ(record().find("released"), std::string::npos) << record();
}

// Whoever can write etcd cannot hand a node an endpoint: an RDMA endpoint
// in a record (as records carried before issue 23 item 2) is ignored, and
// only its generation makes the member's endpoint pending, to be fetched
// from the node the record names.
TEST_F(EtcdGroupDirectoryTest, AnEndpointWrittenIntoARecordIsIgnored) {
  Put("1000/f/meta", "2");
  Put("1000/f/ranks/1", R"({"node_id":"elsewhere","pid":7,"world_size":2,"gpu_index":0,)"
                        R"("rdma":{"raddr":"4096","rkey":77,"qps_per_peer":1,"qpns":[3,0]}})");
  Put("1000/f/ranks/0",
      R"({"node_id":"elsewhere","pid":8,"world_size":2,"gpu_index":0,"rdma_generation":"5",)"
      R"("rdma":{"raddr":"4096","rkey":77,"qps_per_peer":1,"qpns":[0,3]}})");
  deliveries_.WaitFor("1000//f/0=elsewhere:8");
  std::vector<ClusterMember> seen = directory_->RemoteMembers(1000, "", "f");
  ASSERT_EQ(seen.size(), 2u);
  for (const ClusterMember& m : seen) {
    EXPECT_EQ(m.rdma, nullptr) << "rank " << m.rank;
    // Without a fetcher (no peer channel): no route, nothing pending.
    EXPECT_FALSE(m.endpoint_pending) << "rank " << m.rank;
    EXPECT_EQ(m.rdma_generation, m.rank == 0 ? 5u : 0u);
  }
}

}  // namespace
}  // namespace mooncake::daemon::peering
