#include "etcd/etcd_client.h"

#include <fcntl.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "etcd/etcd_internal.h"
#include "mooncake/common/escape.h"
#include "mooncake/common/status.h"

namespace mooncake::daemon::etcd {
namespace {

using etcdserverpb::Compare;

// How long a request waits on a channel that is failing to connect for
// one more attempt (the reconnect backoff is at most 1 s, +-20%).
constexpr absl::Duration kFailingChannelGrace = absl::Milliseconds(1500);

// Large enough for a membership prefix of thousands of ranks with RDMA
// metadata; etcd itself limits a request to 1.5 MiB by default.
constexpr int kMaxResponseBytes = 64 << 20;

absl::StatusOr<std::string> ReadPemFile(const std::string& path, absl::string_view setting) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return ErrnoStatus(errno, absl::StrCat("etcd TLS ", setting, " '", path, "'"));
  }
  std::string text;
  char buf[8192];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      return ErrnoStatus(err, absl::StrCat("read etcd TLS ", setting, " '", path, "'"));
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  if (text.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("etcd TLS ", setting, " '", path, "' is empty; it must hold PEM data"));
  }
  return text;
}

// What a failed connection to `e` means, in the settings' terms, from
// gRPC's text; empty when the text says nothing more specific. gRPC names
// neither cause itself: a server that refuses the client's certificate
// shows as a read failure after the handshake (TLS 1.3 sends that alert
// late; TLS 1.2 as an alert in the handshake), and a server that speaks
// the other protocol as a socket closed before any answer.
std::string ExplainConnectFailure(const EtcdEndpoint& e, const EtcdOptions& o,
                                  absl::string_view error) {
  const bool closed = absl::StrContains(error, "Socket closed") ||
                      absl::StrContains(error, "Connection reset") ||
                      absl::StrContains(error, "WRONG_VERSION_NUMBER") ||
                      absl::StrContains(error, "Handshake failed");
  if (!e.tls) {
    if (!closed && !absl::StrContains(error, "Endpoint read failed")) return "";
    return "the member accepted the connection and closed it without an answer: if it serves "
           "TLS, write https:// and set the etcd TLS files";
  }
  if (absl::StrContains(error, "certificate verify failed")) {
    return absl::StrCat(
        "the server's certificate is not signed by ",
        o.ca_file.empty()
            ? "a CA this system trusts (set the etcd TLS ca_file to the CA that signed it)"
            : absl::StrCat("the CA in the etcd TLS ca_file '", o.ca_file, "'"),
        ", or does not name the host of ", e.target);
  }
  const std::string certificate =
      o.cert_file.empty()
          ? std::string(
                "it requires a client certificate (etcd --client-cert-auth) and none was "
                "given; set the etcd TLS cert_file and key_file to a certificate of the "
                "CA etcd trusts (etcd --trusted-ca-file)")
          : absl::StrCat("it refused the client certificate in the etcd TLS cert_file '",
                         o.cert_file,
                         "'; it must be signed by the CA etcd trusts (etcd --trusted-ca-file)");
  if (absl::StrContains(error, "Endpoint read failed") || absl::StrContains(error, "alert")) {
    return absl::StrCat("the server ended the TLS connection: ", certificate);
  }
  if (closed) {
    // With TLS 1.3 a refused client certificate can also end this way (the
    // server closes before its alert is read): name both causes.
    return absl::StrCat(
        "the member closed the connection in the TLS handshake: if it serves plaintext, write "
        "http:// and drop the etcd TLS files; if it serves TLS, ",
        certificate);
  }
  return "";
}

grpc::ChannelArguments MakeChannelArguments() {
  grpc::ChannelArguments args;
  // A restarted member is found again within about a second, not gRPC's
  // default of up to two minutes of backoff.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // Keepalive pings find a dead connection under a long-lived watch or
  // keepalive stream. etcd refuses pings more often than every 5 s
  // (--grpc-keepalive-min-time) and pings without a call open.
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 0);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  args.SetMaxReceiveMessageSize(kMaxResponseBytes);
  return args;
}

Compare::CompareResult ToProto(CompareOp op) {
  switch (op) {
    case CompareOp::kEqual: return Compare::EQUAL;
    case CompareOp::kNotEqual: return Compare::NOT_EQUAL;
    case CompareOp::kLess: return Compare::LESS;
    case CompareOp::kGreater: return Compare::GREATER;
  }
  return Compare::EQUAL;
}

void FillRange(etcdserverpb::RangeRequest* r, absl::string_view key, bool prefix) {
  r->set_key(std::string(key));
  if (prefix) r->set_range_end(PrefixRangeEnd(key));
}

void FillDelete(etcdserverpb::DeleteRangeRequest* r, absl::string_view key, bool prefix) {
  r->set_key(std::string(key));
  if (prefix) r->set_range_end(PrefixRangeEnd(key));
}

void FillPut(etcdserverpb::PutRequest* r, absl::string_view key, absl::string_view value,
             int64_t lease_id) {
  r->set_key(std::string(key));
  r->set_value(std::string(value));
  r->set_lease(lease_id);
}

absl::Status CheckKey(absl::string_view what, absl::string_view key) {
  if (key.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("etcd ", what, ": the key is empty"));
  }
  return absl::OkStatus();
}

}  // namespace

std::string DescribeKey(absl::string_view what, absl::string_view key) {
  return absl::StrCat(what, " '", EscapeForDisplay(key, 120), "'");
}

namespace internal {

KeyValue FromProto(const mvccpb::KeyValue& kv) {
  KeyValue out;
  out.key = kv.key();
  out.value = kv.value();
  out.create_revision = kv.create_revision();
  out.mod_revision = kv.mod_revision();
  out.version = kv.version();
  out.lease = kv.lease();
  return out;
}

std::string GrpcErrorText(const grpc::Status& s) {
  if (s.error_message().empty()) return absl::StatusCodeToString(FromGrpcCode(s));
  if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
      s.error_code() == grpc::StatusCode::CANCELLED) {
    return absl::StrCat(absl::StatusCodeToString(FromGrpcCode(s)), ": ", s.error_message());
  }
  return s.error_message();
}

std::string LeaseName(int64_t lease_id) {
  return absl::StrCat("lease ", absl::Hex(static_cast<uint64_t>(lease_id)));
}

}  // namespace internal

using internal::FromGrpcCode;
using internal::FromProto;
using internal::GrpcErrorText;
using internal::LeaseName;

// ---- Txn ----

Compare* Txn::AddCompare(absl::string_view key, CompareOp op) {
  Compare* c = request_.add_compare();
  c->set_key(std::string(key));
  c->set_result(ToProto(op));
  return c;
}

Txn& Txn::IfValue(absl::string_view key, CompareOp op, absl::string_view value) {
  Compare* c = AddCompare(key, op);
  c->set_target(Compare::VALUE);
  c->set_value(std::string(value));
  return *this;
}

Txn& Txn::IfVersion(absl::string_view key, CompareOp op, int64_t version) {
  Compare* c = AddCompare(key, op);
  c->set_target(Compare::VERSION);
  c->set_version(version);
  return *this;
}

Txn& Txn::IfCreateRevision(absl::string_view key, CompareOp op, int64_t revision) {
  Compare* c = AddCompare(key, op);
  c->set_target(Compare::CREATE);
  c->set_create_revision(revision);
  return *this;
}

Txn& Txn::IfModRevision(absl::string_view key, CompareOp op, int64_t revision) {
  Compare* c = AddCompare(key, op);
  c->set_target(Compare::MOD);
  c->set_mod_revision(revision);
  return *this;
}

Txn& Txn::IfLease(absl::string_view key, CompareOp op, int64_t lease_id) {
  Compare* c = AddCompare(key, op);
  c->set_target(Compare::LEASE);
  c->set_lease(lease_id);
  return *this;
}

Txn& Txn::IfNoKeyWithPrefix(absl::string_view prefix) {
  // etcd checks a range compare against every key in the range, and an
  // empty range against an absent key: create_revision 0 holds only then.
  Compare* c = AddCompare(prefix, CompareOp::kEqual);
  c->set_target(Compare::CREATE);
  c->set_create_revision(0);
  c->set_range_end(PrefixRangeEnd(prefix));
  return *this;
}

Txn& Txn::ThenPut(absl::string_view key, absl::string_view value, int64_t lease_id) {
  FillPut(request_.add_success()->mutable_request_put(), key, value, lease_id);
  return *this;
}
Txn& Txn::ThenDelete(absl::string_view key) {
  FillDelete(request_.add_success()->mutable_request_delete_range(), key, false);
  return *this;
}
Txn& Txn::ThenDeletePrefix(absl::string_view prefix) {
  FillDelete(request_.add_success()->mutable_request_delete_range(), prefix, true);
  return *this;
}
Txn& Txn::ThenGet(absl::string_view key) {
  FillRange(request_.add_success()->mutable_request_range(), key, false);
  return *this;
}
Txn& Txn::ThenGetPrefix(absl::string_view prefix) {
  FillRange(request_.add_success()->mutable_request_range(), prefix, true);
  return *this;
}
Txn& Txn::ElsePut(absl::string_view key, absl::string_view value, int64_t lease_id) {
  FillPut(request_.add_failure()->mutable_request_put(), key, value, lease_id);
  return *this;
}
Txn& Txn::ElseDelete(absl::string_view key) {
  FillDelete(request_.add_failure()->mutable_request_delete_range(), key, false);
  return *this;
}
Txn& Txn::ElseDeletePrefix(absl::string_view prefix) {
  FillDelete(request_.add_failure()->mutable_request_delete_range(), prefix, true);
  return *this;
}
Txn& Txn::ElseGet(absl::string_view key) {
  FillRange(request_.add_failure()->mutable_request_range(), key, false);
  return *this;
}
Txn& Txn::ElseGetPrefix(absl::string_view prefix) {
  FillRange(request_.add_failure()->mutable_request_range(), prefix, true);
  return *this;
}

bool Txn::read_only() const {
  for (const auto* ops : {&request_.success(), &request_.failure()}) {
    for (const etcdserverpb::RequestOp& op : *ops) {
      if (!op.has_request_range()) return false;
    }
  }
  return true;
}

// ---- EtcdClient ----

EtcdClient::EtcdClient(EtcdOptions options, std::vector<Member> members)
    : options_(std::move(options)), members_(std::move(members)) {}

EtcdClient::~EtcdClient() = default;

absl::StatusOr<std::unique_ptr<EtcdClient>> EtcdClient::Connect(EtcdOptions options) {
  MC_ASSIGN_OR_RETURN(std::vector<EtcdEndpoint> endpoints, ValidateEtcdOptions(options));

  std::shared_ptr<grpc::ChannelCredentials> tls;
  if (std::any_of(endpoints.begin(), endpoints.end(),
                  [](const EtcdEndpoint& e) { return e.tls; })) {
    grpc::SslCredentialsOptions ssl;
    if (!options.ca_file.empty()) {
      MC_ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadPemFile(options.ca_file, "ca_file"));
    }
    if (!options.cert_file.empty()) {
      MC_ASSIGN_OR_RETURN(ssl.pem_cert_chain, ReadPemFile(options.cert_file, "cert_file"));
      MC_ASSIGN_OR_RETURN(ssl.pem_private_key, ReadPemFile(options.key_file, "key_file"));
    }
    tls = grpc::SslCredentials(ssl);
  }
  const grpc::ChannelArguments args = MakeChannelArguments();
  std::vector<Member> members;
  for (EtcdEndpoint& e : endpoints) {
    Member m;
    m.channel =
        grpc::CreateCustomChannel(e.target, e.tls ? tls : grpc::InsecureChannelCredentials(), args);
    m.kv = etcdserverpb::KV::NewStub(m.channel);
    m.lease = etcdserverpb::Lease::NewStub(m.channel);
    m.watch = etcdserverpb::Watch::NewStub(m.channel);
    m.maintenance = etcdserverpb::Maintenance::NewStub(m.channel);
    m.address = std::move(e);
    members.push_back(std::move(m));
  }
  std::unique_ptr<EtcdClient> client(new EtcdClient(std::move(options), std::move(members)));

  // Ask every member in turn until one answers: a member that is starting
  // up (or restarting) gets the whole dial_timeout to come up. The first
  // round fails fast on a refused connection (and names the reason); later
  // rounds wait for the connection (wait_for_ready), which is also what
  // makes gRPC retry it, instead of failing at once on the last refusal.
  const size_t n = client->members_.size();
  const absl::Duration dial = client->options_.dial_timeout;
  const absl::Time deadline = absl::Now() + dial;
  // A member that hangs (accepts, never answers) must not eat the others' time.
  const absl::Duration slice = std::max(dial / static_cast<double>(n), absl::Milliseconds(200));
  std::vector<std::string> last_error(n, "no answer");
  for (bool first_round = true;; first_round = false) {
    for (size_t i = 0; i < n; ++i) {
      const absl::Time now = absl::Now();
      if (!first_round && now >= deadline) break;
      Member& m = client->members_[i];
      grpc::ClientContext ctx;
      ctx.set_wait_for_ready(!first_round);
      ctx.set_deadline(absl::ToChronoTime(
          std::max(std::min(deadline, now + slice), now + absl::Milliseconds(50))));
      etcdserverpb::StatusResponse response;
      grpc::Status s = m.maintenance->Status(&ctx, etcdserverpb::StatusRequest(), &response);
      if (s.ok()) {
        client->set_preferred(i);
        return client;
      }
      if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED &&
          m.channel->GetState(false) == GRPC_CHANNEL_TRANSIENT_FAILURE) {
        // The channel knows why it cannot connect; a probe that does not
        // wait returns that reason ("Connection refused", a TLS error).
        grpc::ClientContext why;
        why.set_deadline(absl::ToChronoTime(absl::Now() + absl::Milliseconds(100)));
        s = m.maintenance->Status(&why, etcdserverpb::StatusRequest(), &response);
        if (s.ok()) {
          client->set_preferred(i);
          return client;
        }
      }
      last_error[i] = GrpcErrorText(s);
    }
    if (absl::Now() >= deadline) break;
  }
  std::vector<std::string> tried;
  bool explained = false;
  for (size_t i = 0; i < n; ++i) {
    const EtcdEndpoint& e = client->members_[i].address;
    const std::string why = ExplainConnectFailure(e, client->options_, last_error[i]);
    explained = explained || !why.empty();
    tried.push_back(absl::StrCat(e.url, " (", why.empty() ? "" : absl::StrCat(why, "; gRPC: "),
                                 last_error[i], ")"));
  }
  return absl::UnavailableError(absl::StrCat(
      "etcd: no member answered Maintenance/Status within ", absl::FormatDuration(dial), ": ",
      absl::StrJoin(tried, "; "),
      explained ? ""
                : ". Check that etcd is running and that the endpoints are its client URLs "
                  "(etcd --advertise-client-urls)"));
}

absl::Status EtcdClient::AwaitConnection(Member& member, absl::Time deadline,
                                         const std::function<bool()>& stop) {
  grpc::Channel& channel = *member.channel;
  grpc_connectivity_state state = channel.GetState(/*try_to_connect=*/true);
  if (state == GRPC_CHANNEL_READY) return absl::OkStatus();
  const absl::Time start = absl::Now();
  // A channel already failing stays TRANSIENT_FAILURE through its next
  // attempts until one succeeds (gRPC's pick_first is "sticky"), so its
  // retries cannot be seen failing: give it time for one retry (the backoff
  // is at most 1 s) and no more.
  if (state == GRPC_CHANNEL_TRANSIENT_FAILURE) {
    deadline = std::min(deadline, start + kFailingChannelGrace);
  }
  bool changed = false;
  while (state != GRPC_CHANNEL_READY) {
    if (state == GRPC_CHANNEL_SHUTDOWN) return absl::UnavailableError("channel shut down");
    if (state == GRPC_CHANNEL_TRANSIENT_FAILURE && changed) break;
    if (stop && stop()) return absl::CancelledError("stopped");
    const absl::Time now = absl::Now();
    if (now >= deadline) break;
    const absl::Time until = stop ? std::min(deadline, now + absl::Milliseconds(100)) : deadline;
    if (channel.WaitForStateChange(state, absl::ToChronoTime(until))) changed = true;
    state = channel.GetState(/*try_to_connect=*/true);
  }
  if (state == GRPC_CHANNEL_READY) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(
      "cannot connect to ", member.address.target, " (",
      state != GRPC_CHANNEL_TRANSIENT_FAILURE
          ? absl::StrCat("no connection within ", absl::FormatDuration(absl::Trunc(
                                                      absl::Now() - start, absl::Milliseconds(1))))
      : member.address.tls ? "nothing listening, unreachable, or the TLS handshake failed"
                           : "nothing listening, or unreachable",
      ")"));
}

template <typename Response>
absl::StatusOr<Response> EtcdClient::Call(absl::string_view what, Repeat repeat, Rpc<Response> rpc,
                                          std::string* answered_by) {
  const absl::Time deadline = absl::Now() + options_.request_timeout;
  const size_t n = members_.size();
  const size_t first = preferred();
  std::vector<std::string> failures;
  for (size_t k = 0; k < n; ++k) {
    const size_t i = (first + k) % n;
    Member& m = members_[i];
    const absl::Time now = absl::Now();
    if (now >= deadline) break;
    // Connect first: a member that cannot be connected to was sent nothing,
    // so even a write may go to the next one.
    absl::Status reach = AwaitConnection(m, std::min(deadline, now + options_.dial_timeout));
    if (!reach.ok()) {
      failures.push_back(absl::StrCat(m.address.url, ": ", reach.message()));
      continue;
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(deadline));
    Response response;
    const grpc::Status s = rpc(m, &ctx, &response);
    if (s.ok()) {
      set_preferred(i);
      if (answered_by != nullptr) *answered_by = m.address.url;
      return response;
    }
    if (s.error_code() == grpc::StatusCode::UNAVAILABLE) {
      if (repeat == Repeat::kSafe) {
        failures.push_back(absl::StrCat(m.address.url, ": ", GrpcErrorText(s)));
        continue;
      }
      return absl::UnavailableError(absl::StrCat(
          "etcd ", what, " at ", m.address.url, ": ", GrpcErrorText(s),
          ". The request was sent before the failure, so it may have been applied: read "
          "back before repeating it"));
    }
    return absl::Status(FromGrpcCode(s),
                        absl::StrCat("etcd ", what, " at ", m.address.url, ": ", GrpcErrorText(s)));
  }
  if (failures.empty()) {
    return absl::DeadlineExceededError(absl::StrCat("etcd ", what, ": no answer within ",
                                                    absl::FormatDuration(options_.request_timeout),
                                                    " (request_timeout)"));
  }
  return absl::UnavailableError(absl::StrCat("etcd ", what, ": no member reachable (",
                                             absl::StrJoin(failures, "; "),
                                             "). Check that etcd is running there"));
}

absl::StatusOr<std::optional<KeyValue>> EtcdClient::Get(absl::string_view key) {
  const std::string what = DescribeKey("Get", key);
  MC_RETURN_IF_ERROR(CheckKey(what, key));
  etcdserverpb::RangeRequest request;
  FillRange(&request, key, false);
  MC_ASSIGN_OR_RETURN(etcdserverpb::RangeResponse response,
                      Call<etcdserverpb::RangeResponse>(
                          what, Repeat::kSafe, [&](Member& m, grpc::ClientContext* ctx, auto* out) {
                            return m.kv->Range(ctx, request, out);
                          }));
  if (response.kvs_size() == 0) return std::optional<KeyValue>();
  return std::optional<KeyValue>(FromProto(response.kvs(0)));
}

absl::StatusOr<RangeResult> EtcdClient::GetPrefix(absl::string_view prefix) {
  RangeResult result;
  MC_ASSIGN_OR_RETURN(result.revision,
                      ScanPrefix(prefix, [&](const KeyValue& kv) { result.kvs.push_back(kv); }));
  return result;
}

absl::StatusOr<int64_t> EtcdClient::ScanPrefix(absl::string_view prefix,
                                               const std::function<void(const KeyValue&)>& visit,
                                               size_t max_keys) {
  const std::string what = DescribeKey("GetPrefix", prefix);
  if (prefix.empty()) {
    return absl::InvalidArgumentError("etcd GetPrefix: the prefix is empty (that is every key)");
  }
  etcdserverpb::RangeRequest request;
  FillRange(&request, prefix, true);
  request.set_limit(kScanPageKeys);
  int64_t revision = 0;
  size_t seen = 0;
  while (true) {
    MC_ASSIGN_OR_RETURN(
        etcdserverpb::RangeResponse response,
        Call<etcdserverpb::RangeResponse>(what, Repeat::kSafe,
                                          [&](Member& m, grpc::ClientContext* ctx, auto* out) {
                                            return m.kv->Range(ctx, request, out);
                                          }));
    if (revision == 0) {
      // Later pages read the same revision: one consistent view.
      revision = response.header().revision();
      request.set_revision(revision);
    }
    for (const mvccpb::KeyValue& kv : response.kvs()) {
      if (++seen > max_keys) {
        return absl::ResourceExhaustedError(absl::StrCat(
            what, ": more than ", max_keys,
            " keys under the prefix; remove what does not belong there and limit who may write "
            "it (docs/cluster.md, RBAC)"));
      }
      visit(FromProto(kv));
    }
    if (!response.more() || response.kvs_size() == 0) break;
    // The next page starts just after the last key read.
    request.set_key(response.kvs(response.kvs_size() - 1).key() + std::string(1, '\0'));
  }
  return revision;
}

absl::StatusOr<int64_t> EtcdClient::Put(absl::string_view key, absl::string_view value,
                                        int64_t lease_id) {
  const std::string what =
      lease_id == 0 ? DescribeKey("Put", key)
                    : absl::StrCat(DescribeKey("Put", key), " with ", LeaseName(lease_id));
  MC_RETURN_IF_ERROR(CheckKey(what, key));
  etcdserverpb::PutRequest request;
  FillPut(&request, key, value, lease_id);
  MC_ASSIGN_OR_RETURN(
      etcdserverpb::PutResponse response,
      Call<etcdserverpb::PutResponse>(what, Repeat::kNotAfterSent,
                                      [&](Member& m, grpc::ClientContext* ctx, auto* out) {
                                        return m.kv->Put(ctx, request, out);
                                      }));
  return response.header().revision();
}

absl::StatusOr<int64_t> EtcdClient::Delete(absl::string_view key) {
  const std::string what = DescribeKey("Delete", key);
  MC_RETURN_IF_ERROR(CheckKey(what, key));
  etcdserverpb::DeleteRangeRequest request;
  FillDelete(&request, key, false);
  MC_ASSIGN_OR_RETURN(
      etcdserverpb::DeleteRangeResponse response,
      Call<etcdserverpb::DeleteRangeResponse>(what, Repeat::kNotAfterSent,
                                              [&](Member& m, grpc::ClientContext* ctx, auto* out) {
                                                return m.kv->DeleteRange(ctx, request, out);
                                              }));
  return response.deleted();
}

absl::StatusOr<int64_t> EtcdClient::DeletePrefix(absl::string_view prefix) {
  const std::string what = DescribeKey("DeletePrefix", prefix);
  if (prefix.empty()) {
    return absl::InvalidArgumentError(
        "etcd DeletePrefix: the prefix is empty (that would delete every key)");
  }
  etcdserverpb::DeleteRangeRequest request;
  FillDelete(&request, prefix, true);
  MC_ASSIGN_OR_RETURN(
      etcdserverpb::DeleteRangeResponse response,
      Call<etcdserverpb::DeleteRangeResponse>(what, Repeat::kNotAfterSent,
                                              [&](Member& m, grpc::ClientContext* ctx, auto* out) {
                                                return m.kv->DeleteRange(ctx, request, out);
                                              }));
  return response.deleted();
}

absl::StatusOr<TxnResult> EtcdClient::Commit(const Txn& txn) {
  const etcdserverpb::TxnRequest& request = txn.request();
  std::string what = "Txn";
  if (request.compare_size() > 0) {
    absl::StrAppend(&what, " on '", EscapeForDisplay(request.compare(0).key(), 120), "'");
  } else if (request.success_size() > 0) {
    const etcdserverpb::RequestOp& op = request.success(0);
    const std::string& key = op.has_request_put()            ? op.request_put().key()
                             : op.has_request_delete_range() ? op.request_delete_range().key()
                                                             : op.request_range().key();
    absl::StrAppend(&what, " on '", EscapeForDisplay(key, 120), "'");
  }
  MC_ASSIGN_OR_RETURN(
      etcdserverpb::TxnResponse response,
      Call<etcdserverpb::TxnResponse>(what, txn.read_only() ? Repeat::kSafe : Repeat::kNotAfterSent,
                                      [&](Member& m, grpc::ClientContext* ctx, auto* out) {
                                        return m.kv->Txn(ctx, request, out);
                                      }));
  TxnResult result;
  result.succeeded = response.succeeded();
  result.revision = response.header().revision();
  for (const etcdserverpb::ResponseOp& op : response.responses()) {
    TxnOpResult r;
    if (op.has_response_put()) {
      r.kind = TxnOpResult::Kind::kPut;
    } else if (op.has_response_delete_range()) {
      r.kind = TxnOpResult::Kind::kDelete;
      r.deleted = op.response_delete_range().deleted();
    } else {
      r.kind = TxnOpResult::Kind::kGet;
      for (const mvccpb::KeyValue& kv : op.response_range().kvs()) r.kvs.push_back(FromProto(kv));
    }
    result.responses.push_back(std::move(r));
  }
  return result;
}

absl::StatusOr<bool> EtcdClient::CreateIfAbsent(absl::string_view key, absl::string_view value,
                                                int64_t lease_id) {
  MC_RETURN_IF_ERROR(CheckKey(DescribeKey("CreateIfAbsent", key), key));
  Txn txn;
  txn.IfCreateRevision(key, CompareOp::kEqual, 0).ThenPut(key, value, lease_id);
  MC_ASSIGN_OR_RETURN(TxnResult result, Commit(txn));
  return result.succeeded;
}

absl::StatusOr<bool> EtcdClient::CompareAndSwap(absl::string_view key,
                                                int64_t expected_mod_revision,
                                                absl::string_view value, int64_t lease_id) {
  MC_RETURN_IF_ERROR(CheckKey(DescribeKey("CompareAndSwap", key), key));
  Txn txn;
  txn.IfModRevision(key, CompareOp::kEqual, expected_mod_revision).ThenPut(key, value, lease_id);
  MC_ASSIGN_OR_RETURN(TxnResult result, Commit(txn));
  return result.succeeded;
}

absl::StatusOr<Lease> EtcdClient::GrantLease(int64_t ttl_seconds) {
  if (ttl_seconds < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("etcd LeaseGrant: TTL ", ttl_seconds, " s; it must be at least 1 s"));
  }
  etcdserverpb::LeaseGrantRequest request;
  request.set_ttl(ttl_seconds);
  const absl::Time requested_at = absl::Now();
  MC_ASSIGN_OR_RETURN(etcdserverpb::LeaseGrantResponse response,
                      Call<etcdserverpb::LeaseGrantResponse>(
                          // Repeating is harmless: a lease granted by a lost attempt has no
                          // keys and expires after its TTL.
                          absl::StrCat("LeaseGrant(", ttl_seconds, " s)"), Repeat::kSafe,
                          [&](Member& m, grpc::ClientContext* ctx, auto* out) {
                            return m.lease->LeaseGrant(ctx, request, out);
                          }));
  if (!response.error().empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("etcd LeaseGrant(", ttl_seconds, " s): ", response.error()));
  }
  Lease lease;
  lease.id = response.id();
  lease.ttl_seconds = response.ttl();
  lease.granted_at = requested_at;
  return lease;
}

absl::Status EtcdClient::RevokeLease(int64_t lease_id) {
  etcdserverpb::LeaseRevokeRequest request;
  request.set_id(lease_id);
  return Call<etcdserverpb::LeaseRevokeResponse>(
             absl::StrCat("LeaseRevoke(", LeaseName(lease_id), ")"), Repeat::kNotAfterSent,
             [&](Member& m, grpc::ClientContext* ctx, auto* out) {
               return m.lease->LeaseRevoke(ctx, request, out);
             })
      .status();
}

absl::StatusOr<LeaseInfo> EtcdClient::LeaseTimeToLive(int64_t lease_id, bool with_keys) {
  etcdserverpb::LeaseTimeToLiveRequest request;
  request.set_id(lease_id);
  request.set_keys(with_keys);
  const std::string what = absl::StrCat("LeaseTimeToLive(", LeaseName(lease_id), ")");
  MC_ASSIGN_OR_RETURN(etcdserverpb::LeaseTimeToLiveResponse response,
                      Call<etcdserverpb::LeaseTimeToLiveResponse>(
                          what, Repeat::kSafe, [&](Member& m, grpc::ClientContext* ctx, auto* out) {
                            return m.lease->LeaseTimeToLive(ctx, request, out);
                          }));
  if (response.ttl() < 0) {
    return absl::NotFoundError(
        absl::StrCat("etcd ", what, ": no such lease (expired, revoked or never granted)"));
  }
  LeaseInfo info;
  info.id = response.id();
  info.ttl_seconds = response.ttl();
  info.granted_ttl_seconds = response.grantedttl();
  for (const std::string& k : response.keys()) info.keys.push_back(k);
  return info;
}

absl::StatusOr<EtcdStatus> EtcdClient::Status() {
  std::string answered_by;
  MC_ASSIGN_OR_RETURN(etcdserverpb::StatusResponse response,
                      Call<etcdserverpb::StatusResponse>(
                          "Maintenance/Status", Repeat::kSafe,
                          [&](Member& m, grpc::ClientContext* ctx, auto* out) {
                            return m.maintenance->Status(ctx, etcdserverpb::StatusRequest(), out);
                          },
                          &answered_by));
  EtcdStatus status;
  status.endpoint = answered_by;
  status.version = response.version();
  status.cluster_id = response.header().cluster_id();
  status.member_id = response.header().member_id();
  status.leader = response.leader();
  status.raft_term = response.raftterm();
  status.revision = response.header().revision();
  status.db_size = response.dbsize();
  for (const std::string& e : response.errors()) status.errors.push_back(e);
  return status;
}

absl::Status EtcdClient::Compact(int64_t revision) {
  etcdserverpb::CompactionRequest request;
  request.set_revision(revision);
  request.set_physical(true);
  return Call<etcdserverpb::CompactionResponse>(
             absl::StrCat("Compact(", revision, ")"), Repeat::kSafe,
             [&](Member& m, grpc::ClientContext* ctx, auto* out) {
               return m.kv->Compact(ctx, request, out);
             })
      .status();
}

std::string EtcdClient::preferred_endpoint() const { return members_[preferred()].address.url; }

}  // namespace mooncake::daemon::etcd
