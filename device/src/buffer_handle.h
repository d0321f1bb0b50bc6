// Internal: the P2P handle format and the reserved tail of every P2P buffer,
// shared by the host and CUDA transports.
//
// Handle (little-endian, returned as int32 words):
//   off  0  u32  magic "MCPH"
//   off  4  u8   version (1)
//   off  5  u8   kind (HandleKind)
//   off  6  u8   payload length
//   off  7  u8   reserved (0)
//   off  8  u64  mapping bytes (what the importer maps)
//   off 16  u64  buffer id (random; also stored in the buffer's tail)
//   off 24  ...  payload: HandleExchange export bytes (<= 40), or a 64-byte
//                cudaIpcMemHandle; zero padding to a multiple of 4 bytes
//                and at least 64 bytes in all.
//
// Buffer tail (the last TailBytes(num_ranks) bytes of the mapping, never
// handed to the caller):
//   +0        u64  buffer id, written by the owner at allocation
//   +64+8*r   u64  probe slot written by rank r's verifyPeerAccess
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace mooncake {
namespace device {
namespace internal {

inline constexpr uint32_t kHandleMagic = 0x4850434d;  // "MCPH"
inline constexpr uint8_t kHandleVersion = 1;
inline constexpr size_t kHandleHeaderBytes = 24;
inline constexpr size_t kMinHandleBytes = 64;
inline constexpr size_t kMaxPayloadBytes = 64;

enum class HandleKind : uint8_t { kMemfd = 1, kCudaVmmFd = 2, kCudaIpc = 3 };

const char* HandleKindName(HandleKind kind);

struct BufferHandle {
  HandleKind kind = HandleKind::kMemfd;
  uint64_t map_bytes = 0;
  uint64_t buffer_id = 0;
  std::string payload;
};

// InvalidArgument when the payload is longer than kMaxPayloadBytes.
absl::StatusOr<std::vector<int32_t>> EncodeHandle(const BufferHandle& handle);

// InvalidArgument naming what is wrong (too short, bad magic, version, kind,
// payload length) so a mixed-up exchange is easy to diagnose.
absl::StatusOr<BufferHandle> DecodeHandle(const std::vector<int32_t>& words);

// Bytes reserved at the end of each buffer: id line + one probe slot per rank,
// rounded up to 64.
inline size_t TailBytes(int num_ranks) {
  const size_t raw = 64 + 8 * static_cast<size_t>(num_ranks);
  return (raw + 63) / 64 * 64;
}
inline size_t TailOffset(uint64_t map_bytes, int num_ranks) {
  return static_cast<size_t>(map_bytes) - TailBytes(num_ranks);
}
inline size_t ProbeSlotOffset(uint64_t map_bytes, int num_ranks, int prober_rank) {
  return TailOffset(map_bytes, num_ranks) + 64 + 8 * static_cast<size_t>(prober_rank);
}

inline size_t RoundUp(size_t v, size_t to) { return (v + to - 1) / to * to; }

// A fresh random 64-bit id (never 0).
uint64_t NewBufferId();

// The value rank `rank` writes into a probe slot: rank in the top 16 bits,
// random low bits, so a stale or foreign value is never mistaken for it.
uint64_t NewProbeValue(int rank);

// "0x7f..." for messages (absl::StrCat takes no pointers).
std::string PtrString(const void* p);

// "0,3,5" style list of ranks, for messages.
std::string RankList(const std::vector<int>& ranks);

// Checks importPeerHandles' arguments, the same for every platform:
// `expected_ranks` is what the transport was created for.
absl::Status ValidateImportArgs(int expected_ranks, int rank, int num_ranks, size_t handle_count,
                                const std::vector<int>& mask);

// Who takes part: mask[r] != 0 (empty mask = everyone); `rank` always.
std::vector<int> ActiveRanks(const std::vector<int>& mask, int num_ranks, int rank);

// Runs import_one(r) for every active rank other than `rank`, all of them
// even after a failure (the rest keep working), and reports the failed
// ranks with the first error. `who` names the importer in the message,
// e.g. "rank 3, GPU 1".
template <class ImportOne>
absl::Status ImportActivePeers(int rank, const std::vector<int>& active, absl::string_view who,
                               ImportOne import_one) {
  std::vector<int> failed;
  absl::Status first;
  for (int r = 0; r < static_cast<int>(active.size()); ++r) {
    if (r == rank || !active[r]) continue;
    absl::Status s = import_one(r);
    if (!s.ok()) {
      failed.push_back(r);
      if (first.ok()) first = s;
    }
  }
  if (failed.empty()) return absl::OkStatus();
  return absl::Status(first.code(), absl::StrCat("importPeerHandles (", who, "): ranks [",
                                                 RankList(failed), "] unavailable; first failure: ",
                                                 first.message()));
}

}  // namespace internal
}  // namespace device
}  // namespace mooncake
