// mcctl's command line: parsing, dispatch to the Admin API, and output.
// main() is a thin wrapper over RunMcctl() so tests drive the whole CLI
// in-process against a real gRPC server.
//
//   mcctl [--socket PATH] [--timeout-ms N] [--json|-j] COMMAND
//   COMMAND: status | gpus | nics | topo | sessions | groups [NAME] | qps |
//            mrs | peers | watch [--count N] | doctor [--root DIR] |
//            selftest rdma [--nic NIC] [--gpu G | --across GROUP --rank R] |
//            help
//   mcctl --version | --help
//
// `watch` streams group events until interrupted (or N events with
// --count); exit 2 when the daemon goes away. `doctor` exits 0 when the
// node is ready for GPU-initiated transfers and 1 when it is not
// (mooncake/mcctl/doctor.h), whether or not the daemon answers.
// `selftest rdma` exits 0 when every step passed, 1 when one failed
// (mooncake/mcctl/selftest_rdma.h), 2 when the daemon is not reached.
//
// The socket is --socket, else $MOONCAKE_SOCKET, else
// /run/mooncake/mooncaked.sock (mooncake::ResolveSocketPath).
//
// Exit codes (kExit*): 0 success; 1 the daemon answered with an error or the
// output could not be produced; 2 the daemon could not be reached (one line
// on stderr: "mcctl: cannot reach mooncaked at PATH (<reason>): is the
// service running?", or, when this user may not open the socket, the
// PermissionDenied message of ConnectUnix naming its mode and group and how
// to be let in); 64 usage error (the problem and the usage on stderr; a
// socket path longer than a UNIX socket allows is one line, no usage).
//
// Thread-safety: RunMcctl reads the environment; otherwise it shares no state
// between calls.
#pragma once

#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "mooncake/drivers/cuda_driver.h"
#include "mooncake/mcctl/doctor.h"

namespace mooncake::mcctl {

inline constexpr int kExitOk = 0;
inline constexpr int kExitError = 1;
inline constexpr int kExitUnreachable = 2;
inline constexpr int kExitUsage = 64;  // EX_USAGE from sysexits.h

inline constexpr int kDefaultTimeoutMs = 2000;

struct CliOptions {
  std::string socket;  // --socket, empty when not given
  int timeout_ms = kDefaultTimeoutMs;
  bool json = false;  // --json or -j
  bool help = false;
  bool version = false;
  std::string command;     // empty with --help / --version alone
  std::string group;       // `groups NAME`: show that group only
  std::string root = "/";  // doctor --root: read sys/, proc/, etc/ below it
  int count = 0;           // watch --count: stop after N events (0: never)
  bool timeout_given = false;
  std::string subject;  // `selftest rdma`
  std::string nic;      // selftest --nic
  int gpu = -1;         // selftest --gpu: from CUDA kernels on this GPU (-1: a CPU thread)
  std::string across;   // selftest --across GROUP: one rank of a pair across nodes
  int rank = -1;        // selftest --rank R (0 or 1) with --across
};

// What tests substitute for the node (mcctl itself passes none).
struct McctlHooks {
  std::shared_ptr<drivers::CudaDriver> cuda_driver;  // doctor: instead of libcuda.so.1
  std::optional<DaemonFacts> daemon;                 // doctor: instead of asking mooncaked
};

// Parses the arguments after argv[0]. InvalidArgument with a message naming
// the offending argument for unknown options or commands, missing or bad
// values, extra words, or no command at all.
absl::StatusOr<CliOptions> ParseCommandLine(const std::vector<std::string>& args);

// The usage text printed by `mcctl help` and on usage errors.
std::string UsageText();

// The version printed by `mcctl --version`.
std::string VersionText();

// Runs mcctl with the arguments after argv[0]; writes results to `out` and
// diagnostics to `err`; returns the exit code.
int RunMcctl(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);
int RunMcctl(const std::vector<std::string>& args, std::ostream& out, std::ostream& err,
             const McctlHooks& hooks);

}  // namespace mooncake::mcctl
