// Metrics: the event counters, the text exposition of every metric over
// fake and real in-process state (SessionRegistry, GroupBroker, FdBroker
// through DaemonGaugeSources), and the HTTP endpoint on a loopback port.
#include "metrics/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <future>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "broker/group_broker.h"
#include "fdchannel/fd_broker.h"
#include "gtest/gtest.h"
#include "mooncake/common/version.h"
#include "prometheus_text.h"
#include "server/daemon_metrics.h"
#include "session/session_registry.h"

namespace mooncake::daemon::metrics {
namespace {

using ::mooncake::testing::BadExpositionLines;
using ::mooncake::testing::Body;
using ::mooncake::testing::HttpGet;
using ::mooncake::testing::ParseSamples;

TEST(EventCountersTest, MethodsAreAFixedSetWithOther) {
  EventCounters c({"mooncake.v1.Local/Hello", "mooncake.v1.Local/JoinGroup", "other"});
  ASSERT_EQ(c.methods().size(), 3u);
  EXPECT_EQ(c.methods().back(), "other");
  EXPECT_EQ(c.MethodIndex("/mooncake.v1.Local/Hello"), 0u);
  EXPECT_EQ(c.MethodIndex("mooncake.v1.Local/JoinGroup"), 1u);
  EXPECT_EQ(c.MethodIndex("/x.Y/Z"), 2u);
  EXPECT_EQ(c.MethodIndex(""), 2u);
  c.RecordRpc(0, 0);
  c.RecordRpc(0, 0);
  c.RecordRpc(1, 3);
  c.RecordRpc(2, 99);  // out of range: UNKNOWN
  c.RecordRpc(77, 5);  // out of range: other
  EXPECT_EQ(c.rpcs(0, 0), 2u);
  EXPECT_EQ(c.rpcs(1, 3), 1u);
  EXPECT_EQ(c.rpcs(2, 2), 1u);
  EXPECT_EQ(c.rpcs(2, 5), 1u);
}

TEST(EventCountersTest, JoinLatencyBuckets) {
  EventCounters c({});
  c.RecordJoin(JoinResult::kFormed, absl::Microseconds(500));  // <= 1 ms
  c.RecordJoin(JoinResult::kFormed, absl::Milliseconds(1));    // le is inclusive
  c.RecordJoin(JoinResult::kFormed, absl::Seconds(2));
  c.RecordJoin(JoinResult::kFormed, absl::Seconds(90));    // +Inf
  c.RecordJoin(JoinResult::kTimedOut, absl::Seconds(30));  // not in the histogram
  EXPECT_EQ(c.joins(JoinResult::kFormed), 4u);
  EXPECT_EQ(c.joins(JoinResult::kTimedOut), 1u);
  EventCounters::Histogram h = c.join_latency();
  ASSERT_EQ(h.cumulative.size(), kJoinLatencyBuckets.size() + 1);
  EXPECT_EQ(h.cumulative[0], 2u);                               // le 0.001
  EXPECT_EQ(h.cumulative[9], 2u);                               // le 1
  EXPECT_EQ(h.cumulative[10], 3u);                              // le 2.5
  EXPECT_EQ(h.cumulative[kJoinLatencyBuckets.size() - 1], 3u);  // le 60
  EXPECT_EQ(h.cumulative.back(), 4u);                           // +Inf
  EXPECT_EQ(h.count, 4u);
  EXPECT_NEAR(h.sum_seconds, 92.0015, 1e-6);
}

TEST(MetricsTest, ExpositionOfEveryMetricFromFakeSources) {
  GaugeSources s;
  s.sessions = [] { return uint64_t{3}; };
  s.groups_by_state = [] { return std::map<std::string, uint64_t>{{"formed", 2}}; };
  s.fd_tickets = [] { return uint64_t{5}; };
  s.exports = [] { return uint64_t{1}; };
  s.rdma = [] {
    RdmaGauges g;
    g.provider = "softnic";
    g.doorbell_mode = "doorbell-record";
    g.qps = 8;
    g.mrs = 2;
    g.registered_bytes = 1 << 20;
    g.softnic_bytes = 4096;
    g.softnic_gpu_workers = 2;
    g.softnic_gpu_waiting = 7;
    return std::optional<RdmaGauges>(g);
  };
  s.cluster_nodes = [] { return std::optional<uint64_t>(4); };
  Metrics m({"mooncake.v1.Local/Hello"}, s, "9.9.9");
  m.counters()->RecordRpc(0, 0);
  m.counters()->RecordRpc(0, 5);
  m.counters()->RecordRpc(m.counters()->MethodIndex("/nope/Nope"), 12);
  m.counters()->RecordJoin(JoinResult::kFormed, absl::Milliseconds(3));
  m.counters()->RecordLost(2);
  m.counters()->RecordRefused(RefusalReason::kCap);
  m.counters()->RecordRefused(RefusalReason::kHandshake, 3);

  const std::string text = m.ScrapeText();
  EXPECT_TRUE(BadExpositionLines(text).empty())
      << ::testing::PrintToString(BadExpositionLines(text)) << "\n"
      << text;
  std::map<std::string, double> v = ParseSamples(text);
  EXPECT_EQ(v["mooncake_build_info{version=\"9.9.9\"}"], 1);
  EXPECT_EQ(v["mooncake_sessions"], 3);
  EXPECT_EQ(v["mooncake_groups{state=\"formed\"}"], 2);
  EXPECT_EQ(v.count("mooncake_groups{state=\"forming\"}"), 1u) << "every state, zero or not";
  EXPECT_EQ(v.count("mooncake_groups{state=\"ready\"}"), 1u);
  EXPECT_EQ(v.count("mooncake_groups{state=\"degraded\"}"), 1u);
  EXPECT_EQ(v["mooncake_fd_tickets"], 5);
  EXPECT_EQ(v["mooncake_exports"], 1);
  EXPECT_EQ(v["mooncake_rdma_qps"], 8);
  EXPECT_EQ(v["mooncake_rdma_mrs"], 2);
  EXPECT_EQ(v["mooncake_rdma_registered_bytes"], 1 << 20);
  EXPECT_EQ(v["mooncake_rdma_doorbell_mode{mode=\"doorbell-record\",provider=\"softnic\"}"], 1);
  EXPECT_EQ(v["mooncake_softnic_bytes_total"], 4096);
  EXPECT_EQ(v["mooncake_softnic_gpu_workers"], 2);
  EXPECT_EQ(v["mooncake_softnic_gpu_wqes_waiting"], 7);
  EXPECT_EQ(v["mooncake_cluster_nodes"], 4);
  EXPECT_EQ(v["mooncake_joins_total{result=\"formed\"}"], 1);
  EXPECT_EQ(v["mooncake_joins_total{result=\"timed_out\"}"], 0);
  EXPECT_EQ(v["mooncake_join_latency_seconds_bucket{le=\"0.001\"}"], 0);
  EXPECT_EQ(v["mooncake_join_latency_seconds_bucket{le=\"0.005\"}"], 1);
  EXPECT_EQ(v["mooncake_join_latency_seconds_bucket{le=\"60\"}"], 1);
  EXPECT_EQ(v["mooncake_join_latency_seconds_bucket{le=\"+Inf\"}"], 1);
  EXPECT_EQ(v["mooncake_join_latency_seconds_count"], 1);
  EXPECT_NEAR(v["mooncake_join_latency_seconds_sum"], 0.003, 1e-9);
  EXPECT_EQ(v["mooncake_lost_events_total"], 2);
  EXPECT_EQ(v["mooncake_connections_refused_total{reason=\"cap\"}"], 1);
  EXPECT_EQ(v["mooncake_connections_refused_total{reason=\"handshake\"}"], 3);
  EXPECT_EQ(v["mooncake_rpcs_total{code=\"OK\",method=\"mooncake.v1.Local/Hello\"}"], 1);
  EXPECT_EQ(v["mooncake_rpcs_total{code=\"NOT_FOUND\",method=\"mooncake.v1.Local/Hello\"}"], 1);
  EXPECT_EQ(v["mooncake_rpcs_total{code=\"UNIMPLEMENTED\",method=\"other\"}"], 1);
  EXPECT_EQ(v["mooncake_rpc_errors_total{method=\"mooncake.v1.Local/Hello\"}"], 1);
  EXPECT_EQ(v["mooncake_rpc_errors_total{method=\"other\"}"], 1);
  EXPECT_TRUE(absl::StrContains(text, "# TYPE mooncake_join_latency_seconds histogram\n"));
  EXPECT_TRUE(absl::StrContains(text, "# TYPE mooncake_sessions gauge\n"));
  EXPECT_TRUE(absl::StrContains(text, "# TYPE mooncake_rpcs_total counter\n"));
}

TEST(MetricsTest, AbsentSourcesAreNotExported) {
  GaugeSources s;
  s.rdma = [] { return std::optional<RdmaGauges>(); };         // RDMA off
  s.cluster_nodes = [] { return std::optional<uint64_t>(); };  // no etcd
  Metrics m({}, s, "1");
  const std::string text = m.ScrapeText();
  EXPECT_TRUE(BadExpositionLines(text).empty()) << text;
  for (const char* absent : {"mooncake_sessions", "mooncake_rdma_", "mooncake_softnic_",
                             "mooncake_cluster_nodes", "mooncake_rpcs_total{"}) {
    EXPECT_FALSE(absl::StrContains(text, absent)) << absent << "\n" << text;
  }
  EXPECT_TRUE(absl::StrContains(text, "mooncake_joins_total{result=\"formed\"} 0"));
}

// The daemon's own state, through the sources and counters the daemon
// wires: a session, a forming then formed group, a lost member, a ticket.
TEST(MetricsTest, RealStateThroughDaemonSources) {
  SessionRegistry sessions(100);
  FdBroker fds(absl::Seconds(30), &sessions);
  GroupBroker broker("node-a", v1::Topology(), BrokerLimits{}, &sessions, &fds);
  Metrics m(CountedRpcMethods(), DaemonGaugeSources(&sessions, &broker, &fds, nullptr, nullptr),
            kMooncakeVersion);
  broker.set_counters(m.counters());
  auto open = [&](int conn) {
    absl::StatusOr<SessionInfo> s = sessions.Open(PeerCred{conn + 100, 1000, 1000}, conn, "t");
    EXPECT_TRUE(s.ok()) << s.status();
    return *s;
  };
  SessionInfo a = open(1), b = open(2);
  auto req = [](uint32_t rank) {
    v1::JoinGroupRequest r;
    r.set_group("secret-group-name");
    r.set_rank(rank);
    r.set_world_size(2);
    r.set_timeout_ms(10000);
    return r;
  };
  auto never = [] { return false; };
  std::future<absl::StatusOr<v1::JoinGroupResponse>> first =
      std::async(std::launch::async, [&] { return broker.Join(a, req(0), nullptr, never); });
  // Rank 0 waits: one forming group.
  absl::Time deadline = absl::Now() + absl::Seconds(10);
  std::map<std::string, double> v;
  do {
    v = ParseSamples(m.ScrapeText());
  } while (v["mooncake_groups{state=\"forming\"}"] != 1 && absl::Now() < deadline);
  EXPECT_EQ(v["mooncake_groups{state=\"forming\"}"], 1);
  EXPECT_EQ(v["mooncake_sessions"], 2);
  ASSERT_TRUE(broker.Join(b, req(1), nullptr, never).ok());
  ASSERT_TRUE(first.get().ok());
  std::vector<UniqueFd> one;
  one.emplace_back(::memfd_create("t", MFD_CLOEXEC));
  ASSERT_TRUE(fds.AddIncoming(a, std::move(one)).ok());
  std::string text = m.ScrapeText();
  v = ParseSamples(text);
  EXPECT_EQ(v["mooncake_groups{state=\"formed\"}"], 1);
  EXPECT_EQ(v["mooncake_groups{state=\"forming\"}"], 0);
  EXPECT_EQ(v["mooncake_joins_total{result=\"formed\"}"], 2);
  EXPECT_EQ(v["mooncake_join_latency_seconds_count"], 2);
  EXPECT_FALSE(absl::StrContains(text, "secret-group-name")) << "no group names in labels";
  EXPECT_FALSE(absl::StrContains(text, "=\"1000\"")) << "no uids in labels";
  EXPECT_EQ(v["mooncake_fd_tickets"], 1);
  EXPECT_EQ(v["mooncake_exports"], 0);

  ASSERT_TRUE(sessions.Close(b.id));
  broker.SessionEnded(b.id);
  v = ParseSamples(m.ScrapeText());
  EXPECT_EQ(v["mooncake_lost_events_total"], 1);
  EXPECT_EQ(v["mooncake_groups{state=\"degraded\"}"], 1);
  EXPECT_EQ(v["mooncake_sessions"], 1);
  broker.Shutdown();
}

TEST(MetricsTest, ServesOnlyOnTheConfiguredAddress) {
  Metrics m({}, GaugeSources{.sessions = [] { return uint64_t{7}; }}, "1");
  EXPECT_EQ(m.port(), 0);
  ASSERT_TRUE(m.Serve("127.0.0.1:0").ok());
  const int port = m.port();
  ASSERT_GT(port, 0);
  std::string resp = HttpGet(port, "/metrics");
  EXPECT_TRUE(absl::StartsWith(resp, "HTTP/1.1 200")) << resp;
  EXPECT_TRUE(absl::StrContains(resp, "text/plain")) << resp;
  EXPECT_TRUE(BadExpositionLines(Body(resp)).empty()) << resp;
  EXPECT_EQ(ParseSamples(Body(resp))["mooncake_sessions"], 7);
  EXPECT_FALSE(absl::StartsWith(HttpGet(port, "/"), "HTTP/1.1 200")) << "only /metrics";
  EXPECT_EQ(m.Serve("127.0.0.1:0").code(), absl::StatusCode::kFailedPrecondition);

  // A port in use is a clear error naming the address and the key.
  Metrics other({}, GaugeSources{}, "1");
  const std::string taken = absl::StrCat("127.0.0.1:", port);
  absl::Status s = other.Serve(taken);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), taken)) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "metrics_listen")) << s;

  m.Stop();
  EXPECT_EQ(m.port(), 0);
  EXPECT_EQ(HttpGet(port, "/metrics"), "") << "stopped: nothing listens";
}

}  // namespace
}  // namespace mooncake::daemon::metrics
