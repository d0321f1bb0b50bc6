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

// A fabric handle is one CUmemFabricHandle: 64 bytes exactly, both ways,
// so a truncated or padded handle is refused before it reaches the driver.
TEST(BufferHandle, FabricPayloadIsExactly64Bytes) {
  BufferHandle h;
  h.kind = HandleKind::kCudaFabric;
  h.map_bytes = 4 << 20;
  h.buffer_id = 7;
  h.node_key = NodeKey("node-7");
  for (size_t i = 0; i < kFabricHandleBytes; ++i) h.payload.push_back(static_cast<char>(0xa0 + i));
  auto words = EncodeHandle(h);
  ASSERT_TRUE(words.ok()) << words.status();
  EXPECT_EQ(words->size() * 4, kHandleBytes);
  auto back = DecodeHandle(*words);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->kind, HandleKind::kCudaFabric);
  EXPECT_STREQ(HandleKindName(back->kind), "cuda-fabric");
  EXPECT_EQ(back->payload, h.payload);

  for (size_t bad : {size_t{0}, size_t{40}, size_t{63}, size_t{65}, kMaxPayloadBytes}) {
    BufferHandle b = h;
    b.payload.assign(bad, 'f');
    auto enc = EncodeHandle(b);
    ASSERT_FALSE(enc.ok()) << bad << " bytes";
    EXPECT_EQ(enc.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(enc.status().message().find("cuda-fabric payload of " + std::to_string(bad)),
              std::string::npos)
        << enc.status();
    // The same bytes under another kind encode; relabelled as fabric, the
    // decoder refuses them.
    b.kind = HandleKind::kCudaIpc;
    auto ipc = EncodeHandle(b);
    ASSERT_TRUE(ipc.ok()) << ipc.status();
    std::vector<int32_t> v = *ipc;
    v[1] = (v[1] & ~0xff00) | (static_cast<int>(HandleKind::kCudaFabric) << 8);
    auto dec = DecodeHandle(v);
    ASSERT_FALSE(dec.ok()) << bad << " bytes";
    EXPECT_NE(dec.status().message().find("expected 64"), std::string::npos) << dec.status();
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
  v[1] = (v[1] & ~0xff00) | ((kMaxHandleKind + 1) << 8);  // the first kind past the known ones
  EXPECT_NE(DecodeHandle(v).status().message().find("unknown kind"), std::string::npos);
  v[1] = (v[1] & ~0xff00);  // kind 0
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
