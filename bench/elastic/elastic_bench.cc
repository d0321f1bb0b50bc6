// elastic_bench: recovery time of an elastic group (issue 10 item 4).
//
// A private mooncaked and 4 device_transport_example processes in --mode
// elastic (host platform) exchange puts and signals in a loop. Each cycle
// SIGKILLs rank 2 and at once starts a replacement for it (as a supervisor
// restarting the process would), then reads the ranks' timestamped lines
// (CLOCK_REALTIME, elastic_run.h) to split the recovery:
//   detection   SIGKILL -> the last survivor saw LOST
//   re-join     -> the last survivor admitted the replacement (the process
//               started, joined, the group re-formed at epoch + 1, and the
//               survivor mapped / connected it)
//   re-connect  -> the first exchange with the replacement done on every
//               side (all 3 survivors and the replacement)
//   total       SIGKILL -> that first exchange
//
//   elastic_bench [--kills N] [--route p2p|rdma] [--bytes B] [--out FILE.md]
// Prints a Markdown report (and writes it to --out). Exits 1 when a cycle
// fails or a rank does not end with PASS.
#include <signal.h>
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench_support.h"
#include "daemon_process.h"

namespace {

using mooncake::testing::BinDir;
using mooncake::testing::Child;
using mooncake::testing::DaemonProcess;
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
  std::string out;
};

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
    else if (k == "--out")
      a.out = v;
    else
      ok = false;
    if (!ok) {
      std::cerr << "usage: elastic_bench [--kills N] [--route p2p|rdma] [--bytes B] [--out F]\n";
      return 64;
    }
  }
  TempDir dir;
  DaemonProcess daemon(dir.path());
  auto rank_argv = [&](int rank, std::vector<std::string> extra) {
    std::vector<std::string> v = {BinDir() + "/device_transport_example",
                                  "--platform",
                                  "host",
                                  "--socket",
                                  daemon.socket(),
                                  "--group",
                                  "elastic-bench",
                                  "--rank",
                                  std::to_string(rank),
                                  "--world-size",
                                  "4",
                                  "--mode",
                                  "elastic",
                                  "--route",
                                  a.route,
                                  "--bytes",
                                  std::to_string(a.bytes),
                                  "--timeout-ms",
                                  "20000"};
    v.insert(v.end(), extra.begin(), extra.end());
    return v;
  };
  std::vector<Child> ranks;
  for (int r = 0; r < 4; ++r) {
    ranks.push_back(Child::Spawn(
        rank_argv(r, {"--expect-rejoins", std::to_string(a.kills), "--rounds", "50"})));
  }
  for (int r = 0; r < 4; ++r) {
    if (ranks[r].WaitForLine("START epoch 1", 20000).empty()) {
      std::cerr << "rank " << r << " did not start:\n" << ranks[r].output() << "\n";
      return 1;
    }
  }
  std::vector<double> detection, rejoin, reconnect, total;
  std::vector<std::string> rows;
  Child* victim = &ranks[2];
  std::vector<Child> replacements;
  replacements.reserve(static_cast<size_t>(a.kills));
  for (int k = 1; k <= a.kills; ++k) {
    const int epoch = k + 1;
    // The group exchanges before the kill: let it run a little.
    usleep(100000);
    const int64_t t_kill = NowUs();
    victim->Kill(SIGKILL);
    // The last replacement finishes on its own; the others wait to be killed.
    replacements.push_back(
        Child::Spawn(rank_argv(2, {"--rounds", k == a.kills ? "50" : "100000000"})));
    Child& fresh = replacements.back();
    victim->Wait(5000);
    int64_t lost = 0, admitted = 0, exchanged = 0;
    bool ok = true;
    for (int r : {0, 1, 3}) {
      const std::string e = std::to_string(epoch);
      int64_t l = TimeOf(ranks[r].WaitForLine("LOST rank 2", 10000));
      int64_t ad = TimeOf(ranks[r].WaitForLine("ADMITTED rank 2 epoch " + e, 20000));
      int64_t ex = TimeOf(ranks[r].WaitForLine("EXCHANGED rank 2 epoch " + e, 20000));
      if (l < 0 || ad < 0 || ex < 0) {
        std::cerr << "cycle " << k << ": rank " << r << " did not recover:\n"
                  << ranks[r].output() << "\nreplacement:\n"
                  << fresh.output() << "\n";
        ok = false;
        break;
      }
      lost = std::max(lost, l);
      admitted = std::max(admitted, ad);
      exchanged = std::max(exchanged, ex);
    }
    for (int r : {0, 1, 3}) {
      if (!ok) break;
      int64_t ex = TimeOf(fresh.WaitForLine("EXCHANGED rank " + std::to_string(r), 20000));
      if (ex < 0) {
        std::cerr << "cycle " << k << ": the replacement did not exchange with rank " << r << ":\n"
                  << fresh.output() << "\n";
        ok = false;
      }
      exchanged = std::max(exchanged, ex);
    }
    if (!ok) return 1;
    detection.push_back((lost - t_kill) / 1000.0);
    rejoin.push_back((admitted - lost) / 1000.0);
    reconnect.push_back((exchanged - admitted) / 1000.0);
    total.push_back((exchanged - t_kill) / 1000.0);
    rows.push_back(absl::StrFormat("| %d | %d | %.3f | %.3f | %.3f | %.3f |", k, epoch,
                                   detection.back(), rejoin.back(), reconnect.back(),
                                   total.back()));
    std::cerr << rows.back() << "\n";
    victim = &fresh;
  }
  int failures = 0;
  for (int r : {0, 1, 3}) {
    if (ranks[r].Wait(60000) != 0 || ranks[r].output().find("PASS") == std::string::npos) {
      std::cerr << "rank " << r << " did not pass:\n" << ranks[r].output() << "\n";
      ++failures;
    }
  }
  if (victim->Wait(60000) != 0) {
    std::cerr << "the last replacement did not pass:\n" << victim->output() << "\n";
    ++failures;
  }
  auto line = [](const char* what, const char* means, std::vector<double> v) {
    mooncake::bench::Stats s = mooncake::bench::Summarize(std::move(v));
    return absl::StrFormat("| %s | %s | %zu | %.3f | %.3f | %.3f | %.3f |", what, means, s.n, s.p50,
                           s.max, s.min, s.mean);
  };
  std::string report =
      absl::StrCat("### elastic_bench: ", a.kills, " SIGKILLs of rank 2 of 4, route ", a.route,
                   ", ", a.bytes, "-byte messages\n\n",
                   "| phase | from -> to | n | p50 ms | max ms | min ms | mean ms "
                   "|\n|---|---|---:|---:|---:|---:|---:|\n",
                   line("detection", "SIGKILL -> last survivor saw LOST", detection), "\n",
                   line("re-join", "-> last survivor admitted the replacement", rejoin), "\n",
                   line("re-connect", "-> first exchange done on all 4 ranks", reconnect), "\n",
                   line("total", "SIGKILL -> first exchange with the replacement", total), "\n\n",
                   "Per kill (ms):\n\n| kill | epoch | detection | re-join | re-connect | total |\n"
                   "|---:|---:|---:|---:|---:|---:|\n");
  for (const std::string& r : rows) absl::StrAppend(&report, r, "\n");
  absl::StrAppend(&report, "\nRanks ended: ", failures == 0 ? "all PASS" : "FAILURES", "\n");
  std::cout << report;
  if (!a.out.empty()) std::ofstream(a.out) << report;
  return failures == 0 ? 0 : 1;
}
