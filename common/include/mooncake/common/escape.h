// Making untrusted strings safe to show: a client's name, a handle kind, a
// peer's node id, anything a process other than the reader chose.
//
// Such a string printed raw can forge lines in a log or a table ("\n"),
// recolour or retitle the reader's terminal (ESC sequences, BEL), or reorder
// what is shown (Unicode bidi overrides). Both functions below render every
// such character as a visible escape instead, so the result is one line of
// printable text whatever the input.
//
//   MC_LOG(kInfo, "session opened (", EscapeForDisplay(name, 128), ")");
//   // name "a\nb\x1b[31m" is logged as  a\nb\x1b[31m  (backslashes literal)
//
// Thread-safe (pure functions).
#pragma once

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace mooncake {

// Returns `text` with:
//   - C0 controls and DEL as "\n", "\r", "\t" or "\xNN" (lower-case hex),
//   - a backslash as "\\", so every escape reads back unambiguously,
//   - C1 controls (U+0080..U+009F), the line and paragraph separators
//     (U+2028, U+2029) and the bidi controls (U+200E, U+200F,
//     U+202A..U+202E, U+2066..U+2069) as "\uNNNN",
//   - each byte that is not part of valid UTF-8 (RFC 3629: no overlong
//     forms, no surrogates, nothing above U+10FFFF) as "\xNN".
// Other printable UTF-8 is copied as is.
//
// The result holds at most `max_len` bytes: when the escaped text is longer
// it is cut at a character or escape boundary and ends in "...". A
// `max_len` below 3 counts as 3. Pass std::string::npos for no limit.
std::string EscapeForDisplay(absl::string_view text, size_t max_len);

// `text` as a JSON string literal, quotes included (RFC 8259): '"' and '\'
// escaped, C0 controls as "\n" or "\u00NN", and DEL, C1 controls, U+2028,
// U+2029 and the bidi controls above as "\uNNNN", so the JSON is safe on a
// terminal and parses back to the same text. A byte that is not valid UTF-8
// becomes U+FFFD (JSON cannot carry it).
std::string EscapeForJson(absl::string_view text);

}  // namespace mooncake
