// Host setup of the EP-style program, as upstream-style code does it: the
// transport from createP2pDeviceTransport, handles exchanged by the program
// itself (files in a run directory, as upstream's example did), tables
// imported and verified. Compiled as C++17 with the standard library only.
#pragma once

#include <transport/device/device_transport.h>

#include <cstdint>
#include <memory>
#include <string>

struct EpSetup {
  std::unique_ptr<mooncake::device::P2pTransport> p2p;
  void* buffer = nullptr;
  int32_t* available = nullptr;
  void** peer_ptrs = nullptr;
};

// Empty on success, else what failed.
std::string SetUpRank(const std::string& run_dir, int rank, int num_ranks, size_t bytes,
                      EpSetup* out);
// Waits until every rank has created run_dir/<name>.<rank>; writes ours first.
std::string RendezvousFiles(const std::string& run_dir, const std::string& name, int rank,
                            int num_ranks, const std::string& payload, std::string* all_payloads);
