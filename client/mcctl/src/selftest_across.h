// `mcctl selftest rdma --across`: how one rank reads the other's memory
// back across nodes, where it cannot look at it. Both ranks hold the
// symmetric selftest buffer (selftest_rdma.h); on one queue pair, whose
// WRITEs the responder places in order:
//
//   asker     WRITE {offset, length} to the other's kRequestOff, then the
//             request's number (1, 2, ...) to its kRequestSeqOff
//   answerer  sees the number move, WRITEs the `length` bytes at `offset`
//             of its own buffer to the asker's kReadbackOff, then the
//             number to the asker's kReplySeqOff (with kRefused set, and
//             no bytes, for a range outside the buffer or over
//             kMaxReadBytes)
//
// A request of length kTurnOver reads nothing: the asker is done, and the
// answerer returns from ServeUntilHandOver() (to take its turn, or to end).
// Internal to mcctl (client/mcctl/src).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "mooncake/client/communicator.h"
#include "mooncake/device/ibgda_qp.h"
#include "mooncake/device/types_device.h"

namespace mooncake::mcctl::selftest {

inline constexpr uint64_t kTurnOver = ~uint64_t{0};
inline constexpr uint64_t kRefused = uint64_t{1} << 63;

// A post's or a wait's failure in words, with the queue pair's cause
// (qp_error.h) when it failed (shared by every selftest step).
std::string QpFailure(device::McStatus status, const device::IbgdaQpDevCtx* qp);

// Whether [offset, offset + length) is a range the answerer sends back.
bool ReadableRange(uint64_t offset, uint64_t length);

// How long one rank waits for the other once the pair has formed (unless
// the session's events say first that the other left or was lost): for the
// answer to a read, and between two requests (which spans one of the
// other's steps: 295 MB of WRITEs, or 70 000 WQEs). Apart from the
// rendezvous window (--timeout-ms), so a short window does not cut off a
// slow link, which is what the selftest is run to diagnose.
// $MOONCAKE_SELFTEST_PATIENCE_MS (1 ms to 1 h) changes it: a fabric slower
// than 295 MB in 2 minutes, or a test that stalls a rank on purpose.
inline constexpr absl::Duration kPatience = absl::Minutes(2);
inline constexpr char kPatienceEnv[] = "MOONCAKE_SELFTEST_PATIENCE_MS";
// kPatience, or what kPatienceEnv says when it holds a valid number.
absl::Duration Patience();

// Whether rank `peer` is gone, from this session's events: it left the
// group or was lost with its node (Aborted), or this node's daemon went
// away (FailedPrecondition). Once known it stays known: the event is read
// once, and every later wait ends at once. Shared by the reader and the
// answerer of one rank.
class PeerWatch {
 public:
  PeerWatch(Communicator* self, uint32_t peer) : self_(self), peer_(peer) {}
  // OK while nothing says the peer is gone.
  absl::Status Gone();
  // Gone(), waiting up to `wait` for an event: a peer that died fails a
  // queue pair a moment before its session's LOST arrives here.
  absl::Status GoneWithin(absl::Duration wait);

 private:
  Communicator* self_;
  uint32_t peer_;
  absl::Status gone_;
};

// The asker's side, over channel 0 toward `peer`.
class PeerReader {
 public:
  PeerReader(Communicator* self, uint32_t peer, absl::Duration patience, PeerWatch* watch)
      : self_(self), peer_(peer), patience_(patience), watch_(watch) {}
  // The peer's bytes at [offset, offset + length), as they are once
  // everything this rank completed toward it has landed. DeadlineExceeded
  // when it does not answer within the patience, InvalidArgument when it
  // refuses, Unavailable (the queue pair's failure) when the request
  // cannot be posted. After a request that was not answered or not
  // posted, every later call returns that status and posts nothing: a
  // request is never overwritten while the peer may still read it.
  absl::StatusOr<std::string> Read(uint64_t offset, uint64_t length);
  // Tells the peer this rank asks nothing more (kTurnOver) for now.
  absl::Status HandOver();
  // Whether this rank asks nothing more (after a read or hand-over failed).
  bool stopped() const { return !stopped_.ok(); }

 private:
  absl::Status Post(uint64_t offset, uint64_t length);

  Communicator* self_;
  uint32_t peer_;
  absl::Duration patience_;
  PeerWatch* watch_;
  uint64_t seq_ = 0;
  absl::Status stopped_;  // not OK once this rank asks nothing more
};

// The answerer's side, over channel 0 toward `peer`.
class PeerAnswerer {
 public:
  PeerAnswerer(Communicator* self, uint32_t peer, absl::Duration patience, PeerWatch* watch)
      : self_(self), peer_(peer), patience_(patience), watch_(watch) {}
  // Serves the peer's reads until it hands over. Each wait for the next
  // request gives up after the patience (DeadlineExceeded, naming it).
  // Called again, it goes on from the last request seen.
  absl::Status ServeUntilHandOver();
  // Reads answered so far.
  uint64_t served() const { return served_; }

 private:
  Communicator* self_;
  uint32_t peer_;
  absl::Duration patience_;
  PeerWatch* watch_;
  // The last request number seen; the buffer starts zeroed, so the first
  // is 1 whenever it comes.
  uint64_t last_ = 0;
  uint64_t served_ = 0;
};

}  // namespace mooncake::mcctl::selftest
