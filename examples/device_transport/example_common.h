// Shared by the host and CUDA variants of device_transport_example: the
// buffer layout, the byte pattern, and the result type.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace mooncake::example {

// Symmetric buffer layout (identical on every rank):
//   [0, kSignalBytes)                 signals: uint64 flag per source rank,
//                                     then one uint64 arrival counter
//   [kSignalBytes + s * msg, ... )    slot s: the message rank s sent here
inline constexpr size_t kSignalBytes = 64 * 1024;
inline constexpr size_t kMaxRanks = (kSignalBytes / sizeof(uint64_t)) - 1;

inline size_t BufferBytes(size_t msg_bytes, int world) {
  return kSignalBytes + msg_bytes * static_cast<size_t>(world);
}
inline size_t SlotOffset(size_t msg_bytes, int src) {
  return kSignalBytes + msg_bytes * static_cast<size_t>(src);
}
inline size_t FlagOffset(int src) { return static_cast<size_t>(src) * sizeof(uint64_t); }
inline size_t CounterOffset() { return kMaxRanks * sizeof(uint64_t); }

// The byte rank `src` sends rank `dst` at offset i: every position, source
// and destination differ, so misplaced or stale bytes are caught.
inline uint8_t PatternByte(size_t i, int src, int dst) {
  return static_cast<uint8_t>(
      (i * 131u + static_cast<size_t>(src) * 31u + static_cast<size_t>(dst) * 7u + 1u) & 0xffu);
}

struct RunResult {
  bool ok = false;
  std::string message;  // what failed, or a one-line summary
  uint64_t bad_bytes = 0;
};

}  // namespace mooncake::example
