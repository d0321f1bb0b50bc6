// The 128-byte typed P2P handle, version 2 (device/src/buffer_handle.h):
// what importPeerHandles does with the handles and arguments an
// application hands it before it maps anything.
//
// Input: i8 expected_ranks, i8 rank, i8 num_ranks, u8 mask length m, m mask
// bytes, then the handles: 128 bytes each, the last one whatever is left
// (so wrong sizes are tried too), each read as little-endian int32 words.
// Invariants: errors are InvalidArgument naming the handle; a handle that
// decodes re-encodes to the same 128 bytes less the reserved byte and the
// padding after its payload, and decodes again to the same fields; and
// arguments that validate give an active-rank list of num_ranks entries
// that includes the caller.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "buffer_handle.h"
#include "fuzz_support.h"

namespace mooncake::device::internal {
namespace {

std::vector<int32_t> ToWords(absl::string_view bytes) {
  std::vector<int32_t> words(bytes.size() / 4);
  for (size_t w = 0; w < words.size(); ++w) {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      v |= static_cast<uint32_t>(static_cast<uint8_t>(bytes[4 * w + i])) << (8 * i);
    }
    words[w] = static_cast<int32_t>(v);
  }
  return words;
}

std::string ToBytes(const std::vector<int32_t>& words) {
  std::string bytes(words.size() * 4, '\0');
  for (size_t w = 0; w < words.size(); ++w) {
    const auto v = static_cast<uint32_t>(words[w]);
    for (int i = 0; i < 4; ++i) bytes[4 * w + i] = static_cast<char>((v >> (8 * i)) & 0xff);
  }
  return bytes;
}

void CheckHandle(const std::vector<int32_t>& words) {
  absl::StatusOr<BufferHandle> h = DecodeHandle(words);
  if (!h.ok()) {
    FUZZ_CHECK(h.status().code() == absl::StatusCode::kInvalidArgument, h.status());
    FUZZ_CHECK(absl::StartsWith(h.status().message(), "P2P handle: "), h.status());
    return;
  }
  FUZZ_CHECK(words.size() * 4 == kHandleBytes, words.size(), " words decoded");
  FUZZ_CHECK(h->payload.size() <= kMaxPayloadBytes, h->payload.size());
  FUZZ_CHECK(std::string(HandleKindName(h->kind)) != "unknown", static_cast<int>(h->kind));

  absl::StatusOr<std::vector<int32_t>> again = EncodeHandle(*h);
  FUZZ_CHECK(again.ok(), "a decoded handle does not encode: ", again.status());
  FUZZ_CHECK(again->size() == words.size(), again->size());
  // Byte 7 is reserved and the bytes after the payload are padding: the
  // decoder ignores both, the encoder writes zeros.
  std::string in = ToBytes(words), out = ToBytes(*again);
  in[7] = 0;
  std::memset(in.data() + kHandleHeaderBytes + h->payload.size(), 0,
              kHandleBytes - kHandleHeaderBytes - h->payload.size());
  FUZZ_CHECK(in == out, "re-encoded handle differs from the one decoded");

  absl::StatusOr<BufferHandle> back = DecodeHandle(*again);
  FUZZ_CHECK(back.ok(), back.status());
  FUZZ_CHECK(back->kind == h->kind && back->map_bytes == h->map_bytes &&
                 back->buffer_id == h->buffer_id && back->node_key == h->node_key &&
                 back->payload == h->payload,
             "decode(encode(h)) != h");
}

void CheckImportArgs(int expected, int rank, int num_ranks, size_t handle_count,
                     const std::vector<int>& mask) {
  absl::Status s = ValidateImportArgs(expected, rank, num_ranks, handle_count, mask);
  if (!s.ok()) {
    FUZZ_CHECK(s.code() == absl::StatusCode::kInvalidArgument, s);
    return;
  }
  std::vector<int> active = ActiveRanks(mask, num_ranks, rank);
  FUZZ_CHECK(active.size() == static_cast<size_t>(num_ranks), active.size(), " of ", num_ranks);
  FUZZ_CHECK(active[rank] == 1, "rank ", rank, " not active for itself");
  for (int r = 0; r < num_ranks; ++r) {
    const int want = (r == rank || mask.empty() || mask[r] != 0) ? 1 : 0;
    FUZZ_CHECK(active[r] == want, "rank ", r, ": ", active[r]);
  }
}

}  // namespace
}  // namespace mooncake::device::internal

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  mooncake::fuzz::QuietLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mooncake::device::internal;
  mooncake::fuzz::ByteReader in(data, size);
  const int expected = static_cast<int8_t>(in.U8());
  const int rank = static_cast<int8_t>(in.U8());
  const int num_ranks = static_cast<int8_t>(in.U8());
  std::vector<int> mask;
  for (char c : in.Bytes(in.U8())) mask.push_back(static_cast<uint8_t>(c));
  std::vector<std::vector<int32_t>> handles;
  while (!in.empty()) handles.push_back(ToWords(in.Bytes(kHandleBytes)));
  CheckImportArgs(expected, rank, num_ranks, handles.size(), mask);
  for (const std::vector<int32_t>& words : handles) CheckHandle(words);
  return 0;
}
