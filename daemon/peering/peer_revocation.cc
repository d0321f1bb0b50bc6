#include "peering/peer_revocation.h"

#include <fcntl.h>
#include <openssl/asn1.h>
#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "mooncake/common/escape.h"
#include "mooncake/common/log.h"
#include "mooncake/common/unique_fd.h"

namespace mooncake::daemon::peering {

namespace {

// A CRL of a cluster lists its revoked nodes: far below this.
constexpr size_t kMaxCrlBytes = 16u << 20;

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct CrlFree {
  void operator()(X509_CRL* c) const { X509_CRL_free(c); }
};
struct BnFree {
  void operator()(BIGNUM* b) const { BN_free(b); }
};
using Bio = std::unique_ptr<BIO, BioFree>;
using Cert = std::unique_ptr<X509, X509Free>;
using Crl = std::unique_ptr<X509_CRL, CrlFree>;

Bio MemoryBio(absl::string_view bytes) {
  return Bio(BIO_new_mem_buf(bytes.data(), static_cast<int>(bytes.size())));
}

// The serial as openssl prints it: upper-case hex, no leading zeros.
std::string HexSerial(const ASN1_INTEGER* serial) {
  std::unique_ptr<BIGNUM, BnFree> bn(ASN1_INTEGER_to_BN(serial, nullptr));
  if (!bn) return "";
  char* hex = BN_bn2hex(bn.get());
  std::string out = hex != nullptr ? hex : "";
  OPENSSL_free(hex);
  return out;
}

// An X509 name as DER bytes: compared byte for byte.
std::string NameBytes(const X509_NAME* name) {
  const unsigned char* der = nullptr;
  size_t len = 0;
  if (X509_NAME_get0_der(const_cast<X509_NAME*>(name), &der, &len) != 1) return "";
  return std::string(reinterpret_cast<const char*>(der), len);
}

absl::Time AsTime(const ASN1_TIME* t) {
  struct tm tm {};
  if (t == nullptr || ASN1_TIME_to_tm(t, &tm) != 1) return absl::InfiniteFuture();
  return absl::FromTM(tm, absl::UTCTimeZone());
}

std::string Shown(absl::Time t) {
  if (t == absl::InfiniteFuture()) return "none";
  return absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", t, absl::UTCTimeZone());
}

}  // namespace

PeerRevocations::FileStamp PeerRevocations::StampOf(const struct stat& st) {
  return FileStamp{static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino),
                   static_cast<uint64_t>(st.st_size),
                   static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec};
}

struct PeerRevocations::Ca {
  std::vector<Cert> certs;
};

PeerRevocations::PeerRevocations(std::string file, std::unique_ptr<Ca> ca)
    : file_(std::move(file)), ca_(std::move(ca)) {}

PeerRevocations::~PeerRevocations() = default;

absl::StatusOr<std::shared_ptr<PeerRevocations>> PeerRevocations::Load(std::string crl_file,
                                                                       const std::string& ca_pem) {
  auto ca = std::make_unique<Ca>();
  Bio bio = MemoryBio(ca_pem);
  while (bio) {
    X509* x = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr);
    if (x == nullptr) break;
    ca->certs.emplace_back(x);
  }
  ERR_clear_error();  // the end of the PEM data reads as an error
  if (ca->certs.empty()) {
    return absl::InvalidArgumentError("peer_tls_ca_file holds no PEM certificate");
  }
  std::shared_ptr<PeerRevocations> r(new PeerRevocations(std::move(crl_file), std::move(ca)));
  absl::StatusOr<List> list = r->Read();
  if (!list.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("peer_tls_crl_file = ", r->file_, ": ", list.status().message()));
  }
  absl::MutexLock lock(&r->mu_);
  r->list_ = *std::move(list);
  r->generation_ = 1;
  r->looked_at_ = absl::Now();
  if (r->list_.next_update < absl::Now()) {
    MC_LOG(kWarning, "peer_tls_crl_file ", r->file_, " is past its next update (",
           Shown(r->list_.next_update),
           "): it stays in force; issue a fresh one (deploy/make-cluster-certs.sh --crl)");
  }
  return r;
}

absl::StatusOr<PeerRevocations::List> PeerRevocations::Read() const {
  // One open file: its size and stamp are those of the bytes read.
  UniqueFd fd(::open(file_.c_str(), O_RDONLY | O_CLOEXEC));
  struct stat st {};
  if (!fd.valid() || ::fstat(fd.get(), &st) != 0) {
    return absl::InvalidArgumentError("cannot be read");
  }
  if (static_cast<uint64_t>(st.st_size) > kMaxCrlBytes) {
    return absl::InvalidArgumentError(absl::StrCat("larger than ", kMaxCrlBytes >> 20, " MiB"));
  }
  std::string pem(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < pem.size()) {
    const ssize_t n = ::read(fd.get(), pem.data() + got, pem.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  pem.resize(got);
  Bio bio = MemoryBio(pem);
  Crl crl(bio ? PEM_read_bio_X509_CRL(bio.get(), nullptr, nullptr, nullptr) : nullptr);
  ERR_clear_error();
  if (!crl) {
    return absl::InvalidArgumentError(
        "not a PEM certificate revocation list (-----BEGIN X509 CRL-----)");
  }
  const std::string issuer = NameBytes(X509_CRL_get_issuer(crl.get()));
  bool signed_by_ca = false;
  for (const Cert& ca : ca_->certs) {
    if (NameBytes(X509_get_subject_name(ca.get())) != issuer) continue;
    EVP_PKEY* key = X509_get0_pubkey(ca.get());
    if (key != nullptr && X509_CRL_verify(crl.get(), key) == 1) {
      signed_by_ca = true;
      break;
    }
  }
  ERR_clear_error();
  if (!signed_by_ca) {
    return absl::InvalidArgumentError(
        "not signed by the cluster CA of peer_tls_ca_file (a list of another CA, or altered)");
  }
  List list;
  list.issuer = issuer;
  list.next_update = AsTime(X509_CRL_get0_nextUpdate(crl.get()));
  list.stamp = StampOf(st);
  STACK_OF(X509_REVOKED)* revoked = X509_CRL_get_REVOKED(crl.get());
  for (int i = 0; revoked != nullptr && i < sk_X509_REVOKED_num(revoked); ++i) {
    list.serials.insert(
        HexSerial(X509_REVOKED_get0_serialNumber(sk_X509_REVOKED_value(revoked, i))));
  }
  return list;
}

void PeerRevocations::RefreshLocked() {
  const absl::Time now = absl::Now();
  if (now - looked_at_ < kRecheck) return;
  looked_at_ = now;
  struct stat st {};
  FileStamp stamp;  // all zero: the file is gone
  if (::stat(file_.c_str(), &st) == 0) stamp = StampOf(st);
  if (stamp == list_.stamp || stamp == refused_) return;
  absl::StatusOr<List> next = Read();
  if (!next.ok()) {
    refused_ = stamp;  // warned once per change
    MC_LOG(kWarning, "peer_tls_crl_file ", file_, " changed but is refused (",
           next.status().message(), "); the list of ", list_.serials.size(),
           " revoked certificate(s) stays in force");
    return;
  }
  MC_LOG(kInfo, "peer_tls_crl_file ", file_, ": ", next->serials.size(),
         " revoked certificate(s), was ", list_.serials.size(), "; next update ",
         Shown(next->next_update));
  if (next->next_update < now) {
    MC_LOG(kWarning, "peer_tls_crl_file ", file_, " is past its next update (",
           Shown(next->next_update), "): it stays in force; issue a fresh one");
  }
  list_ = *std::move(next);
  refused_ = FileStamp{};
  ++generation_;
}

absl::StatusOr<PeerRevocations::Memo> PeerRevocations::MemoOf(absl::string_view cert_pem) {
  auto it = memo_.find(cert_pem);
  if (it != memo_.end()) return it->second;
  Bio bio = MemoryBio(cert_pem);
  Cert cert(bio ? PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr) : nullptr);
  ERR_clear_error();
  if (!cert) return absl::PermissionDeniedError("its certificate cannot be read");
  Memo m{NameBytes(X509_get_issuer_name(cert.get())),
         HexSerial(X509_get0_serialNumber(cert.get()))};
  if (memo_.size() >= kMaxMemo) memo_.clear();
  memo_.emplace(std::string(cert_pem), m);
  return m;
}

absl::Status PeerRevocations::Check(absl::string_view cert_pem) {
  absl::MutexLock lock(&mu_);
  RefreshLocked();
  absl::StatusOr<Memo> m = MemoOf(cert_pem);
  if (!m.ok()) return m.status();
  if (m->issuer == list_.issuer && list_.serials.contains(m->serial)) {
    return absl::PermissionDeniedError(
        absl::StrCat("its certificate (serial ", m->serial, ") is revoked by ", file_));
  }
  return absl::OkStatus();
}

uint64_t PeerRevocations::generation() {
  absl::MutexLock lock(&mu_);
  RefreshLocked();
  return generation_;
}

size_t PeerRevocations::revoked_count() {
  absl::MutexLock lock(&mu_);
  RefreshLocked();
  return list_.serials.size();
}

std::string PeerRevocations::Describe() {
  absl::MutexLock lock(&mu_);
  RefreshLocked();
  return absl::StrCat(list_.serials.size(), " revoked (", file_, "), next update ",
                      Shown(list_.next_update),
                      list_.next_update < absl::Now() ? " (past: issue a fresh list)" : "");
}

}  // namespace mooncake::daemon::peering
