#include "buffer_handle.h"

#include <cstring>
#include <fstream>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "mooncake/device/device_transport.h"

namespace mooncake {
namespace device {
namespace internal {
namespace {

void PutU64(std::string* out, size_t off, uint64_t v) {
  for (int i = 0; i < 8; ++i) (*out)[off + i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
uint64_t GetU64(std::string_view in, size_t off) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i)
    v |= static_cast<uint64_t>(static_cast<uint8_t>(in[off + i])) << (8 * i);
  return v;
}

uint64_t RandomU64() {
  // Seeded per thread from the OS; ids only need to be unlikely to repeat.
  thread_local std::mt19937_64 gen{(static_cast<uint64_t>(std::random_device{}()) << 32) ^
                                   std::random_device{}()};
  return gen();
}

}  // namespace

const char* HandleKindName(HandleKind kind) {
  switch (kind) {
    case HandleKind::kMemfd: return "memfd";
    case HandleKind::kCudaVmmFd: return "cuda-vmm-fd";
    case HandleKind::kCudaIpc: return "cuda-ipc";
    case HandleKind::kCudaFabric: return "cuda-fabric";
  }
  return "unknown";
}

absl::StatusOr<std::vector<int32_t>> EncodeHandle(const BufferHandle& handle) {
  if (handle.payload.size() > kMaxPayloadBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("P2P handle: payload of ", handle.payload.size(), " bytes exceeds the ",
                     kMaxPayloadBytes, "-byte limit (a HandleExchange must return at most ",
                     HandleExchange::kMaxExportedBytes, " bytes from exportFds)"));
  }
  if (handle.kind == HandleKind::kCudaFabric && handle.payload.size() != kFabricHandleBytes) {
    return absl::InvalidArgumentError(absl::StrCat("P2P handle: cuda-fabric payload of ",
                                                   handle.payload.size(), " bytes, expected ",
                                                   kFabricHandleBytes, " (one CUmemFabricHandle)"));
  }
  const size_t total = kHandleBytes;
  std::string bytes(total, '\0');
  const uint32_t magic = kHandleMagic;
  for (int i = 0; i < 4; ++i) bytes[i] = static_cast<char>((magic >> (8 * i)) & 0xff);
  bytes[4] = static_cast<char>(kHandleVersion);
  bytes[5] = static_cast<char>(handle.kind);
  bytes[6] = static_cast<char>(handle.payload.size());
  PutU64(&bytes, 8, handle.map_bytes);
  PutU64(&bytes, 16, handle.buffer_id);
  PutU64(&bytes, 24, handle.node_key);
  std::memcpy(bytes.data() + kHandleHeaderBytes, handle.payload.data(), handle.payload.size());

  std::vector<int32_t> words(total / 4);
  for (size_t w = 0; w < words.size(); ++w) {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i)
      v |= static_cast<uint32_t>(static_cast<uint8_t>(bytes[4 * w + i])) << (8 * i);
    words[w] = static_cast<int32_t>(v);
  }
  return words;
}

absl::StatusOr<BufferHandle> DecodeHandle(const std::vector<int32_t>& words) {
  std::string bytes(words.size() * 4, '\0');
  for (size_t w = 0; w < words.size(); ++w) {
    const uint32_t v = static_cast<uint32_t>(words[w]);
    for (int i = 0; i < 4; ++i) bytes[4 * w + i] = static_cast<char>((v >> (8 * i)) & 0xff);
  }
  if (bytes.size() != kHandleBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "P2P handle: ", bytes.size(), " bytes, expected ", kHandleBytes,
        bytes.empty() ? " (an empty handle means the peer's exportIpcHandle failed; see its "
                        "lastError())"
                      : " (made by another Mooncake version? run the same version on every rank)"));
  }
  uint32_t magic = 0;
  for (int i = 0; i < 4; ++i)
    magic |= static_cast<uint32_t>(static_cast<uint8_t>(bytes[i])) << (8 * i);
  if (magic != kHandleMagic) {
    return absl::InvalidArgumentError(absl::StrCat(
        "P2P handle: bad magic 0x", absl::Hex(magic), " (expected 0x", absl::Hex(kHandleMagic),
        "); the handle was not made by a Mooncake P2pTransport or was corrupted in transit"));
  }
  const uint8_t version = static_cast<uint8_t>(bytes[4]);
  if (version != kHandleVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("P2P handle: version ", version, ", this build reads ", kHandleVersion,
                     "; run the same Mooncake version on every rank"));
  }
  const uint8_t kind = static_cast<uint8_t>(bytes[5]);
  if (kind < 1 || kind > kMaxHandleKind) {
    return absl::InvalidArgumentError(
        absl::StrCat("P2P handle: unknown kind ", kind,
                     " (made by a newer Mooncake? run the same version on every rank)"));
  }
  const size_t len = static_cast<uint8_t>(bytes[6]);
  if (len > kMaxPayloadBytes || kHandleHeaderBytes + len > bytes.size()) {
    return absl::InvalidArgumentError(absl::StrCat("P2P handle: payload length ", len,
                                                   " does not fit in ", bytes.size(), " bytes"));
  }
  if (static_cast<HandleKind>(kind) == HandleKind::kCudaFabric && len != kFabricHandleBytes) {
    return absl::InvalidArgumentError(absl::StrCat("P2P handle: cuda-fabric payload of ", len,
                                                   " bytes, expected ", kFabricHandleBytes,
                                                   " (one CUmemFabricHandle)"));
  }
  BufferHandle h;
  h.kind = static_cast<HandleKind>(kind);
  h.map_bytes = GetU64(bytes, 8);
  h.buffer_id = GetU64(bytes, 16);
  h.node_key = GetU64(bytes, 24);
  h.payload.assign(bytes.data() + kHandleHeaderBytes, len);
  return h;
}

uint64_t NodeKey(std::string_view node_identity) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : node_identity) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h == 0 ? 1 : h;
}

std::string DefaultNodeIdentity() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return id;
}

uint64_t NewBufferId() {
  uint64_t id = 0;
  while (id == 0) id = RandomU64();
  return id;
}

uint64_t NewProbeValue(int rank) {
  return (static_cast<uint64_t>(static_cast<uint16_t>(rank)) << 48) |
         (RandomU64() & 0x0000ffffffffffffull) | 1;
}

std::string PtrString(const void* p) {
  return absl::StrCat("0x", absl::Hex(reinterpret_cast<uintptr_t>(p)));
}

std::string RankList(const std::vector<int>& ranks) { return absl::StrJoin(ranks, ","); }

absl::Status ValidateImportArgs(int expected_ranks, int rank, int num_ranks, size_t handle_count,
                                const std::vector<int>& mask) {
  if (num_ranks != expected_ranks) {
    return absl::InvalidArgumentError(absl::StrCat("importPeerHandles: num_ranks ", num_ranks,
                                                   " but the transport was created for ",
                                                   expected_ranks));
  }
  if (rank < 0 || rank >= num_ranks) {
    return absl::InvalidArgumentError(
        absl::StrCat("importPeerHandles: rank ", rank, " outside [0, ", num_ranks, ")"));
  }
  if (handle_count != static_cast<size_t>(num_ranks)) {
    return absl::InvalidArgumentError(
        absl::StrCat("importPeerHandles: ", handle_count, " handles for ", num_ranks,
                     " ranks; pass one per rank (own entry ignored)"));
  }
  if (!mask.empty() && mask.size() != static_cast<size_t>(num_ranks)) {
    return absl::InvalidArgumentError(absl::StrCat("importPeerHandles: active_ranks_mask has ",
                                                   mask.size(), " entries for ", num_ranks,
                                                   " ranks (pass one per rank, or none)"));
  }
  return absl::OkStatus();
}

std::vector<int> ActiveRanks(const std::vector<int>& mask, int num_ranks, int rank) {
  std::vector<int> active(static_cast<size_t>(num_ranks), 1);
  if (!mask.empty()) {
    for (int r = 0; r < num_ranks; ++r) active[r] = mask[r] != 0 ? 1 : 0;
  }
  // This rank is always reachable by itself, whatever the mask says.
  active[rank] = 1;
  return active;
}

}  // namespace internal
}  // namespace device
}  // namespace mooncake
