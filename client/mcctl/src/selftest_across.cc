#include "selftest_across.h"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "mooncake/device/comm_device.h"
#include "mooncake/device/qp_error.h"
#include "mooncake/mcctl/selftest_rdma.h"

namespace mooncake::mcctl::selftest {
namespace {

using device::McPeer;
using device::McStatus;

template <class T>
T* At(Communicator* c, uint64_t off) {
  return reinterpret_cast<T*>(static_cast<uint8_t*>(c->buffer()) + off);
}

// Words the other rank's NIC writes while this thread looks.
uint64_t Load(Communicator* c, uint64_t off) {
  return std::atomic_ref<uint64_t>(*At<uint64_t>(c, off)).load(std::memory_order_acquire);
}

// Waits until `done()`: OK; DeadlineExceeded (`what`) once `patience` has
// passed; the watch's status as soon as it says the peer is gone. Spins a
// little, then sleeps in short steps (a WRITE from another node takes
// microseconds; the other rank's whole step may take seconds), looking at
// the session's events every 50 ms.
template <class Done>
absl::Status WaitFor(PeerWatch* watch, Done done, absl::Duration patience,
                     const std::string& what) {
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + absl::ToChronoNanoseconds(patience);
  auto next_look = start;
  for (int spins = 0; !done(); ++spins) {
    const auto now = std::chrono::steady_clock::now();
    if (now > deadline) return absl::DeadlineExceededError(what);
    if (now >= next_look) {
      if (absl::Status gone = watch->Gone(); !gone.ok()) {
        // The other rank may have answered just before it went.
        return done() ? absl::OkStatus() : gone;
      }
      next_look = now + std::chrono::milliseconds(50);
    }
    if (spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  return absl::OkStatus();
}

std::string StatusName(McStatus s) {
  switch (s) {
    case McStatus::kOk: return "ok";
    case McStatus::kRdmaError: return "an error completion";
    case McStatus::kTimedOut: return "no completion within the queue pair's timeout";
    case McStatus::kNoRoute: return "no route";
    case McStatus::kNotRegistered: return "source not registered";
    default: return absl::StrCat("status ", static_cast<int>(s));
  }
}

}  // namespace

std::string QpFailure(McStatus status, const device::IbgdaQpDevCtx* qp) {
  std::string out = StatusName(status);
  if (status != McStatus::kOk && qp != nullptr && qp->error != 0) {
    absl::StrAppend(&out, " (", device::DescribeQpError(qp->error), ")");
  }
  return out;
}

absl::Status PeerWatch::Gone() {
  while (gone_.ok()) {
    std::optional<SessionEvent> ev = self_->client().nextEvent(absl::ZeroDuration());
    if (!ev) break;
    using Kind = SessionEvent::Kind;
    if ((ev->kind == Kind::kLeft || ev->kind == Kind::kLost) && ev->rank == peer_) {
      gone_ = absl::AbortedError(absl::StrCat("rank ", peer_, " ",
                                              ev->kind == Kind::kLeft ? "left" : "was lost",
                                              ev->detail.empty() ? "" : ": ", ev->detail));
    } else if (ev->kind == Kind::kDaemonShutdown || ev->kind == Kind::kDisconnected) {
      gone_ = absl::FailedPreconditionError(absl::StrCat(
          "this node's mooncaked went away", ev->detail.empty() ? "" : ": ", ev->detail));
    }
    // Events about other ranks, and READY, are passed over.
  }
  return gone_;
}

absl::Status PeerWatch::GoneWithin(absl::Duration wait) {
  const auto deadline = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(wait);
  absl::Status gone = Gone();
  while (gone.ok() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    gone = Gone();
  }
  return gone;
}

absl::Duration Patience() {
  const char* env = std::getenv(kPatienceEnv);
  int ms = 0;
  if (env != nullptr && absl::SimpleAtoi(env, &ms) && ms >= 1 && ms <= 3600 * 1000) {
    return absl::Milliseconds(ms);
  }
  return kPatience;
}

bool ReadableRange(uint64_t offset, uint64_t length) {
  return length != 0 && length <= kMaxReadBytes && offset <= kBufferBytes &&
         length <= kBufferBytes - offset;
}

absl::Status PeerReader::Post(uint64_t offset, uint64_t length) {
  const McPeer peer = device::mc_peer(self_->ctx(), static_cast<int>(peer_));
  const uint64_t request[2] = {offset, length};
  ++seq_;
  // Both inline (at most 28 bytes each): the source is copied at once.
  McStatus st = device::mc_put_thread(peer, At<void>(self_, kRequestOff), request, sizeof(request));
  if (st == McStatus::kOk) {
    st = device::mc_put_thread(peer, At<void>(self_, kRequestSeqOff), &seq_, sizeof(seq_));
  }
  // This queue pair only: the bad key leaves channel 1 in error before the
  // last hand-over.
  if (st == McStatus::kOk) st = device::mc_qp_quiet(peer.qp);
  if (st != McStatus::kOk) {
    return absl::UnavailableError(absl::StrCat("asking the other rank: ", QpFailure(st, peer.qp)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> PeerReader::Read(uint64_t offset, uint64_t length) {
  if (!ReadableRange(offset, length)) {
    return absl::InvalidArgumentError(absl::StrCat("no read of ", length, " bytes at ", offset));
  }
  if (!stopped_.ok()) return stopped_;
  if (absl::Status s = Post(offset, length); !s.ok()) return stopped_ = s;
  uint64_t reply = 0;
  const absl::Status answered = WaitFor(
      watch_,
      [&] {
        reply = Load(self_, kReplySeqOff);
        return (reply & ~kRefused) == seq_;
      },
      patience_,
      absl::StrCat("rank ", peer_, " did not send its memory back within ",
                   absl::FormatDuration(patience_), " (its own report says why)"));
  if (!answered.ok()) {
    // No request may overwrite this one while the other rank could still
    // be reading it: this rank asks nothing more.
    return stopped_ = answered;
  }
  if ((reply & kRefused) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", peer_, " refused to send ", length, " bytes at ", offset));
  }
  return std::string(At<const char>(self_, kReadbackOff), length);
}

absl::Status PeerReader::HandOver() {
  if (!stopped_.ok()) return stopped_;
  return stopped_ = Post(0, kTurnOver);
}

absl::Status PeerAnswerer::ServeUntilHandOver() {
  const McPeer peer = device::mc_peer(self_->ctx(), static_cast<int>(peer_));
  for (;;) {
    uint64_t seq = last_;
    const absl::Status asked = WaitFor(
        watch_,
        [&] {
          seq = Load(self_, kRequestSeqOff);
          return seq != last_;
        },
        patience_,
        absl::StrCat("rank ", peer_, " asked nothing for ", absl::FormatDuration(patience_),
                     " (its own report says why)"));
    if (!asked.ok()) return asked;
    last_ = seq;
    // Written before the number, on the same queue pair: in place now. (An
    // asker writes no request before the last one's answer, or stops
    // asking: PeerReader.)
    const uint64_t offset = Load(self_, kRequestOff);
    const uint64_t length = Load(self_, kRequestOff + 8);
    if (length == kTurnOver) return absl::OkStatus();
    uint64_t reply = seq;
    McStatus st = McStatus::kOk;
    if (ReadableRange(offset, length)) {
      st = device::mc_put_thread(peer, At<void>(self_, kReadbackOff), At<const void>(self_, offset),
                                 length);
    } else {
      reply |= kRefused;
    }
    if (st == McStatus::kOk) {
      st = device::mc_put_thread(peer, At<void>(self_, kReplySeqOff), &reply, sizeof(reply));
    }
    if (st == McStatus::kOk) st = device::mc_qp_quiet(peer.qp);
    if (st != McStatus::kOk) {
      return absl::UnavailableError(
          absl::StrCat("sending memory back to the other rank: ", QpFailure(st, peer.qp)));
    }
    ++served_;
  }
}

}  // namespace mooncake::mcctl::selftest
