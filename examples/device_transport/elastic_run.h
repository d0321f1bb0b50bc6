// --mode elastic of device_transport_example (host and CUDA platforms):
// every rank exchanges puts and signals with every rank of the group in a
// loop, and keeps going when ranks are lost and replaced
// (Communicator::handleEvent). The loop is the same on both platforms; only
// its data path differs (elastic_data_path.h).
//
// Each (sender, receiver) pair counts its own exchanges: the n-th message
// from s to d goes to d's slot for s, parity n % 2, with the pattern of (s,
// d, n), then s signals n in d's flag word for s. A pair only moves on when
// both sides saw the other's message, so two slots per pair suffice. A pair
// with a replacement starts again at 1 (both sides zero their counts and
// the survivor its flag word for the rank when it releases it).
//
// Lines printed (the integration test and bench/elastic read them; t= is
// CLOCK_REALTIME in microseconds):
//   START epoch E t=T                       set up (a replacement: E > 1)
//   LOST rank R t=T / LEFT rank R t=T       the event arrived
//   RELEASED rank R t=T                     tables cleared, daemon told
//   DEGRADED-OK active A,B,C rounds K t=T   K exchanges without R after its loss
//   ADMITTED rank R epoch E t=T             the replacement is mapped/connected
//   EXCHANGED rank R epoch E t=T            first complete exchange with it
//   PASS                                    done (see ElasticOptions)
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "elastic_data_path.h"
#include "example_common.h"
#include "mooncake/client/communicator.h"

namespace mooncake::example {

struct ElasticOptions {
  size_t msg_bytes = 4096;
  // How long a pair may make no progress before the run fails (a lost peer
  // must be reported within it).
  uint64_t timeout_ns = 30'000'000'000ull;
  // Replacements an original rank waits for before it may finish (a
  // replacement itself waits for none).
  int expect_rejoins = 0;
  // Complete rounds with every active rank, after the last replacement,
  // before PASS.
  int rounds = 50;
  // Rounds among the survivors after a loss before DEGRADED-OK is printed.
  int degraded_report_rounds = 20;
  // Pause between rounds (keeps 4 spinning ranks from starving the daemon
  // on a small CI machine).
  int interval_us = 200;
};

// Buffer bytes the mode needs for `world` ranks.
inline size_t ElasticBufferBytes(size_t msg_bytes, int world) {
  return kSignalBytes + msg_bytes * static_cast<size_t>(world) * 3;
}

// Runs until PASS (returns an ok result) or a failure (message says what),
// moving the data through `path` (which works on comm's buffer and ctx()).
RunResult RunElastic(Communicator& comm, const ElasticOptions& options, ElasticDataPath& path);

// RunElastic with the host platform's data path (CPU loads and stores, the
// Device API's host implementation).
RunResult RunElasticHost(Communicator& comm, const ElasticOptions& options);

// RunElastic with CUDA kernels on the current device (the one the
// Communicator's buffer was allocated on). In a build without CUDA it
// returns a failure saying so.
RunResult RunElasticCuda(Communicator& comm, const ElasticOptions& options);

}  // namespace mooncake::example
