// fence_bench: what the WQE fence bit costs, measured through a real
// mooncaked whose softnic runs NIC atomics as a ConnectX does
// (softnic_atomics = hca) and makes a fenced WQE wait
// softnic_hca_round_trip_us after an atomic of its queue pair, as a NIC's
// fence waits for the atomic's response.
//
//   fence_bench [--round-trip-us R] [--pairs N] [--smoke]
//
// Two ranks in this process (host platform, RDMA between them). Rank 0's
// thread posts N pairs of (mc_red_add, then a signal) to rank 1, then waits
// for completion, in three ways:
//   device API   mc_red_add + mc_signal as they post today: no fence bit
//   fenced       the same two WQEs with the fence bit, as the API posted
//                them before issue 24 item 3 (both fenced)
//   signals      N back-to-back mc_signal alone (the fence never waited
//                there: nothing before them is an atomic)
// and prints microseconds per pair. With R = 0 the three match; with R > 0
// the fenced pairs pay about R each. --smoke: a short run with R = 2000
// that exits 1 unless fenced pairs pay the round trip and the API's do not.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "bench_support.h"
#include "mooncake/client/communicator.h"
#include "mooncake/device/comm_device.h"
#include "mooncake/device/mlx5/wqe.h"

namespace {

using mooncake::Communicator;
using mooncake::device::McPeer;
using mooncake::device::McStatus;
namespace mlx5 = mooncake::device::mlx5;
namespace bench = mooncake::bench;

constexpr uint64_t kCounterOff = 0;
constexpr uint64_t kFlagOff = 64;

// The pair as the API posted it before: a fenced fetch-add, then a fenced
// inline WRITE of the flag.
McStatus PostFencedPair(const McPeer& peer, uint64_t* counter_sym, uint64_t* flag_sym, uint64_t v) {
  constexpr uint8_t kFenced = mlx5::kCtrlCqUpdate | mlx5::kCtrlFence;
  mooncake::device::IbgdaQpDevCtx* qp = peer.qp;
  mlx5::Wqe64 a, w;
  mlx5::build_atomic_fa64(&a, 0, qp->qpn, kFenced,
                          reinterpret_cast<uintptr_t>(counter_sym) + peer.delta, peer.rkey, 1,
                          reinterpret_cast<uintptr_t>(qp->fetch_scratch), qp->scratch_lkey);
  mlx5::build_rdma_write_inline(&w, 0, qp->qpn, kFenced,
                                reinterpret_cast<uintptr_t>(flag_sym) + peer.delta, peer.rkey, &v,
                                sizeof(v));
  McStatus st = mooncake::device::mc_qp_post(qp, a);
  return st == McStatus::kOk ? mooncake::device::mc_qp_post(qp, w) : st;
}

struct Result {
  double api_us = 0, fenced_us = 0, signals_us = 0;
  bool ok = true;
};

Result Run(Communicator& c0, Communicator& c1, int pairs) {
  const mooncake::device::CommCtx& ctx = c0.ctx();
  const McPeer peer = mooncake::device::mc_peer(ctx, 1);
  auto* base = static_cast<uint8_t*>(c0.buffer());
  auto* counter = reinterpret_cast<uint64_t*>(base + kCounterOff);
  auto* flag = reinterpret_cast<uint64_t*>(base + kFlagOff);
  Result r;
  auto time_us = [&](auto&& post_one) {
    const int64_t t0 = bench::NowNs();
    for (int i = 1; i <= pairs && r.ok; ++i)
      r.ok = post_one(static_cast<uint64_t>(i)) == McStatus::kOk;
    r.ok = r.ok && mooncake::device::mc_quiet(ctx) == McStatus::kOk;
    return static_cast<double>(bench::NowNs() - t0) / 1e3 / pairs;
  };
  r.api_us = time_us([&](uint64_t v) {
    McStatus st = mooncake::device::mc_red_add(peer, counter, uint64_t{1});
    return st == McStatus::kOk ? mooncake::device::mc_signal(peer, flag, v) : st;
  });
  r.fenced_us = time_us([&](uint64_t v) { return PostFencedPair(peer, counter, flag, v); });
  r.signals_us = time_us([&](uint64_t v) { return mooncake::device::mc_signal(peer, flag, v); });
  const auto* peer_counter =
      reinterpret_cast<const uint64_t*>(static_cast<uint8_t*>(c1.buffer()) + kCounterOff);
  if (r.ok && *peer_counter != 2ull * pairs) {
    std::fprintf(stderr, "ERROR: the counter holds %llu after %d adds\n",
                 static_cast<unsigned long long>(*peer_counter), 2 * pairs);
    r.ok = false;
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  uint32_t round_trip_us = 20;
  int pairs = 2000;
  bool smoke = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--round-trip-us" && i + 1 < argc && absl::SimpleAtoi(argv[i + 1], &round_trip_us)) {
      ++i;
    } else if (a == "--pairs" && i + 1 < argc && absl::SimpleAtoi(argv[i + 1], &pairs) &&
               pairs > 0) {
      ++i;
    } else if (a == "--smoke") {
      smoke = true;
      round_trip_us = 2000;
      pairs = 50;
    } else {
      std::fprintf(stderr, "usage: fence_bench [--round-trip-us R] [--pairs N] [--smoke]\n");
      return 64;
    }
  }
  char tmpl[] = "/tmp/fence_bench.XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) return 2;
  const std::string dir = tmpl;
  const std::string conf = dir + "/mooncaked.conf";
  std::ofstream(conf) << "softnic_atomics = hca\nsoftnic_hca_round_trip_us = " << round_trip_us
                      << "\n";
  const std::string daemon_bin =
      bench::SelfExe().substr(0, bench::SelfExe().rfind('/')) + "/mooncaked";
  auto daemon = bench::BenchDaemon::Start(daemon_bin, dir, "fence-bench", {"--config", conf});
  if (!daemon.ok()) {
    std::fprintf(stderr, "ERROR: %s\n", std::string(daemon.status().message()).c_str());
    return 2;
  }
  auto options = [&](uint32_t rank) {
    mooncake::CommunicatorOptions o;
    o.socket_path = (*daemon)->socket();
    o.group = "fence-bench";
    o.rank = rank;
    o.world_size = 2;
    o.buffer_bytes = 1 << 20;
    o.route = mooncake::Route::kRdma;
    o.atomics_route = mooncake::AtomicsRoute::kDevice;  // one QP each way: the pair alone
    o.rdma_sq_depth = 4096;
    return o;
  };
  absl::StatusOr<std::unique_ptr<Communicator>> c1 = absl::UnknownError("not run");
  std::thread t([&] { c1 = Communicator::Create(options(1)); });
  absl::StatusOr<std::unique_ptr<Communicator>> c0 = Communicator::Create(options(0));
  t.join();
  if (!c0.ok() || !c1.ok()) {
    std::fprintf(stderr, "ERROR: setup: %s\n",
                 std::string((c0.ok() ? c1 : c0).status().message()).c_str());
    return 2;
  }
  const Result r = Run(**c0, **c1, pairs);
  std::printf("fence_bench: softnic hca model, fence round trip %u us, %d pairs, one CPU poster\n",
              round_trip_us, pairs);
  std::printf("%-44s %12s\n", "posted", "us per pair");
  std::printf("%-44s %12.2f\n", "red_add + signal, device API (no fence)", r.api_us);
  std::printf("%-44s %12.2f\n", "red_add + signal, both fenced (before)", r.fenced_us);
  std::printf("%-44s %12.2f\n", "signal alone, back to back", r.signals_us);
  if (!r.ok) {
    std::fprintf(stderr, "ERROR: a post or completion failed\n");
    return 1;
  }
  if (smoke && !(r.fenced_us >= 0.9 * round_trip_us && r.api_us < 0.5 * round_trip_us)) {
    std::fprintf(stderr, "ERROR: fenced pairs must pay the round trip and the API's must not\n");
    return 1;
  }
  return 0;
}
