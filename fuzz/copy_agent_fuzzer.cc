// softnic's end of the copy agents (daemon/softnic/copy_agent_link.cc)
// against agents that lie. The channel header is shared memory the client
// writes whenever it likes, and the daemon reads it on every WQE that
// touches the client's GPU memory; here two hostile agents
// (hostile_copy_agent.h) write any of its words while the daemon copies
// through, between and within their channels, and asks them for atomics.
//
// Input:
//   u8 flags: bit 0/1 agent A/B answers honestly once its script ends;
//             bit 2/3 channel A/B starts gated (copy_agent_gate.h);
//             bit 4 both channels claim one process and CUDA context
//   u32 A's first request number, u32 A's cancel word, the same for B
//     (so the 32-bit sequence wraps within an input)
//   A's script, B's script (hostile_copy_agent.h)
//   then up to kMaxOps daemon steps of [u8 kind][u8 arg][u64 a][u64 b][u16 n]:
//     arg bit 0 picks the link; n + ((arg >> 1) % 4) * kStaging bytes (so up
//     to four staging pieces); a and b are the agent's addresses (the daemon
//     never dereferences them) or a sink's refusal point.
//
// Invariants, after every step:
// - each call returns within kStepBound whatever the agent does (the link's
//   bounds are small here: 10 ms per request, 2 ms stall, 5 ms landing);
// - its status is OK or one the engine handles (the codes in AllowedCode);
// - an OK ToDevice left its last piece's bytes in the staging area;
// - FromDevice hands the sink the staging area's pieces in order, each
//   within the copy, and reports Aborted exactly when the sink refused;
// - MirrorThenWrite runs the write exactly once and returns its result;
// - FetchAdd never says "applied" (no agent here writes an answer), and
//   says why not;
// - requests_done() never falls and grows by at most the requests sent;
// - a staging page the client punched out stays out of memory: the daemon
//   never faults a page in on its own account (issue 23 item 5).
// After each input the process has exactly the fds it had before.
#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <set>
#include <vector>

#include "fuzz_support.h"
#include "hostile_copy_agent.h"
#include "mooncake/common/copy_agent_channel.h"
#include "softnic/copy_agent_link.h"
#include "softnic/shared_mapping.h"

namespace mooncake::softnic {
namespace {

using fuzz::ByteReader;
constexpr uint64_t kStaging = copy_agent::kMinStagingBytes;
constexpr uint64_t kChannelBytes = copy_agent::kHeaderBytes + kStaging;
constexpr size_t kMaxOps = 16;
// Most requests one step sends on one link: four pieces, two requests each
// (WithinDevice; Between sends one out on the source and one in on the
// destination per piece).
constexpr uint64_t kMaxRequestsPerStep = 8;
// Per step: at most 8 requests of 10 ms plus one 5 ms call-off, with room
// for a sanitized build on a loaded 2-core machine. (The link's bounds are
// not tighter because a sanitized agent thread can take milliseconds to be
// scheduled: a seed would then reach the timeout instead of its path.)
constexpr auto kStepBound = std::chrono::seconds(1);

constexpr CopyAgentLinkOptions kOptions{
    .timeout = absl::Milliseconds(10),
    .spin = absl::Microseconds(20),
    .stall = absl::Milliseconds(2),
    .landing = absl::Milliseconds(5),
};

bool AllowedCode(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kOk:
    case absl::StatusCode::kFailedPrecondition:  // ended, or a page no longer in memory
    case absl::StatusCode::kUnavailable:         // closed, or paused on a blocked copy
    case absl::StatusCode::kDeadlineExceeded:    // no answer, or a stalled CUDA call
    case absl::StatusCode::kInternal:            // the agent's CUDA error
    case absl::StatusCode::kAborted:             // the sink refused
      return true;
    default: return false;
  }
}

// MC_FUZZ_VERBOSE=1 prints each call's status (to see what a seed reaches).
bool verbose = false;

absl::Status Checked(const char* what, absl::Status s) {
  if (verbose) std::fprintf(stderr, "copy_agent_fuzzer: %s: %s\n", what, s.ToString().c_str());
  FUZZ_CHECK(AllowedCode(s), what, ": ", s);
  return s;
}

uint8_t PatternByte(uint64_t i, uint64_t seed) {
  return static_cast<uint8_t>((i * 131 + seed) ^ (i >> 8));
}

// One channel as a client makes it (a populated memfd sealed against
// shrinking, a serving header), the daemon's mapping and link over it, and
// its hostile agent.
struct Side {
  int fd = -1;
  std::shared_ptr<SharedMapping> mapping;
  std::shared_ptr<CopyAgentLink> link;
  std::unique_ptr<fuzz::HostileAgent> agent;
  std::set<uint64_t> punched;  // staging pages the client punched out
  uint64_t done = 0;           // requests_done() after the last step

  copy_agent::Channel* channel() const {
    return reinterpret_cast<copy_agent::Channel*>(mapping->data());
  }
  const uint8_t* staging() const { return mapping->data() + copy_agent::kHeaderBytes; }

  ~Side() {
    if (agent) agent->Stop();
    agent.reset();
    link.reset();
    mapping.reset();
    if (fd >= 0) ::close(fd);
  }
};

// `one_process`: both channels claim one process and one CUDA context
// (the same pid, token and context), so Between lands through the
// destination's agent alone.
void Open(Side& side, uint32_t first_seq, uint32_t cancel, bool gated, bool one_process) {
  side.fd = ::memfd_create("copy-agent-fuzz", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  FUZZ_CHECK(side.fd >= 0, "memfd_create");
  FUZZ_CHECK(::ftruncate(side.fd, kChannelBytes) == 0, "ftruncate");
  void* p = ::mmap(nullptr, kChannelBytes, PROT_READ | PROT_WRITE, MAP_SHARED, side.fd, 0);
  FUZZ_CHECK(p != MAP_FAILED, "mmap");
  std::memset(p, 0, kChannelBytes);  // every page in memory, as the client must
  auto* c = static_cast<copy_agent::Channel*>(p);
  c->magic = copy_agent::kMagic;
  c->version = copy_agent::kVersion;
  c->staging_bytes = kStaging;
  c->state = static_cast<uint32_t>(copy_agent::State::kServing);
  c->request_seq = first_seq;
  c->done_seq = first_seq;
  c->gate.cancel_seq = cancel;
  c->gate.gated = gated ? 1 : 0;
  if (one_process) {
    c->process_token = 0x70c3e4;
    c->context = 0x1000;
  }
  ::munmap(p, kChannelBytes);
  FUZZ_CHECK(::fcntl(side.fd, F_ADD_SEALS, F_SEAL_SHRINK) == 0, "seal");
  auto mapping = SharedMapping::FromPopulatedMemfd(side.fd, 0, kChannelBytes);
  FUZZ_CHECK(mapping.ok(), mapping.status());
  side.mapping = *std::move(mapping);
  auto link = CopyAgentLink::Create(side.mapping, kStaging, ::getpid(), kOptions);
  FUZZ_CHECK(link.ok(), link.status());
  side.link = *std::move(link);
}

// Whether staging page `page` of `side` is in memory (mincore).
bool StagingPageResident(const Side& side, uint64_t page) {
  const uint64_t size = SharedMapping::PageSize();
  unsigned char v = 0;
  void* at = const_cast<uint8_t*>(side.staging()) + page * size;
  FUZZ_CHECK(::mincore(at, size, &v) == 0, "mincore");
  return (v & 1) != 0;
}

void Punch(Side& side, uint64_t offset) {
  const uint64_t size = SharedMapping::PageSize();
  FUZZ_CHECK(::fallocate(side.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                         static_cast<off_t>(offset), static_cast<off_t>(size)) == 0,
             "fallocate");
}

void CheckAfterStep(Side& side, std::chrono::steady_clock::duration took, const char* what) {
  FUZZ_CHECK(took < kStepBound, what, " took ",
             std::chrono::duration_cast<std::chrono::milliseconds>(took).count(), " ms");
  const uint64_t done = side.link->requests_done();
  FUZZ_CHECK(done >= side.done && done - side.done <= kMaxRequestsPerStep, what,
             ": requests_done went from ", side.done, " to ", done);
  side.done = done;
  for (uint64_t page : side.punched) {
    FUZZ_CHECK(!StagingPageResident(side, page), what, " faulted in staging page ", page,
               " that the client punched out");
  }
}

void Step(ByteReader& in, Side& a, Side& b) {
  const uint8_t kind = in.U8();
  const uint8_t arg = in.U8();
  const uint64_t x = in.U64();
  const uint64_t y = in.U64();
  const uint64_t n = in.U16() + ((arg >> 1) % 4) * kStaging;
  Side& side = (arg & 1) != 0 ? b : a;
  Side& other = (arg & 1) != 0 ? a : b;
  std::vector<uint8_t> bytes(n);
  for (uint64_t i = 0; i < n; ++i) bytes[i] = PatternByte(i, x);

  const auto start = std::chrono::steady_clock::now();
  const char* what = "";
  switch (kind % 10) {
    case 0: {
      what = "ToDevice";
      absl::Status s = Checked(what, side.link->ToDevice(x, bytes.data(), n));
      if (s.ok() && n > 0) {
        const uint64_t last = n - (n - 1) / kStaging * kStaging;
        FUZZ_CHECK(std::memcmp(side.staging(), bytes.data() + n - last, last) == 0,
                   "an OK ToDevice left other bytes in the staging area");
      }
      break;
    }
    case 1: {
      what = "FromDevice";
      const uint64_t refuse_at = y % 6;  // the piece the sink refuses (none past the last)
      uint64_t next = 0, pieces = 0;
      bool refused = false;
      absl::Status s = Checked(
          what,
          side.link->FromDevice(x, n, [&](const uint8_t* piece, uint64_t offset, uint64_t length) {
            FUZZ_CHECK(piece == side.staging(), "a piece outside the staging area");
            FUZZ_CHECK(offset == next && length == std::min(n - offset, kStaging), "piece at ",
                       offset, " of ", length, " bytes; expected ", next);
            next += length;
            refused = pieces++ == refuse_at;
            return !refused;
          }));
      FUZZ_CHECK((s.code() == absl::StatusCode::kAborted) == refused, what, ": ", s,
                 " with the sink ", refused ? "refusing" : "accepting");
      FUZZ_CHECK(!s.ok() || next == n, what, " OK after ", next, " of ", n, " bytes");
      break;
    }
    case 2: {
      what = "WithinDevice";
      (void)Checked(what, side.link->WithinDevice(x, y, n));
      break;
    }
    case 3: {
      what = "Between";
      (void)Checked(what, CopyAgentLink::Between(*side.link, x, *other.link, y, n));
      break;
    }
    case 4:
      what = "MirrorIntoLateCopy";
      side.link->MirrorIntoLateCopy(x, bytes.data(), n);
      break;
    case 5: {
      what = "MirrorThenWrite";
      int writes = 0;
      const bool result = (y & 1) != 0;
      FUZZ_CHECK(side.link->MirrorThenWrite(x, bytes.data(), n,
                                            [&] {
                                              ++writes;
                                              return result;
                                            }) == result,
                 "MirrorThenWrite changed its write's result");
      FUZZ_CHECK(writes == 1, "MirrorThenWrite wrote ", writes, " times");
      break;
    }
    case 6:
      what = "usable/LateCopyOverlaps";
      (void)side.link->usable();
      (void)side.link->LateCopyOverlaps(x, n);
      break;
    case 7: {
      what = "punch a staging page";
      const uint64_t page = y % (kStaging / SharedMapping::PageSize());
      Punch(side, copy_agent::kHeaderBytes + page * SharedMapping::PageSize());
      side.punched.insert(page);
      break;
    }
    case 8:
      // The header page: the agent writes it again at once (the client's
      // own memory); the daemon must notice or not care.
      what = "punch the header page";
      Punch(side, 0);
      break;
    default: {
      // An atomic on the agent's GPU word. These agents never write the
      // staging area, so none ever answers an atomic as run: "applied"
      // would be the daemon believing a blank or stale answer (and then
      // not running an add that nobody ran).
      what = "FetchAdd";
      const CopyAgentLink::AtomicOutcome a =
          side.link->FetchAdd(x, (y & 1) != 0, y >> 1, static_cast<uint32_t>(n));
      if (verbose) {
        std::fprintf(stderr, "copy_agent_fuzzer: %s: outcome %d %s\n", what,
                     static_cast<int>(a.kind), a.why.ToString().c_str());
      }
      FUZZ_CHECK(a.kind != CopyAgentLink::AtomicOutcome::Kind::kApplied, what,
                 ": reported applied, old value ", a.old, ", with no answer written");
      FUZZ_CHECK(!a.why.ok() && AllowedCode(a.why), what, ": not applied, for ", a.why);
      break;
    }
  }
  CheckAfterStep(side, std::chrono::steady_clock::now() - start, what);
  if (kind % 10 == 3) CheckAfterStep(other, std::chrono::steady_clock::duration{}, what);
}

}  // namespace
}  // namespace mooncake::softnic

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  mooncake::fuzz::QuietLogs();
  mooncake::softnic::verbose = std::getenv("MC_FUZZ_VERBOSE") != nullptr;
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mooncake::softnic;
  mooncake::fuzz::ExpectFdsKept([&] {
    ByteReader in(data, size);
    const uint8_t flags = in.U8();
    Side a, b;
    const uint32_t a_seq = in.U32(), a_cancel = in.U32();
    const uint32_t b_seq = in.U32(), b_cancel = in.U32();
    Open(a, a_seq, a_cancel, (flags & 4) != 0, (flags & 16) != 0);
    Open(b, b_seq, b_cancel, (flags & 8) != 0, (flags & 16) != 0);
    auto a_script = mooncake::fuzz::ReadAgentScript(in);
    auto b_script = mooncake::fuzz::ReadAgentScript(in);
    a.agent = std::make_unique<mooncake::fuzz::HostileAgent>(a.channel(), std::move(a_script),
                                                             (flags & 1) != 0);
    b.agent = std::make_unique<mooncake::fuzz::HostileAgent>(b.channel(), std::move(b_script),
                                                             (flags & 2) != 0);
    for (size_t i = 0; i < kMaxOps && !in.empty(); ++i) Step(in, a, b);
  });
  return 0;
}
