// Certificate revocation on the peer port: the cluster CA's revocation list
// (peer_tls_crl_file), so that a node whose key leaked, or that left the
// cluster for good, stops being a peer without a new CA for every node.
//
// The list is a PEM CRL signed by the cluster CA
// (deploy/make-cluster-certs.sh --revoke NODE writes it). The daemon takes
// it at start (a file that is not such a CRL stops the start) and again
// whenever it changes on disk, looked at no more than once per kRecheck: a
// new list reaches every peer call after that, on connections already open
// too, with no restart. A changed file that does not verify (torn write,
// another CA's list) is refused with a warning and the list in force stays.
// A list past its next-update time stays in force: it still names what it
// revoked; the daemon warns so that the operator issues a fresh one.
//
// What is checked: on this node's peer port, every call's client
// certificate (peer_identity.h, AuthenticatePeer); when this node dials
// another, the server's certificate in the TLS handshake (peer_tls.cc) and
// again on PeerHello (trusted_peers.h), which also drops the channels of
// nodes verified under an older list.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <memory>
#include <set>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace mooncake::daemon::peering {

class PeerRevocations {
 public:
  static constexpr absl::Duration kRecheck = absl::Seconds(1);
  // Certificates whose serial Check remembers (one per peer node is the
  // usual; past this the memo starts over).
  static constexpr size_t kMaxMemo = 4096;

  // Reads `crl_file` and checks it against the CA certificate(s) in
  // `ca_pem`. InvalidArgument naming the file and what is wrong.
  static absl::StatusOr<std::shared_ptr<PeerRevocations>> Load(std::string crl_file,
                                                               const std::string& ca_pem);
  ~PeerRevocations();

  // OK unless the certificate (PEM, as the TLS handshake gave it) is on the
  // list in force: then PermissionDenied naming its serial. A certificate
  // that cannot be read is PermissionDenied too (it passed the handshake,
  // so this does not happen short of a bug).
  absl::Status Check(absl::string_view cert_pem);

  // Counts the lists taken: 1 after Load, one more per changed file taken.
  uint64_t generation();
  size_t revoked_count();
  const std::string& file() const { return file_; }

  // What the list says (tests, mcctl): "N revoked, next update T".
  std::string Describe();

 private:
  struct FileStamp {
    uint64_t dev = 0, ino = 0, size = 0;
    int64_t mtime_ns = 0;
    bool operator==(const FileStamp&) const = default;
  };
  static FileStamp StampOf(const struct stat& st);
  struct List {
    std::string issuer;             // the CRL's issuer name (DER)
    std::set<std::string> serials;  // upper-case hex, as openssl prints them
    absl::Time next_update = absl::InfiniteFuture();
    FileStamp stamp;
  };
  struct Ca;
  struct Memo {          // what Check needs of a certificate
    std::string issuer;  // DER
    std::string serial;
  };

  PeerRevocations(std::string file, std::unique_ptr<Ca> ca);
  absl::StatusOr<List> Read() const;
  void RefreshLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Memo> MemoOf(absl::string_view cert_pem) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string file_;
  const std::unique_ptr<Ca> ca_;
  absl::Mutex mu_;
  List list_ ABSL_GUARDED_BY(mu_);
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time looked_at_ ABSL_GUARDED_BY(mu_);
  FileStamp refused_ ABSL_GUARDED_BY(mu_);  // a changed file already warned about
  absl::flat_hash_map<std::string, Memo> memo_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mooncake::daemon::peering
