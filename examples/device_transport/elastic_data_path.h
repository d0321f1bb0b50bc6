// The data path of --mode elastic (elastic_run.h): how one message reaches a
// peer and how one from a peer is awaited and checked, apart from the loop
// that decides who talks to whom and handles LOST/LEFT/JOINED. One
// implementation per platform: host threads on the mapped buffer
// (elastic_run.cc) and CUDA kernels on the GPU buffer (elastic_cuda.cu).
// Plain C++ (no Abseil): nvcc compiles the CUDA implementation.
//
// Layout of the symmetric buffer (ElasticBufferBytes in elastic_run.h):
//   flag word of source s                 FlagOffset(s)
//   inbox of source s, parity p           kSignalBytes + (2 s + p) msg
//   outbox toward d (staged source bytes) kSignalBytes + (2 n + d) msg
// Message #seq from s to d lands in d's inbox of s, parity seq % 2, with the
// bytes ElasticByte(i, s, d, seq); then s signals seq in d's flag word of s.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "example_common.h"

namespace mooncake::example {

struct ElasticLayout {
  size_t msg;  // bytes per message
  int n;       // world size
  size_t Inbox(int src, uint64_t seq) const {
    return kSignalBytes + (2 * static_cast<size_t>(src) + (seq & 1)) * msg;
  }
  size_t Outbox(int dst) const {
    return kSignalBytes + (2 * static_cast<size_t>(n) + static_cast<size_t>(dst)) * msg;
  }
};

// Byte i of message #seq from src to dst (the CUDA kernels compute the same).
inline uint8_t ElasticByte(size_t i, int src, int dst, uint64_t seq) {
  return PatternByte(i + static_cast<size_t>(seq) * 17u, src, dst);
}

// What a data-path call came to. kPeerFailed is a Device API failure toward
// one peer (expected when that peer was just lost: the loop waits for its
// event); kBroken means the platform itself failed (a CUDA error) and the run
// stops. `why` says what, with the values.
enum class PathResult { kOk, kNotYet, kPeerFailed, kBroken };

// One rank's data path. Used from the loop's thread only; every call returns
// with its work complete (nothing of it still runs when the loop calls
// Communicator::handleEvent, which rewrites the routing tables).
class ElasticDataPath {
 public:
  virtual ~ElasticDataPath() = default;
  // Stages message #seq toward dst, puts it into dst's inbox of this rank,
  // signals seq in dst's flag word of this rank and, to an RDMA peer, waits
  // until the work requests completed (the staged bytes may change after).
  // kOk, kPeerFailed or kBroken.
  virtual PathResult Send(int dst, uint64_t seq, std::string* why) = 0;
  // Waits at most timeout_ns for the flag word of src to reach want: kOk,
  // kNotYet (timed out: the loop polls events and comes back), kBroken.
  virtual PathResult WaitFlag(int src, uint64_t want, uint64_t timeout_ns, std::string* why) = 0;
  // Counts the wrong bytes of message #seq from src in *bad: kOk or kBroken.
  virtual PathResult CheckInbox(int src, uint64_t seq, uint64_t* bad, std::string* why) = 0;
  // Zeroes the flag word of src (its replacement counts from 1 again):
  // kOk or kBroken.
  virtual PathResult ZeroFlag(int src, std::string* why) = 0;
};

}  // namespace mooncake::example
