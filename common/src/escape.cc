#include "mooncake/common/escape.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_format.h"

namespace mooncake {
namespace {

// Length (1-4) of the well-formed UTF-8 sequence at text[i], with its code
// point in *cp; 0 when the byte there does not start one (RFC 3629, table 3-7
// of the Unicode standard).
size_t DecodeUtf8(absl::string_view text, size_t i, uint32_t* cp) {
  const auto byte = [&](size_t k) { return static_cast<uint8_t>(text[k]); };
  const uint8_t b0 = byte(i);
  if (b0 < 0x80) {
    *cp = b0;
    return 1;
  }
  size_t len = 0;
  uint8_t lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    len = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    len = 3;
    if (b0 == 0xE0) lo = 0xA0;  // overlong
    if (b0 == 0xED) hi = 0x9F;  // surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    len = 4;
    if (b0 == 0xF0) lo = 0x90;  // overlong
    if (b0 == 0xF4) hi = 0x8F;  // above U+10FFFF
  } else {
    return 0;
  }
  if (i + len > text.size()) return 0;
  if (byte(i + 1) < lo || byte(i + 1) > hi) return 0;
  uint32_t v = b0 & (0xFF >> (len + 1));
  for (size_t k = 1; k < len; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
    v = (v << 6) | (byte(i + k) & 0x3F);
  }
  *cp = v;
  return len;
}

// Non-ASCII code points that must not reach a terminal or a log raw.
bool IsUnsafeCodePoint(uint32_t cp) {
  return (cp >= 0x80 && cp <= 0x9F) ||      // C1 controls
         cp == 0x2028 || cp == 0x2029 ||    // line / paragraph separator
         cp == 0x200E || cp == 0x200F ||    // LRM, RLM
         (cp >= 0x202A && cp <= 0x202E) ||  // bidi embeddings and overrides
         (cp >= 0x2066 && cp <= 0x2069);    // bidi isolates
}

}  // namespace

std::string EscapeForDisplay(absl::string_view text, size_t max_len) {
  static constexpr absl::string_view kMarker = "...";
  max_len = std::max(max_len, kMarker.size());
  std::string out;
  size_t fits = 0;  // out.size() at the last boundary that leaves room for the marker
  for (size_t i = 0; i < text.size();) {
    uint32_t cp = 0;
    const size_t len = DecodeUtf8(text, i, &cp);
    if (len == 0) {
      absl::StrAppendFormat(&out, "\\x%02x", static_cast<uint8_t>(text[i]));
      i += 1;
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp == '\\') {
      out += "\\\\";
    } else if (cp < 0x20 || cp == 0x7F) {
      absl::StrAppendFormat(&out, "\\x%02x", cp);
    } else if (IsUnsafeCodePoint(cp)) {
      absl::StrAppendFormat(&out, "\\u%04x", cp);
    } else {
      out.append(text.data() + i, len);
    }
    if (len != 0) i += len;
    if (out.size() <= max_len - kMarker.size()) fits = out.size();
    // Past the limit with input left (or this piece itself too long): cut.
    if (out.size() > max_len) {
      out.resize(fits);
      out.append(kMarker.data(), kMarker.size());
      return out;
    }
  }
  return out;
}

std::string EscapeForJson(absl::string_view text) {
  std::string out = "\"";
  for (size_t i = 0; i < text.size();) {
    uint32_t cp = 0;
    const size_t len = DecodeUtf8(text, i, &cp);
    if (len == 0) {
      out += "\\ufffd";
      i += 1;
      continue;
    }
    switch (cp) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (cp < 0x20 || cp == 0x7F || IsUnsafeCodePoint(cp)) {
          absl::StrAppendFormat(&out, "\\u%04x", cp);
        } else {
          out.append(text.data() + i, len);
        }
    }
    i += len;
  }
  out += '"';
  return out;
}

}  // namespace mooncake
