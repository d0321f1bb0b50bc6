// Escaping of strings other processes chose (common/escape.h): a client's
// name, a handle kind, a peer's node id, a failure detail, before the daemon
// logs them (EscapeForDisplay) or mcctl prints them as JSON (EscapeForJson).
//
// Input: one byte b, then the text. max_len for EscapeForDisplay is b (0..255).
// Invariants: the display form holds no control character (C0, DEL, C1),
// no line separator and no bidi control, is valid UTF-8, fits in
// max(max_len, 3) bytes, and, unlimited, reads back to exactly the input;
// cut short, it is a prefix of the unlimited form followed by "...". The
// JSON form is a valid JSON string of printable UTF-8 that decodes to the
// input, each byte that is not UTF-8 replaced by U+FFFD.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/match.h"
#include "fuzz_support.h"
#include "mooncake/common/escape.h"

namespace mooncake {
namespace {

// The well-formed UTF-8 sequence at s[i] (RFC 3629): its length and code
// point, or 0. Written apart from escape.cc's decoder on purpose.
size_t NextUtf8(absl::string_view s, size_t i, uint32_t* cp) {
  const auto b = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  const uint8_t b0 = b(i);
  size_t len = b0 < 0x80           ? 1
               : (b0 >> 5) == 0x6  ? 2
               : (b0 >> 4) == 0xE  ? 3
               : (b0 >> 3) == 0x1E ? 4
                                   : 0;
  if (len == 0 || i + len > s.size()) return 0;
  uint32_t v = len == 1 ? b0 : b0 & (0x7F >> len);
  for (size_t k = 1; k < len; ++k) {
    if ((b(i + k) & 0xC0) != 0x80) return 0;
    v = (v << 6) | (b(i + k) & 0x3F);
  }
  static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
  if (v < kMin[len] || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
  *cp = v;
  return len;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool Unsafe(uint32_t cp) {
  return cp < 0x20 || (cp >= 0x7F && cp <= 0x9F) || cp == 0x2028 || cp == 0x2029 || cp == 0x200E ||
         cp == 0x200F || (cp >= 0x202A && cp <= 0x202E) || (cp >= 0x2066 && cp <= 0x2069);
}

// Every character valid UTF-8 and safe to show.
void CheckShowable(absl::string_view s, absl::string_view what) {
  for (size_t i = 0; i < s.size();) {
    uint32_t cp = 0;
    const size_t len = NextUtf8(s, i, &cp);
    FUZZ_CHECK(len != 0, what, ": byte ", i, " is not UTF-8");
    FUZZ_CHECK(!Unsafe(cp), what, ": U+", absl::Hex(cp), " at byte ", i, " survived");
    i += len;
  }
}

std::optional<uint32_t> Hex(absl::string_view s) {
  uint32_t v = 0;
  for (char c : s) {
    int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : -1;
    if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
    if (d < 0) return std::nullopt;
    v = v * 16 + static_cast<uint32_t>(d);
  }
  return v;
}

// Reads EscapeForDisplay's escapes back: \n \r \t \\ \xNN (one byte) and
// \uNNNN (one code point).
std::string Unescape(absl::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\') {
      out.push_back(s[i]);
      continue;
    }
    FUZZ_CHECK(i + 1 < s.size(), "display form ends in a lone backslash");
    const char e = s[++i];
    if (e == 'n' || e == 'r' || e == 't' || e == '\\') {
      out.push_back(e == 'n' ? '\n' : e == 'r' ? '\r' : e == 't' ? '\t' : '\\');
    } else if (e == 'x' || e == 'u') {
      const size_t digits = e == 'x' ? 2 : 4;
      std::optional<uint32_t> v = Hex(s.substr(i + 1, digits));
      FUZZ_CHECK(v && i + digits < s.size(), "bad \\", std::string(1, e), " escape");
      if (e == 'x') {
        out.push_back(static_cast<char>(*v));
      } else {
        AppendUtf8(*v, &out);
      }
      i += digits;
    } else {
      FUZZ_CHECK(false, "unknown escape \\", std::string(1, e));
    }
  }
  return out;
}

// Decodes a JSON string literal (RFC 8259), surrogate pairs included.
std::string JsonDecode(absl::string_view s) {
  FUZZ_CHECK(s.size() >= 2 && s.front() == '"' && s.back() == '"', "not a JSON string");
  s = s.substr(1, s.size() - 2);
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<uint8_t>(s[i]);
    FUZZ_CHECK(c >= 0x20 && c != '"', "raw ", static_cast<int>(c), " inside a JSON string");
    if (c != '\\') {
      out.push_back(static_cast<char>(c));
      continue;
    }
    FUZZ_CHECK(i + 1 < s.size(), "JSON string ends in a lone backslash");
    const char e = s[++i];
    switch (e) {
      case '"': out.push_back('"'); break;
      case '\\': out.push_back('\\'); break;
      case '/': out.push_back('/'); break;
      case 'b': out.push_back('\b'); break;
      case 'f': out.push_back('\f'); break;
      case 'n': out.push_back('\n'); break;
      case 'r': out.push_back('\r'); break;
      case 't': out.push_back('\t'); break;
      case 'u': {
        std::optional<uint32_t> v = Hex(s.substr(i + 1, 4));
        FUZZ_CHECK(v && i + 4 < s.size(), "bad \\u escape in JSON");
        i += 4;
        uint32_t cp = *v;
        if (cp >= 0xD800 && cp <= 0xDBFF && s.substr(i + 1, 2) == "\\u") {
          std::optional<uint32_t> lo = Hex(s.substr(i + 3, 4));
          if (lo && *lo >= 0xDC00 && *lo <= 0xDFFF) {
            cp = 0x10000 + ((cp - 0xD800) << 10) + (*lo - 0xDC00);
            i += 6;
          }
        }
        FUZZ_CHECK(cp < 0xD800 || cp > 0xDFFF, "lone surrogate in JSON");
        AppendUtf8(cp, &out);
        break;
      }
      default: FUZZ_CHECK(false, "unknown JSON escape \\", std::string(1, e));
    }
  }
  return out;
}

// The input with every byte that is not part of well-formed UTF-8 replaced
// by U+FFFD.
std::string Sanitized(absl::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    uint32_t cp = 0;
    const size_t len = NextUtf8(s, i, &cp);
    if (len == 0) {
      AppendUtf8(0xFFFD, &out);
      i += 1;
    } else {
      out.append(s.data() + i, len);
      i += len;
    }
  }
  return out;
}

}  // namespace
}  // namespace mooncake

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  mooncake::fuzz::QuietLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mooncake;
  fuzz::ByteReader in(data, size);
  const size_t max_len = in.U8();
  const absl::string_view text = in.Rest();

  const std::string full = EscapeForDisplay(text, std::string::npos);
  CheckShowable(full, "display");
  FUZZ_CHECK(Unescape(full) == text, "the display form does not read back to the input");

  const std::string cut = EscapeForDisplay(text, max_len);
  CheckShowable(cut, "display (cut)");
  FUZZ_CHECK(cut.size() <= std::max<size_t>(max_len, 3), cut.size(), " bytes for ", max_len);
  if (cut != full) {
    FUZZ_CHECK(absl::EndsWith(cut, "...") &&
                   absl::StartsWith(full, absl::string_view(cut).substr(0, cut.size() - 3)),
               "cut form is not a prefix of the full one plus \"...\"");
  }

  const std::string json = EscapeForJson(text);
  CheckShowable(json, "json");
  FUZZ_CHECK(JsonDecode(json) == Sanitized(text), "the JSON form does not decode to the input");
  return 0;
}
