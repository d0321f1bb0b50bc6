// Bit-field access for mlx5 command mailboxes (the "ifc" layouts of the PRM).
//
// The PRM describes every command input, output and context as a run of
// big-endian 32-bit dwords and numbers bits from the most significant bit of
// dword 0: bit 0 is the top bit of byte 0, bit 31 the low bit of byte 3,
// bit 32 the top bit of byte 4. A field is (bit_offset, bit_width) in that
// numbering, exactly as mlx5_ifc.h spells it with `u8 name[width]` runs and
// as rdma-core's DEVX_SET/DEVX_GET read it. Writing a field leaves every
// other bit of the buffer as it was.
//
// DEVX_SET handles fields of at most 32 bits inside one dword and
// DEVX_SET64 dword-aligned 64-bit fields; Set/Get here take any width from
// 1 to 64 at any offset, which is the same result for those cases and also
// covers the odd field that straddles a dword (none in the tables we use,
// but the tests pin the rule down).
//
// Nothing here aborts: an access outside the buffer, a width of 0 or more
// than 64, or a value wider than its field is refused (Set returns false and
// writes nothing; Get returns 0). Command builders check their parameters
// first and turn a refusal into an absl::Status (devx_commands.cc).
// Thread-compatible: plain functions on caller-owned bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace mooncake::daemon::mlx5 {

// One PRM field, or a whole embedded context (the qpc inside CREATE_QP_IN)
// when used as the container of other fields.
struct Field {
  uint32_t bit_offset = 0;
  uint32_t bit_width = 0;

  constexpr uint32_t end_bit() const { return bit_offset + bit_width; }
  // The same field placed inside `container` (a context embedded in a
  // command): offsets add, the width stays.
  constexpr Field In(Field container) const {
    return Field{container.bit_offset + bit_offset, bit_width};
  }
  // The largest value the field holds.
  constexpr uint64_t max_value() const {
    return bit_width >= 64 ? ~uint64_t{0} : (uint64_t{1} << bit_width) - 1;
  }
  constexpr bool Holds(uint64_t value) const { return value <= max_value(); }
  // Whether the field lies inside a buffer of `bytes` bytes.
  constexpr bool FitsIn(size_t bytes) const {
    return bit_width >= 1 && bit_width <= 64 && uint64_t{end_bit()} <= uint64_t{bytes} * 8;
  }
  // Fully inside `container` (compile-time checks of the tables).
  constexpr bool Inside(Field container) const {
    return bit_offset + bit_width <= container.bit_width;
  }
};

// Writes `value` into `f` of `buf`. False (and nothing written) when the field
// is not inside `buf`, its width is not 1..64, or `value` does not fit.
[[nodiscard]] inline bool Set(std::span<uint8_t> buf, Field f, uint64_t value) {
  if (!f.FitsIn(buf.size()) || !f.Holds(value)) return false;
  // Walk the field a byte at a time from its most significant bit: each step
  // takes the bits of the value that land in one byte of the buffer.
  uint32_t pos = f.bit_offset;
  const uint32_t end = f.end_bit();
  while (pos < end) {
    const uint32_t in_byte = pos % 8;  // 0 = the byte's most significant bit
    const uint32_t take = (8 - in_byte) < (end - pos) ? (8 - in_byte) : (end - pos);
    const uint32_t below = end - pos - take;  // value bits still to come after these
    const uint32_t shift = 8 - in_byte - take;
    const uint32_t ones = (1u << take) - 1;
    const auto chunk = static_cast<uint32_t>((value >> below) & ones);
    uint8_t& b = buf[pos / 8];
    b = static_cast<uint8_t>((b & ~(ones << shift)) | (chunk << shift));
    pos += take;
  }
  return true;
}

// Reads `f` from `buf`; 0 when the field is not inside `buf`.
inline uint64_t Get(std::span<const uint8_t> buf, Field f) {
  if (!f.FitsIn(buf.size())) return 0;
  uint64_t value = 0;
  uint32_t pos = f.bit_offset;
  const uint32_t end = f.end_bit();
  while (pos < end) {
    const uint32_t in_byte = pos % 8;
    const uint32_t take = (8 - in_byte) < (end - pos) ? (8 - in_byte) : (end - pos);
    const uint32_t shift = 8 - in_byte - take;
    const uint32_t ones = (1u << take) - 1;
    value = (value << take) | ((buf[pos / 8] >> shift) & ones);
    pos += take;
  }
  return value;
}

// The DEVX_SET64 rule: a 64-bit field starting on a dword boundary (the
// PRM's addresses and umem offsets). Refuses anything else.
[[nodiscard]] inline bool Set64(std::span<uint8_t> buf, Field f, uint64_t value) {
  if (f.bit_width != 64 || f.bit_offset % 32 != 0) return false;
  return Set(buf, f, value);
}
inline uint64_t Get64(std::span<const uint8_t> buf, Field f) {
  if (f.bit_width != 64 || f.bit_offset % 32 != 0) return 0;
  return Get(buf, f);
}

}  // namespace mooncake::daemon::mlx5
