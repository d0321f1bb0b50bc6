// device_transport_example: the upstream two-rank Device API example, now
// through mooncaked (no handle files, no MPI), plus an n-rank all-to-all.
//
//   device_transport_example --platform host --socket S --group G \
//       --rank R --world-size N [--mode pair|all2all|watch|elastic] [--bytes B]
//       [--timeout-ms T] [--route auto|p2p|rdma] [--rdma-peers R1,R2,...] [--qps-per-peer Q]
//       [--nic N1,N2,...] [--rings auto|host|gpu] [--atomics auto|device|nic]
//       [--rounds K] [--expect-rejoins J]
//
// --route rdma sends to every peer over RDMA (GPU-initiated RDMA's WQEs and
// doorbells; softnic in mooncaked executes them where no RDMA NIC is);
// --rdma-peers makes only those peers RDMA (both ends of a pair must say so).
// --nic puts this rank's QPs on one of those NICs (default: the daemon's
// choice, the NIC closest to the rank's GPU). --rings says where the QPs'
// rings live (CUDA): auto (GPU memory when kernels ring the NIC
// themselves, else host memory), host, or gpu (a setup error when the
// daemon, the NIC or the driver refuses GPU memory); the line after
// "ready" names where they are. --atomics says where mc_red_add runs
// (CommunicatorOptions::atomics_route): nic sends every add through the
// target's NIC, device uses SM/CPU atomics toward P2P peers, auto is nic
// on ranks with RDMA peers; every rank of a group must agree.
//
// Across nodes, give every rank the same group secret in MC_GROUP_SECRET
// (the launcher's job; e.g. export MC_GROUP_SECRET=$(openssl rand -hex 32)
// once per job): a rank of the same uid on another node that does not know
// it is not counted as a member (docs/cluster.md, "Group secrets").
//
// Start one process per rank. Prints PASS and exits 0 when every byte
// checks out; exits 1 on wrong data, 2 on a setup error (with the reason),
// 3 on a timeout, 64 on bad arguments.
//
// --mode watch: set up, print READY, then hold the group with all its
// resources (buffer, QPs, MRs) until a peer is reported lost or leaves,
// however long that takes (--timeout-ms bounds forming the group only);
// print "EVENT lost rank R" (or left) and PASS. Other events are printed and
// it keeps waiting; losing the daemon exits 2. Tests SIGKILL one rank and
// check the others are told and the daemon cleaned up.
//
// --mode elastic (host or CUDA platform): every rank exchanges puts and
// signals with every other in a loop (--bytes per message, default 4096), survives the
// loss of ranks (their LOST event releases them) and admits replacements
// (start a process with the same --rank: it re-joins the group at epoch + 1).
// An original rank finishes after --expect-rejoins replacements and --rounds
// complete rounds after the last; a replacement after --rounds. See
// elastic_run.h for the lines it prints. On CUDA, kernels on the rank's GPU
// move and check the messages (elastic_cuda.h); the loop is the same.
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "elastic_run.h"
#include "example_common.h"
#include "host_run.h"
#include "mooncake/client/communicator.h"
#if MOONCAKE_EXAMPLE_HAVE_CUDA
#include "cuda_run.h"
#endif

namespace {

struct Args {
  std::string platform = "host";
  std::string socket;
  std::string group = "device-transport-example";
  int rank = -1;
  int world_size = -1;
  std::string mode;  // default: pair for 2 ranks, all2all otherwise
  size_t bytes = 1 << 20;
  int timeout_ms = 30000;
  int device = -1;  // CUDA device; default: rank % device count
  // CUDA sharing: auto, vmm (cuMem POSIX fd), ipc (legacy), fabric (MNNVL)
  std::string handle = "auto";
  std::string route = "auto";
  std::vector<uint32_t> rdma_peers;
  uint32_t qps_per_peer = 1;
  std::vector<std::string> nics;
  std::string rings = "auto";
  std::string atomics = "auto";
  int rounds = 50;         // elastic
  int expect_rejoins = 0;  // elastic
  bool bytes_given = false;
};

void Usage() {
  std::cerr << "usage: device_transport_example --platform host|cuda --rank R --world-size N\n"
               "         [--socket PATH] [--group NAME] [--mode pair|all2all|watch] [--bytes B]\n"
               "         [--timeout-ms T] [--device D] [--handle auto|vmm|ipc|fabric]\n"
               "         [--route auto|p2p|rdma] [--rdma-peers R1,R2,...] [--qps-per-peer Q]\n"
               "         [--nic N1,N2,...] [--rings auto|host|gpu] [--atomics auto|device|nic]\n"
               "         [--rounds K] [--expect-rejoins J]   (--mode elastic)\n"
               "  --timeout-ms T how long to wait for the group to form and be ready, and\n"
               "                 (pair, all2all, elastic) for each transfer; default 30000\n"
               "  --mode watch   set up, print READY, hold the group until a peer is lost or\n"
               "                 leaves, print 'EVENT lost|left rank R' and PASS; the watch\n"
               "                 itself has no time limit (--timeout-ms bounds the setup)\n"
               "  --route rdma   reach every peer over RDMA (softnic where there is no NIC)\n"
               "  --rings gpu    keep the QPs' rings in GPU memory or fail setup saying why\n"
               "  --mode elastic exchange in a loop, survive lost ranks, admit replacements\n";
}

bool ParseArgs(int argc, char** argv, Args* a) {
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    if (k == "--help" || k == "-h") return false;
    if (i + 1 >= argc) {
      std::cerr << "device_transport_example: " << k << " needs a value\n";
      return false;
    }
    std::string v = argv[++i];
    bool ok = true;
    if (k == "--platform")
      a->platform = v;
    else if (k == "--socket")
      a->socket = v;
    else if (k == "--group")
      a->group = v;
    else if (k == "--mode")
      a->mode = v;
    else if (k == "--rank")
      ok = absl::SimpleAtoi(v, &a->rank);
    else if (k == "--world-size")
      ok = absl::SimpleAtoi(v, &a->world_size);
    else if (k == "--bytes") {
      ok = absl::SimpleAtoi(v, &a->bytes);
      a->bytes_given = true;
    } else if (k == "--rounds")
      ok = absl::SimpleAtoi(v, &a->rounds) && a->rounds >= 1;
    else if (k == "--expect-rejoins")
      ok = absl::SimpleAtoi(v, &a->expect_rejoins) && a->expect_rejoins >= 0;
    else if (k == "--timeout-ms")
      ok = absl::SimpleAtoi(v, &a->timeout_ms);
    else if (k == "--device")
      ok = absl::SimpleAtoi(v, &a->device);
    else if (k == "--route") {
      a->route = v;
      ok = v == "auto" || v == "p2p" || v == "rdma";
    } else if (k == "--rdma-peers") {
      for (absl::string_view part : absl::StrSplit(v, ',', absl::SkipEmpty())) {
        uint32_t p = 0;
        ok = ok && absl::SimpleAtoi(part, &p);
        a->rdma_peers.push_back(p);
      }
    } else if (k == "--nic") {
      for (absl::string_view part : absl::StrSplit(v, ',', absl::SkipEmpty())) {
        a->nics.emplace_back(part);
      }
      ok = !a->nics.empty();
    } else if (k == "--atomics") {
      a->atomics = v;
      ok = mooncake::ParseAtomicsRoute(v).ok();
    } else if (k == "--rings") {
      a->rings = v;
      ok = v == "auto" || v == "host" || v == "gpu";
    } else if (k == "--qps-per-peer")
      ok = absl::SimpleAtoi(v, &a->qps_per_peer) && a->qps_per_peer >= 1 && a->qps_per_peer <= 64;
    else if (k == "--handle") {
      a->handle = v;
      ok = v == "auto" || v == "vmm" || v == "ipc" || v == "fabric";
    } else {
      std::cerr << "device_transport_example: unknown argument " << k << "\n";
      return false;
    }
    if (!ok) {
      std::cerr << "device_transport_example: bad value for " << k << ": " << v << "\n";
      return false;
    }
  }
  if (a->rank < 0 || a->world_size < 1 || a->rank >= a->world_size) {
    std::cerr << "device_transport_example: need --rank R and --world-size N with 0 <= R < N\n";
    return false;
  }
  if (a->world_size > static_cast<int>(mooncake::example::kMaxRanks)) {
    std::cerr << "device_transport_example: at most " << mooncake::example::kMaxRanks << " ranks\n";
    return false;
  }
  if (a->mode.empty()) a->mode = a->world_size == 2 ? "pair" : "all2all";
  if (a->mode != "pair" && a->mode != "all2all" && a->mode != "watch" && a->mode != "elastic") {
    std::cerr << "device_transport_example: --mode is pair, all2all, watch or elastic\n";
    return false;
  }
  if (a->mode == "elastic" && !a->bytes_given) a->bytes = 4096;
  if (a->mode == "pair" && a->world_size < 2) {
    std::cerr << "device_transport_example: pair mode needs --world-size >= 2\n";
    return false;
  }
  if (a->timeout_ms <= 0) a->timeout_ms = 30000;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  if (!ParseArgs(argc, argv, &a)) {
    Usage();
    return 64;
  }
  absl::StatusOr<mooncake::Platform> platform = mooncake::ParsePlatform(a.platform);
  if (!platform.ok()) {
    std::cerr << "device_transport_example: " << platform.status().message() << "\n";
    return 64;
  }
  const std::string who = absl::StrCat("rank ", a.rank, "/", a.world_size);

  mooncake::CommunicatorOptions o;
  o.socket_path = a.socket;
  o.group = a.group;
  o.rank = static_cast<uint32_t>(a.rank);
  o.world_size = static_cast<uint32_t>(a.world_size);
  o.buffer_bytes = a.mode == "elastic"
                       ? mooncake::example::ElasticBufferBytes(a.bytes, a.world_size)
                       : mooncake::example::BufferBytes(a.bytes, a.world_size);
  o.platform = *platform;
  o.timeout = absl::Milliseconds(a.timeout_ms);
  o.client_name = absl::StrCat("device_transport_example ", who);
  o.route = *mooncake::ParseRoute(a.route);
  o.rdma_peers = a.rdma_peers;
  o.atomics_route = *mooncake::ParseAtomicsRoute(a.atomics);
  o.qps_per_peer = a.qps_per_peer;
  o.rdma_nics = a.nics;
  o.rdma_ring_memory = a.rings == "gpu"    ? mooncake::DaemonRdmaOptions::RingMemory::kGpu
                       : a.rings == "host" ? mooncake::DaemonRdmaOptions::RingMemory::kHost
                                           : mooncake::DaemonRdmaOptions::RingMemory::kAuto;
  o.cuda_handle = a.handle == "vmm"      ? mooncake::device::CudaHandleKind::kVmmPosixFd
                  : a.handle == "ipc"    ? mooncake::device::CudaHandleKind::kLegacyIpc
                  : a.handle == "fabric" ? mooncake::device::CudaHandleKind::kFabric
                                         : mooncake::device::CudaHandleKind::kAuto;
#if MOONCAKE_EXAMPLE_HAVE_CUDA
  if (*platform == mooncake::Platform::kCuda) {
    absl::Status s = mooncake::example::PrepareCudaDevice(a.device, a.rank, &o.gpu_uuid);
    if (!s.ok()) {
      std::cerr << "device_transport_example " << who << ": " << s.message() << "\n";
      return 2;
    }
  }
#endif
  absl::StatusOr<std::unique_ptr<mooncake::Communicator>> comm = mooncake::Communicator::Create(o);
  if (!comm.ok()) {
    std::cerr << "device_transport_example " << who << ": setup failed: " << comm.status().message()
              << "\n";
    return comm.status().code() == absl::StatusCode::kDeadlineExceeded ? 3 : 2;
  }
  std::cout << who << ": ready in " << absl::FormatDuration((*comm)->setupTime()) << " ("
            << (*comm)->handleKind() << ", group " << a.group << ")\n";
  if (mooncake::DaemonRdmaTransport* rdma = (*comm)->rdmaTransport()) {
    std::cout << who << ": RDMA on " << rdma->nic() << ", doorbells " << rdma->doorbellMode()
              << ", rings in " << rdma->ringMemory() << " memory\n";
  }

  const uint64_t timeout_ns = static_cast<uint64_t>(a.timeout_ms) * 1000000ull;
  mooncake::example::RunResult r;
  if (a.mode == "watch") {
    std::cout << who << ": READY" << std::endl;
    // No deadline: the group is held until something happens to it. Waits
    // in slices (an infinite Duration would overflow the condition wait).
    for (;;) {
      std::optional<mooncake::SessionEvent> ev = (*comm)->client().nextEvent(absl::Minutes(1));
      if (!ev) continue;
      std::cout << who << ": EVENT " << mooncake::SessionEventKindName(ev->kind) << " rank "
                << ev->rank << " (" << ev->detail << ")" << std::endl;
      if (ev->kind == mooncake::SessionEvent::Kind::kLost ||
          ev->kind == mooncake::SessionEvent::Kind::kLeft) {
        std::cout << "PASS" << std::endl;
        return 0;
      }
      if (ev->kind == mooncake::SessionEvent::Kind::kDaemonShutdown ||
          ev->kind == mooncake::SessionEvent::Kind::kDisconnected) {
        std::cerr << "device_transport_example " << who << ": FAIL: lost the daemon\n";
        return 2;
      }
    }
  }
  if (a.mode == "elastic") {
    mooncake::example::ElasticOptions eo;
    eo.msg_bytes = a.bytes;
    eo.timeout_ns = timeout_ns;
    eo.rounds = a.rounds;
    eo.expect_rejoins = a.expect_rejoins;
    r = *platform == mooncake::Platform::kHost ? mooncake::example::RunElasticHost(**comm, eo)
                                               : mooncake::example::RunElasticCuda(**comm, eo);
  } else if (*platform == mooncake::Platform::kHost) {
    r = a.mode == "pair"
            ? mooncake::example::RunPairHost((*comm)->ctx(), (*comm)->buffer(), a.bytes, timeout_ns)
            : mooncake::example::RunAllToAllHost((*comm)->ctx(), (*comm)->buffer(), a.bytes,
                                                 timeout_ns);
  } else {
#if MOONCAKE_EXAMPLE_HAVE_CUDA
    r = a.mode == "pair"
            ? mooncake::example::RunPairCuda((*comm)->ctx(), (*comm)->buffer(), a.bytes, timeout_ns)
            : mooncake::example::RunAllToAllCuda((*comm)->ctx(), (*comm)->buffer(), a.bytes,
                                                 timeout_ns);
#else
    r.message = "this build has no CUDA support (rebuild with the CUDA toolkit)";
#endif
  }
  if (!r.ok) {
    std::cerr << "device_transport_example " << who << ": FAIL: " << r.message << "\n";
    if (r.message.find("timed out") != std::string::npos) return 3;
    return r.bad_bytes > 0 ? 1 : 2;
  }
  std::cout << who << ": " << r.message << "\nPASS\n";
  return 0;
}
