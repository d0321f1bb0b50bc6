// SoftnicProvider: RdmaProvider over mooncaked's software NIC
// (softnic/engine.h). The engine thread watches each QP's doorbell record
// ("doorbell-record" mode) and executes the WQEs it finds; keys are both
// lkey and rkey; a session's protection domain is its id.
//
// Takes "memfd" and "cuda-vmm-fd" regions (the GPU allocation imported by
// RdmaResources' CudaMemory). Thread-safe (the engine is).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "rdma/provider.h"
#include "softnic/engine.h"

namespace mooncake::daemon {

class SoftnicProvider final : public RdmaProvider {
 public:
  // Starts the engine thread; the destructor stops it.
  SoftnicProvider(std::string nic_name, softnic::EngineOptions options);
  ~SoftnicProvider() override;

  const std::string& name() const override { return name_; }
  const std::string& nic() const override { return nic_; }
  const std::string& doorbell_mode() const override { return doorbell_mode_; }
  uint32_t max_cq_cqe_cnt() const override { return softnic::Engine::kMaxCqCqeCnt; }
  // How the engine models NIC atomics (softnic_atomics in mooncaked.conf).
  std::string AtomicsOf(const std::string& nic) override;

  absl::Status CheckMemoryKind(const std::string& kind) const override;
  absl::Status CheckLayouts(const std::vector<QpLayout>&) const override {
    return absl::OkStatus();
  }
  absl::StatusOr<ProviderRegion> RegisterMemory(RegionMemory memory) override;
  absl::Status DeregisterMemory(uint64_t session, uint32_t lkey) override;
  absl::StatusOr<std::vector<uint32_t>> CreateQueuePairs(
      uint64_t session, std::shared_ptr<softnic::SharedMapping> control, uint64_t control_offset,
      const std::vector<QpLayout>& layouts) override;
  absl::Status AcceptRemote(uint64_t session, uint32_t qpn, const std::string& node,
                            uint32_t remote_qpn, std::string secret) override;
  absl::Status ConnectRemote(uint64_t session, uint32_t qpn, const std::string& node,
                             uint32_t remote_qpn, std::string secret,
                             const QpEndpoint& peer) override;
  absl::Status Connect(uint64_t session, uint32_t qpn, uint64_t remote_session,
                       uint32_t remote_qpn) override;
  absl::Status DestroyQueuePair(uint64_t session, uint32_t qpn) override;
  void SessionEnded(uint64_t session) override;
  void SessionOwner(uint64_t session, uint64_t owner) override;
  absl::Status AttachCopyAgent(uint64_t session,
                               std::shared_ptr<softnic::CopyAgentLink> agent) override {
    return engine_.AttachCopyAgent(session, std::move(agent));
  }
  std::vector<softnic::QpInfo> ListQps() const override { return engine_.ListQps(); }
  std::vector<softnic::RegionInfo> ListRegions() const override { return engine_.ListRegions(); }
  bool counts_wqes() const override { return true; }
  std::vector<QpRingCounters> ListRingCounters() const override;
  int64_t bytes_moved() const override { return static_cast<int64_t>(engine_.bytes_written()); }
  std::optional<GpuWork> gpu_work() const override {
    return GpuWork{engine_.gpu_worker_threads(), engine_.gpu_jobs_waiting()};
  }

  softnic::Engine& engine() { return engine_; }

 private:
  const std::string name_ = "softnic";
  const std::string nic_;
  const std::string doorbell_mode_ = "doorbell-record";
  softnic::Engine engine_;

  // Where each QP's doorbell records lie, for ListRingCounters (the
  // engine keeps its own view; this one only reads).
  struct Records {
    uint64_t session = 0;
    const uint8_t* sq_dbrec = nullptr;
    const uint8_t* cq_dbrec = nullptr;
    std::shared_ptr<softnic::SharedMapping> control;  // keeps them mapped
  };
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint32_t, Records> records_ ABSL_GUARDED_BY(mu_);  // by QPN
};

}  // namespace mooncake::daemon
