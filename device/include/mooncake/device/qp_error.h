// What a queue pair's failure means, in words a user can act on: the value
// kernels find in IbgdaQpDevCtx::error (ibgda_qp.h) and mcctl's ERROR
// column, from one table. Host code only (logs, mcctl, examples); kernels
// branch on McStatus (kRdmaError: the NIC or softnic reported an error
// CQE; kTimedOut: the device gave up waiting, nothing was reported).
//
// The order of the two matters (issue 24 item 4): a NIC retries a lost
// packet for (retry_count + 1) x 4.096 us x 2^ack_timeout before it writes
// a transport-retry-exceeded CQE; the daemon's defaults (ack_timeout 17,
// retry_count 7: about 4.3 s) keep that well inside the device's default
// timeout_ns (10 s), so a wrong GID or MAC, a port that is down or a lossy
// priority shows as the NIC's named error, not as a stall.
#pragma once

#include <cstdint>
#include <string>

#include "mooncake/device/ibgda_qp.h"
#include "mooncake/device/mlx5/prm.h"

namespace mooncake {
namespace device {

// An mlx5 completion syndrome (CQE byte 55), with what to check. "" for 0.
inline std::string DescribeCqeSyndrome(uint8_t syndrome) {
  auto with = [syndrome](const char* text) {
    static const char kHex[] = "0123456789abcdef";
    std::string s(text);
    s += " (syndrome 0x";
    s += kHex[syndrome >> 4];
    s += kHex[syndrome & 0xf];
    s += ")";
    return s;
  };
  switch (syndrome) {
    case 0: return "";
    case mlx5::kSyndLocalLengthErr: return with("local length error");
    case mlx5::kSyndLocalQpOpErr:
      return with("local QP operation error: malformed WQE or doorbell");
    case mlx5::kSyndLocalProtErr: return with("local protection error: bad lkey or source range");
    case mlx5::kSyndWrFlushErr: return with("work request flushed");
    case mlx5::kSyndBadRespErr: return with("bad response from the peer");
    case mlx5::kSyndLocalAccessErr: return with("local access error");
    case mlx5::kSyndRemoteInvalReqErr:
      return with("remote invalid request: misaligned atomic or an operation the peer refused");
    case mlx5::kSyndRemoteAccessErr: return with("remote access error: bad rkey, range or rights");
    case mlx5::kSyndRemoteOpErr: return with("remote operation error");
    case mlx5::kSyndTransportRetryExcErr:
      return with(
          "transport retry exceeded: the peer never acknowledged; check the GID index, the "
          "MAC/ARP entry of the peer's address, both ports' state, and PFC on the priority in use");
    case mlx5::kSyndRnrRetryExcErr:
      return with("receiver-not-ready retry exceeded: the peer's QP is not in RTR or RTS");
    default: return with("completion error");
  }
}

// IbgdaQpDevCtx::error: "" while the QP is healthy.
inline std::string DescribeQpError(uint32_t error) {
  if (error == 0) return "";
  if ((error & kQpErrStalled) != 0) {
    return "stalled: no progress within timeout_ns on the device, and no error from the NIC "
           "(the daemon or softnic is gone, or the NIC's retries outlast timeout_ns)";
  }
  return DescribeCqeSyndrome(static_cast<uint8_t>(error & 0xffu));
}

}  // namespace device
}  // namespace mooncake
