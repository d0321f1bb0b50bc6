// Why a NIC failed a queue pair, read from its completion queue in the
// client's control memory (issue 24 item 4): the daemon never polls a
// session's CQ (the client's kernels do), but `mcctl qps` and the log must
// still name a real NIC's error ("transport retry exceeded: check GID
// index, MAC, port state, PFC"), as they do for softnic's.
//
// A ConnectX that fails a WQE writes one error CQE with the cause's
// syndrome, moves the QP to the error state, and flushes every WQE after it
// (WR_FLUSH_ERR). A QP does not leave the error state (it is destroyed and
// made again, its CQ filled with invalid CQEs first: RingFill), so any
// error CQE in the ring is this QP's failure, wherever the ring's owner
// bits stand.
#pragma once

#include <cstdint>

namespace mooncake::daemon::mlx5 {

// The syndrome of the failure the CQ ring at `cq` (`cqe_cnt` 64-byte CQEs,
// the daemon's mapping of client memory) shows: 0 when it holds no error
// CQE; the cause's syndrome when one says more than a flush; else
// WR_FLUSH_ERR (0x05: every WQE flushed, as after the daemon's loss).
// Reads each CQE's opcode and syndrome byte with relaxed loads (the client
// and the NIC write the ring meanwhile: a torn view can only name another
// of the QP's own syndromes).
uint8_t CqFailureSyndrome(const uint8_t* cq, uint32_t cqe_cnt);

}  // namespace mooncake::daemon::mlx5
