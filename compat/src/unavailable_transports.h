// What upstream's factories return when no transport can be made here: an
// object whose every call fails, never nullptr. Upstream's
// createP2pDeviceTransport and createIbgdaDeviceTransport always return an
// object (their failures surface in the calls), and Mooncake EP
// dereferences the result without a check: with no daemon, or a daemon
// serving no RDMA, EP gets an RDMA transport whose initialize() fails (and
// falls back to P2P, as on a node without a NIC) instead of a crash.
//
// Each keeps the reason and logs it at the first call that fails.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "mooncake/common/log.h"
#include "mooncake/device/upstream_transport.h"

namespace mooncake::device {

class UnavailableP2pTransport final : public P2pTransport {
 public:
  explicit UnavailableP2pTransport(std::string why) : why_(std::move(why)) {}
  const std::string& why() const { return why_; }

  void* allocateBuffer(size_t) override {
    Fail("allocateBuffer");
    return nullptr;
  }
  void freeBuffer(void*) override {}
  std::vector<int32_t> exportIpcHandle(void*) override {
    Fail("exportIpcHandle");
    return {};
  }
  void importPeerHandles(void*, int, int, const std::vector<std::vector<int32_t>>&,
                         const std::vector<int>&) override {
    Fail("importPeerHandles");
  }
  int32_t* availableTablePtr() override { return nullptr; }
  void** peerPtrsTablePtr() override { return nullptr; }
  bool allPeersAccessible() const override { return false; }
  bool verifyPeerAccess() override {
    Fail("verifyPeerAccess");
    return false;
  }

 private:
  void Fail(const char* call) {
    if (logged_) return;
    logged_ = true;
    MC_LOG(kError, "P2pTransport::", call, ": no transport was made (", why_, ")");
  }
  const std::string why_;
  bool logged_ = false;
};

class UnavailableRdmaTransport final : public RdmaTransport {
 public:
  explicit UnavailableRdmaTransport(std::string why) : why_(std::move(why)) {}
  const std::string& why() const { return why_; }

  int initialize(const std::string&, int, int) override { return Fail("initialize"); }
  int registerMemory(void*, size_t) override { return Fail("registerMemory"); }
  int allocateControlBuffer() override { return Fail("allocateControlBuffer"); }
  int createQueuePairs(void*) override { return Fail("createQueuePairs"); }
  int recreateQueuePairs(void*) override { return Fail("recreateQueuePairs"); }
  int connectPeers(int, bool, const std::vector<int64_t>&, const std::vector<int32_t>&,
                   const std::vector<int32_t>&, const std::vector<int32_t>&,
                   const std::vector<int64_t>&, const std::vector<int64_t>&,
                   const std::vector<int>&) override {
    return Fail("connectPeers");
  }
  RdmaLocalMetadata localMetadata() const override { return {}; }
  void* raddrsPtr() override { return nullptr; }
  void* rkeysPtr() override { return nullptr; }
  void* qpDevCtxsPtr() override { return nullptr; }
  bool isRoce() const override { return false; }
  int gidIndex() const override { return 0; }

 private:
  int Fail(const char* call) {
    if (!logged_) {
      logged_ = true;
      MC_LOG(kWarning, "RdmaTransport::", call, ": no RDMA transport was made (", why_,
             "); GPU-initiated RDMA is off for this process");
    }
    return -1;
  }
  const std::string why_;
  bool logged_ = false;
};

}  // namespace mooncake::device
