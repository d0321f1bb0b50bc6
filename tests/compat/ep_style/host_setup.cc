#include "host_setup.h"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

using mooncake::device::createP2pDeviceTransport;

std::string RendezvousFiles(const std::string& run_dir, const std::string& name, int rank,
                            int num_ranks, const std::string& payload, std::string* all_payloads) {
  const std::string mine = run_dir + "/" + name + "." + std::to_string(rank);
  {
    std::ofstream f(mine + ".tmp", std::ios::binary);
    f << payload;
    if (!f) return "writing " + mine;
  }
  if (std::rename((mine + ".tmp").c_str(), mine.c_str()) != 0) return "renaming " + mine;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  all_payloads->clear();
  for (int r = 0; r < num_ranks; ++r) {
    const std::string theirs = run_dir + "/" + name + "." + std::to_string(r);
    for (;;) {
      std::ifstream f(theirs, std::ios::binary);
      if (f) {
        std::stringstream ss;
        ss << f.rdbuf();
        *all_payloads += ss.str();
        break;
      }
      if (std::chrono::steady_clock::now() > deadline) return "timed out waiting for " + theirs;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  return "";
}

std::string SetUpRank(const std::string& run_dir, int rank, int num_ranks, size_t bytes,
                      EpSetup* out) {
  out->p2p = createP2pDeviceTransport(num_ranks);
  if (!out->p2p) return "createP2pDeviceTransport returned nullptr (see the log above)";
  out->buffer = out->p2p->allocateBuffer(bytes);
  if (out->buffer == nullptr) return "allocateBuffer failed";
  const std::vector<int32_t> mine = out->p2p->exportIpcHandle(out->buffer);
  if (mine.empty()) return "exportIpcHandle failed";
  // Every handle has the same length: all-gather them through files.
  std::string all;
  const std::string err = RendezvousFiles(
      run_dir, "handle", rank, num_ranks,
      std::string(reinterpret_cast<const char*>(mine.data()), mine.size() * sizeof(int32_t)), &all);
  if (!err.empty()) return err;
  if (all.size() != mine.size() * sizeof(int32_t) * num_ranks) return "handles differ in length";
  std::vector<std::vector<int32_t>> handles(num_ranks, std::vector<int32_t>(mine.size()));
  for (int r = 0; r < num_ranks; ++r) {
    std::memcpy(handles[r].data(), all.data() + r * mine.size() * sizeof(int32_t),
                mine.size() * sizeof(int32_t));
  }
  out->p2p->importPeerHandles(out->buffer, rank, num_ranks, handles, std::vector<int>());
  if (!out->p2p->verifyPeerAccess()) return "verifyPeerAccess: not every peer is reachable";
  if (!out->p2p->allPeersAccessible()) return "allPeersAccessible is false";
  out->available = out->p2p->availableTablePtr();
  out->peer_ptrs = out->p2p->peerPtrsTablePtr();
  return "";
}
