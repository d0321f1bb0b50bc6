// Watcher: follows every change under a key prefix, from a revision on,
// across connection losses, and hands the changes to a callback on its own
// thread. Membership uses it to see nodes and ranks join and vanish (a key
// whose lease expired arrives as a kDelete).
//
//   absl::StatusOr<RangeResult> now = etcd->GetPrefix("/mc/nodes/");
//   absl::StatusOr<std::unique_ptr<Watcher>> w = Watcher::Start(
//       etcd.get(), "/mc/nodes/", now->revision + 1,
//       [](const std::vector<WatchEvent>& events) { ... },
//       [](const absl::Status& error) { ... });  // then the watcher has stopped
//
// Order and gaps. Events come in revision order, each once, batched as etcd
// sends them (all changes of one Txn come in one batch). When the stream
// breaks (a member restarts, the connection drops), the watcher reconnects
// (the next endpoint, backing off 100 ms .. 1 s) and resumes from the last
// delivered revision + 1, so nothing is lost or repeated and nothing is
// reported: a loss only delays events. A start revision that etcd has
// compacted away cannot be resumed without a gap: on_error gets OutOfRange
// (naming the oldest revision left) and the watcher stops; re-read the
// prefix and start a new watcher. A watch the server cancels for another
// reason is reported the same way (FailedPrecondition).
//
// Callbacks run on the watcher's thread, one at a time; they may call
// Cancel() but must not destroy the watcher. The EtcdClient is not owned and
// must outlive the watcher. Thread-safe.
#pragma once

#include <grpcpp/client_context.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "etcd/etcd_client.h"

namespace mooncake::daemon::etcd {

struct WatchEvent {
  enum class Type { kPut, kDelete };
  Type type = Type::kPut;
  // kPut: the key as written. kDelete: the key, its value empty, and
  // mod_revision the revision of the deletion (an expired lease included).
  KeyValue kv;
};

class Watcher {
 public:
  using EventsCallback = std::function<void(const std::vector<WatchEvent>& events)>;
  using ErrorCallback = std::function<void(const absl::Status& error)>;

  // Watches every key starting with `prefix` (non-empty) from
  // `start_revision` (inclusive; 0: changes after the watch is set up).
  // Returns once etcd has set up the watch, so every change committed after
  // Start returns is delivered. Unavailable: no member reachable;
  // DeadlineExceeded: none answered within request_timeout.
  static absl::StatusOr<std::unique_ptr<Watcher>> Start(EtcdClient* client, std::string prefix,
                                                        int64_t start_revision,
                                                        EventsCallback on_events,
                                                        ErrorCallback on_error);
  // Cancel().
  ~Watcher();
  Watcher(const Watcher&) = delete;
  Watcher& operator=(const Watcher&) = delete;

  // Stops watching and joins the thread (unless called from a callback);
  // no callback runs after it returns. Idempotent.
  void Cancel();

  // The revision the watch continues from: the last delivered + 1.
  int64_t next_revision() const;
  // How many times it tried to open the stream again after a loss.
  int64_t reconnects() const;

 private:
  Watcher(EtcdClient* client, std::string prefix, int64_t start_revision, EventsCallback on_events,
          ErrorCallback on_error);
  void Run();
  void SetStarted(absl::Status status);

  EtcdClient* const client_;
  const std::string prefix_;
  const EventsCallback on_events_;
  const ErrorCallback on_error_;

  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status start_status_ ABSL_GUARDED_BY(mu_);
  int64_t next_revision_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t reconnects_ ABSL_GUARDED_BY(mu_) = 0;
  std::shared_ptr<grpc::ClientContext> ctx_ ABSL_GUARDED_BY(mu_);  // of the open stream
  absl::Mutex join_mu_;
  std::thread thread_;
};

}  // namespace mooncake::daemon::etcd
