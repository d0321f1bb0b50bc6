// Internal: the P2P handle format and the reserved tail of every P2P buffer,
// shared by the host and CUDA transports.
//
// Handle (little-endian, returned as int32 words), version 2:
//   off  0  u32  magic "MCPH"
//   off  4  u8   version (2)
//   off  5  u8   kind (HandleKind)
//   off  6  u8   payload length
//   off  7  u8   reserved (0)
//   off  8  u64  mapping bytes (what the importer maps)
//   off 16  u64  buffer id (random; also stored in the buffer's tail)
//   off 24  u64  node key: NodeKey() of the exporter's node identity, so an
//                importer recognises an off-node rank without asking anyone
//   off 32  ...  payload (<= 96 bytes): empty when the fds travel beside the
//                handle (the join route), the HandleExchange export name
//                (<= 40 bytes, the exportIpcHandle adapter), a 64-byte
//                cudaIpcMemHandle, or a 64-byte CUmemFabricHandle (kind
//                cuda-fabric: exactly 64 bytes, checked both ways); zero
//                padded.
// Every kind encodes to exactly kHandleBytes (128 bytes, 32 words): upstream
// EP all-gathers handles with an equal-length collective, so ranks that
// chose different kinds must still produce blobs of one length. RDMA
// metadata (several QPs per peer, variable size) does not travel in this
// blob but in the group view.
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
inline constexpr uint8_t kHandleVersion = 2;
inline constexpr size_t kHandleHeaderBytes = 32;
inline constexpr size_t kHandleBytes = 128;
inline constexpr size_t kMaxPayloadBytes = kHandleBytes - kHandleHeaderBytes;

// kCudaFabric: a cuMem VMM allocation named by its 64-byte fabric handle
// (the payload), mappable by any process of the NVLink fabric, this node's
// or another's (MNNVL). On the join route its POSIX fd travels beside it
// too, so a same-node rank without fabric support still maps it.
enum class HandleKind : uint8_t { kMemfd = 1, kCudaVmmFd = 2, kCudaIpc = 3, kCudaFabric = 4 };
inline constexpr uint8_t kMaxHandleKind = 4;
// The payload of a kCudaFabric handle: one CUmemFabricHandle.
inline constexpr size_t kFabricHandleBytes = 64;

const char* HandleKindName(HandleKind kind);

// True for the kinds whose memory is shared by passing file descriptors.
inline bool IsFdKind(HandleKind kind) {
  return kind == HandleKind::kMemfd || kind == HandleKind::kCudaVmmFd;
}

struct BufferHandle {
  HandleKind kind = HandleKind::kMemfd;
  uint64_t map_bytes = 0;
  uint64_t buffer_id = 0;
  uint64_t node_key = 0;
  std::string payload;
};

// 64-bit FNV-1a of a node identity (the daemon's node id, or the kernel's
// boot id without a daemon). Never 0, so 0 can mean "unknown".
uint64_t NodeKey(std::string_view node_identity);

// This machine's default node identity: the kernel boot id
// (/proc/sys/kernel/random/boot_id): processes that share it share one
// kernel, which is what memfd and CUDA IPC sharing need. "" if unreadable.
std::string DefaultNodeIdentity();

// InvalidArgument when the payload is longer than kMaxPayloadBytes, or a
// kCudaFabric payload is not exactly kFabricHandleBytes.
absl::StatusOr<std::vector<int32_t>> EncodeHandle(const BufferHandle& handle);

// InvalidArgument naming what is wrong (too short, bad magic, version, kind,
// payload length, a fabric handle's size) so a mixed-up exchange is easy to
// diagnose.
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

}  // namespace internal
}  // namespace device
}  // namespace mooncake
