#include "peering/peer_identity.h"

#include <grpc/grpc_security_constants.h>

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "mooncake/common/escape.h"

namespace mooncake::daemon::peering {

std::vector<std::string> CertificateNodeNames(const grpc::AuthContext& auth) {
  std::vector<std::string> names;
  for (const grpc::string_ref& v : auth.FindPropertyValues(GRPC_PEER_DNS_PROPERTY_NAME)) {
    names.emplace_back(v.data(), v.size());
  }
  return names;
}

namespace {

bool Names(const std::vector<std::string>& names, const std::string& node) {
  return std::find(names.begin(), names.end(), node) != names.end();
}

std::string Listed(const std::vector<std::string>& names) {
  if (names.empty()) return "no DNS name";
  std::vector<std::string> shown;
  for (size_t i = 0; i < names.size() && i < 4; ++i) {
    shown.push_back(EscapeForDisplay(names[i], 64));
  }
  return absl::StrCat("DNS:", absl::StrJoin(shown, ", DNS:"), names.size() > 4 ? ", ..." : "");
}

// The verified certificate's revocation, under `revocations` (OK without).
absl::Status NotRevoked(const grpc::AuthContext* auth, PeerRevocations* revocations) {
  if (revocations == nullptr) return absl::OkStatus();
  if (auth == nullptr) return absl::PermissionDeniedError("no certificate");
  const std::vector<grpc::string_ref> pem =
      auth->FindPropertyValues(GRPC_X509_PEM_CERT_PROPERTY_NAME);
  if (pem.empty()) return absl::PermissionDeniedError("no certificate");
  return revocations->Check(absl::string_view(pem.front().data(), pem.front().size()));
}

}  // namespace

absl::StatusOr<std::string> AuthenticatePeer(PeerMode mode, const grpc::ServerContext& ctx,
                                             const std::string& claimed,
                                             PeerRevocations* revocations) {
  switch (mode) {
    case PeerMode::kInsecure: return claimed;
    case PeerMode::kTlsRequired:
      return absl::PermissionDeniedError(
          absl::StrCat("TLS required: this node's peer port serves only PeerHello over plaintext; ",
                       kTlsKeysHint));
    case PeerMode::kMutualTls: break;
  }
  const std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
  const std::vector<std::string> names =
      auth ? CertificateNodeNames(*auth) : std::vector<std::string>{};
  if (claimed.empty() || !Names(names, claimed)) {
    return absl::PermissionDeniedError(
        absl::StrCat("the caller names node '", EscapeForDisplay(claimed, 64),
                     "' but its certificate is for ", Listed(names)));
  }
  if (absl::Status r = NotRevoked(auth.get(), revocations); !r.ok()) {
    return absl::PermissionDeniedError(
        absl::StrCat("node ", EscapeForDisplay(claimed, 64), ": ", r.message()));
  }
  return claimed;
}

absl::Status CheckServerIdentity(PeerMode mode, const grpc::ClientContext& ctx,
                                 const std::string& node_id, PeerRevocations* revocations) {
  if (mode != PeerMode::kMutualTls) return absl::OkStatus();
  const std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
  const std::vector<std::string> names =
      auth ? CertificateNodeNames(*auth) : std::vector<std::string>{};
  if (!Names(names, node_id)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the server reached for node ", node_id, " presented a certificate for ", Listed(names)));
  }
  if (absl::Status r = NotRevoked(auth.get(), revocations); !r.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("node ", node_id, ": ", r.message()));
  }
  return absl::OkStatus();
}

std::shared_ptr<grpc::Channel> PeerChannel(PeerMode mode,
                                           std::shared_ptr<grpc::ChannelCredentials> credentials,
                                           const std::string& node_id, const std::string& address,
                                           int max_message_bytes) {
  grpc::ChannelArguments args;
  if (max_message_bytes > 0) {
    args.SetMaxReceiveMessageSize(max_message_bytes);
    args.SetMaxSendMessageSize(max_message_bytes);
  }
  if (mode == PeerMode::kMutualTls) args.SetSslTargetNameOverride(node_id);
  // One channel per peer node: no sharing of subchannels between nodes,
  // so one node's target name never verifies another's connection.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  // "dns:///" pins the resolver: a host that happens to read as a scheme
  // ("unix", "ipv4") cannot select another one.
  return grpc::CreateCustomChannel(absl::StrCat("dns:///", address), std::move(credentials), args);
}

absl::Status ValidatePeerAddress(const std::string& address) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("peer address '", EscapeForDisplay(address, 64),
                                                   "': ", why, " (expected host:port)"));
  };
  if (address.empty() || address.size() > 256) return bad("empty or longer than 256 bytes");
  std::string host;
  std::string port;
  if (address[0] == '[') {
    const size_t close = address.find(']');
    if (close == std::string::npos || close + 1 >= address.size() || address[close + 1] != ':') {
      return bad("an IPv6 address is written [addr]:port");
    }
    host = address.substr(1, close - 1);
    port = address.substr(close + 2);
    if (host.empty()) return bad("empty IPv6 address");
    for (char c : host) {
      if (!absl::ascii_isxdigit(static_cast<unsigned char>(c)) && c != ':' && c != '.') {
        return bad("not an IPv6 address");
      }
    }
  } else {
    const size_t colon = address.rfind(':');
    if (colon == std::string::npos || colon == 0) return bad("no host or no port");
    host = address.substr(0, colon);
    port = address.substr(colon + 1);
    if (host.find(':') != std::string::npos) {
      return bad("a scheme or an unbracketed IPv6 address");
    }
    for (char c : host) {
      if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '.') {
        return bad("the host is not a DNS name or an IPv4 address");
      }
    }
  }
  uint32_t p = 0;
  if (port.empty() || port.size() > 5 || !absl::SimpleAtoi(port, &p) || p == 0 || p > 65535 ||
      !std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return bad("the port is not 1..65535");
  }
  return absl::OkStatus();
}

}  // namespace mooncake::daemon::peering
