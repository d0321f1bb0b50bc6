#include "broker/tenant_span_policy.h"

#include <fcntl.h>
#include <fnmatch.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "config/daemon_config.h"
#include "mooncake/common/escape.h"

namespace mooncake::daemon {
namespace {

// A node id (peering/node_registry.h: letters, digits, '.', '_', '-') or a
// shell pattern over them ('*', '?', '[...]', '!' in a bracket).
bool ValidNodePattern(absl::string_view p) {
  return !p.empty() && p.size() <= 128 && std::all_of(p.begin(), p.end(), [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-' ||
           c == '*' || c == '?' || c == '[' || c == ']' || c == '!';
  });
}

}  // namespace

absl::StatusOr<std::shared_ptr<const TenantSpanPolicy>> TenantSpanPolicy::Parse(
    const std::string& text, const std::string& source) {
  if (text.size() > kMaxTenantPolicyBytes) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", text.size(),
                                                   " bytes; a tenant policy holds at most ",
                                                   kMaxTenantPolicyBytes));
  }
  std::shared_ptr<TenantSpanPolicy> policy(new TenantSpanPolicy());
  policy->source_ = source;
  size_t line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat(source, ":", line_no, ": ", why));
    };
    if (size_t hash = line.find('#'); hash != absl::string_view::npos) line = line.substr(0, hash);
    std::vector<absl::string_view> words =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (words.empty()) continue;
    const std::string tenant(words.front());
    if (tenant != kMainSocketTenantKey && tenant != kEveryOtherTenantKey &&
        !ValidTenantName(tenant)) {
      return bad(absl::StrCat("'", EscapeForDisplay(tenant, 64),
                              "' is not a tenant name, '@main' (the main socket's groups) or '*' "
                              "(every tenant without a line)"));
    }
    if (policy->by_tenant_.count(tenant) != 0) {
      return bad(absl::StrCat("tenant '", tenant, "' has a line already"));
    }
    if (policy->by_tenant_.size() == kMaxTenantPolicyLines) {
      return bad(absl::StrCat("more than ", kMaxTenantPolicyLines, " tenant lines"));
    }
    if (words.size() - 1 > kMaxNodePatternsPerTenant) {
      return bad(absl::StrCat(words.size() - 1, " nodes for tenant '", tenant, "'; at most ",
                              kMaxNodePatternsPerTenant, " (use patterns such as gpu-a-*)"));
    }
    std::vector<std::string> patterns;
    for (size_t i = 1; i < words.size(); ++i) {
      if (!ValidNodePattern(words[i])) {
        return bad(absl::StrCat("'", EscapeForDisplay(words[i], 64),
                                "' is neither a node id nor a pattern of one (letters, digits, "
                                "'.', '_', '-', and '*', '?', '[...]'; at most 128 bytes)"));
      }
      patterns.emplace_back(words[i]);
    }
    policy->by_tenant_.emplace(tenant, std::move(patterns));
  }
  return std::shared_ptr<const TenantSpanPolicy>(std::move(policy));
}

absl::StatusOr<std::shared_ptr<const TenantSpanPolicy>> TenantSpanPolicy::Load(
    const std::string& path, uint32_t daemon_uid) {
  const std::string what = absl::StrCat("tenant_policy_file ", EscapeForDisplay(path, 200));
  // Symbolic links are followed (a Kubernetes ConfigMap mounts each key as
  // one); the file opened is the one checked.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    return absl::FailedPreconditionError(absl::StrCat(what, ": ", std::strerror(errno)));
  }
  struct stat st {};
  std::string text;
  absl::Status status = [&]() -> absl::Status {
    if (::fstat(fd, &st) != 0) return absl::InternalError(absl::StrCat(what, ": fstat failed"));
    if (!S_ISREG(st.st_mode)) return absl::FailedPreconditionError(what + ": not a regular file");
    if (st.st_uid != 0 && st.st_uid != daemon_uid) {
      return absl::PermissionDeniedError(absl::StrCat(
          what, ": owned by uid ", st.st_uid, "; it must belong to root or to the daemon's uid ",
          daemon_uid, " (whoever may edit it decides where a tenant's memory is reachable from)"));
    }
    if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
      return absl::PermissionDeniedError(
          absl::StrCat(what, ": writable by its group or by others (mode ",
                       absl::StrCat(absl::Hex(st.st_mode & 07777)), "); chmod go-w it"));
    }
    if (static_cast<uint64_t>(st.st_size) > kMaxTenantPolicyBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": ", st.st_size, " bytes; a tenant policy holds at most ", kMaxTenantPolicyBytes));
    }
    text.resize(kMaxTenantPolicyBytes + 1);
    size_t got = 0;
    for (;;) {
      const ssize_t n = ::read(fd, text.data() + got, text.size() - got);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
      if (n == 0) break;
      got += static_cast<size_t>(n);
      if (got == text.size()) break;
    }
    text.resize(got);
    return absl::OkStatus();
  }();
  ::close(fd);
  if (!status.ok()) return status;
  return Parse(text, EscapeForDisplay(path, 200));
}

const std::vector<std::string>* TenantSpanPolicy::PatternsOf(const std::string& tenant) const {
  auto it = by_tenant_.find(tenant.empty() ? std::string(kMainSocketTenantKey) : tenant);
  if (it == by_tenant_.end()) it = by_tenant_.find(kEveryOtherTenantKey);
  return it == by_tenant_.end() ? nullptr : &it->second;
}

bool TenantSpanPolicy::MaySpan(const std::string& tenant, const std::string& node) const {
  const std::vector<std::string>* patterns = PatternsOf(tenant);
  if (patterns == nullptr) return false;
  return std::any_of(patterns->begin(), patterns->end(), [&](const std::string& p) {
    return ::fnmatch(p.c_str(), node.c_str(), 0) == 0;
  });
}

}  // namespace mooncake::daemon
