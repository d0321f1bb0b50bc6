// `mcctl watch`: one line per group event streamed by Admin.WatchEvents,
// as text or as JSON lines (--json). Pure functions of the event, so tests
// check them directly. Thread-safe.
//
// Text:  2025-01-31T12:00:00.123Z  member_joined   group 'g' rank 1/2 pid 4242 uid 1000
//        (then " tenant 'team-a'" for a tenant socket's group)
// JSON:  {"seq":7,"time":"2025-01-31T12:00:00.123Z","time_unix_ms":...,"kind":"member_joined",
//         "group":"g","uid":1000,"tenant":"","rank":1,"world_size":2,"epoch":0,"pid":4242,
//         "detail":"","dropped":0}
//
// Group names, tenants and details come from clients or the daemon's
// configuration: the text form shows them
// through EscapeForDisplay, the JSON form through EscapeForJson
// (mooncake/common/escape.h), so neither can forge a line or reach the
// terminal raw.
#pragma once

#include <string>

#include "mooncake/v1/admin.pb.h"

namespace mooncake::mcctl {

// "member_joined", "group_formed", ..., "dropped"; "unknown" otherwise.
std::string WatchKindName(mooncake::v1::WatchEvent::Kind kind);

// One line, ending in '\n'.
std::string WatchEventText(const mooncake::v1::WatchEvent& event);
// One compact JSON object, ending in '\n'.
std::string WatchEventJson(const mooncake::v1::WatchEvent& event);

}  // namespace mooncake::mcctl
