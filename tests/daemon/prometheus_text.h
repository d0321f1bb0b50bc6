// Test helpers for the Prometheus text exposition format (version 0.0.4):
// a plain HTTP scrape, a line-by-line format check and a parser of samples,
// for the metrics unit test and the metrics integration test.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace mooncake::testing {

// A plain HTTP/1.0 GET of `path` on 127.0.0.1:`port`; the whole response,
// "" when nothing listens.
inline std::string HttpGet(int port, const std::string& path) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string out;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    timeval tv{10, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    const std::string req =
        absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    if (::write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size())) {
      char buf[4096];
      for (ssize_t n; (n = ::read(fd, buf, sizeof(buf))) > 0;) out.append(buf, n);
    }
  }
  ::close(fd);
  return out;
}

inline std::string Body(const std::string& response) {
  size_t at = response.find("\r\n\r\n");
  return at == std::string::npos ? "" : response.substr(at + 4);
}

// Every line that is neither a `# HELP name text` / `# TYPE name type`
// comment nor a `name{label="value",...} value [timestamp]` sample, with
// names matching [a-zA-Z_:][a-zA-Z0-9_:]*; empty when the text is valid.
// Values as Prometheus parses them (Go's ParseFloat): NaN and Inf in any
// case (prometheus-cpp writes "Nan").
inline std::vector<std::string> BadExpositionLines(const std::string& text) {
  static const std::regex kHelp(R"(# HELP [a-zA-Z_:][a-zA-Z0-9_:]* .*)");
  static const std::regex kType(
      R"(# TYPE [a-zA-Z_:][a-zA-Z0-9_:]* (counter|gauge|histogram|summary|untyped))");
  static const std::regex kSample(
      R"([a-zA-Z_:][a-zA-Z0-9_:]*)"
      R"((\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\\n]|\\["\\n])*")(,[a-zA-Z_][a-zA-Z0-9_]*="([^"\\\n]|\\["\\n])*")*,?\})?)"
      R"( [-+]?([0-9]*\.?[0-9]+([eE][-+]?[0-9]+)?|[Ii][Nn][Ff]|[Nn][Aa][Nn])( -?[0-9]+)?)");
  std::vector<std::string> bad;
  if (text.empty() || text.back() != '\n') bad.push_back("<the text does not end in a newline>");
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    std::string l(line);
    if (!std::regex_match(l, kHelp) && !std::regex_match(l, kType) &&
        !std::regex_match(l, kSample)) {
      bad.push_back(l);
    }
  }
  return bad;
}

// Samples by series as written ("name" or "name{a=\"x\",b=\"y\"}").
inline std::map<std::string, double> ParseSamples(const std::string& text) {
  std::map<std::string, double> out;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    if (line.empty() || line[0] == '#') continue;
    const size_t brace = line.rfind('}');
    const size_t space = line.find(' ', brace == absl::string_view::npos ? 0 : brace);
    if (space == absl::string_view::npos) continue;
    out[std::string(line.substr(0, space))] =
        std::strtod(std::string(line.substr(space + 1)).c_str(), nullptr);
  }
  return out;
}

}  // namespace mooncake::testing
