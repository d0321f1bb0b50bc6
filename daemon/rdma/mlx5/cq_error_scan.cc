#include "rdma/mlx5/cq_error_scan.h"

#include <atomic>

#include "mooncake/device/mlx5/prm.h"

namespace mooncake::daemon::mlx5 {

namespace prm = device::mlx5;

uint8_t CqFailureSyndrome(const uint8_t* cq, uint32_t cqe_cnt) {
  const auto load = [](const uint8_t* p) {
    return std::atomic_ref<uint8_t>(*const_cast<uint8_t*>(p)).load(std::memory_order_relaxed);
  };
  uint8_t flushed = 0;
  for (uint32_t i = 0; i < cqe_cnt; ++i) {
    const uint8_t* cqe = cq + uint64_t{i} * prm::kCqeBytes;
    const uint8_t opcode = prm::cqe_opcode(load(cqe + prm::kCqeBytes - 1));
    if (opcode != prm::kCqeReqErr && opcode != prm::kCqeRespErr) continue;
    const uint8_t syndrome = load(cqe + prm::kCqeSyndromeByte);
    if (syndrome != prm::kSyndWrFlushErr && syndrome != 0) return syndrome;
    flushed = prm::kSyndWrFlushErr;
  }
  return flushed;
}

}  // namespace mooncake::daemon::mlx5
