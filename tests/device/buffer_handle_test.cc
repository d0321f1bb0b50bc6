// The P2P handle format (device/src/buffer_handle.h): round trips, size
// classes, and the diagnostics for handles that are not ours.
#include "buffer_handle.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace mooncake::device::internal {
namespace {

// Upstream EP all-gathers handles with an equal-length collective: every
// kind, with or without a payload, encodes to the same 128 bytes.
TEST(BufferHandle, EveryKindEncodesToOneLength) {
  for (HandleKind kind : {HandleKind::kMemfd, HandleKind::kCudaVmmFd, HandleKind::kCudaIpc}) {
    for (size_t payload : {size_t{0}, size_t{24}, size_t{64}, kMaxPayloadBytes}) {
      BufferHandle h;
      h.kind = kind;
      h.map_bytes = 0x123456789abcull;
      h.buffer_id = 0xfeedfacecafebeefull;
      h.node_key = NodeKey("node-7");
      for (size_t i = 0; i < payload; ++i) h.payload.push_back(static_cast<char>(i * 3));
      auto words = EncodeHandle(h);
      ASSERT_TRUE(words.ok()) << words.status();
      EXPECT_EQ(words->size() * 4, kHandleBytes);
      auto back = DecodeHandle(*words);
      ASSERT_TRUE(back.ok()) << back.status();
      EXPECT_EQ(back->kind, kind);
      EXPECT_EQ(back->map_bytes, h.map_bytes);
      EXPECT_EQ(back->buffer_id, h.buffer_id);
      EXPECT_EQ(back->node_key, h.node_key);
      EXPECT_EQ(back->payload, h.payload);
    }
  }
}

TEST(BufferHandle, NodeKeysTellNodesApart) {
  EXPECT_EQ(NodeKey("node-a"), NodeKey("node-a"));
  EXPECT_NE(NodeKey("node-a"), NodeKey("node-b"));
  EXPECT_NE(NodeKey(""), 0u);
  // This machine's default identity is its kernel boot id.
  EXPECT_EQ(DefaultNodeIdentity().size(), 36u) << DefaultNodeIdentity();
}

TEST(BufferHandle, RejectsOversizedPayload) {
  BufferHandle h;
  h.payload = std::string(kMaxPayloadBytes + 1, 'x');
  EXPECT_EQ(EncodeHandle(h).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(BufferHandle, DiagnosesForeignHandles) {
  BufferHandle h;
  h.payload = "x";
  std::vector<int32_t> good = *EncodeHandle(h);

  auto empty = DecodeHandle({});
  EXPECT_NE(empty.status().message().find("exportIpcHandle failed"), std::string::npos);

  std::vector<int32_t> raw_ipc(16, 0x11223344);  // e.g. a bare cudaIpcMemHandle
  EXPECT_NE(DecodeHandle(raw_ipc).status().message().find("expected 128"), std::string::npos);
  std::vector<int32_t> foreign(32, 0x11223344);
  EXPECT_NE(DecodeHandle(foreign).status().message().find("bad magic"), std::string::npos);

  std::vector<int32_t> v = good;
  v[1] ^= 0x2;  // version byte
  EXPECT_NE(DecodeHandle(v).status().message().find("version"), std::string::npos);

  v = good;
  v[1] = (v[1] & ~0xff00) | (9 << 8);  // kind byte
  EXPECT_NE(DecodeHandle(v).status().message().find("unknown kind"), std::string::npos);

  v = good;
  v[1] = (v[1] & ~0xff0000) | (100 << 16);  // payload length past the end
  EXPECT_NE(DecodeHandle(v).status().message().find("does not fit"), std::string::npos);
}

TEST(BufferHandle, TailLayout) {
  EXPECT_EQ(TailBytes(1), 128u);
  EXPECT_EQ(TailBytes(8), 128u);
  EXPECT_EQ(TailBytes(9), 192u);
  EXPECT_EQ(TailOffset(4096, 8), 4096u - 128u);
  EXPECT_EQ(ProbeSlotOffset(4096, 8, 3), 4096u - 128u + 64u + 24u);
  EXPECT_NE(NewBufferId(), 0u);
  EXPECT_EQ(NewProbeValue(5) >> 48, 5u);
  EXPECT_NE(NewProbeValue(5), NewProbeValue(5));
}

}  // namespace
}  // namespace mooncake::device::internal
