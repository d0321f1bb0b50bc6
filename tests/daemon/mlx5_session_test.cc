// The mlx5 DevX session (daemon/rdma/mlx5/): every decision it makes apart
// from the hardware (GID choice, path MTU, RoCE UDP source port, access
// flags, dmabuf and umem ranges, ring placement, the connect plan) and
// every error message it builds from an errno or a firmware mailbox; and,
// against the real libibverbs of this machine, that opening a device that
// is not there fails with NotFound naming it and what exists.
//
// Facts the expectations come from:
//   ibv_reg_mr(3): remote write/atomic need local write; ibv_reg_dmabuf_mr
//     needs iova and offset at the same page offset.
//   Linux include/rdma/ib_verbs.h rdma_calc_flow_label and rdma-core
//     verbs.h ibv_flow_label_to_udp_sport (compared below with the real one).
//   ibv_query_gid_table(3), enum ibv_gid_type; ibv_mtu 1..5 = 256..4096.
//   IB spec: unicast LIDs 0x0001..0xbfff; RoCE v2 UDP source ports
//     0xC000..0xFFFF (IB_ROCE_UDP_ENCAP_VALID_PORT_MIN/MAX).
#include "rdma/mlx5/mlx5_session.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <array>
#include <cerrno>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "rdma/mlx5/devx_commands.h"
#include "rdma/mlx5/devx_ifc.h"
#include "rdma/mlx5/session_params.h"
#include "rdma/mlx5/verbs_status.h"

#if MOONCAKE_HAVE_MLX5DV
#include <infiniband/verbs.h>
#endif

namespace mooncake::daemon::mlx5 {
namespace {

using ::testing::HasSubstr;

Gid MakeGid(std::initializer_list<uint8_t> bytes) {
  Gid g{};
  size_t i = 0;
  for (uint8_t b : bytes) g[i++] = b;
  return g;
}
Gid Ipv4Gid(uint8_t a, uint8_t b, uint8_t c, uint8_t d) {
  return MakeGid({0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, a, b, c, d});
}
Gid LinkLocalGid(uint8_t last) {
  return MakeGid({0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x02, 0x02, 0xc9, 0xff, 0xfe, 0, 0, last});
}
Gid GlobalIpv6Gid(uint8_t last) {
  return MakeGid({0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, last});
}
GidEntry Entry(uint32_t index, Gid gid, GidType type) {
  GidEntry e;
  e.index = index;
  e.gid = gid;
  e.type = type;
  return e;
}

// ---- verbs_status -------------------------------------------------------------------------------

TEST(Mlx5VerbsStatus, ErrnoTextIsStrerror) {
  EXPECT_EQ(ErrnoText(EINVAL), "Invalid argument");
  EXPECT_EQ(ErrnoText(EOPNOTSUPP), "Operation not supported");
  EXPECT_THAT(ErrnoText(99999), HasSubstr("99999"));
}

TEST(Mlx5VerbsStatus, CodeForErrno) {
  EXPECT_EQ(CodeForErrno(ENOENT), absl::StatusCode::kNotFound);
  EXPECT_EQ(CodeForErrno(ENODEV), absl::StatusCode::kNotFound);
  EXPECT_EQ(CodeForErrno(EPERM), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(CodeForErrno(EACCES), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(CodeForErrno(EINVAL), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CodeForErrno(EBADF), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CodeForErrno(EFAULT), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CodeForErrno(ENOMEM), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(CodeForErrno(EAGAIN), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(CodeForErrno(EMFILE), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(CodeForErrno(EOPNOTSUPP), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(CodeForErrno(EPROTONOSUPPORT), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(CodeForErrno(ENOSYS), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(CodeForErrno(EBUSY), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(CodeForErrno(EHOSTUNREACH), absl::StatusCode::kUnavailable);
  EXPECT_EQ(CodeForErrno(ENETUNREACH), absl::StatusCode::kUnavailable);
  EXPECT_EQ(CodeForErrno(ETIMEDOUT), absl::StatusCode::kUnavailable);
  EXPECT_EQ(CodeForErrno(EREMOTEIO), absl::StatusCode::kInternal);
  EXPECT_EQ(CodeForErrno(EIO), absl::StatusCode::kInternal);
}

TEST(Mlx5VerbsStatus, DmabufRefusalNamesCallDeviceErrnoAndFallback) {
  absl::Status s =
      VerbsError(VerbsCall::kRegDmabufMr, "mlx5_0", EOPNOTSUPP, "(fd 12, offset 0, 1048576 bytes)");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(),
            "ibv_reg_dmabuf_mr(fd 12, offset 0, 1048576 bytes) on mlx5_0 failed: Operation not "
            "supported (the kernel or the NIC driver lacks dmabuf support; load nvidia-peermem "
            "for the ibv_reg_mr fallback)");
}

TEST(Mlx5VerbsStatus, NoHintNoParentheses) {
  absl::Status s = VerbsError(VerbsCall::kDupCommandFd, "mlx5_1", EMFILE);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(s.message(), "fcntl(F_DUPFD_CLOEXEC) on mlx5_1 failed: Too many open files");
}

TEST(Mlx5VerbsStatus, ZeroErrnoIsInternalAndSaysSo) {
  absl::Status s = VerbsError(VerbsCall::kAllocPd, "mlx5_0", 0);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(s.message(), "ibv_alloc_pd on mlx5_0 failed without an errno");
}

TEST(Mlx5VerbsStatus, EveryCallHasAName) {
  for (int c = static_cast<int>(VerbsCall::kGetDeviceList);
       c <= static_cast<int>(VerbsCall::kDupCommandFd); ++c) {
    absl::string_view name = VerbsCallName(static_cast<VerbsCall>(c));
    EXPECT_FALSE(name.empty()) << c;
    EXPECT_NE(name, "unknown verbs call") << c;
  }
  EXPECT_EQ(VerbsCallName(VerbsCall::kRegHostMr), "ibv_reg_mr_iova2");
  EXPECT_EQ(VerbsCallName(VerbsCall::kUmemRegDmabuf), "mlx5dv_devx_umem_reg_ex");
}

TEST(Mlx5VerbsStatus, HintsSayWhatIsMissing) {
  EXPECT_THAT(std::string(HintFor(VerbsCall::kOpenDevice, EACCES)),
              HasSubstr("/dev/infiniband/uverbs"));
  EXPECT_THAT(std::string(HintFor(VerbsCall::kOpenDevice, EOPNOTSUPP)), HasSubstr("DevX"));
  EXPECT_THAT(std::string(HintFor(VerbsCall::kOpenDevice, EINVAL)), HasSubstr("log_max_uctx"));
  EXPECT_THAT(std::string(HintFor(VerbsCall::kRegPeermemMr, EFAULT)),
              HasSubstr("modprobe nvidia-peermem"));
  EXPECT_THAT(std::string(HintFor(VerbsCall::kRegHostMr, ENOMEM)), HasSubstr("RLIMIT_MEMLOCK"));
  EXPECT_THAT(std::string(HintFor(VerbsCall::kUmemRegHost, ENOMEM)), HasSubstr("RLIMIT_MEMLOCK"));
  EXPECT_THAT(std::string(HintFor(VerbsCall::kUmemRegDmabuf, EOPNOTSUPP)),
              HasSubstr("host memory"));
  EXPECT_THAT(std::string(HintFor(VerbsCall::kRegDmabufMr, EINVAL)), HasSubstr("page offset"));
  EXPECT_THAT(std::string(HintFor(VerbsCall::kCreateAh, EHOSTUNREACH)), HasSubstr("ip route get"));
  EXPECT_THAT(std::string(HintFor(VerbsCall::kQueryPort, EINVAL)), HasSubstr("numbered from 1"));
  EXPECT_THAT(std::string(HintFor(VerbsCall::kAllocUar, ENOMEM)), HasSubstr("UAR"));
  // Advice only where it applies.
  EXPECT_EQ(HintFor(VerbsCall::kRegHostMr, EBADF), "");
  EXPECT_EQ(HintFor(VerbsCall::kQueryPort, ENOMEM), "");
  EXPECT_EQ(HintFor(VerbsCall::kRegDmabufMr, ENOMEM), "");
}

// A 16-byte output mailbox with `status` and `syndrome` (PRM: status in
// byte 0, syndrome in dword 1, big-endian).
DevxCommand Refused(absl::string_view name, uint8_t status, uint32_t syndrome) {
  DevxCommand c{name, std::vector<uint8_t>(16, 0), std::vector<uint8_t>(16, 0)};
  c.out[0] = status;
  c.out[4] = static_cast<uint8_t>(syndrome >> 24);
  c.out[5] = static_cast<uint8_t>(syndrome >> 16);
  c.out[6] = static_cast<uint8_t>(syndrome >> 8);
  c.out[7] = static_cast<uint8_t>(syndrome);
  return c;
}

TEST(Mlx5VerbsStatus, FirmwareRefusalCarriesStatusAndSyndrome) {
  absl::Status s =
      DevxError(VerbsCall::kDevxObjCreate, "mlx5_0", EREMOTEIO,
                Refused("CREATE_QP", 0x03, 0x1234abcd), "put the rings in host memory");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "mlx5dv_devx_obj_create(CREATE_QP) on mlx5_0 failed: CREATE_QP failed: status 0x03 "
            "(bad parameter), syndrome 0x1234abcd (put the rings in host memory)");

  absl::Status limits = DevxError(VerbsCall::kDevxObjModify, "mlx5_2", EREMOTEIO,
                                  Refused("INIT2RTR_QP", 0x08, 0x00000001));
  EXPECT_EQ(limits.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(limits.message(),
            "mlx5dv_devx_obj_modify(INIT2RTR_QP) on mlx5_2 failed: INIT2RTR_QP failed: status "
            "0x08 (limits exceeded), syndrome 0x00000001");
}

TEST(Mlx5VerbsStatus, KernelRefusalIsTheErrno) {
  // EREMOTEIO with a clean mailbox: nothing from the firmware to report.
  absl::Status clean =
      DevxError(VerbsCall::kDevxObjCreate, "mlx5_0", EREMOTEIO, Refused("CREATE_CQ", 0, 0));
  EXPECT_EQ(clean.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(clean.message(),
            "mlx5dv_devx_obj_create(CREATE_CQ) on mlx5_0 failed: Remote I/O error");
  // The hint for a firmware refusal is not given for a kernel refusal.
  absl::Status perm = DevxError(VerbsCall::kDevxGeneralCmd, "mlx5_0", EPERM,
                                Refused("QUERY_HCA_CAP", 0x03, 1), "firmware hint");
  EXPECT_EQ(perm.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(perm.message()),
              HasSubstr("mlx5dv_devx_general_cmd(QUERY_HCA_CAP) on mlx5_0 failed: Operation not "
                        "permitted (the kernel refused the DevX command"));
  EXPECT_THAT(std::string(perm.message()), ::testing::Not(HasSubstr("firmware hint")));
}

TEST(Mlx5VerbsStatus, DeviceNotFoundListsWhatExists) {
  absl::Status s = DeviceNotFound("mlx5_3", {"mlx5_0", "mlx5_1"}, 0);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "RDMA device mlx5_3 not found; devices: mlx5_0, mlx5_1");

  absl::Status none = DeviceNotFound("mlx5_0", {}, ENOSYS);
  EXPECT_EQ(none.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(none.message()),
              HasSubstr("RDMA device mlx5_0 not found: no RDMA devices (ibv_get_device_list: "
                        "Function not implemented); load the ib_uverbs kernel module"));

  absl::Status empty = DeviceNotFound("mlx5_0", {}, 0);
  EXPECT_THAT(std::string(empty.message()),
              HasSubstr("RDMA device mlx5_0 not found: no RDMA devices; load the ib_uverbs"));
}

TEST(Mlx5VerbsStatus, BothRegistrationsFailedNamesBoth) {
  absl::Status dmabuf = VerbsError(VerbsCall::kRegDmabufMr, "mlx5_0", EOPNOTSUPP);
  absl::Status peer = VerbsError(VerbsCall::kRegPeermemMr, "mlx5_0", EFAULT);
  absl::Status s = BothRegistrationsFailed("mlx5_0", dmabuf, peer);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);  // EFAULT, the fallback's
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("GPU memory on mlx5_0 could not be registered either way: "
                        "ibv_reg_dmabuf_mr on mlx5_0 failed: Operation not supported"));
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("; then ibv_reg_mr_iova2 on mlx5_0 failed: Bad address (the kernel "
                        "cannot pin GPU memory by address: load nvidia-peermem"));
}

// ---- GIDs ---------------------------------------------------------------------------------------

TEST(Mlx5Gid, Classification) {
  EXPECT_TRUE(IsIpv4MappedGid(Ipv4Gid(10, 0, 0, 1)));
  EXPECT_FALSE(IsIpv4MappedGid(LinkLocalGid(1)));
  EXPECT_FALSE(IsIpv4MappedGid(MakeGid({0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0xff, 0xff, 10, 0, 0, 1})));
  EXPECT_FALSE(IsIpv4MappedGid(MakeGid({0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xfe, 10, 0, 0, 1})));
  EXPECT_TRUE(IsLinkLocalGid(LinkLocalGid(1)));
  EXPECT_TRUE(IsLinkLocalGid(MakeGid({0xfe, 0xbf})));
  EXPECT_FALSE(IsLinkLocalGid(MakeGid({0xfe, 0xc0})));  // site-local, not link-local
  EXPECT_FALSE(IsLinkLocalGid(GlobalIpv6Gid(1)));
  EXPECT_TRUE(IsZeroGid(Gid{}));
  EXPECT_FALSE(IsZeroGid(MakeGid({0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1})));
  EXPECT_EQ(FormatGid(LinkLocalGid(0x2a)), "fe80:0000:0000:0000:0202:c9ff:fe00:002a");
  EXPECT_EQ(FormatGid(Ipv4Gid(192, 168, 1, 7)), "0000:0000:0000:0000:0000:ffff:c0a8:0107");
  EXPECT_STREQ(GidTypeName(GidType::kRoceV2), "RoCE v2");
}

TEST(Mlx5Gid, RocePrefersV2Ipv4ThenV2GlobalThenV2LinkLocalThenV1) {
  std::vector<GidEntry> table = {
      Entry(0, LinkLocalGid(1), GidType::kRoceV1),
      Entry(1, LinkLocalGid(1), GidType::kRoceV2),
      Entry(2, Ipv4Gid(10, 0, 0, 1), GidType::kRoceV1),
      Entry(3, Ipv4Gid(10, 0, 0, 1), GidType::kRoceV2),
      Entry(4, GlobalIpv6Gid(1), GidType::kRoceV2),
      Entry(5, GlobalIpv6Gid(1), GidType::kRoceV1),
  };
  auto pick = [&]() { return ChooseGid(table, LinkLayer::kEthernet, std::nullopt); };
  ASSERT_TRUE(pick().ok());
  EXPECT_EQ(pick()->index, 3u);
  EXPECT_EQ(pick()->type, GidType::kRoceV2);
  table.erase(table.begin() + 3);  // no v2 IPv4
  EXPECT_EQ(pick()->index, 4u);
  table.erase(table.begin() + 3);  // no v2 global either
  EXPECT_EQ(pick()->index, 1u);
  table.erase(table.begin() + 1);  // v1 only: lowest index
  EXPECT_EQ(pick()->index, 0u);
  EXPECT_EQ(pick()->type, GidType::kRoceV1);
}

TEST(Mlx5Gid, TiesGoToTheLowestIndexWhateverTheOrder) {
  std::vector<GidEntry> table = {
      Entry(7, Ipv4Gid(10, 0, 0, 7), GidType::kRoceV2),
      Entry(5, Ipv4Gid(10, 0, 0, 5), GidType::kRoceV2),
      Entry(9, Ipv4Gid(10, 0, 0, 9), GidType::kRoceV2),
  };
  absl::StatusOr<GidEntry> g = ChooseGid(table, LinkLayer::kEthernet, std::nullopt);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->index, 5u);
  EXPECT_EQ(g->gid, Ipv4Gid(10, 0, 0, 5));
}

TEST(Mlx5Gid, ZeroEntriesAreSkipped) {
  std::vector<GidEntry> table = {
      Entry(0, Gid{}, GidType::kRoceV2),
      Entry(1, LinkLocalGid(3), GidType::kRoceV1),
  };
  EXPECT_EQ(ChooseGid(table, LinkLayer::kEthernet, std::nullopt)->index, 1u);
  // Nor can the override name one.
  EXPECT_EQ(ChooseGid(table, LinkLayer::kEthernet, 0).status().code(), absl::StatusCode::kNotFound);
}

TEST(Mlx5Gid, InfiniBandTakesTheLowestIbGid) {
  std::vector<GidEntry> table = {
      Entry(2, LinkLocalGid(2), GidType::kIb), Entry(0, LinkLocalGid(0), GidType::kIb),
      Entry(1, Ipv4Gid(10, 0, 0, 1), GidType::kRoceV2),  // cannot happen on IB; never chosen
  };
  EXPECT_EQ(ChooseGid(table, LinkLayer::kInfiniBand, std::nullopt)->index, 0u);
  EXPECT_EQ(ChooseGid({table[2]}, LinkLayer::kInfiniBand, std::nullopt).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(Mlx5Gid, NoRoceGidSaysWhy) {
  absl::StatusOr<GidEntry> g =
      ChooseGid({Entry(0, LinkLocalGid(0), GidType::kIb)}, LinkLayer::kEthernet, std::nullopt);
  EXPECT_EQ(g.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(g.status().message()), HasSubstr("no RoCE GID"));
  EXPECT_THAT(std::string(g.status().message()), HasSubstr("IP address"));
  EXPECT_EQ(ChooseGid({}, LinkLayer::kEthernet, std::nullopt).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(Mlx5Gid, OverrideByIndex) {
  std::vector<GidEntry> table = {
      Entry(0, LinkLocalGid(1), GidType::kRoceV1),
      Entry(1, LinkLocalGid(1), GidType::kRoceV2),
      Entry(3, Ipv4Gid(10, 0, 0, 1), GidType::kRoceV2),
  };
  // The configured index wins over the preference.
  EXPECT_EQ(ChooseGid(table, LinkLayer::kEthernet, 0)->index, 0u);
  absl::StatusOr<GidEntry> missing = ChooseGid(table, LinkLayer::kEthernet, 2);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()),
              HasSubstr("configured GID index 2 is not populated on this port; populated "
                        "indices: 0, 1, 3"));
  absl::StatusOr<GidEntry> wrong = ChooseGid(table, LinkLayer::kInfiniBand, 3);
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(wrong.status().message()), HasSubstr("RoCE v2 GID, not usable"));
  EXPECT_THAT(std::string(ChooseGid({}, LinkLayer::kEthernet, 1).status().message()),
              HasSubstr("the port has no GIDs"));
}

// ---- MTU, UDP source port, access -----------------------------------------------------------

TEST(Mlx5Mtu, TheSmallerOfBothEnds) {
  EXPECT_EQ(*NegotiatePathMtu(5, 3), PathMtu::k1024);
  EXPECT_EQ(*NegotiatePathMtu(3, 5), PathMtu::k1024);
  EXPECT_EQ(*NegotiatePathMtu(5, 5), PathMtu::k4096);
  EXPECT_EQ(*NegotiatePathMtu(1, 4), PathMtu::k256);
  absl::Status local = NegotiatePathMtu(0, 5).status();
  EXPECT_EQ(local.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(local.message()), HasSubstr("local active MTU code 0"));
  EXPECT_THAT(std::string(NegotiatePathMtu(5, 6).status().message()),
              HasSubstr("remote MTU code 6"));
  EXPECT_EQ(PathMtuBytes(PathMtu::k256), 256u);
  EXPECT_EQ(PathMtuBytes(PathMtu::k1024), 1024u);
  EXPECT_EQ(PathMtuBytes(PathMtu::k4096), 4096u);
}

TEST(Mlx5UdpSport, FlowLabelAndPortFromTheQpnPair) {
  // Worked by hand from the kernel's rdma_calc_flow_label and rdma-core's
  // ibv_flow_label_to_udp_sport.
  EXPECT_EQ(RoceFlowLabel(0x100, 0x200), 0x20000u);
  EXPECT_EQ(RoceUdpSourcePort(0x20000), 0xc008);
  EXPECT_EQ(RoceFlowLabel(0xffffff, 0xffffff), 0xfff1eu);
  EXPECT_EQ(RoceUdpSourcePort(0xfff1e), 0xff21);
  EXPECT_EQ(RoceFlowLabel(0x1234, 0xabcd), 0x74f67u);
  EXPECT_EQ(RoceUdpSourcePort(0x74f67), 0xcf7a);
  // Both ends derive the same port.
  EXPECT_EQ(RoceFlowLabel(0x1234, 0xabcd), RoceFlowLabel(0xabcd, 0x1234));
  for (uint32_t fl : {0u, 1u, 0x3fffu, 0x4000u, 0xfffffu}) {
    EXPECT_GE(RoceUdpSourcePort(fl), 0xc000) << fl;
  }
  EXPECT_LE(RoceFlowLabel(0xffffff, 0xfffffe), 0xfffffu);
}

#if MOONCAKE_HAVE_MLX5DV
TEST(Mlx5UdpSport, MatchesRdmaCoreForEveryFlowLabel) {
  for (uint32_t fl = 0; fl <= IB_GRH_FLOWLABEL_MASK; ++fl) {
    ASSERT_EQ(RoceUdpSourcePort(fl), ibv_flow_label_to_udp_sport(fl)) << fl;
  }
}
#endif

TEST(Mlx5Access, LocalWriteIsAddedUnknownBitsRefused) {
  EXPECT_EQ(*RegistrationAccess(0), uint32_t{kMrLocalWrite});
  EXPECT_EQ(*RegistrationAccess(kMrRemoteWrite), uint32_t{kMrLocalWrite | kMrRemoteWrite});
  EXPECT_EQ(*RegistrationAccess(kMrRemoteAtomic | kMrRemoteRead),
            uint32_t{kMrLocalWrite | kMrRemoteAtomic | kMrRemoteRead});
  EXPECT_EQ(*RegistrationAccess(kMrAccessAll), kMrAccessAll);
  absl::Status bad = RegistrationAccess(0x10).status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.message()), HasSubstr("access 0x10"));
  // Relaxed ordering (IBV_ACCESS_RELAXED_ORDERING, 1 << 20) is never set:
  // put -> signal order rests on strictly ordered regions (docs/rdma.md
  // "Ordering without fences").
  EXPECT_EQ(RegistrationAccess(kMrAccessAll | (1u << 20)).status().code(),
            absl::StatusCode::kInvalidArgument);
#if MOONCAKE_HAVE_MLX5DV
  EXPECT_EQ(uint32_t{IBV_ACCESS_RELAXED_ORDERING}, 1u << 20);
#endif
}

TEST(Mlx5Dmabuf, RangeChecks) {
  EXPECT_TRUE(CheckDmabufRange(0, 1 << 20, 0x7f0000000000, 4096).ok());
  EXPECT_TRUE(CheckDmabufRange(0x1010, 64, 0x7f0000003010, 4096).ok());
  absl::Status pages = CheckDmabufRange(0x1000, 64, 0x7f0000000010, 4096);
  EXPECT_EQ(pages.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(pages.message()), HasSubstr("different offsets into a 4096-byte page"));
  EXPECT_EQ(CheckDmabufRange(0, 0, 0, 4096).code(), absl::StatusCode::kInvalidArgument);
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  EXPECT_THAT(std::string(CheckDmabufRange(kMax - 10, 64, 0, 4096).message()),
              HasSubstr("overflows"));
  EXPECT_THAT(std::string(CheckDmabufRange(0, 64, kMax - 10, 4096).message()),
              HasSubstr("overflows"));
  EXPECT_THAT(std::string(CheckDmabufRange(0, 64, 0, 3000).message()),
              HasSubstr("not a power of two"));
}

TEST(Mlx5Dmabuf, WhichRefusalsTryTheAddressFallback) {
  EXPECT_TRUE(DmabufRefusalAllowsFallback(EOPNOTSUPP));
  EXPECT_TRUE(DmabufRefusalAllowsFallback(EPROTONOSUPPORT));
  EXPECT_TRUE(DmabufRefusalAllowsFallback(ENOSYS));
  EXPECT_TRUE(DmabufRefusalAllowsFallback(EINVAL));
  EXPECT_FALSE(DmabufRefusalAllowsFallback(EBADF));
  EXPECT_FALSE(DmabufRefusalAllowsFallback(ENOMEM));
  EXPECT_FALSE(DmabufRefusalAllowsFallback(EPERM));
  EXPECT_FALSE(DmabufRefusalAllowsFallback(0));
}

// ---- umem and rings -----------------------------------------------------------------------------

TEST(Mlx5Umem, RangeChecks) {
  EXPECT_TRUE(CheckUmemRange("u", 0x10000, 0x3000).ok());
  EXPECT_THAT(std::string(CheckUmemRange("u", 0, 0).message()), HasSubstr("0 bytes"));
  EXPECT_THAT(std::string(CheckUmemRange("u", 0x10040, 0x1000).message()),
              HasSubstr("multiples of 4096"));
  EXPECT_THAT(std::string(CheckUmemRange("u", 0x10000, 0x1040).message()),
              HasSubstr("multiples of 4096"));
  EXPECT_THAT(std::string(CheckUmemRange("u", ~uint64_t{0xfff}, 0x2000).message()),
              HasSubstr("overflows"));
  EXPECT_EQ(Log2(1), 0u);
  EXPECT_EQ(Log2(64), 6u);
  EXPECT_EQ(Log2(uint64_t{1} << 40), 40u);
}

// 64 WQEs and 64 CQEs in one 12 KiB umem: SQ page, CQ page, a page of
// doorbell records.
QpRings GoodRings() {
  QpRings r;
  r.sq = {7, 0};
  r.sq_wqe_cnt = 64;
  r.cq = {7, 4096};
  r.cq_cqe_cnt = 64;
  r.sq_dbrec = {7, 8192};
  r.cq_dbrec = {7, 8200};
  return r;
}
const absl::flat_hash_map<uint32_t, uint64_t> kOneUmem = {{7, 12288}};

TEST(Mlx5Rings, AGoodLayout) {
  EXPECT_TRUE(ValidateQpRings(GoodRings(), kOneUmem).ok());
  QpRings tight = GoodRings();
  tight.cq_dbrec = {7, 12288 - 8};  // ends exactly at the umem's end
  EXPECT_TRUE(ValidateQpRings(tight, kOneUmem).ok());
  // Rings in different umems may share offsets.
  QpRings split = GoodRings();
  split.cq = {8, 0};
  split.cq_dbrec = {8, 4096};
  EXPECT_TRUE(ValidateQpRings(split, {{7, 12288}, {8, 8192}}).ok());
}

TEST(Mlx5Rings, EachRuleRefusesWithTheRingNamed) {
  auto expect = [](QpRings r, const char* text,
                   const absl::flat_hash_map<uint32_t, uint64_t>& umems = kOneUmem) {
    absl::Status s = ValidateQpRings(r, umems);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(std::string(s.message()), HasSubstr(text));
  };
  QpRings r = GoodRings();
  r.sq_wqe_cnt = 48;
  expect(r, "sq_wqe_cnt 48 is not a power of two in 1..32768");
  r.sq_wqe_cnt = 0;
  expect(r, "sq_wqe_cnt 0");
  r.sq_wqe_cnt = 65536;
  expect(r, "sq_wqe_cnt 65536");
  r = GoodRings();
  r.cq_cqe_cnt = 32;
  expect(r, "cq_cqe_cnt 32 is not a power of two >= sq_wqe_cnt (64)");
  r = GoodRings();
  r.cq = {9, 4096};
  expect(r, "cq: umem 9 is not registered in this session");
  r = GoodRings();
  r.sq = {7, 64};
  expect(r, "sq: offset 64 is not a multiple of 4096");
  r = GoodRings();
  r.cq_dbrec = {7, 8196};
  expect(r, "cq_dbrec: offset 8196 is not a multiple of 8");
  r = GoodRings();
  r.cq_dbrec = {7, 12288};
  expect(r, "cq_dbrec: 8 bytes at offset 12288 do not fit umem 7 of 12288 bytes");
  r = GoodRings();
  r.cq = {7, 8192};
  r.cq_cqe_cnt = 128;  // 8 KiB from 8 KiB on: past the 12 KiB umem's end
  expect(r, "cq: 8192 bytes at offset 8192 do not fit umem 7 of 12288 bytes");
  r = GoodRings();
  r.cq = {7, 8192};  // fits, but over the doorbell records
  expect(r, "sq_dbrec [8192, 8200) overlaps cq [8192, 12288) in umem 7");
  r = GoodRings();
  r.cq_dbrec = {7, ~uint64_t{7}};  // offset + size would wrap
  expect(r, "do not fit umem 7");
  r = GoodRings();
  r.cq_dbrec = r.sq_dbrec;
  expect(r, "sq_dbrec [8192, 8200) overlaps cq_dbrec [8192, 8200) in umem 7");
  r = GoodRings();
  r.sq_dbrec = {7, 4096 + 64};  // inside the CQ ring
  expect(r, "sq_dbrec [4160, 4168) overlaps cq [4096, 8192) in umem 7");
}

TEST(Mlx5Rings, CreateParamsFollowTheRings) {
  HcaGeneralCaps caps;
  caps.log_max_qp_sz = 15;
  caps.log_max_cq_sz = 22;
  caps.log_max_msg = 30;
  QpRings r = GoodRings();
  r.cq_cqe_cnt = 128;
  r.cq = {7, 4096};
  absl::flat_hash_map<uint32_t, uint64_t> umem = {{7, 4096 * 4}};
  r.sq_dbrec = {7, 12288};
  r.cq_dbrec = {7, 12296};
  ASSERT_TRUE(ValidateQpRings(r, umem).ok());

  CreateCqParams cq = MakeCreateCqParams(r, /*uar_page=*/0x77, /*eqn=*/3);
  EXPECT_EQ(cq.log_cq_size, 7u);
  EXPECT_EQ(cq.cqe_size, CqeSize::k64Bytes);
  EXPECT_EQ(cq.uar_page, 0x77u);
  EXPECT_EQ(cq.eqn, 3u);
  EXPECT_TRUE(cq.overrun_ignore);
  EXPECT_EQ(cq.cq_umem_id, 7u);
  EXPECT_EQ(cq.cq_umem_offset, 4096u);
  EXPECT_EQ(cq.dbr_umem_id, 7u);
  EXPECT_EQ(cq.dbr_offset, 12296u);
  EXPECT_TRUE(BuildCreateCq(cq).ok());
  EXPECT_TRUE(CheckAgainstCaps(cq, caps).ok());

  CreateQpParams qp = MakeCreateQpParams(r, /*pdn=*/0x15, /*uar_page=*/0x77, /*cqn=*/0x400, caps);
  EXPECT_EQ(qp.pd, 0x15u);
  EXPECT_EQ(qp.uar_page, 0x77u);
  EXPECT_EQ(qp.cqn_snd, 0x400u);
  EXPECT_EQ(qp.cqn_rcv, 0x400u);
  EXPECT_EQ(qp.log_sq_size, 6u);
  EXPECT_EQ(qp.log_msg_max, 30u);
  EXPECT_EQ(qp.ts_format, TimestampFormat::kDefault);
  EXPECT_EQ(qp.wq_umem_id, 7u);
  EXPECT_EQ(qp.wq_umem_offset, 0u);
  EXPECT_EQ(qp.dbr_umem_id, 7u);
  EXPECT_EQ(qp.dbr_offset, 12288u);
  EXPECT_TRUE(BuildCreateQp(qp).ok());
  EXPECT_TRUE(CheckAgainstCaps(qp, caps).ok());

  caps.log_max_cq_sz = 6;  // a smaller device: the CQ no longer fits
  EXPECT_THAT(std::string(CheckAgainstCaps(cq, caps).message()),
              HasSubstr("log_cq_size = 7 exceeds the device's log_max_cq_sz = 6"));
}

// ---- connecting ---------------------------------------------------------------------------------

TEST(Mlx5Tuning, DefaultsAreValidOnBothLinkLayers) {
  EXPECT_TRUE(ValidateConnectTuning(ConnectTuning{}, LinkLayer::kEthernet).ok());
  EXPECT_TRUE(ValidateConnectTuning(ConnectTuning{}, LinkLayer::kInfiniBand).ok());
}

TEST(Mlx5Tuning, EveryFieldHasItsRange) {
  auto refused = [](ConnectTuning t, LinkLayer ll, const char* text) {
    absl::Status s = ValidateConnectTuning(t, ll);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(std::string(s.message()), HasSubstr(text));
  };
  const LinkLayer eth = LinkLayer::kEthernet;
  const LinkLayer ib = LinkLayer::kInfiniBand;
  ConnectTuning t;
  t.traffic_class = 256;
  refused(t, eth, "traffic_class = 256 is outside 0..255");
  t = {};
  t.service_level = 8;
  refused(t, eth, "service_level (Ethernet priority) = 8 is outside 0..7");
  EXPECT_TRUE(ValidateConnectTuning(t, ib).ok());
  t.service_level = 16;
  refused(t, ib, "service_level = 16 is outside 0..15");
  t = {};
  t.hop_limit = 0;
  refused(t, eth, "hop_limit = 0 is outside 1..255");
  t = {};
  t.ack_timeout = 32;
  refused(t, ib, "ack_timeout = 32 is outside 0..31");
  t = {};
  t.retry_count = 8;
  refused(t, ib, "retry_count = 8");
  t = {};
  t.rnr_retry = 8;
  refused(t, ib, "rnr_retry = 8");
  t = {};
  t.min_rnr_nak = 32;
  refused(t, ib, "min_rnr_nak = 32");
  t = {};
  t.pkey_index = 0x10000;
  refused(t, ib, "pkey_index = 65536");
  t = {};
  t.flow_label = 0x100000;
  refused(t, ib, "flow_label = 1048576");
  t = {};
  t.udp_sport = 0x1234;
  refused(t, eth, "udp_sport = 4660 is neither 0 (derived) nor in 0xc000..0xffff");
  t.udp_sport = 0xc000;
  EXPECT_TRUE(ValidateConnectTuning(t, eth).ok());
  t = {};
  t.log_max_rd_atomic = 8;
  refused(t, ib, "log_max_rd_atomic = 8");
  t = {};
  t.atomic_mode = AtomicMode::kNone;
  refused(t, ib, "atomic_mode none");
}

HcaGeneralCaps EthCaps() {
  HcaGeneralCaps c;
  c.log_max_qp_sz = 15;
  c.log_max_cq_sz = 22;
  c.log_max_msg = 30;
  c.log_max_ra_req_qp = 4;
  c.log_max_ra_res_qp = 5;
  c.gid_table_size = 16;
  c.port_type = kCapPortTypeEth;
  c.num_ports = 1;
  c.cqe_version = 1;
  c.roce = c.atomic = c.rc = true;
  c.log_max_uctx = 4;
  c.log_max_umem = 10;
  return c;
}
HcaGeneralCaps IbCaps() {
  HcaGeneralCaps c = EthCaps();
  c.port_type = kCapPortTypeIb;
  c.roce = false;
  c.num_ports = 2;
  return c;
}
LocalPort EthPort(GidType type = GidType::kRoceV2) {
  LocalPort p;
  p.port = 1;
  p.link_layer = LinkLayer::kEthernet;
  p.active_mtu = 5;
  p.gid = Entry(3, Ipv4Gid(10, 0, 0, 1), type);
  return p;
}
LocalPort IbPort() {
  LocalPort p;
  p.port = 2;
  p.link_layer = LinkLayer::kInfiniBand;
  p.lid = 0x11;
  p.active_mtu = 5;
  p.gid = Entry(0, LinkLocalGid(0x11), GidType::kIb);
  return p;
}
RemoteQp RoceRemote() {
  RemoteQp r;
  r.qpn = 0x1234;
  r.psn = 0x42;
  r.gid = Ipv4Gid(10, 0, 0, 2);
  r.gid_type = GidType::kRoceV2;
  r.mtu = 3;
  return r;
}
RemoteQp IbRemote() {
  RemoteQp r;
  r.qpn = 0x1234;
  r.psn = 0x42;
  r.lid = 0x12;
  r.mtu = 4;
  return r;
}

TEST(Mlx5ConnectPlan, RoceV2) {
  absl::StatusOr<ConnectPlan> plan =
      PlanConnect(0xabcd, 0x77, EthPort(), EthCaps(), RoceRemote(), ConnectTuning{});
  ASSERT_TRUE(plan.ok()) << plan.status();
  const ConnectPlan& p = *plan;
  EXPECT_TRUE(p.needs_remote_mac);

  EXPECT_EQ(p.rst2init.qpn, 0xabcdu);
  EXPECT_EQ(p.rst2init.port, 1u);
  EXPECT_TRUE(p.rst2init.remote_read && p.rst2init.remote_write && p.rst2init.remote_atomic);
  EXPECT_EQ(p.rst2init.atomic_mode, AtomicMode::kUpTo8Bytes);
  EXPECT_EQ(p.rst2init.pkey_index, 0u);

  const Init2RtrParams& rtr = p.init2rtr;
  EXPECT_EQ(rtr.qpn, 0xabcdu);
  EXPECT_EQ(rtr.mtu, PathMtu::k1024);  // min(4096, the peer's 1024)
  EXPECT_EQ(rtr.log_msg_max, 30u);
  EXPECT_EQ(rtr.remote_qpn, 0x1234u);
  EXPECT_EQ(rtr.next_rcv_psn, 0x42u);
  EXPECT_EQ(rtr.log_rra_max, 5u);  // the device's responder limit
  EXPECT_EQ(rtr.min_rnr_nak, 12u);
  EXPECT_EQ(rtr.link_layer, LinkLayer::kEthernet);
  EXPECT_TRUE(rtr.roce_v2);
  EXPECT_EQ(rtr.udp_sport, RoceUdpSourcePort(RoceFlowLabel(0xabcd, 0x1234)));
  EXPECT_EQ(rtr.rgid, Ipv4Gid(10, 0, 0, 2));
  EXPECT_EQ(rtr.gid_index, 3u);
  EXPECT_EQ(rtr.hop_limit, 64u);
  EXPECT_EQ(rtr.rlid, 0u);

  EXPECT_EQ(p.rtr2rts.qpn, 0xabcdu);
  EXPECT_EQ(p.rtr2rts.next_send_psn, 0x77u);
  EXPECT_EQ(p.rtr2rts.log_sra_max, 4u);  // the device's requester limit
  EXPECT_EQ(p.rtr2rts.retry_count, 7u);
  EXPECT_EQ(p.rtr2rts.rnr_retry, 7u);
  EXPECT_EQ(p.rtr2rts.ack_timeout, 17u);
  // Issue 24 item 4: the NIC's own error (transport retry exceeded) comes
  // well before the device gives up (DaemonRdmaOptions::timeout_ns, 10 s by
  // default), so the user reads why, not "timed out".
  EXPECT_LT(NicRetryBudget(ConnectTuning{}), absl::Seconds(5));
  EXPECT_GT(NicRetryBudget(ConnectTuning{}), absl::Seconds(4));
  ConnectTuning nvshmem;
  nvshmem.ack_timeout = 20;
  EXPECT_GT(NicRetryBudget(nvshmem), absl::Seconds(30));  // what the old default cost
  nvshmem.ack_timeout = 0;
  EXPECT_EQ(NicRetryBudget(nvshmem), absl::InfiniteDuration());

  // The MAC is the session's to fill: without it INIT2RTR does not build.
  EXPECT_EQ(BuildInit2Rtr(rtr).status().code(), absl::StatusCode::kInvalidArgument);
  Init2RtrParams filled = rtr;
  filled.rmac = {0x0c, 0x42, 0xa1, 0x00, 0x00, 0x02};
  EXPECT_TRUE(BuildInit2Rtr(filled).ok());
  EXPECT_TRUE(BuildRst2Init(p.rst2init).ok());
  EXPECT_TRUE(BuildRtr2Rts(p.rtr2rts).ok());
}

TEST(Mlx5ConnectPlan, RoceV1HasNoUdpPort) {
  RemoteQp remote = RoceRemote();
  remote.gid_type = GidType::kRoceV1;
  ConnectTuning t;
  t.udp_sport = 0xc123;  // ignored: RoCE v1 is not UDP
  absl::StatusOr<ConnectPlan> plan =
      PlanConnect(0xabcd, 0, EthPort(GidType::kRoceV1), EthCaps(), remote, t);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(plan->init2rtr.roce_v2);
  EXPECT_EQ(plan->init2rtr.udp_sport, 0u);
}

TEST(Mlx5ConnectPlan, TuningIsApplied) {
  ConnectTuning t;
  t.udp_sport = 0xd000;
  t.traffic_class = 106;  // DSCP 26, ECN 2
  t.service_level = 3;
  t.hop_limit = 8;
  t.ack_timeout = 14;
  t.retry_count = 5;
  t.rnr_retry = 6;
  t.min_rnr_nak = 1;
  t.flow_label = 0x12345;
  t.log_max_rd_atomic = 2;
  t.atomic_mode = AtomicMode::kUpTo16Bytes;
  absl::StatusOr<ConnectPlan> plan = PlanConnect(5, 6, EthPort(), EthCaps(), RoceRemote(), t);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->init2rtr.udp_sport, 0xd000u);
  EXPECT_EQ(plan->init2rtr.traffic_class, 106u);
  EXPECT_EQ(plan->init2rtr.sl, 3u);
  EXPECT_EQ(plan->init2rtr.hop_limit, 8u);
  EXPECT_EQ(plan->init2rtr.flow_label, 0x12345u);
  EXPECT_EQ(plan->init2rtr.min_rnr_nak, 1u);
  EXPECT_EQ(plan->init2rtr.log_rra_max, 2u);
  EXPECT_EQ(plan->rtr2rts.log_sra_max, 2u);
  EXPECT_EQ(plan->rtr2rts.ack_timeout, 14u);
  EXPECT_EQ(plan->rtr2rts.retry_count, 5u);
  EXPECT_EQ(plan->rtr2rts.rnr_retry, 6u);
  EXPECT_EQ(plan->rst2init.atomic_mode, AtomicMode::kUpTo16Bytes);
}

TEST(Mlx5ConnectPlan, InfiniBandByLid) {
  absl::StatusOr<ConnectPlan> plan =
      PlanConnect(0x99, 1, IbPort(), IbCaps(), IbRemote(), ConnectTuning{});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(plan->needs_remote_mac);
  EXPECT_EQ(plan->init2rtr.link_layer, LinkLayer::kInfiniBand);
  EXPECT_EQ(plan->init2rtr.rlid, 0x12u);
  EXPECT_FALSE(plan->init2rtr.grh);
  EXPECT_EQ(plan->init2rtr.mtu, PathMtu::k2048);
  EXPECT_EQ(plan->init2rtr.port, 2u);
  EXPECT_EQ(plan->rst2init.port, 2u);
  EXPECT_EQ(plan->rtr2rts.port, 2u);
  EXPECT_TRUE(IsZeroGid(plan->init2rtr.rgid));
  EXPECT_TRUE(BuildInit2Rtr(plan->init2rtr).ok());
}

TEST(Mlx5ConnectPlan, InfiniBandAcrossSubnetsSendsAGrh) {
  ConnectTuning t;
  t.ib_global_route = true;
  RemoteQp remote = IbRemote();
  absl::Status no_gid = PlanConnect(0x99, 1, IbPort(), IbCaps(), remote, t).status();
  EXPECT_EQ(no_gid.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(no_gid.message()), HasSubstr("ib_global_route is set but the peer"));
  remote.gid = LinkLocalGid(0x12);
  absl::StatusOr<ConnectPlan> plan = PlanConnect(0x99, 1, IbPort(), IbCaps(), remote, t);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->init2rtr.grh);
  EXPECT_EQ(plan->init2rtr.rgid, LinkLocalGid(0x12));
  EXPECT_EQ(plan->init2rtr.gid_index, 0u);
  EXPECT_TRUE(BuildInit2Rtr(plan->init2rtr).ok());
}

TEST(Mlx5ConnectPlan, RefusalsNameTheProblem) {
  auto refused = [](absl::StatusOr<ConnectPlan> plan, absl::StatusCode code, const char* text) {
    EXPECT_EQ(plan.status().code(), code) << text;
    EXPECT_THAT(std::string(plan.status().message()), HasSubstr(text));
  };
  const ConnectTuning t;
  RemoteQp r = RoceRemote();
  r.gid_type = GidType::kRoceV1;
  refused(PlanConnect(1, 0, EthPort(), EthCaps(), r, t), absl::StatusCode::kFailedPrecondition,
          "RoCE version mismatch: this end uses a RoCE v2 GID (index 3) and the peer a RoCE v1");
  r = RoceRemote();
  r.gid = Gid{};
  refused(PlanConnect(1, 0, EthPort(), EthCaps(), r, t), absl::StatusCode::kInvalidArgument,
          "the peer sent no GID");
  r = RoceRemote();
  r.qpn = 0;
  refused(PlanConnect(1, 0, EthPort(), EthCaps(), r, t), absl::StatusCode::kInvalidArgument,
          "remote QPN 0 is outside 1..0xffffff");
  r.qpn = 0x1000000;
  refused(PlanConnect(1, 0, EthPort(), EthCaps(), r, t), absl::StatusCode::kInvalidArgument,
          "remote QPN 16777216");
  refused(PlanConnect(0, 0, EthPort(), EthCaps(), RoceRemote(), t),
          absl::StatusCode::kInvalidArgument, "local QPN 0");
  refused(PlanConnect(1, 0x1000000, EthPort(), EthCaps(), RoceRemote(), t),
          absl::StatusCode::kInvalidArgument, "local PSN 16777216 does not fit 24 bits");
  r = RoceRemote();
  r.psn = 0x1000000;
  refused(PlanConnect(1, 0, EthPort(), EthCaps(), r, t), absl::StatusCode::kInvalidArgument,
          "remote PSN 16777216");
  r = RoceRemote();
  r.mtu = 0;
  refused(PlanConnect(1, 0, EthPort(), EthCaps(), r, t), absl::StatusCode::kInvalidArgument,
          "remote MTU code 0");

  RemoteQp ib = IbRemote();
  ib.lid = 0;
  refused(PlanConnect(1, 0, IbPort(), IbCaps(), ib, t), absl::StatusCode::kInvalidArgument,
          "the peer's LID 0x0 is not a unicast LID");
  ib.lid = 0xc000;  // multicast range
  refused(PlanConnect(1, 0, IbPort(), IbCaps(), ib, t), absl::StatusCode::kInvalidArgument,
          "the peer's LID 0xc000");

  // The device's own limits and port type.
  refused(PlanConnect(1, 0, EthPort(), IbCaps(), RoceRemote(), t),
          absl::StatusCode::kInvalidArgument,
          "link_layer is Ethernet but the device's port_type is InfiniBand");
  ConnectTuning deep;
  deep.log_max_rd_atomic = 6;
  refused(PlanConnect(1, 0, EthPort(), EthCaps(), RoceRemote(), deep),
          absl::StatusCode::kInvalidArgument, "exceeds the device's log_max_ra");
  LocalPort far = EthPort();
  far.gid.index = 16;  // beyond the caps' table of 16
  refused(PlanConnect(1, 0, far, EthCaps(), RoceRemote(), t), absl::StatusCode::kInvalidArgument,
          "gid_index = 16 is outside the GID table of 16 entries");
  LocalPort port3 = IbPort();
  port3.port = 3;
  refused(PlanConnect(1, 0, port3, IbCaps(), IbRemote(), t), absl::StatusCode::kInvalidArgument,
          "port 3 is outside 1..2");
  ConnectTuning bad;
  bad.service_level = 9;
  refused(PlanConnect(1, 0, EthPort(), EthCaps(), RoceRemote(), bad),
          absl::StatusCode::kInvalidArgument, "service_level (Ethernet priority) = 9");
}

// ---- the session against this machine's libibverbs ----------------------------------------------

TEST(Mlx5Session, OptionsAreCheckedFirst) {
  Mlx5SessionOptions o;
  EXPECT_EQ(Mlx5Session::Open(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.device = "mlx5_0";
  o.port = 0;
  EXPECT_THAT(std::string(Mlx5Session::Open(o).status().message()),
              HasSubstr("port 0 is outside 1..255"));
  o.port = 256;
  EXPECT_EQ(Mlx5Session::Open(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.port = 1;
  o.gid_index = 256;
  EXPECT_THAT(std::string(Mlx5Session::Open(o).status().message()),
              HasSubstr("GID index 256 is outside 0..255"));
}

// Whether this machine has no RDMA device at all (then libibverbs lists none).
bool NoRdmaDevices() {
  std::error_code ec;
  std::filesystem::directory_iterator it("/sys/class/infiniband", ec);
  return ec || it == std::filesystem::directory_iterator();
}

TEST(Mlx5Session, AMissingDeviceIsNotFoundWithWhatExists) {
  Mlx5SessionOptions o;
  o.device = "mooncake_test_no_such_nic";
  absl::StatusOr<std::unique_ptr<Mlx5Session>> s = Mlx5Session::Open(o);
#if MOONCAKE_HAVE_MLX5DV
  ASSERT_EQ(s.status().code(), absl::StatusCode::kNotFound) << s.status();
  EXPECT_THAT(std::string(s.status().message()),
              HasSubstr("RDMA device mooncake_test_no_such_nic not found"));
  if (NoRdmaDevices()) {
    EXPECT_THAT(std::string(s.status().message()), HasSubstr("no RDMA devices"));
  } else {
    EXPECT_THAT(std::string(s.status().message()), HasSubstr("; devices: "));
  }
#else
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("built without rdma-core"));
#endif
}

TEST(Mlx5Session, Mlx5ZeroOnAMachineWithoutNics) {
  if (!NoRdmaDevices()) GTEST_SKIP() << "this machine has RDMA devices";
  Mlx5SessionOptions o;
  o.device = "mlx5_0";
  absl::StatusOr<std::unique_ptr<Mlx5Session>> s = Mlx5Session::Open(o);
#if MOONCAKE_HAVE_MLX5DV
  EXPECT_EQ(s.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(s.status().message()),
              HasSubstr("RDMA device mlx5_0 not found: no RDMA devices"));
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("ib_uverbs"));
#else
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
#endif
}

TEST(Mlx5Session, MrPathNames) {
  EXPECT_STREQ(MrPathName(Mlx5Session::MrPath::kDmabuf), "dmabuf");
  EXPECT_STREQ(MrPathName(Mlx5Session::MrPath::kPeermem), "peermem");
  EXPECT_STREQ(MrPathName(Mlx5Session::MrPath::kHost), "host");
}

}  // namespace
}  // namespace mooncake::daemon::mlx5
