// The etcd client (daemon/etcd/) against a real etcd: KV, Txn, leases and
// their keeper, prefix watches across a server restart, connection
// failures and endpoint failover; and TLS to an etcd that requires client
// certificates (made by openssl at test time). Each test gets its own etcd
// (free ports, temporary data directory). A missing etcd binary fails the
// tests; it is never a skip.
#include "etcd/etcd_client.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "etcd/etcd_lease.h"
#include "etcd/etcd_options.h"
#include "etcd/etcd_watch.h"
#include "etcd_test_server.h"
#include "gtest/gtest.h"
#include "test_certs.h"

namespace mooncake::daemon::etcd {
namespace {

using testing::EtcdBinary;
using testing::EtcdTestServer;
using testing::PickFreePort;
using testing::TcpProxy;

EtcdOptions OptionsFor(std::vector<std::string> endpoints) {
  EtcdOptions o;
  o.endpoints = std::move(endpoints);
  o.dial_timeout = absl::Seconds(2);
  o.request_timeout = absl::Seconds(3);
  return o;
}

bool Contains(absl::string_view text, absl::string_view part) {
  return absl::StrContains(text, part);
}

// Polls `key` until it is gone; returns how long that took, or nullopt.
std::optional<absl::Duration> WaitUntilGone(EtcdClient& c, const std::string& key, absl::Time since,
                                            absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    absl::StatusOr<std::optional<KeyValue>> kv = c.Get(key);
    if (kv.ok() && !kv->has_value()) return absl::Now() - since;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return std::nullopt;
}

// What a watcher delivered, as "PUT key=value" / "DEL key" lines.
class EventLog {
 public:
  void Add(const std::vector<WatchEvent>& events) {
    absl::MutexLock lock(&mu_);
    for (const WatchEvent& e : events) {
      lines_.push_back(e.type == WatchEvent::Type::kPut
                           ? absl::StrCat("PUT ", e.kv.key, "=", e.kv.value)
                           : absl::StrCat("DEL ", e.kv.key));
      events_.push_back(e);
    }
  }
  void AddError(const absl::Status& s) {
    absl::MutexLock lock(&mu_);
    errors_.push_back(s);
  }
  bool WaitForEvents(size_t n, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return lines_.size() >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
  }
  bool WaitForError(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto any = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !errors_.empty(); };
    return mu_.AwaitWithTimeout(absl::Condition(&any), timeout);
  }
  std::vector<std::string> lines() {
    absl::MutexLock lock(&mu_);
    return lines_;
  }
  std::vector<WatchEvent> events() {
    absl::MutexLock lock(&mu_);
    return events_;
  }
  std::vector<absl::Status> errors() {
    absl::MutexLock lock(&mu_);
    return errors_;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::string> lines_ ABSL_GUARDED_BY(mu_);
  std::vector<WatchEvent> events_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Status> errors_ ABSL_GUARDED_BY(mu_);
};

absl::StatusOr<std::unique_ptr<Watcher>> StartWatch(EtcdClient* c, const std::string& prefix,
                                                    int64_t from, EventLog* log) {
  return Watcher::Start(
      c, prefix, from, [log](const std::vector<WatchEvent>& e) { log->Add(e); },
      [log](const absl::Status& s) { log->AddError(s); });
}

// ---- Options, no server ----

TEST(EtcdOptionsTest, ParsesEndpointLists) {
  absl::StatusOr<EtcdOptions> o =
      ParseEtcdEndpoints(" 127.0.0.1:2379 , http://localhost:2380/,http://[::1]:2381");
  ASSERT_TRUE(o.ok()) << o.status();
  ASSERT_EQ(o->endpoints.size(), 3u);
  absl::StatusOr<std::vector<EtcdEndpoint>> e = ValidateEtcdOptions(*o);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ((*e)[0].target, "127.0.0.1:2379");
  EXPECT_EQ((*e)[1].target, "localhost:2380");
  EXPECT_EQ((*e)[1].url, "http://localhost:2380/");
  EXPECT_EQ((*e)[2].target, "[::1]:2381");
  for (const EtcdEndpoint& x : *e) EXPECT_FALSE(x.tls);

  absl::StatusOr<EtcdOptions> tls = ParseEtcdEndpoints("https://a.example:2379,b.example:2379");
  ASSERT_TRUE(tls.ok()) << tls.status();
  e = ValidateEtcdOptions(*tls);
  ASSERT_TRUE(e.ok());
  EXPECT_TRUE((*e)[0].tls);
  EXPECT_TRUE((*e)[1].tls);  // one cluster, one protocol

  EtcdOptions with_ca;
  with_ca.ca_file = "/etc/mooncake/ca.pem";
  tls = ParseEtcdEndpoints("10.0.0.1:2379", with_ca);
  ASSERT_TRUE(tls.ok()) << tls.status();
  EXPECT_EQ(tls->ca_file, "/etc/mooncake/ca.pem");
  EXPECT_TRUE(ValidateEtcdOptions(*tls)->at(0).tls);
}

TEST(EtcdOptionsTest, RejectsBadEndpointsNamingThem) {
  for (const char* bad : {"127.0.0.1", "http://h:0", "http://h:65536", "http://h:12x",
                          "unix:///tmp/etcd.sock", "ftp://h:21", "http://h:1/v3", "http://user@h:1",
                          "::1:2379", "[::1", "[zz]:1", "h:", ":2379", "ho st:1"}) {
    absl::StatusOr<EtcdOptions> o = ParseEtcdEndpoints(bad);
    ASSERT_FALSE(o.ok()) << bad;
    EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_TRUE(Contains(o.status().message(), bad)) << o.status();
  }
  for (const char* bad_list : {"", " , ", "h:1,,g:2", "h:1,h:1", "http://h:1,https://g:2"}) {
    absl::StatusOr<EtcdOptions> o = ParseEtcdEndpoints(bad_list);
    ASSERT_FALSE(o.ok()) << bad_list;
    EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument) << o.status();
  }
  EtcdOptions base;
  base.ca_file = "/ca.pem";
  absl::StatusOr<EtcdOptions> o = ParseEtcdEndpoints("http://h:1", base);
  EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(o.status().message(), "https://")) << o.status();
  base = EtcdOptions();
  base.cert_file = "/client.pem";
  o = ParseEtcdEndpoints("https://h:1", base);
  EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(o.status().message(), "key_file")) << o.status();
  base = EtcdOptions();
  base.dial_timeout = absl::ZeroDuration();
  EXPECT_EQ(ParseEtcdEndpoints("h:1", base).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(EtcdOptionsTest, PrefixRangeEnd) {
  EXPECT_EQ(PrefixRangeEnd("a"), "b");
  EXPECT_EQ(PrefixRangeEnd("/mc/g/"), "/mc/g0");
  EXPECT_EQ(PrefixRangeEnd("a\xff"), "b");
  EXPECT_EQ(PrefixRangeEnd("a\xfe\xff\xff"), "a\xff");
  EXPECT_EQ(PrefixRangeEnd(std::string("\xff\xff")), std::string(1, '\0'));
  EXPECT_EQ(PrefixRangeEnd(""), std::string(1, '\0'));
}

TEST(EtcdConnectTest, DeadPortFailsWithinDialTimeoutNamingEachEndpoint) {
  const int dead1 = PickFreePort();
  const int dead2 = PickFreePort();
  EtcdOptions o =
      OptionsFor({absl::StrCat("127.0.0.1:", dead1), absl::StrCat("http://127.0.0.1:", dead2)});
  o.dial_timeout = absl::Seconds(1);
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<EtcdClient>> c = EtcdClient::Connect(o);
  const absl::Duration took = absl::Now() - start;
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable) << c.status();
  EXPECT_TRUE(Contains(c.status().message(), absl::StrCat("127.0.0.1:", dead1))) << c.status();
  EXPECT_TRUE(Contains(c.status().message(), absl::StrCat("http://127.0.0.1:", dead2)))
      << c.status();
  EXPECT_LT(took, absl::Milliseconds(1500));
}

TEST(EtcdConnectTest, MissingTlsFileIsNamed) {
  EtcdOptions o = OptionsFor({"https://127.0.0.1:1"});
  o.ca_file = "/nonexistent/mooncake-ca.pem";
  absl::StatusOr<std::unique_ptr<EtcdClient>> c = EtcdClient::Connect(o);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound) << c.status();
  EXPECT_TRUE(Contains(c.status().message(), "/nonexistent/mooncake-ca.pem")) << c.status();
}

// ---- Against a real etcd ----

class EtcdTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(::access(EtcdBinary().c_str(), X_OK), 0)
        << EtcdBinary()
        << " not found: the etcd client tests need a real etcd server; run "
           "deploy/install-deps.sh (it installs Debian's etcd-server package)";
    server_ = std::make_unique<EtcdTestServer>();
    const absl::Status started = server_->Start();
    ASSERT_TRUE(started.ok()) << started;
    absl::StatusOr<std::unique_ptr<EtcdClient>> c =
        EtcdClient::Connect(OptionsFor({server_->client_url()}));
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = std::move(*c);
  }
  void TearDown() override {
    client_.reset();
    server_.reset();
  }

  std::unique_ptr<EtcdTestServer> server_;
  std::unique_ptr<EtcdClient> client_;
};

TEST_F(EtcdTest, StatusNamesServerAndEndpoint) {
  absl::StatusOr<EtcdStatus> s = client_->Status();
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(absl::StartsWith(s->version, "3.")) << s->version;
  EXPECT_NE(s->leader, 0u);
  EXPECT_NE(s->cluster_id, 0u);
  EXPECT_EQ(s->endpoint, server_->client_url());
  EXPECT_EQ(client_->preferred_endpoint(), server_->client_url());
}

TEST_F(EtcdTest, AnHttpsUrlAgainstAPlaintextServerFails) {
  const std::string url = absl::StrCat("https://127.0.0.1:", server_->client_port());
  absl::StatusOr<std::unique_ptr<EtcdClient>> c = EtcdClient::Connect(OptionsFor({url}));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable) << c.status();
  EXPECT_TRUE(Contains(c.status().message(), url)) << c.status();
  EXPECT_TRUE(Contains(c.status().message(), "if it serves plaintext, write http://"))
      << c.status();
}

TEST_F(EtcdTest, PutGetOverwriteAndMissingKey) {
  absl::StatusOr<std::optional<KeyValue>> got = client_->Get("/t/a");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_FALSE(got->has_value());

  absl::StatusOr<int64_t> r1 = client_->Put("/t/a", "one");
  ASSERT_TRUE(r1.ok()) << r1.status();
  got = client_->Get("/t/a");
  ASSERT_TRUE(got.ok() && got->has_value()) << got.status();
  EXPECT_EQ((*got)->key, "/t/a");
  EXPECT_EQ((*got)->value, "one");
  EXPECT_EQ((*got)->version, 1);
  EXPECT_EQ((*got)->create_revision, *r1);
  EXPECT_EQ((*got)->mod_revision, *r1);
  EXPECT_EQ((*got)->lease, 0);

  absl::StatusOr<int64_t> r2 = client_->Put("/t/a", "two");
  ASSERT_TRUE(r2.ok()) << r2.status();
  EXPECT_GT(*r2, *r1);
  got = client_->Get("/t/a");
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ((*got)->value, "two");
  EXPECT_EQ((*got)->version, 2);
  EXPECT_EQ((*got)->create_revision, *r1);
  EXPECT_EQ((*got)->mod_revision, *r2);

  // Keys and values are bytes.
  const std::string key("/t/\x00\xff", 5);
  const std::string value("v\x00\x01\xfe", 4);
  ASSERT_TRUE(client_->Put(key, value).ok());
  got = client_->Get(key);
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ((*got)->value, value);

  EXPECT_EQ(client_->Put("", "x").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client_->Get("").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(EtcdTest, GetPrefixListsKeysInOrderWithRevision) {
  ASSERT_TRUE(client_->Put("/p/b", "2").ok());
  ASSERT_TRUE(client_->Put("/p/a", "1").ok());
  ASSERT_TRUE(client_->Put("/p0", "outside").ok());
  ASSERT_TRUE(client_->Put("/q/x", "outside").ok());
  absl::StatusOr<int64_t> last = client_->Put("/p/c", "3");
  ASSERT_TRUE(last.ok());

  absl::StatusOr<RangeResult> r = client_->GetPrefix("/p/");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->kvs.size(), 3u);
  EXPECT_EQ(r->kvs[0].key, "/p/a");
  EXPECT_EQ(r->kvs[1].key, "/p/b");
  EXPECT_EQ(r->kvs[2].key, "/p/c");
  EXPECT_EQ(r->kvs[2].value, "3");
  EXPECT_EQ(r->revision, *last);

  // A prefix ending in 0xff: its range end carries into the byte before.
  ASSERT_TRUE(client_->Put("/z\xff", "a").ok());
  ASSERT_TRUE(client_->Put("/z\xff\x01", "b").ok());
  ASSERT_TRUE(client_->Put("/{", "outside").ok());
  r = client_->GetPrefix("/z\xff");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->kvs.size(), 2u);
  EXPECT_EQ(r->kvs[1].key, "/z\xff\x01");

  r = client_->GetPrefix("/none/");
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->kvs.empty());
  EXPECT_GE(r->revision, *last);
  EXPECT_EQ(client_->GetPrefix("").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(EtcdTest, DeleteAndDeletePrefixCount) {
  for (int i = 1; i <= 5; ++i) ASSERT_TRUE(client_->Put(absl::StrCat("/d/", i), "x").ok());
  ASSERT_TRUE(client_->Put("/e/1", "x").ok());
  absl::StatusOr<int64_t> n = client_->Delete("/d/1");
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 1);
  n = client_->Delete("/d/1");
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 0);
  n = client_->DeletePrefix("/d/");
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 4);
  EXPECT_TRUE(client_->GetPrefix("/d/")->kvs.empty());
  EXPECT_EQ(client_->GetPrefix("/e/")->kvs.size(), 1u);
  EXPECT_EQ(client_->DeletePrefix("").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(EtcdTest, CreateIfAbsentRaceHasExactlyOneWinner) {
  constexpr int kThreads = 16;
  for (int round = 0; round < 3; ++round) {
    const std::string key = absl::StrCat("/race/", round, "/rank/0");
    std::atomic<bool> go{false};
    std::atomic<int> wins{0};
    std::atomic<int> errors{0};
    std::vector<int> won(kThreads, 0);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        while (!go.load()) std::this_thread::yield();
        absl::StatusOr<bool> r = client_->CreateIfAbsent(key, absl::StrCat("owner-", t));
        if (!r.ok()) {
          ++errors;
        } else if (*r) {
          ++wins;
          won[t] = 1;
        }
      });
    }
    go = true;
    for (std::thread& t : threads) t.join();
    EXPECT_EQ(errors.load(), 0);
    ASSERT_EQ(wins.load(), 1) << "round " << round;
    int winner = -1;
    for (int t = 0; t < kThreads; ++t) {
      if (won[t]) winner = t;
    }
    absl::StatusOr<std::optional<KeyValue>> kv = client_->Get(key);
    ASSERT_TRUE(kv.ok() && kv->has_value());
    EXPECT_EQ((*kv)->value, absl::StrCat("owner-", winner));
    EXPECT_EQ((*kv)->version, 1);  // written once
  }
}

TEST_F(EtcdTest, CompareAndSwapOnModRevision) {
  ASSERT_TRUE(client_->Put("/cas/k", "v1").ok());
  absl::StatusOr<std::optional<KeyValue>> kv = client_->Get("/cas/k");
  ASSERT_TRUE(kv.ok() && kv->has_value());
  const int64_t seen = (*kv)->mod_revision;

  absl::StatusOr<bool> swapped = client_->CompareAndSwap("/cas/k", seen, "v2");
  ASSERT_TRUE(swapped.ok()) << swapped.status();
  EXPECT_TRUE(*swapped);
  swapped = client_->CompareAndSwap("/cas/k", seen, "v3");  // stale revision
  ASSERT_TRUE(swapped.ok());
  EXPECT_FALSE(*swapped);
  EXPECT_EQ(client_->Get("/cas/k")->value().value, "v2");
  // mod_revision 0 means "absent".
  EXPECT_TRUE(*client_->CompareAndSwap("/cas/new", 0, "n"));
  EXPECT_FALSE(*client_->CompareAndSwap("/cas/new", 0, "again"));

  // The Else branch runs, and reads, when a compare fails.
  Txn txn;
  txn.IfValue("/cas/k", CompareOp::kEqual, "nope")
      .IfVersion("/cas/k", CompareOp::kGreater, 1)
      .ThenPut("/cas/k", "bad")
      .ElseGet("/cas/k")
      .ElseGetPrefix("/cas/");
  EXPECT_FALSE(txn.read_only());
  absl::StatusOr<TxnResult> r = client_->Commit(txn);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->succeeded);
  ASSERT_EQ(r->responses.size(), 2u);
  EXPECT_EQ(r->responses[0].kind, TxnOpResult::Kind::kGet);
  ASSERT_EQ(r->responses[0].kvs.size(), 1u);
  EXPECT_EQ(r->responses[0].kvs[0].value, "v2");
  EXPECT_EQ(r->responses[1].kvs.size(), 2u);

  // Every compare holds: the Then ops run, at one revision.
  Txn both;
  both.IfValue("/cas/k", CompareOp::kNotEqual, "v1")
      .IfLease("/cas/k", CompareOp::kEqual, 0)
      .IfCreateRevision("/cas/k", CompareOp::kLess, seen + 1)
      .ThenPut("/cas/a", "1")
      .ThenDelete("/cas/new")
      .ThenDeletePrefix("/cas/none/");
  r = client_->Commit(both);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->succeeded);
  ASSERT_EQ(r->responses.size(), 3u);
  EXPECT_EQ(r->responses[0].kind, TxnOpResult::Kind::kPut);
  EXPECT_EQ(r->responses[1].kind, TxnOpResult::Kind::kDelete);
  EXPECT_EQ(r->responses[1].deleted, 1);
  EXPECT_EQ(r->responses[2].deleted, 0);
  EXPECT_EQ(client_->Get("/cas/a")->value().mod_revision, r->revision);

  // etcd refuses a Txn that writes one key twice; the code comes through.
  Txn twice;
  twice.ThenPut("/cas/x", "1").ThenPut("/cas/x", "2");
  EXPECT_EQ(client_->Commit(twice).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(EtcdTest, IfNoKeyWithPrefixHoldsOnlyForAnEmptyPrefix) {
  auto drop_meta_if_empty = [&] {
    Txn t;
    t.IfNoKeyWithPrefix("/last/ranks/").ThenDelete("/last/meta");
    absl::StatusOr<TxnResult> r = client_->Commit(t);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() && r->succeeded;
  };
  ASSERT_TRUE(client_->Put("/last/meta", "2").ok());
  ASSERT_TRUE(client_->Put("/last/ranks/0", "a").ok());
  ASSERT_TRUE(client_->Put("/last/ranks/1", "b").ok());
  ASSERT_TRUE(client_->Put("/last/ranks0", "beside the prefix").ok());
  EXPECT_FALSE(drop_meta_if_empty());
  ASSERT_TRUE(client_->Delete("/last/ranks/0").ok());
  EXPECT_FALSE(drop_meta_if_empty());  // one key left is enough to fail it
  EXPECT_TRUE(client_->Get("/last/meta")->has_value());
  ASSERT_TRUE(client_->Delete("/last/ranks/1").ok());
  EXPECT_TRUE(drop_meta_if_empty());  // "/last/ranks0" is not under the prefix
  EXPECT_FALSE(client_->Get("/last/meta")->has_value());
}

TEST_F(EtcdTest, RevokedLeaseTakesItsKeys) {
  absl::StatusOr<Lease> lease = client_->GrantLease(30);
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_NE(lease->id, 0);
  EXPECT_EQ(lease->ttl_seconds, 30);
  ASSERT_TRUE(client_->Put("/lease/k", "v", lease->id).ok());
  EXPECT_EQ(client_->Get("/lease/k")->value().lease, lease->id);
  absl::StatusOr<LeaseInfo> info = client_->LeaseTimeToLive(lease->id, /*with_keys=*/true);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_GT(info->ttl_seconds, 25);
  EXPECT_EQ(info->granted_ttl_seconds, 30);
  ASSERT_EQ(info->keys.size(), 1u);
  EXPECT_EQ(info->keys[0], "/lease/k");

  ASSERT_TRUE(client_->RevokeLease(lease->id).ok());
  EXPECT_FALSE(client_->Get("/lease/k")->has_value());
  EXPECT_EQ(client_->RevokeLease(lease->id).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(client_->LeaseTimeToLive(lease->id).status().code(), absl::StatusCode::kNotFound);
  absl::StatusOr<int64_t> put = client_->Put("/lease/k2", "v", lease->id);
  EXPECT_EQ(put.status().code(), absl::StatusCode::kNotFound) << put.status();
  EXPECT_EQ(client_->GrantLease(0).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(EtcdTest, LeaseWithoutKeepAliveExpires) {
  absl::StatusOr<Lease> lease = client_->GrantLease(2);
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_TRUE(client_->Put("/exp/k", "v", lease->id).ok());
  std::optional<absl::Duration> gone =
      WaitUntilGone(*client_, "/exp/k", lease->granted_at, absl::Seconds(6));
  ASSERT_TRUE(gone.has_value()) << "a key with a 2 s lease outlived 6 s";
  EXPECT_GE(*gone, absl::Milliseconds(1900));
  EXPECT_LE(*gone, absl::Seconds(4));
}

TEST_F(EtcdTest, LeaseKeeperKeepsLeaseAliveUntilStopped) {
  absl::StatusOr<Lease> lease = client_->GrantLease(2);
  ASSERT_TRUE(lease.ok()) << lease.status();
  std::atomic<int> lost{0};
  auto keeper =
      std::make_unique<LeaseKeeper>(client_.get(), *lease, [&](const absl::Status&) { ++lost; });
  ASSERT_TRUE(client_->Put("/keep/k", "v", lease->id).ok());
  const absl::Time until = absl::Now() + absl::Seconds(6);
  while (absl::Now() < until) {
    absl::StatusOr<std::optional<KeyValue>> kv = client_->Get("/keep/k");
    ASSERT_TRUE(kv.ok()) << kv.status();
    ASSERT_TRUE(kv->has_value()) << "the kept lease expired";
    absl::SleepFor(absl::Milliseconds(250));
  }
  EXPECT_GE(keeper->refreshes(), 6);  // about every TTL/3
  EXPECT_GT(keeper->known_alive_until(), absl::Now());
  EXPECT_FALSE(keeper->lost());

  keeper->Stop();
  const absl::Time stopped = absl::Now();
  std::optional<absl::Duration> gone =
      WaitUntilGone(*client_, "/keep/k", stopped, absl::Seconds(6));
  ASSERT_TRUE(gone.has_value()) << "the key outlived its stopped keeper";
  EXPECT_LE(*gone, absl::Seconds(4));
  EXPECT_EQ(lost.load(), 0);  // stopping is not losing
}

TEST_F(EtcdTest, LeaseKeeperReportsRevokedLease) {
  absl::StatusOr<Lease> lease = client_->GrantLease(3);
  ASSERT_TRUE(lease.ok()) << lease.status();
  absl::Mutex mu;
  std::vector<absl::Status> reports;
  LeaseKeeper keeper(client_.get(), *lease, [&](const absl::Status& why) {
    absl::MutexLock lock(&mu);
    reports.push_back(why);
  });
  ASSERT_TRUE(client_->RevokeLease(lease->id).ok());
  absl::MutexLock lock(&mu);
  auto reported = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu) { return !reports.empty(); };
  ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(&reported), absl::Seconds(3)))
      << "a revoked lease was not reported lost within TTL";
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].code(), absl::StatusCode::kNotFound) << reports[0];
  EXPECT_TRUE(keeper.lost());
}

TEST_F(EtcdTest, LeaseKeeperReportsLossWhenEtcdIsGone) {
  absl::StatusOr<Lease> lease = client_->GrantLease(2);
  ASSERT_TRUE(lease.ok()) << lease.status();
  absl::Mutex mu;
  std::vector<absl::Status> reports;
  LeaseKeeper keeper(client_.get(), *lease, [&](const absl::Status& why) {
    absl::MutexLock lock(&mu);
    reports.push_back(why);
  });
  while (keeper.refreshes() < 1) absl::SleepFor(absl::Milliseconds(20));
  server_->Stop(SIGKILL);
  const absl::Time killed = absl::Now();
  {
    absl::MutexLock lock(&mu);
    auto reported = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu) { return !reports.empty(); };
    ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(&reported), absl::Seconds(4)))
        << "etcd gone, but the lease was not reported lost";
    EXPECT_EQ(reports[0].code(), absl::StatusCode::kUnavailable) << reports[0];
  }
  // Reported no later than the TTL after the last refresh that got through.
  EXPECT_LE(absl::Now() - killed, absl::Milliseconds(2300));
  EXPECT_TRUE(keeper.lost());
  keeper.Stop();
  absl::MutexLock lock(&mu);
  EXPECT_EQ(reports.size(), 1u);
}

TEST_F(EtcdTest, WatcherSeesPutsAndDeletesInOrderIncludingLeaseExpiry) {
  EventLog log;
  absl::StatusOr<std::unique_ptr<Watcher>> w = StartWatch(client_.get(), "/w/", 0, &log);
  ASSERT_TRUE(w.ok()) << w.status();
  std::vector<int64_t> revisions;
  auto put = [&](const std::string& k, const std::string& v, int64_t lease = 0) {
    absl::StatusOr<int64_t> r = client_->Put(k, v, lease);
    ASSERT_TRUE(r.ok()) << r.status();
    revisions.push_back(*r);
  };
  put("/w/a", "1");
  put("/w/b", "2");
  ASSERT_TRUE(client_->Put("/x/outside", "no").ok());
  put("/w/a", "3");
  absl::StatusOr<int64_t> del = client_->Delete("/w/b");
  ASSERT_TRUE(del.ok() && *del == 1);
  absl::StatusOr<Lease> lease = client_->GrantLease(2);
  ASSERT_TRUE(lease.ok());
  put("/w/c", "leased", lease->id);

  ASSERT_TRUE(log.WaitForEvents(6, absl::Seconds(6))) << "got only " << log.lines().size();
  const std::vector<std::string> want = {"PUT /w/a=1",      "PUT /w/b=2", "PUT /w/a=3", "DEL /w/b",
                                         "PUT /w/c=leased", "DEL /w/c"};  // the lease expired
  EXPECT_EQ(log.lines(), want);
  const std::vector<WatchEvent> events = log.events();
  ASSERT_EQ(events.size(), 6u);
  EXPECT_EQ(events[0].kv.mod_revision, revisions[0]);
  EXPECT_EQ(events[2].kv.mod_revision, revisions[2]);
  EXPECT_EQ(events[4].kv.lease, lease->id);
  for (size_t i = 1; i < events.size(); ++i) {
    EXPECT_GT(events[i].kv.mod_revision, events[i - 1].kv.mod_revision);
  }
  EXPECT_EQ((*w)->next_revision(), events.back().kv.mod_revision + 1);
  EXPECT_TRUE(log.errors().empty());
  (*w)->Cancel();
}

TEST_F(EtcdTest, WatcherReplaysFromStartRevision) {
  absl::StatusOr<int64_t> first = client_->Put("/h/a", "1");
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(client_->Put("/h/a", "2").ok());
  ASSERT_TRUE(client_->Delete("/h/a").ok());
  EventLog log;
  absl::StatusOr<std::unique_ptr<Watcher>> w = StartWatch(client_.get(), "/h/", *first + 1, &log);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE(log.WaitForEvents(2, absl::Seconds(3)));
  ASSERT_TRUE(client_->Put("/h/b", "3").ok());
  ASSERT_TRUE(log.WaitForEvents(3, absl::Seconds(3)));
  EXPECT_EQ(log.lines(), (std::vector<std::string>{"PUT /h/a=2", "DEL /h/a", "PUT /h/b=3"}));
  EXPECT_TRUE(log.errors().empty());
}

TEST_F(EtcdTest, WatcherResumesAfterEtcdRestartWithoutLossOrRepeats) {
  EventLog log;
  absl::StatusOr<std::unique_ptr<Watcher>> w = StartWatch(client_.get(), "/r/", 0, &log);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE(client_->Put("/r/1", "before").ok());
  ASSERT_TRUE(log.WaitForEvents(1, absl::Seconds(3)));

  server_->Stop();
  absl::SleepFor(absl::Milliseconds(300));  // the watcher sees the loss and retries
  const absl::Status restarted = server_->Restart();
  ASSERT_TRUE(restarted.ok()) << restarted;
  // Written at once, before the watcher has necessarily reconnected: it
  // must resume from its last revision, not from "now".
  ASSERT_TRUE(client_->Put("/r/2", "after").ok());
  ASSERT_TRUE(client_->Put("/r/3", "after").ok());
  ASSERT_TRUE(client_->Delete("/r/1").ok());

  ASSERT_TRUE(log.WaitForEvents(4, absl::Seconds(8))) << "got only " << log.lines().size();
  absl::SleepFor(absl::Milliseconds(200));  // anything extra would show now
  EXPECT_EQ(log.lines(), (std::vector<std::string>{"PUT /r/1=before", "PUT /r/2=after",
                                                   "PUT /r/3=after", "DEL /r/1"}));
  EXPECT_TRUE(log.errors().empty()) << log.errors()[0];
  EXPECT_GE((*w)->reconnects(), 1);
}

TEST_F(EtcdTest, WatcherResumesFromLastRevisionAfterMissingChanges) {
  // The watcher reaches etcd through a proxy, so it can be kept away while
  // etcd restarts and changes are made; it must then catch up on them.
  auto proxy = std::make_unique<TcpProxy>(server_->client_port());
  const int proxy_port = proxy->port();
  absl::StatusOr<std::unique_ptr<EtcdClient>> via_proxy =
      EtcdClient::Connect(OptionsFor({proxy->url()}));
  ASSERT_TRUE(via_proxy.ok()) << via_proxy.status();
  EventLog log;
  absl::StatusOr<std::unique_ptr<Watcher>> w = StartWatch(via_proxy->get(), "/g/", 0, &log);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE(client_->Put("/g/1", "seen").ok());
  ASSERT_TRUE(log.WaitForEvents(1, absl::Seconds(3)));

  proxy.reset();  // the watch stream breaks; reconnecting is refused
  server_->Stop();
  const absl::Status restarted = server_->Restart();
  ASSERT_TRUE(restarted.ok()) << restarted;
  ASSERT_TRUE(client_->Put("/g/2", "missed").ok());
  ASSERT_TRUE(client_->Delete("/g/1").ok());
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(log.lines().size(), 1u);  // really cut off

  proxy = std::make_unique<TcpProxy>(server_->client_port(), proxy_port);
  ASSERT_TRUE(client_->Put("/g/3", "after").ok());
  ASSERT_TRUE(log.WaitForEvents(4, absl::Seconds(8))) << "got only " << log.lines().size();
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_EQ(log.lines(), (std::vector<std::string>{"PUT /g/1=seen", "PUT /g/2=missed", "DEL /g/1",
                                                   "PUT /g/3=after"}));
  EXPECT_TRUE(log.errors().empty()) << log.errors()[0];
  EXPECT_GE((*w)->reconnects(), 1);
  (*w)->Cancel();
}

TEST_F(EtcdTest, WatcherReportsCompactedStartRevision) {
  absl::StatusOr<int64_t> first = client_->Put("/c/a", "1");
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(client_->Put("/c/a", "2").ok());
  absl::StatusOr<int64_t> last = client_->Put("/c/a", "3");
  ASSERT_TRUE(last.ok());
  ASSERT_TRUE(client_->Compact(*last).ok());

  EventLog log;
  absl::StatusOr<std::unique_ptr<Watcher>> w = StartWatch(client_.get(), "/c/", *first, &log);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE(log.WaitForError(absl::Seconds(3)));
  const absl::Status error = log.errors()[0];
  EXPECT_EQ(error.code(), absl::StatusCode::kOutOfRange) << error;
  EXPECT_TRUE(Contains(error.message(), absl::StrCat(*last))) << error;
  EXPECT_TRUE(log.lines().empty());
}

TEST_F(EtcdTest, FailsOverToSecondEndpointWhenFirstIsDead) {
  const std::string dead = absl::StrCat("http://127.0.0.1:", PickFreePort());
  absl::StatusOr<std::unique_ptr<EtcdClient>> c =
      EtcdClient::Connect(OptionsFor({dead, server_->client_url()}));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ((*c)->preferred_endpoint(), server_->client_url());
  ASSERT_TRUE((*c)->Put("/fo/a", "1").ok());
  EXPECT_EQ((*c)->Get("/fo/a")->value().value, "1");
}

TEST_F(EtcdTest, FailsOverWhenTheEndpointInUseDies) {
  TcpProxy proxy(server_->client_port());
  absl::StatusOr<std::unique_ptr<EtcdClient>> c =
      EtcdClient::Connect(OptionsFor({proxy.url(), server_->client_url()}));
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ((*c)->preferred_endpoint(), proxy.url());
  ASSERT_TRUE((*c)->Put("/fo/k", "1").ok());

  proxy.Close();
  // gRPC notices the reset connection only while some thread polls: let
  // another call (on client_, same process) do that, so the Put below
  // finds the endpoint dead before sending rather than on the way.
  absl::SleepFor(absl::Milliseconds(50));
  ASSERT_TRUE(client_->Status().ok());
  absl::SleepFor(absl::Milliseconds(50));
  // A write may move on: connecting to the dead endpoint failed, so
  // nothing was sent there.
  absl::StatusOr<int64_t> put = (*c)->Put("/fo/k", "2");
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ((*c)->preferred_endpoint(), server_->client_url());
  absl::StatusOr<std::optional<KeyValue>> kv = (*c)->Get("/fo/k");
  ASSERT_TRUE(kv.ok() && kv->has_value()) << kv.status();
  EXPECT_EQ((*kv)->value, "2");
  EXPECT_EQ((*kv)->version, 2);  // applied once
}

TEST_F(EtcdTest, RequestsFailWithUnavailableWhileEtcdIsDownAndRecover) {
  server_->Stop();
  const absl::Time start = absl::Now();
  absl::StatusOr<int64_t> put = client_->Put("/down/k", "v");
  EXPECT_EQ(put.status().code(), absl::StatusCode::kUnavailable) << put.status();
  EXPECT_TRUE(Contains(put.status().message(), server_->client_url())) << put.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  ASSERT_TRUE(server_->Restart().ok());
  put = client_->Put("/down/k", "v");
  EXPECT_TRUE(put.ok()) << put.status();
}

// ---- Over TLS: etcd --client-cert-auth, certificates made by openssl ----

class EtcdTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(::access(EtcdBinary().c_str(), X_OK), 0) << EtcdBinary() << " not found";
    char tmpl[] = "/tmp/mc-etcd-tls-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    absl::StatusOr<mooncake::testing::TestCertificates> cluster =
        mooncake::testing::MakeTestCa(dir_, "cluster");
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    absl::StatusOr<mooncake::testing::TestCertificates> rogue =
        mooncake::testing::MakeTestCa(dir_, "rogue");
    ASSERT_TRUE(rogue.ok()) << rogue.status();
    cluster_ = *cluster;
    rogue_ = *rogue;
    server_.UseTls({cluster_.ca_file, cluster_.cert_file, cluster_.key_file});
    const absl::Status started = server_.Start();
    ASSERT_TRUE(started.ok()) << started;
  }
  void TearDown() override {
    server_.Stop(SIGKILL);
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  // The server's https:// URL with `ca` trusted and `client` (may be
  // empty: none) as the client's certificate.
  EtcdOptions Tls(const std::string& ca, const mooncake::testing::TestCertificates* client) {
    EtcdOptions o = OptionsFor({server_.client_url()});
    o.ca_file = ca;
    if (client != nullptr) {
      o.cert_file = client->cert_file;
      o.key_file = client->key_file;
    }
    return o;
  }

  std::string dir_;
  mooncake::testing::TestCertificates cluster_;
  mooncake::testing::TestCertificates rogue_;
  EtcdTestServer server_;
};

TEST_F(EtcdTlsTest, WithTheClustersCertificateKvTxnLeaseAndWatchWork) {
  ASSERT_TRUE(absl::StartsWith(server_.client_url(), "https://")) << server_.client_url();
  absl::StatusOr<std::unique_ptr<EtcdClient>> c =
      EtcdClient::Connect(Tls(cluster_.ca_file, &cluster_));
  ASSERT_TRUE(c.ok()) << c.status();
  EtcdClient& client = **c;
  absl::StatusOr<EtcdStatus> st = client.Status();
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->endpoint, server_.client_url());

  EventLog log;
  absl::StatusOr<std::unique_ptr<Watcher>> w = StartWatch(&client, "/tls/", 0, &log);
  ASSERT_TRUE(w.ok()) << w.status();

  ASSERT_TRUE(client.Put("/tls/a", "1").ok());
  absl::StatusOr<std::optional<KeyValue>> got = client.Get("/tls/a");
  ASSERT_TRUE(got.ok() && got->has_value()) << got.status();
  EXPECT_EQ((*got)->value, "1");

  Txn txn;
  txn.IfValue("/tls/a", CompareOp::kEqual, "1").ThenPut("/tls/a", "2").ElseGet("/tls/a");
  absl::StatusOr<TxnResult> committed = client.Commit(txn);
  ASSERT_TRUE(committed.ok()) << committed.status();
  EXPECT_TRUE(committed->succeeded);

  absl::StatusOr<Lease> lease = client.GrantLease(30);
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_TRUE(client.Put("/tls/leased", "x", lease->id).ok());
  LeaseKeeper keeper(&client, *lease, [](const absl::Status&) {});
  absl::StatusOr<LeaseInfo> info = client.LeaseTimeToLive(lease->id, /*with_keys=*/true);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->keys, std::vector<std::string>{"/tls/leased"});
  keeper.Stop();
  ASSERT_TRUE(client.RevokeLease(lease->id).ok());

  ASSERT_TRUE(log.WaitForEvents(4, absl::Seconds(5))) << "got only " << log.lines().size();
  const std::vector<std::string> want = {"PUT /tls/a=1", "PUT /tls/a=2", "PUT /tls/leased=x",
                                         "DEL /tls/leased"};
  EXPECT_EQ(log.lines(), want);
  EXPECT_TRUE(log.errors().empty());
  (*w)->Cancel();
}

TEST_F(EtcdTlsTest, WithoutAClientCertificateTheConnectFailsSayingSo) {
  absl::StatusOr<std::unique_ptr<EtcdClient>> c =
      EtcdClient::Connect(Tls(cluster_.ca_file, nullptr));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable) << c.status();
  EXPECT_TRUE(Contains(c.status().message(), server_.client_url())) << c.status();
  EXPECT_TRUE(Contains(c.status().message(), "requires a client certificate")) << c.status();
  EXPECT_TRUE(Contains(c.status().message(), "cert_file and key_file")) << c.status();
}

TEST_F(EtcdTlsTest, AnotherCasCertificateIsRefusedSayingWhich) {
  // A client certificate etcd's CA did not sign.
  absl::StatusOr<std::unique_ptr<EtcdClient>> c =
      EtcdClient::Connect(Tls(cluster_.ca_file, &rogue_));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable) << c.status();
  EXPECT_TRUE(Contains(c.status().message(), "refused the client certificate")) << c.status();
  EXPECT_TRUE(Contains(c.status().message(), rogue_.cert_file)) << c.status();
  // A server certificate the CA given did not sign.
  c = EtcdClient::Connect(Tls(rogue_.ca_file, &cluster_));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable) << c.status();
  EXPECT_TRUE(Contains(c.status().message(), "the server's certificate is not signed by"))
      << c.status();
  EXPECT_TRUE(Contains(c.status().message(), rogue_.ca_file)) << c.status();
}

TEST_F(EtcdTlsTest, AnHttpUrlFailsClearly) {
  const std::string url = absl::StrCat("http://127.0.0.1:", server_.client_port());
  absl::StatusOr<std::unique_ptr<EtcdClient>> c = EtcdClient::Connect(OptionsFor({url}));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable) << c.status();
  EXPECT_TRUE(Contains(c.status().message(), url)) << c.status();
  EXPECT_TRUE(Contains(c.status().message(), "if it serves TLS, write https://")) << c.status();
}

}  // namespace
}  // namespace mooncake::daemon::etcd
