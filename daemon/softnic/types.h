// Plain types shared by the softnic pieces: protection domains, access
// rights, the regions and queue pairs the engine knows, and what listings show.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "softnic/shared_mapping.h"

namespace mooncake::softnic {

// A protection domain: the daemon uses the owning session's id, so a key is
// only usable by the QPs of the session that registered it (and, remotely,
// by QPs connected to that session's QPs).
using PdId = uint64_t;

// Access rights of a region (the subset of IBV_ACCESS_* softnic honours).
enum Access : uint32_t {
  kLocalWrite = 1u << 0,
  kRemoteWrite = 1u << 1,
  kRemoteRead = 1u << 2,
  kRemoteAtomic = 1u << 3,
};

// Where a registered region's bytes are, as the daemon reaches them.
enum class MemoryKind {
  kHost,  // a SharedMapping (memfd) in the daemon
  kCuda,  // GPU memory the daemon mapped from the client's VMM fd (CudaBuffer)
};

class CudaBuffer;  // softnic/cuda_memory.h

struct RegionSpec {
  PdId pd = 0;
  uint64_t iova = 0;  // the address the client uses for it
  uint64_t length = 0;
  uint32_t access = 0;
  MemoryKind kind = MemoryKind::kHost;
  // kHost: bytes [offset, offset + length) of `mapping`.
  // kCuda: bytes [offset, offset + length) of `cuda`, an allocation the
  // daemon imported and mapped (CudaMemory::Import). A kCuda region without
  // one can be registered but names memory the engine cannot reach: every
  // WQE touching it fails (LOCAL_PROT_ERR / REMOTE_ACCESS_ERR).
  std::shared_ptr<SharedMapping> mapping;
  std::shared_ptr<CudaBuffer> cuda;
  uint64_t offset = 0;
};

struct RegionInfo {
  uint32_t key = 0;  // lkey == rkey
  PdId pd = 0;
  uint64_t iova = 0;
  uint64_t length = 0;
  uint32_t access = 0;
  MemoryKind kind = MemoryKind::kHost;
};

// The rings of one QP inside client control memory the daemon mapped. Every
// offset is into `mapping`; the engine checks they fit before accepting.
struct QpSpec {
  PdId pd = 0;
  std::shared_ptr<SharedMapping> mapping;
  uint64_t sq_offset = 0;        // sq_wqe_cnt * 64 bytes, 64-byte aligned
  uint32_t sq_wqe_cnt = 0;       // power of two, 1 .. 32768
  uint64_t sq_dbrec_offset = 0;  // 8 bytes, 4-byte aligned ([1] = send counter)
  uint64_t cq_offset = 0;        // cq_cqe_cnt * 64 bytes, 64-byte aligned
  uint32_t cq_cqe_cnt = 0;       // power of two, >= sq_wqe_cnt
  uint64_t cq_dbrec_offset = 0;  // 8 bytes, 4-byte aligned ([0] = consumer index)
};

enum class QpState { kReset, kRts, kError };
const char* QpStateName(QpState s);

struct QpInfo {
  uint32_t qpn = 0;
  PdId pd = 0;
  QpState state = QpState::kReset;
  uint32_t remote_qpn = 0;  // 0 while not connected
  std::string remote_node;  // "" = this node
  uint32_t sq_wqe_cnt = 0;
  uint64_t wqes_done = 0;     // completed (successfully or not)
  uint8_t last_syndrome = 0;  // of the error CQE that moved it to kError
  // How its doorbells reach the NIC when it differs from the provider's
  // default (a static string, e.g. "gpu-uar"); null: the provider's.
  const char* doorbell_mode = nullptr;
  std::string nic;                   // the NIC it is on, when the provider serves several
  bool rings_in_gpu_memory = false;  // a dmabuf umem, not the daemon-mapped memfd
};

}  // namespace mooncake::softnic
