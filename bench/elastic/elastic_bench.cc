// elastic_bench: recovery time of an elastic group (issue 10 item 4).
//
// 4 device_transport_example processes in --mode elastic (host platform)
// exchange puts and signals in a loop, on one private mooncaked or (with
// --nodes 2) on two, ranks 0-1 on node-a and 2-3 on node-b, with a private
// etcd. Each cycle loses ranks and replaces them, as a supervisor would,
// then reads the ranks' timestamped lines (CLOCK_REALTIME, elastic_run.h)
// to split the recovery:
//   detection   loss -> the last survivor saw LOST (of every lost rank)
//   re-join     -> the last survivor admitted the replacement(s) (started,
//               joined, the group re-formed at epoch + 1, and the survivor
//               mapped / connected them)
//   re-connect  -> the first exchange with the replacement(s) done on every
//               side
//   total       loss -> that first exchange
// What is lost (--lose):
//   rank  rank 2 is SIGKILLed and its replacement started at once, on the
//         same node;
//   node  (--nodes 2) node-b's daemon and both its ranks are SIGKILLed; the
//         replacements start on a spare node (started before the loss, as a
//         cluster keeps spares) once the survivors report the ranks LOST,
//         which takes the node's lease TTL (--lease-ttl, seconds).
//
//   elastic_bench [--kills N] [--route p2p|rdma (always rdma with --nodes 2)] [--bytes B]
//                 [--nodes 1|2] [--lose rank|node] [--lease-ttl S] [--out FILE.md]
// Prints a Markdown report (and writes it to --out). Exits 1 when a cycle
// fails or a rank does not end with PASS.
#include <signal.h>
#include <sys/stat.h>
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench_support.h"
#include "daemon_process.h"
#include "etcd_test_server.h"
#include "example_argv.h"
#include "test_certs.h"

namespace {

using mooncake::testing::Child;
using mooncake::testing::DaemonProcess;
using mooncake::testing::ElasticRankArgv;
using mooncake::testing::TempDir;

int64_t NowUs() {
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000 + ts.tv_nsec / 1000;
}

// The t= of a line; -1 when there is none (the line did not come).
int64_t TimeOf(const std::string& line) {
  size_t at = line.rfind(" t=");
  int64_t t = -1;
  if (at == std::string::npos || !absl::SimpleAtoi(line.substr(at + 3), &t)) return -1;
  return t;
}

struct Args {
  int kills = 20;
  std::string route = "p2p";
  int bytes = 4096;
  int nodes = 1;
  std::string lose = "rank";
  int lease_ttl_s = 2;
  std::string out;
};

// The daemons: one, or a cluster of named nodes on a private etcd.
class Nodes {
 public:
  Nodes(const std::string& dir, int count, int lease_ttl_s)
      : dir_(dir), clustered_(count > 1), lease_ttl_s_(lease_ttl_s) {
    if (!clustered_) return;
    if (absl::Status s = etcd_.Start(); !s.ok()) {
      std::cerr << "etcd: " << s << "\n";
      std::exit(1);
    }
  }
  // A node (a daemon); `id` names it in the cluster.
  std::unique_ptr<DaemonProcess> Start(const std::string& id) {
    const std::string sub = dir_ + "/" + id;
    ::mkdir(sub.c_str(), 0700);
    if (!clustered_) return std::make_unique<DaemonProcess>(sub);
    // Nodes talk mTLS, as deploy/make-cluster-certs.sh sets a cluster up.
    const absl::StatusOr<mooncake::testing::TestCertificates> certs =
        mooncake::testing::MakeNodeCertificate(dir_ + "/tls", id);
    if (!certs.ok()) {
      std::cerr << "certificates: " << certs.status() << "\n";
      std::exit(1);
    }
    std::ofstream(sub + "/node.conf")
        << "etcd_lease_ttl_s = " << lease_ttl_s_ << "\netcd_prefix = /elastic-bench\n"
        << mooncake::testing::PeerTlsConfig(*certs);
    return std::make_unique<DaemonProcess>(
        sub, std::vector<std::string>{
                 "--config", sub + "/node.conf", "--node-id", id, "--peer-listen",
                 absl::StrCat("127.0.0.1:", mooncake::daemon::etcd::testing::PickFreePort()),
                 "--etcd", etcd_.client_url()});
  }

 private:
  const std::string dir_;
  const bool clustered_;
  const int lease_ttl_s_;
  mooncake::daemon::etcd::testing::EtcdTestServer etcd_;
};

// The first line containing `needle` in what `c` printed from byte `from`
// on, read or still to come (timeout_ms at most); "" when none. The lines
// of one cycle come in any order (two lost ranks, two replacements), and
// WaitForLine alone moves past the lines it skips.
std::string LineFrom(Child& c, size_t from, const std::string& needle, int timeout_ms) {
  const std::string& out = c.output();
  if (size_t at = out.find(needle, std::min(from, out.size())); at != std::string::npos) {
    const size_t begin = out.rfind('\n', at);
    const size_t end = out.find('\n', at);
    const size_t b = begin == std::string::npos ? 0 : begin + 1;
    return out.substr(b, end == std::string::npos ? std::string::npos : end - b);
  }
  return c.WaitForLine(needle, timeout_ms);
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    bool ok = true;
    if (k == "--kills")
      ok = absl::SimpleAtoi(v, &a.kills) && a.kills >= 1;
    else if (k == "--route")
      a.route = v, ok = v == "p2p" || v == "rdma";
    else if (k == "--bytes")
      ok = absl::SimpleAtoi(v, &a.bytes) && a.bytes >= 8;
    else if (k == "--nodes")
      ok = absl::SimpleAtoi(v, &a.nodes) && (a.nodes == 1 || a.nodes == 2);
    else if (k == "--lose")
      a.lose = v, ok = v == "rank" || v == "node";
    else if (k == "--lease-ttl")
      ok = absl::SimpleAtoi(v, &a.lease_ttl_s) && a.lease_ttl_s >= 1;
    else if (k == "--out")
      a.out = v;
    else
      ok = false;
    // Across nodes every pair goes over RDMA (softnic over the peer port):
    // the auto route maps only P2P-reachable peers.
    if (a.nodes == 2) a.route = "rdma";
    if (a.lose == "node" && a.nodes != 2) ok = false;
    if (!ok) {
      std::cerr << "usage: elastic_bench [--kills N] [--route p2p|rdma] [--bytes B] "
                   "[--nodes 1|2] [--lose rank|node] [--lease-ttl S] [--out F]\n";
      return 64;
    }
  }
  const bool lose_node = a.lose == "node";
  TempDir dir;
  Nodes nodes(dir.path(), a.nodes, a.lease_ttl_s);
  std::vector<std::unique_ptr<DaemonProcess>> daemons;
  daemons.push_back(nodes.Start("node-a"));
  if (a.nodes == 2) daemons.push_back(nodes.Start("node-b"));
  auto rank_argv = [&](const DaemonProcess& on, int rank, std::vector<std::string> extra) {
    std::vector<std::string> v = ElasticRankArgv(on.socket(), "elastic-bench", rank, 20000);
    v.insert(v.end(), {"--route", a.route, "--bytes", std::to_string(a.bytes)});
    v.insert(v.end(), extra.begin(), extra.end());
    return v;
  };
  // Lost each cycle: rank 2, or node-b's ranks 2 and 3.
  const std::vector<int> lost_ranks = lose_node ? std::vector<int>{2, 3} : std::vector<int>{2};
  const std::vector<int> survivors = lose_node ? std::vector<int>{0, 1} : std::vector<int>{0, 1, 3};
  const int rejoins = a.kills * static_cast<int>(lost_ranks.size());
  std::vector<Child> ranks;
  for (int r = 0; r < 4; ++r) {
    ranks.push_back(
        Child::Spawn(rank_argv(*daemons[r < 2 ? 0 : daemons.size() - 1], r,
                               {"--expect-rejoins", std::to_string(rejoins), "--rounds", "50"})));
  }
  for (int r = 0; r < 4; ++r) {
    if (ranks[r].WaitForLine("START epoch 1", 30000).empty()) {
      std::cerr << "rank " << r << " did not start:\n" << ranks[r].output() << "\n";
      return 1;
    }
  }
  std::vector<double> detection, rejoin, reconnect, total;
  std::vector<std::string> rows;
  // The current holders of the lost ranks, and every replacement started.
  std::vector<Child*> victims;
  for (int r : lost_ranks) victims.push_back(&ranks[r]);
  std::vector<Child> replacements;
  replacements.reserve(static_cast<size_t>(rejoins));
  const int lost_wait_ms = lose_node ? (a.lease_ttl_s + 10) * 1000 : 10000;
  for (int k = 1; k <= a.kills; ++k) {
    const int epoch = k + 1;
    const std::string e = std::to_string(epoch);
    // A spare node, up before the loss (node mode).
    if (lose_node) daemons.push_back(nodes.Start(absl::StrCat("spare-", k)));
    const DaemonProcess& home = *daemons.back();
    // The group exchanges before the kill: let it run a little.
    usleep(100000);
    // What each survivor printed before the loss (its earlier cycles).
    std::vector<size_t> before(4, 0);
    for (int r : survivors) before[r] = ranks[r].output().size();
    const int64_t t_kill = NowUs();
    if (lose_node) daemons[daemons.size() - 2]->child().Kill(SIGKILL);
    for (Child* v : victims) v->Kill(SIGKILL);
    const std::vector<std::string> extra = {"--rounds", k == a.kills ? "50" : "100000000"};
    auto start_replacements = [&] {
      for (int r : lost_ranks) replacements.push_back(Child::Spawn(rank_argv(home, r, extra)));
    };
    // A process restarted at once by its supervisor; a node's ranks once
    // the survivors report them lost (before, the dead node's records hold
    // the ranks and a replacement is refused).
    if (!lose_node) start_replacements();
    for (Child* v : victims) v->Wait(5000);
    int64_t lost = 0, admitted = 0, exchanged = 0;
    bool ok = true;
    for (int r : survivors) {
      for (int l : lost_ranks) {
        int64_t t =
            TimeOf(LineFrom(ranks[r], before[r], absl::StrCat("LOST rank ", l), lost_wait_ms));
        if (t < 0) ok = false;
        lost = std::max(lost, t);
      }
    }
    if (lose_node && ok) start_replacements();
    std::vector<Child*> fresh;
    for (size_t i = replacements.size() - lost_ranks.size(); i < replacements.size(); ++i) {
      fresh.push_back(&replacements[i]);
    }
    for (int r : survivors) {
      if (!ok) break;
      for (int l : lost_ranks) {
        const std::string which = absl::StrCat("rank ", l, " epoch ", e);
        int64_t ad = TimeOf(LineFrom(ranks[r], before[r], "ADMITTED " + which, 30000));
        int64_t ex = TimeOf(LineFrom(ranks[r], before[r], "EXCHANGED " + which, 30000));
        if (ad < 0 || ex < 0) ok = false;
        admitted = std::max(admitted, ad);
        exchanged = std::max(exchanged, ex);
      }
    }
    for (size_t i = 0; i < fresh.size() && ok; ++i) {
      for (int r = 0; r < 4 && ok; ++r) {
        if (r == lost_ranks[i]) continue;  // fresh[i] holds lost_ranks[i]
        int64_t ex =
            TimeOf(LineFrom(*fresh[i], 0, absl::StrCat("EXCHANGED rank ", r, " epoch "), 30000));
        if (ex < 0) ok = false;
        exchanged = std::max(exchanged, ex);
      }
    }
    if (!ok) {
      std::cerr << "cycle " << k << ": did not recover\n";
      for (int r : survivors) std::cerr << "rank " << r << ":\n" << ranks[r].output() << "\n";
      for (Child* f : fresh) std::cerr << "replacement:\n" << f->output() << "\n";
      return 1;
    }
    detection.push_back((lost - t_kill) / 1000.0);
    rejoin.push_back((admitted - lost) / 1000.0);
    reconnect.push_back((exchanged - admitted) / 1000.0);
    total.push_back((exchanged - t_kill) / 1000.0);
    rows.push_back(absl::StrFormat("| %d | %d | %.3f | %.3f | %.3f | %.3f |", k, epoch,
                                   detection.back(), rejoin.back(), reconnect.back(),
                                   total.back()));
    std::cerr << rows.back() << "\n";
    victims = fresh;
  }
  int failures = 0;
  for (int r : survivors) {
    if (ranks[r].Wait(60000) != 0 || ranks[r].output().find("PASS") == std::string::npos) {
      std::cerr << "rank " << r << " did not pass:\n" << ranks[r].output() << "\n";
      ++failures;
    }
  }
  for (Child* v : victims) {
    if (v->Wait(60000) != 0) {
      std::cerr << "a last replacement did not pass:\n" << v->output() << "\n";
      ++failures;
    }
  }
  auto line = [](const char* what, const char* means, std::vector<double> v) {
    mooncake::bench::Stats s = mooncake::bench::Summarize(std::move(v));
    return absl::StrFormat("| %s | %s | %zu | %.3f | %.3f | %.3f | %.3f |", what, means, s.n, s.p50,
                           s.max, s.min, s.mean);
  };
  const std::string what =
      lose_node ? absl::StrCat("SIGKILLs of node-b (daemon and ranks 2, 3) of 2 nodes, lease TTL ",
                               a.lease_ttl_s, " s, replacements on a spare node")
      : a.nodes == 2 ? "SIGKILLs of rank 2 of 4 (ranks 0-1 on node-a, 2-3 on node-b)"
                     : "SIGKILLs of rank 2 of 4";
  std::string report = absl::StrCat(
      "### elastic_bench: ", a.kills, " ", what, ", route ", a.route, ", ", a.bytes,
      "-byte messages\n\n",
      "| phase | from -> to | n | p50 ms | max ms | min ms | mean ms "
      "|\n|---|---|---:|---:|---:|---:|---:|\n",
      line("detection", "SIGKILL -> last survivor saw LOST", detection), "\n",
      line("re-join", "-> last survivor admitted the replacement(s)", rejoin), "\n",
      line("re-connect", "-> first exchange done on all 4 ranks", reconnect), "\n",
      line("total", "SIGKILL -> first exchange with the replacement(s)", total), "\n\n",
      "Per kill (ms):\n\n| kill | epoch | detection | re-join | re-connect | total |\n"
      "|---:|---:|---:|---:|---:|---:|\n");
  for (const std::string& r : rows) absl::StrAppend(&report, r, "\n");
  absl::StrAppend(&report, "\nRanks ended: ", failures == 0 ? "all PASS" : "FAILURES", "\n");
  std::cout << report;
  if (!a.out.empty()) std::ofstream(a.out) << report;
  return failures == 0 ? 0 : 1;
}
