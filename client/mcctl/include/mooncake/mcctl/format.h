// Human-readable renderings of the Admin API replies, one function per mcctl
// command. Pure functions of the messages (no I/O, no clock), so tests check
// them directly. Every result ends in '\n'. Thread-safe.
//
// Strings from the daemon are shown through EscapeForDisplay
// (mooncake/common/escape.h): control characters and invalid UTF-8 appear as
// "\n", "\x1b", ..., never raw. A session's client name is cut at 48 bytes
// and a member's handle kind at 32 (escaped), ending in "...".
#pragma once

#include <cstdint>
#include <string>

#include "mooncake/v1/admin.pb.h"
#include "mooncake/v1/node.pb.h"

namespace mooncake::mcctl {

// "512 B", "1.5 KiB", "80.0 GiB".
std::string FormatBytes(uint64_t bytes);
// "850ms", "12s", "3m05s", "2h07m", "3d04h".
std::string FormatDurationMs(uint64_t ms);
// CUDA's encoded driver version (13000) as "13.0"; "none" for 0.
std::string FormatCudaDriverVersion(int32_t version);

// `mcctl status`: the daemon's identity and counters, then the GPU and NIC
// tables (or why they are empty).
std::string FormatStatus(const mooncake::v1::DaemonStatus& status,
                         const mooncake::v1::Topology& topology);

// `mcctl gpus`: one row per GPU, or "no GPUs (<discovery note>)".
std::string FormatGpus(const mooncake::v1::Topology& topology);

// `mcctl nics`: one row per NIC port, or "no RDMA NICs (<discovery note>)".
std::string FormatNics(const mooncake::v1::Topology& topology);

// The GPU x GPU matrix, as `nvidia-smi topo -m` lays it out. A cell is
//   X     the GPU itself
//   A<r>  P2P access with native atomics, performance rank r (lower is better)
//   P<r>  P2P access without native atomics, performance rank r
//   -     no P2P access
//   ?     the daemon reported nothing for this pair
// Followed by a legend. "no GPUs (...)" when there are none.
std::string FormatGpuMatrix(const mooncake::v1::Topology& topology);

// The GPU x NIC matrix: the distance class (PIX, PXB, PHB, NODE, SYS,
// UNKNOWN) per pair, with '*' after the class of each GPU's closest NIC(s),
// '?' where the daemon reported nothing, then a legend. Explains an empty
// matrix with the discovery notes instead.
std::string FormatGpuNicMatrix(const mooncake::v1::Topology& topology);

// `mcctl topo`: both matrices.
std::string FormatTopology(const mooncake::v1::Topology& topology);

// `mcctl sessions`: one row per session, or "no sessions".
std::string FormatSessions(const mooncake::v1::ListSessionsResponse& sessions);

// `mcctl groups`: a table of groups, then each group's members, or
// "no groups".
std::string FormatGroups(const mooncake::v1::ListGroupsResponse& groups);
// One row per queue pair / registered memory region; a line when there are none.
std::string FormatQueuePairs(const mooncake::v1::ListQueuePairsResponse& qps);
std::string FormatPeers(const mooncake::v1::ListPeersResponse& peers);
std::string FormatMemoryRegions(const mooncake::v1::ListMemoryRegionsResponse& mrs);

}  // namespace mooncake::mcctl
