// The per-tenant span policy (issue 23 item 3): which nodes each tenant's
// groups may span. The same uid on two nodes is not the same person, and a
// tenant name on two nodes is the same tenant only where the operator says
// so: with `tenant_policy_file` set, a rank on another node counts as a
// member of tenant T's group only when the policy lets T span both that
// node and this one. It is the operator's alternative to a launcher-set
// group secret (group_secret.h); both apply when both are set.
//
// The file, one line per tenant (docs/cluster.md, "Tenant span policy"):
//
//   # tenant   nodes its groups may span: node ids or shell patterns
//   team-a     gpu-a-01 gpu-a-02
//   team-b     gpu-b-*
//   @main      *            # the main socket's groups (no tenant)
//   *          gpu-shared-* # every tenant without a line of its own
//
// A tenant with no line (and no '*' line), or a line naming no node, keeps
// its groups on one node. The file must be owned by root or the daemon's
// uid and writable by no one else (as sshd's StrictModes): whoever may
// edit it decides which nodes a tenant's memory is reachable from.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace mooncake::daemon {

// The line naming the main socket's groups (tenant ""): not a tenant name
// (tenant names start with a letter or digit).
inline constexpr char kMainSocketTenantKey[] = "@main";
inline constexpr char kEveryOtherTenantKey[] = "*";
// Bounds on what the daemon reads and holds.
inline constexpr size_t kMaxTenantPolicyBytes = 1u << 20;
inline constexpr size_t kMaxTenantPolicyLines = 4096;
inline constexpr size_t kMaxNodePatternsPerTenant = 1024;

class TenantSpanPolicy {
 public:
  // Parses the file's text; `source` names it in errors ("FILE:LINE: ...").
  static absl::StatusOr<std::shared_ptr<const TenantSpanPolicy>> Parse(const std::string& text,
                                                                       const std::string& source);
  // Reads and parses `path` (a symbolic link is followed), refusing a file
  // another user could have written (owner not root nor `daemon_uid`,
  // group- or other-writable, not a regular file) or one over
  // kMaxTenantPolicyBytes.
  static absl::StatusOr<std::shared_ptr<const TenantSpanPolicy>> Load(const std::string& path,
                                                                      uint32_t daemon_uid);

  // Whether groups of `tenant` ("" = the main socket's) may have ranks on
  // `node`.
  bool MaySpan(const std::string& tenant, const std::string& node) const;
  // Whether a group of `tenant` held on `here` may count a rank on `there`:
  // the same node always; otherwise both must be allowed.
  bool MayMeet(const std::string& tenant, const std::string& here, const std::string& there) const {
    return here == there || (MaySpan(tenant, here) && MaySpan(tenant, there));
  }
  // Where the policy came from, and how many tenant lines (for the log).
  const std::string& source() const { return source_; }
  size_t tenant_count() const { return by_tenant_.size(); }

 private:
  TenantSpanPolicy() = default;
  const std::vector<std::string>* PatternsOf(const std::string& tenant) const;

  std::string source_;
  // Key: tenant name, kMainSocketTenantKey or kEveryOtherTenantKey.
  std::map<std::string, std::vector<std::string>> by_tenant_;
};

}  // namespace mooncake::daemon
