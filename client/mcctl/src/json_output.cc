#include "mooncake/mcctl/json_output.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/util/json_util.h"
#include "mooncake/common/status.h"

namespace mooncake::mcctl {
namespace {

// "{...}" + ,"key":value pairs -> "{...,"key":value}".
std::string WithExtraKeys(const std::string& object,
                          const std::vector<std::pair<std::string, std::string>>& extra) {
  std::string out = object.substr(0, object.size() - 1);  // drop '}'
  bool first = out == "{";
  for (const auto& [key, value] : extra) {
    absl::StrAppend(&out, first ? "" : ",", "\"", key, "\":", value);
    first = false;
  }
  out += '}';
  return out;
}

template <typename Repeated>
absl::StatusOr<std::string> ArrayOf(const Repeated& items) {
  std::vector<std::string> parts;
  parts.reserve(items.size());
  for (const auto& item : items) {
    MC_ASSIGN_OR_RETURN(std::string json, MessageToCompactJson(item));
    parts.push_back(std::move(json));
  }
  return absl::StrCat("[", absl::StrJoin(parts, ","), "]");
}

}  // namespace

absl::StatusOr<std::string> MessageToCompactJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = false;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string out;
  auto st = google::protobuf::util::MessageToJsonString(message, &out, options);
  if (!st.ok()) {
    return absl::InternalError(
        absl::StrCat("cannot print ", message.GetTypeName(), " as JSON: ", st.ToString()));
  }
  if (out.size() < 2 || out.front() != '{' || out.back() != '}') {
    return absl::InternalError(absl::StrCat("protobuf printed ", message.GetTypeName(),
                                            " as something other than a JSON object: ", out));
  }
  return out;
}

absl::StatusOr<std::string> StatusJson(const v1::DaemonStatus& status,
                                       const v1::Topology& topology) {
  MC_ASSIGN_OR_RETURN(std::string object, MessageToCompactJson(status));
  MC_ASSIGN_OR_RETURN(std::string gpus, ArrayOf(topology.gpus()));
  MC_ASSIGN_OR_RETURN(std::string nics, ArrayOf(topology.nics()));
  return WithExtraKeys(object, {{"gpus", gpus}, {"nics", nics}});
}

absl::StatusOr<std::string> GpusJson(const v1::Topology& topology) {
  return ArrayOf(topology.gpus());
}

absl::StatusOr<std::string> NicsJson(const v1::Topology& topology) {
  return ArrayOf(topology.nics());
}

absl::StatusOr<std::string> TopologyJson(const v1::Topology& topology) {
  return MessageToCompactJson(topology);
}

absl::StatusOr<std::string> SessionsJson(const v1::ListSessionsResponse& sessions) {
  return ArrayOf(sessions.sessions());
}

std::vector<uint32_t> JoinedRanks(const v1::GroupInfo& group) {
  std::vector<uint32_t> ranks;
  for (const auto& m : group.members()) {
    if (m.state() != "left" && m.state() != "lost") ranks.push_back(m.rank());
  }
  std::sort(ranks.begin(), ranks.end());
  return ranks;
}

absl::StatusOr<std::string> GroupsJson(const v1::ListGroupsResponse& groups) {
  std::vector<std::string> parts;
  for (const auto& g : groups.groups()) {
    MC_ASSIGN_OR_RETURN(std::string object, MessageToCompactJson(g));
    parts.push_back(WithExtraKeys(
        object, {{"joined_ranks", absl::StrCat("[", absl::StrJoin(JoinedRanks(g), ","), "]")}}));
  }
  return absl::StrCat("[", absl::StrJoin(parts, ","), "]");
}

std::string PrettyJson(std::string_view in) {
  std::string out;
  int depth = 0;
  bool in_string = false;
  bool escaped = false;
  auto newline = [&] {
    out += '\n';
    out.append(static_cast<std::size_t>(std::max(depth, 0)) * 2, ' ');
  };
  for (std::size_t i = 0; i < in.size(); ++i) {
    const char c = in[i];
    if (in_string) {
      out += c;
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    switch (c) {
      case '"':
        in_string = true;
        out += c;
        break;
      case '{':
      case '[':
        // Keep empty containers on one line: "[]", "{}".
        if (i + 1 < in.size() && (in[i + 1] == '}' || in[i + 1] == ']')) {
          out += c;
          out += in[++i];
          break;
        }
        out += c;
        ++depth;
        newline();
        break;
      case '}':
      case ']':
        --depth;
        newline();
        out += c;
        break;
      case ',':
        out += c;
        newline();
        break;
      case ':': out += ": "; break;
      case ' ':
      case '\n':
      case '\t':
      case '\r': break;
      default: out += c;
    }
  }
  return out;
}

}  // namespace mooncake::mcctl
