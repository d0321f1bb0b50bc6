// Test helpers for the Prometheus text exposition format (version 0.0.4):
// a line-by-line format check and a parser of samples, for the metrics
// unit test and the metrics integration test.
#pragma once

#include <cstdlib>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"

namespace mooncake::testing {

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
