// The P2P handle format (device/src/buffer_handle.h): round trips, size
// classes, and the diagnostics for handles that are not ours.
#include "buffer_handle.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace mooncake::device::internal {
namespace {

TEST(BufferHandle, FdKindsFitInSixtyFourBytes) {
  BufferHandle h;
  h.kind = HandleKind::kCudaVmmFd;
  h.map_bytes = 0x123456789abcull;
  h.buffer_id = 0xfeedfacecafebeefull;
  h.payload = std::string(40, '\x7f');
  auto words = EncodeHandle(h);
  ASSERT_TRUE(words.ok()) << words.status();
  EXPECT_EQ(words->size(), 16u);
  auto back = DecodeHandle(*words);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->kind, HandleKind::kCudaVmmFd);
  EXPECT_EQ(back->map_bytes, h.map_bytes);
  EXPECT_EQ(back->buffer_id, h.buffer_id);
  EXPECT_EQ(back->payload, h.payload);
}

TEST(BufferHandle, LegacyIpcCarriesSixtyFourPayloadBytes) {
  BufferHandle h;
  h.kind = HandleKind::kCudaIpc;
  h.map_bytes = 1 << 21;
  h.buffer_id = 1;
  for (int i = 0; i < 64; ++i) h.payload.push_back(static_cast<char>(i * 3));
  auto words = EncodeHandle(h);
  ASSERT_TRUE(words.ok()) << words.status();
  EXPECT_EQ(words->size(), 22u);
  auto back = DecodeHandle(*words);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->payload, h.payload);
}

TEST(BufferHandle, ShortPayloadPadsToSixtyFourBytes) {
  BufferHandle h;
  h.payload = "abc";
  auto words = EncodeHandle(h);
  ASSERT_TRUE(words.ok());
  EXPECT_EQ(words->size(), 16u);
  EXPECT_EQ(DecodeHandle(*words)->payload, "abc");
}

TEST(BufferHandle, RejectsOversizedPayload) {
  BufferHandle h;
  h.payload = std::string(65, 'x');
  EXPECT_EQ(EncodeHandle(h).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(BufferHandle, DiagnosesForeignHandles) {
  BufferHandle h;
  h.payload = "x";
  std::vector<int32_t> good = *EncodeHandle(h);

  auto empty = DecodeHandle({});
  EXPECT_NE(empty.status().message().find("exportIpcHandle failed"), std::string::npos);

  std::vector<int32_t> raw_ipc(16, 0x11223344);  // e.g. a bare cudaIpcMemHandle
  EXPECT_NE(DecodeHandle(raw_ipc).status().message().find("bad magic"), std::string::npos);

  std::vector<int32_t> v = good;
  v[1] ^= 0x2;  // version byte
  EXPECT_NE(DecodeHandle(v).status().message().find("version"), std::string::npos);

  v = good;
  v[1] = (v[1] & ~0xff00) | (9 << 8);  // kind byte
  EXPECT_NE(DecodeHandle(v).status().message().find("unknown kind"), std::string::npos);

  v = good;
  v[1] = (v[1] & ~0xff0000) | (60 << 16);  // payload length past the end
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
