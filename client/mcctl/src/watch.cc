#include "mooncake/mcctl/watch.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "mooncake/common/escape.h"

namespace mooncake::mcctl {
namespace {

constexpr size_t kMaxShown = 256;  // group names and details in the text form

std::string TimeText(uint64_t unix_ms) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ",
                          absl::FromUnixMillis(static_cast<int64_t>(unix_ms)), absl::UTCTimeZone());
}

}  // namespace

std::string WatchKindName(v1::WatchEvent::Kind kind) {
  if (kind == v1::WatchEvent::KIND_UNSPECIFIED || !v1::WatchEvent::Kind_IsValid(kind)) {
    return "unknown";
  }
  return absl::AsciiStrToLower(v1::WatchEvent::Kind_Name(kind));
}

std::string WatchEventText(const v1::WatchEvent& e) {
  std::string line = absl::StrCat(TimeText(e.time_unix_ms()), "  ");
  absl::StrAppend(&line, WatchKindName(e.kind()));
  line.resize(std::max<size_t>(line.size(), 24 + 18), ' ');
  switch (e.kind()) {
    case v1::WatchEvent::WATCHING:
    case v1::WatchEvent::DROPPED:
      absl::StrAppend(&line, EscapeForDisplay(e.detail(), kMaxShown));
      return absl::StrCat(line, "\n");
    default: break;
  }
  absl::StrAppend(&line, "group '", EscapeForDisplay(e.group(), kMaxShown), "'");
  switch (e.kind()) {
    case v1::WatchEvent::GROUP_FORMED:
    case v1::WatchEvent::GROUP_READY:
    case v1::WatchEvent::GROUP_RELEASED:
      absl::StrAppend(&line, " (", e.world_size(), " ranks, epoch ", e.epoch(), ")");
      break;
    default:
      absl::StrAppend(&line, " rank ", e.rank(), "/", e.world_size());
      if (e.pid() != 0) absl::StrAppend(&line, " pid ", e.pid());
      break;
  }
  absl::StrAppend(&line, " uid ", e.uid());
  if (!e.tenant().empty()) {
    absl::StrAppend(&line, " tenant '", EscapeForDisplay(e.tenant(), kMaxShown), "'");
  }
  if (!e.detail().empty()) absl::StrAppend(&line, ": ", EscapeForDisplay(e.detail(), kMaxShown));
  return absl::StrCat(line, "\n");
}

std::string WatchEventJson(const v1::WatchEvent& e) {
  return absl::StrCat(
      "{\"seq\":", e.seq(), ",\"time\":", EscapeForJson(TimeText(e.time_unix_ms())),
      ",\"time_unix_ms\":", e.time_unix_ms(), ",\"kind\":", EscapeForJson(WatchKindName(e.kind())),
      ",\"group\":", EscapeForJson(e.group()), ",\"uid\":", e.uid(),
      ",\"tenant\":", EscapeForJson(e.tenant()), ",\"rank\":", e.rank(),
      ",\"world_size\":", e.world_size(), ",\"epoch\":", e.epoch(), ",\"pid\":", e.pid(),
      ",\"detail\":", EscapeForJson(e.detail()), ",\"dropped\":", e.dropped(), "}\n");
}

}  // namespace mooncake::mcctl
