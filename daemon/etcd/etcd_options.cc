#include "etcd/etcd_options.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "mooncake/common/escape.h"

namespace mooncake::daemon::etcd {
namespace {

enum class Scheme { kNone, kHttp, kHttps };

constexpr absl::string_view kExample = "e.g. http://127.0.0.1:2379";

absl::Status BadEndpoint(absl::string_view text, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("etcd endpoint '", EscapeForDisplay(text, 200),
                                                 "': ", why, " (", kExample, ")"));
}

bool IsHostChar(char c) { return absl::ascii_isalnum(c) || c == '.' || c == '-' || c == '_'; }

bool IsIpv6Char(char c) { return absl::ascii_isxdigit(c) || c == ':' || c == '.'; }

struct Parsed {
  Scheme scheme = Scheme::kNone;
  std::string target;
};

absl::StatusOr<Parsed> ParseOne(absl::string_view text) {
  Parsed out;
  absl::string_view rest = text;
  const size_t sep = rest.find("://");
  if (sep != absl::string_view::npos) {
    const std::string scheme = absl::AsciiStrToLower(rest.substr(0, sep));
    if (scheme == "http") {
      out.scheme = Scheme::kHttp;
    } else if (scheme == "https") {
      out.scheme = Scheme::kHttps;
    } else {
      return BadEndpoint(text, absl::StrCat("unsupported scheme '", EscapeForDisplay(scheme, 40),
                                            "'; use http:// or https://"));
    }
    rest.remove_prefix(sep + 3);
  }
  if (absl::EndsWith(rest, "/")) rest.remove_suffix(1);
  if (rest.find_first_of("/?#@ \t") != absl::string_view::npos) {
    return BadEndpoint(text, "only scheme://host:port is allowed (no path, query or user)");
  }
  if (rest.empty()) return BadEndpoint(text, "no host");

  absl::string_view host;
  absl::string_view port;
  bool bracketed = false;
  if (rest.front() == '[') {
    const size_t close = rest.find(']');
    if (close == absl::string_view::npos) return BadEndpoint(text, "'[' without ']'");
    host = rest.substr(1, close - 1);
    absl::string_view after = rest.substr(close + 1);
    if (!absl::ConsumePrefix(&after, ":")) return BadEndpoint(text, "no port after ']'");
    port = after;
    bracketed = true;
    for (char c : host) {
      if (!IsIpv6Char(c)) return BadEndpoint(text, "not an IPv6 address inside [...]");
    }
  } else {
    const size_t colon = rest.rfind(':');
    if (colon == absl::string_view::npos) return BadEndpoint(text, "no port; write host:port");
    host = rest.substr(0, colon);
    port = rest.substr(colon + 1);
    if (host.find(':') != absl::string_view::npos) {
      return BadEndpoint(text, "an IPv6 address needs brackets, as [::1]:2379");
    }
    for (char c : host) {
      if (!IsHostChar(c)) return BadEndpoint(text, "the host has a character not allowed in names");
    }
  }
  if (host.empty()) return BadEndpoint(text, "no host");
  uint32_t port_number = 0;
  const bool digits = !port.empty() && port.size() <= 5 &&
                      std::all_of(port.begin(), port.end(), absl::ascii_isdigit);
  if (!digits || !absl::SimpleAtoi(port, &port_number) || port_number == 0 || port_number > 65535) {
    return BadEndpoint(text, "the port must be a number from 1 to 65535");
  }
  out.target =
      bracketed ? absl::StrCat("[", host, "]:", port_number) : absl::StrCat(host, ":", port_number);
  return out;
}

}  // namespace

absl::StatusOr<std::vector<EtcdEndpoint>> ValidateEtcdOptions(const EtcdOptions& options) {
  if (options.endpoints.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("no etcd endpoint given: list the cluster's client URLs (", kExample, ")"));
  }
  if (options.cert_file.empty() != options.key_file.empty()) {
    return absl::InvalidArgumentError(
        "etcd TLS: a client certificate needs both cert_file and key_file (got only " +
        std::string(options.cert_file.empty() ? "key_file" : "cert_file") + ")");
  }
  if (options.dial_timeout <= absl::ZeroDuration() ||
      options.request_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "etcd timeouts must be positive (dial_timeout ", absl::FormatDuration(options.dial_timeout),
        ", request_timeout ", absl::FormatDuration(options.request_timeout), ")"));
  }
  const bool tls_files =
      !options.ca_file.empty() || !options.cert_file.empty() || !options.key_file.empty();

  std::vector<EtcdEndpoint> out;
  std::vector<Scheme> schemes;
  std::set<std::string> targets;
  for (const std::string& raw : options.endpoints) {
    const absl::string_view text = absl::StripAsciiWhitespace(raw);
    if (text.empty()) return absl::InvalidArgumentError("empty etcd endpoint in the list");
    absl::StatusOr<Parsed> p = ParseOne(text);
    if (!p.ok()) return p.status();
    if (!targets.insert(p->target).second) {
      return BadEndpoint(text, "listed twice");
    }
    if (p->scheme == Scheme::kHttp && tls_files) {
      return BadEndpoint(text,
                         "http:// is plaintext but etcd TLS files are set; write https:// "
                         "or drop the TLS files");
    }
    schemes.push_back(p->scheme);
    EtcdEndpoint e;
    e.url = std::string(text);
    e.target = std::move(p->target);
    e.tls = p->scheme == Scheme::kHttps || tls_files;
    out.push_back(std::move(e));
  }
  const bool any_http = std::count(schemes.begin(), schemes.end(), Scheme::kHttp) > 0;
  const bool any_https = std::count(schemes.begin(), schemes.end(), Scheme::kHttps) > 0;
  if (any_http && any_https) {
    return absl::InvalidArgumentError(
        "etcd endpoints mix http:// and https://: one cluster speaks one of them; fix the "
        "list");
  }
  if (any_https) {
    for (EtcdEndpoint& e : out) e.tls = true;
  }
  return out;
}

absl::StatusOr<EtcdOptions> ParseEtcdEndpoints(absl::string_view comma_list, EtcdOptions base) {
  base.endpoints.clear();
  if (absl::StripAsciiWhitespace(comma_list).empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("no etcd endpoint given: list the cluster's client URLs, comma-separated (",
                     kExample, ")"));
  }
  for (absl::string_view part : absl::StrSplit(comma_list, ',')) {
    base.endpoints.emplace_back(absl::StripAsciiWhitespace(part));
  }
  absl::StatusOr<std::vector<EtcdEndpoint>> checked = ValidateEtcdOptions(base);
  if (!checked.ok()) return checked.status();
  return base;
}

std::string PrefixRangeEnd(absl::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    unsigned char last = static_cast<unsigned char>(end.back());
    if (last < 0xff) {
      end.back() = static_cast<char>(last + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');
}

}  // namespace mooncake::daemon::etcd
