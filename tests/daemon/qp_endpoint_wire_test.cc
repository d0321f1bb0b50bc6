// A QP's endpoint on the peer channel (daemon/peering/qp_endpoint_wire.h):
// what one node sends survives the trip, and what another node sends is
// checked field by field before a provider sees it.
#include "peering/qp_endpoint_wire.h"

#include "gtest/gtest.h"

namespace mooncake::daemon::peering {
namespace {

TEST(QpEndpointWireTest, AnEndpointSurvivesTheTrip) {
  QpEndpoint e;
  e.provider = "mlx5";
  e.is_roce = true;
  e.lid = 0;
  e.gid = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 9};
  e.gid_index = 3;
  e.gid_type = "RoCE v2";
  e.mtu = 5;
  e.psn = 0xabcdef;
  absl::StatusOr<QpEndpoint> back = FromWire(ToWire(e), "node-b's queue pair 7");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->provider, e.provider);
  EXPECT_EQ(back->is_roce, e.is_roce);
  EXPECT_EQ(back->gid, e.gid);
  EXPECT_EQ(back->gid_index, e.gid_index);
  EXPECT_EQ(back->gid_type, e.gid_type);
  EXPECT_EQ(back->mtu, e.mtu);
  EXPECT_EQ(back->psn, e.psn);
  // softnic sends no GID; a daemon older than the exchange sends nothing
  // at all, and connected across nodes only on softnic.
  QpEndpoint soft;
  soft.provider = "softnic";
  EXPECT_TRUE(ToWire(soft).gid().empty());
  absl::StatusOr<QpEndpoint> old = FromWire(v1::QpEndpoint(), "node-b's queue pair 7");
  ASSERT_TRUE(old.ok());
  EXPECT_EQ(old->provider, "softnic");
}

TEST(QpEndpointWireTest, WhatAnotherNodeSendsIsCheckedFieldByField) {
  auto with = [](auto change) {
    v1::QpEndpoint w;
    w.set_provider("mlx5");
    w.set_gid(std::string(16, '\0'));
    change(w);
    return FromWire(w, "node-b's queue pair 7").status();
  };
  struct Case {
    const char* expected;
    std::function<void(v1::QpEndpoint&)> change;
  };
  for (const Case& c : std::vector<Case>{
           {"a GID of 15 bytes", [](v1::QpEndpoint& w) { w.set_gid(std::string(15, 'g')); }},
           {"PSN 16777216", [](v1::QpEndpoint& w) { w.set_psn(1u << 24); }},
           {"LID 65536", [](v1::QpEndpoint& w) { w.set_lid(1u << 16); }},
           {"MTU code 6", [](v1::QpEndpoint& w) { w.set_mtu(6); }},
           {"GID index 65536", [](v1::QpEndpoint& w) { w.set_gid_index(1u << 16); }},
           {"GID type longer", [](v1::QpEndpoint& w) { w.set_gid_type(std::string(17, 't')); }},
           {"provider 'ml\\x1b", [](v1::QpEndpoint& w) { w.set_provider("ml\x1b[0m"); }},
       }) {
    absl::Status s = with(c.change);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.expected;
    EXPECT_NE(s.message().find("node-b's queue pair 7 came with"), std::string::npos) << s;
    EXPECT_NE(s.message().find(c.expected), std::string::npos) << s;
  }
}

}  // namespace
}  // namespace mooncake::daemon::peering
