// Test support: calling a daemon's peer port as another node (or an
// outsider) would, with or without a certificate.
#pragma once

#include <grpcpp/grpcpp.h>

#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "mooncake/v1/peer.grpc.pb.h"
#include "test_certs.h"

namespace mooncake::testing {

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// TLS trusting `ca_file`, presenting `who`'s certificate (none when its
// files are empty).
inline std::shared_ptr<grpc::ChannelCredentials> TlsAs(const std::string& ca_file,
                                                       const TestCertificates& who) {
  grpc::SslCredentialsOptions o;
  o.pem_root_certs = ReadFile(ca_file);
  if (!who.cert_file.empty()) {
    o.pem_private_key = ReadFile(who.key_file);
    o.pem_cert_chain = ReadFile(who.cert_file);
  }
  return grpc::SslCredentials(o);
}

// A channel to the peer port at `addr`; under TLS the server must present
// a certificate for `server_node` (as daemons dial each other).
inline std::shared_ptr<grpc::Channel> PeerChannelTo(const std::string& addr,
                                                    std::shared_ptr<grpc::ChannelCredentials> creds,
                                                    const std::string& server_node = "") {
  grpc::ChannelArguments args;
  if (!server_node.empty()) args.SetSslTargetNameOverride(server_node);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel(addr, std::move(creds), args);
}

}  // namespace mooncake::testing
