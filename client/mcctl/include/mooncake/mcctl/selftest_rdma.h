// `mcctl selftest rdma`: the command a first user runs on a node to learn
// whether the RDMA route works there, and if not, what to fix (issue 24
// item 10). It runs a pair of ranks in this process, joined through the
// local mooncaked like any application (a group of two, RDMA between them,
// on the NIC --nic names or the daemon's choice), and drives the Device
// API's RDMA route from a CPU thread (the host platform: the same
// comm_device.h and mlx5/qp_ops.h code kernels run):
//
//   write-inline    8-byte WRITEs inline in the WQE, each waited for
//   write           64 KiB WRITEs from the registered buffer
//   fetch-add-8     8-byte fetch-adds; the counter and the fetched old value
//                   (host order, as mlx5_core's atomic mode returns it)
//   masked-fa-4     4-byte masked fetch-adds; counter and fetched value
//                   (big-endian, extended atomics)
//   ring-wrap       70 000 WQEs through a 256-deep ring: the owner bit and
//                   the 16-bit WQE counter wrap
//   loopback-atomic an add to this rank's own word through its loopback
//                   queue pair (connected to itself), as NIC atomics do
//   bad-rkey        a WRITE with a key the peer never gave: must fail with
//                   the remote-access syndrome, named
//
// Each step says pass or fail, its latency and message rate, and on failure
// what to check (docs/rdma.md, "First run"). Runs on softnic in CI and
// unchanged on a real NIC. `--gpu G` runs the same steps from CUDA kernels
// on GPU G, once per ring placement (mcctl-selftest-gpu, next to mcctl in
// CUDA builds: client/mcctl/gpu/).
//
// A loopback pair never leaves the NIC: a wrong GID index, a missing
// MAC/ARP entry or a lossy priority between nodes shows only across them.
// `--across GROUP --rank R` (R = 0 on one node, 1 on the other, both
// started within the timeout, both with the same $MC_GROUP_SECRET) makes
// this process one rank of a group of two across nodes. Rank 0 runs the
// steps toward rank 1, then rank 1 toward rank 0 (a path can fail one way
// only), then rank 0 the bad key; loopback-atomic is the local selftest's.
// A rank reads the other's memory back by asking it (selftest_across.h):
// the answering rank copies the bytes asked for into the asker's
// readback area with an RDMA WRITE of its own.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mooncake::mcctl {

// The pair's buffer layout (symmetric) and the steps' sizes, shared by the
// CPU steps and mcctl-selftest-gpu's kernels.
namespace selftest {
inline constexpr uint64_t kBufferBytes = 1 << 20;
inline constexpr uint64_t kWordOff = 0;          // write-inline, ring-wrap
inline constexpr uint64_t kCounter64Off = 64;    // fetch-add-8
inline constexpr uint64_t kCounter32Off = 128;   // masked-fa-4
inline constexpr uint64_t kLoopbackOff = 192;    // loopback-atomic
inline constexpr uint64_t kBadKeyOff = 256;      // bad-rkey target
inline constexpr uint64_t kRequestOff = 320;     // across: {offset, length} asked for
inline constexpr uint64_t kRequestSeqOff = 384;  // across: the request's number, after it
inline constexpr uint64_t kReplySeqOff = 448;    // across: the answer's number, after the bytes
inline constexpr uint64_t kSrcOff = 64 << 10;
inline constexpr uint64_t kReadbackOff = 256 << 10;  // across: the bytes read back land here
inline constexpr uint64_t kMaxReadBytes = 64 << 10;
inline constexpr uint64_t kDstOff = 512 << 10;
inline constexpr uint64_t kWriteBytes = 64 << 10;
inline constexpr int kLatencyOps = 500;       // each posted and waited for
inline constexpr int kRateOps = 4000;         // posted back to back
inline constexpr uint64_t kWrapWqes = 70000;  // through a 256-deep ring
}  // namespace selftest

// --across GROUP joins the group kAcrossGroupPrefix + GROUP: never a job's.
inline constexpr char kAcrossGroupPrefix[] = "mcctl-selftest-";

struct SelftestOptions {
  std::string socket;  // resolved daemon socket
  std::string nic;     // empty: the daemon's choice
  // The rendezvous (the two ranks' Creates). Across nodes, once the pair
  // formed, a rank waits up to 2 minutes for the other (selftest_across.h).
  int timeout_ms = 30000;
  // Empty: both ranks in this process (a loopback pair). Else the group of
  // two across nodes this process joins as rank `across_rank` (0 or 1).
  std::string across_group;
  int across_rank = -1;
};

struct SelftestStep {
  std::string name;
  bool pass = false;
  double latency_us = 0;  // median of one operation posted and completed; 0: not measured
  double rate = 0;        // operations per second, posted back to back; 0: not measured
  std::string detail;     // what was seen
  std::string hint;       // on failure: what to check
};

struct SelftestReport {
  // Who ran the steps (the table's title).
  std::string where = "a pair of ranks in this process, from a CPU thread";
  std::string nic;            // where the QPs went
  std::string provider;       // "softnic", "mlx5"
  std::string doorbell_mode;  // "doorbell-record", "cpu-assisted", ...
  std::string setup_error;    // non-empty: no step ran
  std::string setup_hint;
  std::vector<SelftestStep> steps;
  bool ok() const;
};

SelftestReport RunRdmaSelftest(const SelftestOptions& options);

std::string FormatSelftest(const SelftestReport& report);
std::string SelftestJson(const SelftestReport& report);

}  // namespace mooncake::mcctl
