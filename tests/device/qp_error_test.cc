// What a queue pair's failure says (mooncake/device/qp_error.h): the NIC's
// named errors with what to check, a device-side stall told apart from a
// NIC failure, and the order of the two timeouts.
#include "mooncake/device/qp_error.h"

#include <gtest/gtest.h>

namespace mooncake::device {
namespace {

TEST(QpErrorTest, TheNicsErrorsAreNamedWithWhatToCheck) {
  EXPECT_EQ(DescribeQpError(0), "");
  const std::string retry = DescribeQpError(kQpErrCqe | mlx5::kSyndTransportRetryExcErr);
  EXPECT_NE(retry.find("transport retry exceeded"), std::string::npos) << retry;
  for (const char* hint : {"GID index", "MAC", "state", "PFC", "0x15"}) {
    EXPECT_NE(retry.find(hint), std::string::npos) << hint << ": " << retry;
  }
  EXPECT_NE(DescribeQpError(kQpErrCqe | (0x42u << 8) | mlx5::kSyndRemoteAccessErr)
                .find("remote access error: bad rkey"),
            std::string::npos);
  EXPECT_NE(DescribeCqeSyndrome(0x7f).find("completion error (syndrome 0x7f)"), std::string::npos);
}

TEST(QpErrorTest, AStallOnTheDeviceIsToldApartFromAFailureTheNicReported) {
  const std::string stalled = DescribeQpError(kQpErrStalled);
  EXPECT_NE(stalled.find("stalled"), std::string::npos) << stalled;
  EXPECT_NE(stalled.find("no error from the NIC"), std::string::npos) << stalled;
  EXPECT_EQ(stalled.find("syndrome"), std::string::npos) << stalled;
  EXPECT_EQ(DescribeQpError(kQpErrCqe | mlx5::kSyndTransportRetryExcErr).find("stalled"),
            std::string::npos);
}

}  // namespace
}  // namespace mooncake::device
