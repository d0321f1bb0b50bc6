// EtcdClient: the daemon's client for etcd's v3 gRPC API (KV, Txn, leases,
// member status). Cross-node membership (issue 9) is built on it: a daemon
// registers its node under a lease kept alive by a LeaseKeeper
// (etcd_lease.h), publishes group members with that lease, agrees on ranks
// with a Txn, and follows joins and losses with a Watcher (etcd_watch.h).
//
//   absl::StatusOr<EtcdOptions> options = ParseEtcdEndpoints("http://127.0.0.1:2379");
//   absl::StatusOr<std::unique_ptr<EtcdClient>> etcd = EtcdClient::Connect(*options);
//   if (!etcd.ok()) return etcd.status();  // Unavailable: names every endpoint tried
//   absl::StatusOr<Lease> lease = (*etcd)->GrantLease(5);
//   absl::StatusOr<bool> won = (*etcd)->CreateIfAbsent("/mc/g/rank/0", "node-a", lease->id);
//
// Keys and values are bytes (std::string may hold any byte). Every request
// has a deadline (EtcdOptions::request_timeout) and errors carry the etcd
// status code (absl and gRPC codes are the same numbers) with a message
// that names the call, the key and the endpoint: NotFound for an unknown
// lease, OutOfRange for a compacted revision, InvalidArgument for a request
// etcd refuses, Unavailable when no member can be reached.
//
// Failover. One gRPC channel per endpoint. A request goes to the endpoint
// that answered last; when that endpoint cannot be connected to (refused,
// unreachable, or no connection within dial_timeout; a channel that is
// already failing gets one retry, about 1.5 s) the request moves on to the
// next one, each endpoint once, because nothing was sent. When a request
// was sent and then failed with UNAVAILABLE (the connection broke):
//   - reads (Get, GetPrefix, read-only Txn, Status, LeaseTimeToLive) and
//     LeaseGrant move on to the next endpoint: repeating them is harmless
//     (a lease granted by a lost attempt just expires);
//   - writes (Put, Delete, a Txn that writes, RevokeLease) are NOT repeated: the
//     member may have applied them, and a repeated Put would make a second
//     revision (and fire watches twice). The error says so; the caller reads
//     back (or uses a Txn that is safe to repeat, as CreateIfAbsent is) and
//     decides.
// A request that hangs (a member that accepts connections but does not
// answer) ends with DeadlineExceeded and is not moved on.
//
// Thread-safe: any number of threads may call any method at once.
#pragma once

#include <grpcpp/channel.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "etcd/etcd_options.h"
#include "etcdserverpb/rpc.grpc.pb.h"
#include "etcdserverpb/rpc.pb.h"

namespace mooncake::daemon::etcd {

// One key as stored.
struct KeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;  // revision that created it
  int64_t mod_revision = 0;     // revision of its last change (use for compare-and-swap)
  int64_t version = 0;          // number of changes since creation, from 1
  int64_t lease = 0;            // attached lease; 0: none
};

struct RangeResult {
  std::vector<KeyValue> kvs;  // in key order
  // The store's revision the read saw: watch from revision + 1 to get
  // every later change without a gap.
  int64_t revision = 0;
};

// A granted lease.
struct Lease {
  int64_t id = 0;
  int64_t ttl_seconds = 0;  // the TTL the server granted (it may raise small ones)
  // Local time just before the grant was requested, so granted_at + TTL is
  // a conservative expiry. InfinitePast when unknown.
  absl::Time granted_at = absl::InfinitePast();
};

struct LeaseInfo {
  int64_t id = 0;
  int64_t ttl_seconds = 0;          // remaining
  int64_t granted_ttl_seconds = 0;  // at grant or last refresh
  std::vector<std::string> keys;    // keys attached to it
};

// Maintenance/Status of the member that answered.
struct EtcdStatus {
  std::string endpoint;  // the URL that answered
  std::string version;   // the server's version, "3.4.23"
  uint64_t cluster_id = 0;
  uint64_t member_id = 0;
  uint64_t leader = 0;  // member id of the leader; 0: no leader
  uint64_t raft_term = 0;
  int64_t revision = 0;
  int64_t db_size = 0;
  std::vector<std::string> errors;  // alarms, as the member reports them
};

enum class CompareOp { kEqual, kNotEqual, kLess, kGreater };

// A transaction: if every compare holds, the Then ops run, else the Else
// ops; atomically, at one revision. A compare on a key that does not exist
// sees version, create_revision, mod_revision and lease as 0 (and a value
// compare on it is false), so IfCreateRevision(k, kEqual, 0) means "k is
// absent". etcd refuses a Txn that changes one key twice in a branch.
//
//   Txn txn;
//   txn.IfModRevision("/k", CompareOp::kEqual, seen.mod_revision)
//      .ThenPut("/k", "new")
//      .ElseGet("/k");
//   absl::StatusOr<TxnResult> r = client->Commit(txn);
//
// A value type; not thread-safe itself (build it on one thread).
class Txn {
 public:
  Txn& IfValue(absl::string_view key, CompareOp op, absl::string_view value);
  Txn& IfVersion(absl::string_view key, CompareOp op, int64_t version);
  Txn& IfCreateRevision(absl::string_view key, CompareOp op, int64_t revision);
  Txn& IfModRevision(absl::string_view key, CompareOp op, int64_t revision);
  Txn& IfLease(absl::string_view key, CompareOp op, int64_t lease_id);
  // No key starts with `prefix` (non-empty): one compare over the prefix's
  // range, so "the last one out" can be decided atomically.
  Txn& IfNoKeyWithPrefix(absl::string_view prefix);

  Txn& ThenPut(absl::string_view key, absl::string_view value, int64_t lease_id = 0);
  Txn& ThenDelete(absl::string_view key);
  Txn& ThenDeletePrefix(absl::string_view prefix);
  Txn& ThenGet(absl::string_view key);
  Txn& ThenGetPrefix(absl::string_view prefix);

  Txn& ElsePut(absl::string_view key, absl::string_view value, int64_t lease_id = 0);
  Txn& ElseDelete(absl::string_view key);
  Txn& ElseDeletePrefix(absl::string_view prefix);
  Txn& ElseGet(absl::string_view key);
  Txn& ElseGetPrefix(absl::string_view prefix);

  // Whether no op writes (then a failed request may be repeated elsewhere).
  bool read_only() const;
  const etcdserverpb::TxnRequest& request() const { return request_; }

 private:
  etcdserverpb::Compare* AddCompare(absl::string_view key, CompareOp op);
  etcdserverpb::TxnRequest request_;
};

// The result of one Then/Else op, in the order the ops were added.
struct TxnOpResult {
  enum class Kind { kGet, kPut, kDelete };
  Kind kind = Kind::kGet;
  std::vector<KeyValue> kvs;  // kGet: the keys read
  int64_t deleted = 0;        // kDelete: how many keys went
};

struct TxnResult {
  bool succeeded = false;  // the compares held: the Then ops ran
  int64_t revision = 0;    // the store's revision after the Txn
  std::vector<TxnOpResult> responses;
};

class EtcdClient {
 public:
  // Validates `options`, reads the TLS files, opens a channel per endpoint
  // and waits until one member answers Maintenance/Status, for at most
  // dial_timeout. InvalidArgument: a bad endpoint or option; NotFound /
  // PermissionDenied: a TLS file; Unavailable: no member answered, the
  // message naming each endpoint and why.
  static absl::StatusOr<std::unique_ptr<EtcdClient>> Connect(EtcdOptions options);
  ~EtcdClient();
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  // The key, or nullopt when it does not exist.
  absl::StatusOr<std::optional<KeyValue>> Get(absl::string_view key);
  // Every key starting with `prefix` (non-empty), in key order, with the
  // revision of the read (ScanPrefix, collected).
  absl::StatusOr<RangeResult> GetPrefix(absl::string_view prefix);
  // Reads the keys under `prefix` (non-empty) in key order, kScanPageKeys a
  // response, every page at the revision of the first (one consistent
  // view), and hands each to `visit`; returns that revision. Whoever can
  // write the prefix decides how much is there (issue 23 item 2): pages
  // keep each response under gRPC's message limit, `visit` keeps only what
  // it needs, and past `max_keys` keys the read stops with
  // ResourceExhausted naming the prefix.
  static constexpr int64_t kScanPageKeys = 1000;
  static constexpr size_t kDefaultMaxScanKeys = 1000000;
  absl::StatusOr<int64_t> ScanPrefix(absl::string_view prefix,
                                     const std::function<void(const KeyValue&)>& visit,
                                     size_t max_keys = kDefaultMaxScanKeys);
  // Writes `value` (attached to `lease_id` unless 0); returns the new
  // revision. NotFound: the lease does not exist (any more).
  absl::StatusOr<int64_t> Put(absl::string_view key, absl::string_view value, int64_t lease_id = 0);
  // Deletes `key` / every key under `prefix` (non-empty); returns how many.
  absl::StatusOr<int64_t> Delete(absl::string_view key);
  absl::StatusOr<int64_t> DeletePrefix(absl::string_view prefix);

  absl::StatusOr<TxnResult> Commit(const Txn& txn);
  // Creates `key` only if it does not exist; true when this call created
  // it. Safe to repeat after an ambiguous failure: compare the value read
  // back with yours to know whether the first attempt won.
  absl::StatusOr<bool> CreateIfAbsent(absl::string_view key, absl::string_view value,
                                      int64_t lease_id = 0);
  // Writes `key` only if its mod_revision is still `expected_mod_revision`
  // (0: only if absent); true when written.
  absl::StatusOr<bool> CompareAndSwap(absl::string_view key, int64_t expected_mod_revision,
                                      absl::string_view value, int64_t lease_id = 0);

  // A lease of `ttl_seconds` (>= 1; the server may raise it to its minimum,
  // about 2 s with default settings). Keys put with it go when it expires
  // or is revoked.
  absl::StatusOr<Lease> GrantLease(int64_t ttl_seconds);
  // Revokes the lease and deletes its keys. NotFound: no such lease.
  absl::Status RevokeLease(int64_t lease_id);
  // NotFound: no such lease (never granted, expired or revoked).
  absl::StatusOr<LeaseInfo> LeaseTimeToLive(int64_t lease_id, bool with_keys = false);

  absl::StatusOr<EtcdStatus> Status();
  // Compacts the history up to `revision` (watches from before it then
  // fail with OutOfRange). For maintenance and tests.
  absl::Status Compact(int64_t revision);

  const EtcdOptions& options() const { return options_; }
  // The endpoint requests go to first (the one that answered last).
  std::string preferred_endpoint() const;

 private:
  friend class LeaseKeeper;
  friend class Watcher;

  struct Member {
    EtcdEndpoint address;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<etcdserverpb::KV::Stub> kv;
    std::unique_ptr<etcdserverpb::Lease::Stub> lease;
    std::unique_ptr<etcdserverpb::Watch::Stub> watch;
    std::unique_ptr<etcdserverpb::Maintenance::Stub> maintenance;
  };
  // Whether a request that failed after it was sent may go to another member.
  enum class Repeat { kSafe, kNotAfterSent };
  template <typename Response>
  using Rpc = absl::FunctionRef<grpc::Status(Member&, grpc::ClientContext*, Response*)>;

  EtcdClient(EtcdOptions options, std::vector<Member> members);
  template <typename Response>
  absl::StatusOr<Response> Call(absl::string_view what, Repeat repeat, Rpc<Response> rpc,
                                std::string* answered_by = nullptr);
  // Waits (until `deadline`) for the member's channel to be connected, long
  // enough for one fresh connection attempt; Unavailable with the reason
  // otherwise. `stop`, when given, is polled every 100 ms and ends the wait
  // (Cancelled). Waiting on the channel is also what drives its connection
  // attempts: gRPC makes progress on a connection only while someone polls.
  static absl::Status AwaitConnection(Member& member, absl::Time deadline,
                                      const std::function<bool()>& stop = nullptr);

  // For LeaseKeeper and Watcher: members by index, the preferred one, and
  // marking one preferred after it answered.
  size_t member_count() const { return members_.size(); }
  Member& member(size_t i) { return members_[i]; }
  size_t preferred() const { return preferred_.load(std::memory_order_relaxed); }
  void set_preferred(size_t i) { preferred_.store(i, std::memory_order_relaxed); }

  const EtcdOptions options_;
  std::vector<Member> members_;
  std::atomic<size_t> preferred_{0};
};

// "what 'key'" for messages: the key made printable and shortened.
std::string DescribeKey(absl::string_view what, absl::string_view key);

}  // namespace mooncake::daemon::etcd
