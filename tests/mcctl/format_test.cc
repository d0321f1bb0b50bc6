// The human-readable renderings, topology matrices above all.
#include "mooncake/mcctl/format.h"

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "mooncake/mcctl/watch.h"

namespace mooncake::mcctl {
namespace {

v1::Topology ThreeGpusTwoNics() {
  v1::Topology t;
  for (int i = 0; i < 3; ++i) {
    auto* g = t.add_gpus();
    g->set_index(i);
    g->set_name("NVIDIA H200");
    g->set_numa_node(i < 2 ? 0 : 1);
  }
  auto pair = [&](int s, int d, bool access, bool atomics, int rank) {
    auto* p = t.add_gpu_pairs();
    p->set_src(s);
    p->set_dst(d);
    p->set_access_supported(access);
    p->set_native_atomics(atomics);
    p->set_performance_rank(rank);
  };
  pair(0, 1, true, true, 0);
  pair(1, 0, true, true, 0);
  pair(0, 2, true, false, 1);
  pair(2, 0, true, false, 1);
  pair(1, 2, false, false, 0);
  // (2,1) deliberately missing: the matrix must say so rather than guess.
  for (const char* name : {"mlx5_0", "mlx5_1"}) t.add_nics()->set_name(name);
  auto aff = [&](int gpu, const char* nic, const char* dist, bool closest) {
    auto* a = t.add_affinity();
    a->set_gpu(gpu);
    a->set_nic(nic);
    a->set_distance(dist);
    a->set_closest(closest);
  };
  aff(0, "mlx5_0", "PIX", true);
  aff(0, "mlx5_1", "SYS", false);
  aff(1, "mlx5_0", "PXB", true);
  aff(1, "mlx5_1", "PXB", true);
  aff(2, "mlx5_0", "", false);
  return t;
}

TEST(FormatTopologyTest, GpuMatrixCells) {
  const std::string m = FormatGpuMatrix(ThreeGpusTwoNics());
  EXPECT_TRUE(absl::StartsWith(m,
                               "      GPU0  GPU1  GPU2  NUMA\n"
                               "GPU0  X     A0    P1    0\n"
                               "GPU1  A0    X     -     0\n"
                               "GPU2  P1    ?     X     1\n"))
      << m;
  EXPECT_TRUE(absl::StrContains(m, "Legend:")) << m;
}

TEST(FormatTopologyTest, GpuNicMatrixMarksClosest) {
  const std::string m = FormatGpuNicMatrix(ThreeGpusTwoNics());
  EXPECT_TRUE(absl::StartsWith(m,
                               "      mlx5_0   mlx5_1  CLOSEST\n"
                               "GPU0  PIX*     SYS     mlx5_0\n"
                               "GPU1  PXB*     PXB*    mlx5_0,mlx5_1\n"
                               "GPU2  UNKNOWN  ?       -\n"))
      << m;
  EXPECT_TRUE(absl::StrContains(m, "PIX   = behind the same PCIe switch")) << m;
}

TEST(FormatTopologyTest, EmptyListsExplainWhy) {
  v1::Topology t;
  t.set_gpu_discovery_note("libcuda.so.1 not found: no NVIDIA driver on this node");
  t.set_nic_discovery_note("no RDMA devices under /sys/class/infiniband");
  EXPECT_EQ(FormatGpuMatrix(t),
            "no GPUs (libcuda.so.1 not found: no NVIDIA driver on this node)\n");
  EXPECT_EQ(FormatGpuNicMatrix(t), "no RDMA NICs (no RDMA devices under /sys/class/infiniband)\n");
  EXPECT_EQ(FormatGpus(t), "no GPUs (libcuda.so.1 not found: no NVIDIA driver on this node)\n");
  EXPECT_EQ(FormatNics(t), "no RDMA NICs (no RDMA devices under /sys/class/infiniband)\n");
  const std::string topo = FormatTopology(t);
  EXPECT_TRUE(absl::StrContains(topo, "GPU to GPU:\nno GPUs (")) << topo;
  EXPECT_TRUE(absl::StrContains(topo, "GPU to NIC:\nno RDMA NICs (")) << topo;

  v1::Topology silent;
  EXPECT_EQ(FormatGpus(silent), "no GPUs (discovery found none)\n");
}

TEST(FormatTopologyTest, NicsWithoutGpus) {
  v1::Topology t = ThreeGpusTwoNics();
  t.clear_gpus();
  t.set_gpu_discovery_note("CUDA driver reports 0 devices");
  EXPECT_EQ(FormatGpuNicMatrix(t), "no GPUs (CUDA driver reports 0 devices)\n");
}

TEST(FormatTest, NicPortsOneRowEach) {
  v1::Topology t;
  auto* n = t.add_nics();
  n->set_name("mlx5_0");
  n->set_pci_bus_id("0000:18:00.0");
  n->set_numa_node(-1);
  auto* p = n->add_ports();
  p->set_port(1);
  p->set_state("ACTIVE");
  p->set_link_layer("InfiniBand");
  p->set_lid(7);
  p->add_gids()->set_gid("fe80::1");
  auto* q = n->add_ports();
  q->set_port(2);
  q->set_state("DOWN");
  n->set_provider("mlx5");
  auto* soft = t.add_nics();  // no ports
  soft->set_name("softnic0");
  soft->set_provider("softnic");
  const std::string s = FormatNics(t);
  EXPECT_TRUE(absl::StrContains(
      s, "mlx5_0    mlx5         1  ACTIVE  -     InfiniBand  -       7     1  0000:18:00.0     -"))
      << s;
  EXPECT_TRUE(absl::StrContains(s, "mlx5_0    mlx5         2  DOWN")) << s;
  EXPECT_TRUE(absl::StrContains(s, "softnic0  softnic      -  -")) << s;
}

TEST(FormatTest, QueuePairsAndMemoryRegions) {
  EXPECT_EQ(FormatQueuePairs(v1::ListQueuePairsResponse()), "no queue pairs\n");
  EXPECT_EQ(FormatMemoryRegions(v1::ListMemoryRegionsResponse()), "no memory regions\n");
  v1::ListQueuePairsResponse qps;
  auto* q = qps.add_qps();
  q->set_qpn(4660);
  q->set_nic("softnic0");
  q->set_state("ERROR");
  q->set_session_id(7);
  q->set_pid(42);
  q->set_uid(1000);
  q->set_sq_wqe_cnt(256);
  q->set_wqes_done(9);
  q->set_doorbell_mode("doorbell-record");
  q->set_last_error("remote access error: bad rkey, range or rights (0x13)");
  q->set_wqes_counted(true);
  q->set_ring_counters(true);
  q->set_sq_posted(10);
  q->set_cq_consumed(8);
  // A NIC's QP: completions not seen, only the client's records.
  auto* n = qps.add_qps();
  n->set_qpn(77);
  n->set_nic("mlx5_1");
  n->set_state("RTS");
  n->set_sq_wqe_cnt(64);
  n->set_ring_counters(true);
  n->set_sq_posted(65535);
  n->set_cq_consumed(16777215);
  n->set_doorbell_mode("cpu-assisted");
  n->set_ring_memory("host");
  // Rings in GPU memory: the daemon cannot read their records.
  auto* g = qps.add_qps();
  g->set_qpn(78);
  g->set_nic("mlx5_1");
  g->set_state("RTS");
  g->set_sq_wqe_cnt(64);
  g->set_ring_memory("gpu");
  g->set_doorbell_mode("gpu-uar");
  const std::string s = FormatQueuePairs(qps);
  EXPECT_TRUE(absl::StartsWith(s, " QPN  NIC       STATE  SESSION")) << s;
  EXPECT_TRUE(absl::StrContains(s, "4660  softnic0  ERROR")) << s;
  EXPECT_TRUE(absl::StrContains(s, "doorbell-record  remote access error")) << s;
  EXPECT_TRUE(absl::StrContains(s, "WQES  POSTED     CQ-CI  RINGS  DOORBELL")) << s;
  EXPECT_TRUE(absl::StrContains(s, "256     9      10         8  -      doorbell-record")) << s;
  EXPECT_TRUE(absl::StrContains(s, "64     -   65535  16777215  host   cpu-assisted")) << s;
  EXPECT_TRUE(absl::StrContains(s, "64     -       -         -  gpu    gpu-uar")) << s;
  v1::ListMemoryRegionsResponse mrs;
  auto* m = mrs.add_regions();
  m->set_nic("softnic0");
  m->set_size(1 << 20);
  m->set_kind("host");
  m->set_access("local,remote-write");
  m->set_session_id(7);
  const std::string r = FormatMemoryRegions(mrs);
  EXPECT_TRUE(absl::StrContains(r, "softnic0  1048576  host  local,remote-write")) << r;
}

TEST(FormatTest, Units) {
  EXPECT_EQ(FormatBytes(0), "0 B");
  EXPECT_EQ(FormatBytes(1023), "1023 B");
  EXPECT_EQ(FormatBytes(1536), "1.5 KiB");
  EXPECT_EQ(FormatBytes(150ull << 30), "150.0 GiB");
  EXPECT_EQ(FormatDurationMs(850), "850ms");
  EXPECT_EQ(FormatDurationMs(12'000), "12s");
  EXPECT_EQ(FormatDurationMs(185'000), "3m05s");
  EXPECT_EQ(FormatDurationMs(7'620'000), "2h07m");
  EXPECT_EQ(FormatDurationMs(273'600'000), "3d04h");
  EXPECT_EQ(FormatCudaDriverVersion(13000), "13.0");
  EXPECT_EQ(FormatCudaDriverVersion(12080), "12.8");
  EXPECT_EQ(FormatCudaDriverVersion(0), "none");
}

TEST(FormatTest, GroupsListMembers) {
  v1::ListGroupsResponse r;
  auto* g = r.add_groups();
  g->set_name("quickstart");
  g->set_uid(1000);
  g->set_world_size(2);
  g->set_joined(2);
  g->set_state("ready");
  g->set_epoch(1);
  for (int rank = 0; rank < 2; ++rank) {
    auto* m = g->add_members();
    m->set_rank(rank);
    m->set_state("ready");
    m->set_pid(100 + rank);
    m->set_gpu_index(rank == 0 ? -1 : 3);
    m->set_handle_kind("memfd");
    m->set_handle_size(1 << 20);
    m->set_session_id(9);
  }
  const std::string s = FormatGroups(r);
  EXPECT_TRUE(absl::StartsWith(s,
                               "NAME         UID  SIZE  JOINED  STATE  EPOCH  AGE\n"
                               "quickstart  1000     2       2  ready      1  0ms\n"))
      << s;
  EXPECT_TRUE(absl::StrContains(s,
                                "members of quickstart:\n"
                                "  RANK  STATE  PID   GPU  HANDLE     SIZE  SESSION\n"
                                "     0  ready  100  host  memfd   1.0 MiB        9\n"
                                "     1  ready  101     3  memfd   1.0 MiB        9\n"))
      << s;
  EXPECT_EQ(FormatGroups(v1::ListGroupsResponse()), "no groups\n");
  EXPECT_EQ(FormatSessions(v1::ListSessionsResponse()), "no sessions\n");
}

TEST(FormatTest, GroupsAcrossNodesAndTenantsSayWhereAndWhose) {
  v1::ListGroupsResponse r;
  auto* g = r.add_groups();
  g->set_name("wide");
  g->set_uid(1000);
  g->set_world_size(2);
  g->set_joined(2);
  g->set_state("formed");
  for (int rank = 0; rank < 2; ++rank) {
    auto* m = g->add_members();
    m->set_rank(rank);
    m->set_state("joined");
    m->set_pid(100 + rank);
    m->set_gpu_index(0);
    if (rank == 1) m->set_node_id("node-b");
  }
  *r.add_groups() = *g;
  r.mutable_groups(1)->set_tenant("team-a");
  const std::string s = FormatGroups(r);
  // Root sees one name in two tenants: each row says whose.
  EXPECT_TRUE(absl::StrContains(s, "AGE  TENANT\n")) << s;
  EXPECT_TRUE(absl::StrContains(s, "0ms  -\n")) << s;
  EXPECT_TRUE(absl::StrContains(s, "0ms  team-a\n")) << s;
  EXPECT_TRUE(absl::StrContains(s, "members of wide (tenant team-a):\n")) << s;
  EXPECT_TRUE(absl::StrContains(s, "SESSION  NODE\n")) << s;
  EXPECT_TRUE(absl::StrContains(s, "0  local\n")) << s;
  EXPECT_TRUE(absl::StrContains(s, "0  node-b\n")) << s;
}

TEST(FormatTest, WatchLinesEscapeClientStringsAndNameTheTenant) {
  v1::WatchEvent e;
  e.set_seq(7);
  e.set_time_unix_ms(1738324800123);
  e.set_kind(v1::WatchEvent::MEMBER_JOINED);
  e.set_group("g");
  e.set_uid(1000);
  e.set_rank(1);
  e.set_world_size(2);
  e.set_pid(4242);
  e.set_detail("evil\n2025-01-31T00:00:00.000Z  group_ready\x1b[2J");
  std::string text = WatchEventText(e);
  EXPECT_EQ(text.find('\n'), text.size() - 1) << text;  // one line, however forged
  EXPECT_EQ(text.find('\x1b'), std::string::npos) << text;
  EXPECT_FALSE(absl::StrContains(text, "tenant")) << text;  // the main socket's group
  EXPECT_TRUE(absl::StrContains(WatchEventJson(e), "\"tenant\":\"\"")) << WatchEventJson(e);

  e.set_tenant("team-a");
  text = WatchEventText(e);
  EXPECT_TRUE(absl::StrContains(text, "uid 1000 tenant 'team-a'")) << text;
  const std::string json = WatchEventJson(e);
  EXPECT_TRUE(absl::StrContains(json, "\"uid\":1000,\"tenant\":\"team-a\",")) << json;
  EXPECT_EQ(json.find('\n'), json.size() - 1) << json;
  EXPECT_EQ(json.find('\x1b'), std::string::npos) << json;
}

}  // namespace
}  // namespace mooncake::mcctl
