// Small pieces shared by the fuzz targets in this folder: a reader for the
// targets' own input formats, an invariant check that crashes (so libFuzzer
// keeps the input), the process's open fd count, and quiet logging.
#pragma once

#include <dirent.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/stubs/logging.h"
#include "mooncake/common/log.h"

// An invariant the code under test must keep: prints the message (its
// pieces as absl::StrCat takes them, or an absl::Status) and aborts, which
// libFuzzer reports as a crash and saves the input for.
#define FUZZ_CHECK(cond, ...)                                                                 \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      std::fprintf(stderr, "FUZZ_CHECK failed at %s:%d: %s: %s\n", __FILE__, __LINE__, #cond, \
                   ::mooncake::fuzz::Describe(__VA_ARGS__).c_str());                          \
      std::abort();                                                                           \
    }                                                                                         \
  } while (0)

namespace mooncake::fuzz {

template <typename T>
std::string Piece(const T& v) {
  return absl::StrCat(v);
}
inline std::string Piece(const absl::Status& s) { return s.ToString(); }
template <typename... T>
std::string Describe(const T&... v) {
  return (std::string() + ... + Piece(v));
}

// Reads a fuzz input front to back; past the end, every read yields zeros
// or empty strings, so a target never needs to check lengths.
class ByteReader {
 public:
  ByteReader(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  bool empty() const { return pos_ >= size_; }
  size_t remaining() const { return empty() ? 0 : size_ - pos_; }
  uint8_t U8() { return empty() ? 0 : data_[pos_++]; }
  uint16_t U16() {
    uint16_t lo = U8();
    return static_cast<uint16_t>(lo | (U8() << 8));
  }
  uint32_t U32() {
    uint32_t lo = U16();
    return lo | (static_cast<uint32_t>(U16()) << 16);
  }
  uint64_t U64() {
    uint64_t lo = U32();
    return lo | (static_cast<uint64_t>(U32()) << 32);
  }
  // Up to `n` bytes (fewer at the end of the input).
  absl::string_view Bytes(size_t n) {
    n = std::min(n, remaining());
    absl::string_view out(reinterpret_cast<const char*>(data_) + pos_, n);
    pos_ += n;
    return out;
  }
  // A u16 length, then that many bytes.
  absl::string_view Chunk() { return Bytes(U16()); }
  absl::string_view Rest() { return Bytes(remaining()); }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// Open file descriptors of this process (entries of /proc/self/fd, less
// the one this count opens to read it).
inline size_t OpenFdCount() {
  DIR* dir = ::opendir("/proc/self/fd");
  FUZZ_CHECK(dir != nullptr, "cannot open /proc/self/fd");
  size_t n = 0;
  while (dirent* e = ::readdir(dir)) {
    if (e->d_name[0] != '.') ++n;
  }
  ::closedir(dir);
  return n - 1;
}

// Runs one input's work (`input`, which closes whatever it opens before it
// returns) and checks the process has exactly the fds it had before.
template <class F>
void ExpectFdsKept(F&& input) {
  const size_t before = OpenFdCount();
  input();
  const size_t after = OpenFdCount();
  FUZZ_CHECK(after == before, "fds: ", before, " before the input, ", after, " after");
}

// Daemon log lines at info level and protobuf's complaints about malformed
// input would cost more than the code under test: errors only.
inline void QuietLogs() {
  SetLogLevel(LogLevel::kError);
  google::protobuf::SetLogHandler(nullptr);
}

// True when `s` holds no C0 control, DEL, or C1 control (U+0080..U+009F in
// UTF-8): what EscapeForDisplay promises for anything it returns.
inline bool IsDisplaySafe(absl::string_view s) {
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f) return false;
    if (c == 0xc2 && i + 1 < s.size()) {
      const auto next = static_cast<unsigned char>(s[i + 1]);
      if (next >= 0x80 && next <= 0x9f) return false;
    }
  }
  return true;
}

}  // namespace mooncake::fuzz
