// mcctl doctor against fake nodes: a sysfs/procfs tree in a temporary
// directory (tests/discovery/fake_sysfs.h) and a FakeCudaDriver, so every
// check runs its real code on a machine without GPU or NIC.
#include "mooncake/mcctl/doctor.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "fake_cuda_driver.h"
#include "fake_sysfs.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "mooncake/mcctl/cli.h"

namespace mooncake::mcctl {
namespace {

using daemon::test_support::BuildTwoSocketNode;
using daemon::test_support::FakeSysfs;
using drivers::FakeCudaDriver;
using drivers::FakeGpu;

// An extended config space whose only capability is ACS with `control`.
std::string ConfigWithAcs(uint16_t control) {
  std::string c(4096, '\0');
  c[0x100] = 0x0D;  // ACS
  c[0x101] = 0x00;
  c[0x102] = 0x01;  // version 1, next 0
  c[0x106] = static_cast<char>(control & 0xff);
  c[0x107] = static_cast<char>(control >> 8);
  return c;
}

class DoctorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = std::filesystem::path(sys_.root()).parent_path().string();
    cuda_ = std::make_shared<FakeCudaDriver>();
  }

  void Write(const std::string& rel, const std::string& content) {
    std::filesystem::path p = std::filesystem::path(root_) / rel;
    std::filesystem::create_directories(p.parent_path());
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out << content;
  }

  // A node ready for GPU-initiated transfers: two GPUs under switch A with
  // two NICs, P2P both ways, open driver with the regkey, peermem, kernel
  // 6.1, no IOMMU, unlimited memlock, ACS off on every switch port.
  void BuildReadyNode() {
    BuildTwoSocketNode(sys_);
    FakeGpu g0 = FakeGpu::Hopper(0);
    g0.pci_bus_id = "0000:03:00.0";
    FakeGpu g1 = FakeGpu::Hopper(1);
    g1.pci_bus_id = "0000:07:00.0";
    cuda_->addGpu(g0);
    cuda_->addGpu(g1);
    for (int a : {0, 1}) {
      cuda_->setP2PAttribute(a, 1 - a, drivers::kCuP2pAttrAccessSupported, 1);
      cuda_->setP2PAttribute(a, 1 - a, drivers::kCuP2pAttrNativeAtomicSupported, 1);
    }
    for (const char* ib : {"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"}) {
      sys_.AddGid(ib, 1, 0, "fe80:0000:0000:0000:0c42:a103:0065:ef30", "IB");
    }
    Write("proc/driver/nvidia/version",
          "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  Release Build  "
          "(dvs-builder@U16)  Thu Jan 16 2025\nGCC version:  gcc version 12.2.0\n");
    Write("proc/driver/nvidia/params",
          "ResmanDebugLevel: 4294967295\nRegistryDwords: \"PeerMappingOverride=1;\"\n");
    std::filesystem::create_directories(root_ + "/sys/module/nvidia_peermem");
    Write("proc/sys/kernel/osrelease", "6.1.0-28-amd64\n");
    Write("proc/self/limits",
          "Limit                     Soft Limit           Hard Limit           Units\n"
          "Max open files            1048576              1048576              files\n"
          "Max locked memory         unlimited            unlimited            bytes\n");
    for (const char* bridge : {"0000:00:01.0", "0000:01:00.0", "0000:02:00.0", "0000:02:01.0",
                               "0000:02:02.0", "0000:05:00.0", "0000:06:00.0"}) {
      SetAcs(bridge, 0x0001);  // source validation only: no redirect
    }
  }

  void SetAcs(const std::string& bdf, uint16_t control) {
    Write(absl::StrCat("sys/bus/pci/devices/", bdf, "/config"), ConfigWithAcs(control));
  }

  DoctorOptions Options() const {
    DoctorOptions o;
    o.root = root_;
    o.socket = root_ + "/no-daemon.sock";
    o.cuda_driver = cuda_;
    o.use_verbs = false;
    return o;
  }

  // mooncaked's answer as if it ran on this node.
  DaemonFacts MatchingDaemon() const {
    DaemonFacts d;
    v1::DaemonStatus st;
    st.set_version("test");
    st.set_node_id("fake-node");
    d.status = st;
    d.topology = LocalTopology(Options());
    return d;
  }

  static const DoctorCheck& Find(const DoctorReport& r, const std::string& name) {
    for (const DoctorCheck& c : r.checks) {
      if (c.name == name) return c;
    }
    static DoctorCheck none{"<missing>", CheckStatus::kSkip, "", ""};
    ADD_FAILURE() << "no check named " << name;
    return none;
  }

  static std::string Dump(const DoctorReport& r) { return FormatDoctor(r); }

  FakeSysfs sys_;
  std::string root_;
  std::shared_ptr<FakeCudaDriver> cuda_;
};

TEST_F(DoctorTest, ReadyNodePassesEveryCheck) {
  BuildReadyNode();
  DoctorReport r = RunDoctor(Options(), MatchingDaemon());
  for (const char* name :
       {"driver", "gpus", "p2p", "peermem", "dmabuf", "peer-mapping-regkey", "pcie-acs", "iommu",
        "memlock", "nofile", "socket-access", "nic-ports", "daemon-view"}) {
    EXPECT_EQ(Find(r, name).status, CheckStatus::kOk) << name << "\n" << Dump(r);
  }
  EXPECT_TRUE(r.ready()) << Dump(r);
  EXPECT_EQ(r.checks.size(), 13u);
  EXPECT_NE(Find(r, "driver").detail.find("570.86.15"), std::string::npos);
  EXPECT_NE(Find(r, "driver").detail.find("13.0"), std::string::npos);
  EXPECT_NE(Find(r, "pcie-acs").detail.find("none redirects"), std::string::npos) << Dump(r);
  EXPECT_NE(FormatDoctor(r).find("ready for GPU-initiated transfers"), std::string::npos);
}

TEST_F(DoctorTest, AcsRedirectOnTheSwitchFails) {
  BuildReadyNode();
  SetAcs("0000:02:00.0", 0x001d);  // SV, RR, CR, UF: requests go to the root complex
  DoctorReport r = RunDoctor(Options(), MatchingDaemon());
  const DoctorCheck& acs = Find(r, "pcie-acs");
  EXPECT_EQ(acs.status, CheckStatus::kFail) << Dump(r);
  EXPECT_NE(acs.detail.find("0000:02:00.0"), std::string::npos) << acs.detail;
  EXPECT_FALSE(acs.fix.empty());
  EXPECT_FALSE(r.ready());
}

TEST_F(DoctorTest, UnreadableExtendedConfigSpaceIsSkippedNotPassed) {
  BuildReadyNode();
  Write("sys/bus/pci/devices/0000:02:00.0/config", std::string(256, '\0'));  // unprivileged read
  DoctorReport r = RunDoctor(Options(), MatchingDaemon());
  EXPECT_EQ(Find(r, "pcie-acs").status, CheckStatus::kSkip) << Dump(r);
  EXPECT_NE(Find(r, "pcie-acs").detail.find("needs root"), std::string::npos);
}

TEST_F(DoctorTest, MissingRegkeyPeermemAndDmabufFail) {
  BuildReadyNode();
  Write("proc/driver/nvidia/params", "RegistryDwords: \"\"\n");
  Write("etc/modprobe.d/nvidia.conf",
        "options nvidia NVreg_RegistryDwords=\"PeerMappingOverride=1;\"\n");
  std::filesystem::remove_all(root_ + "/sys/module/nvidia_peermem");
  Write("proc/sys/kernel/osrelease", "5.10.0-30-amd64\n");
  DoctorReport r = RunDoctor(Options(), MatchingDaemon());
  const DoctorCheck& key = Find(r, "peer-mapping-regkey");
  EXPECT_EQ(key.status, CheckStatus::kFail) << Dump(r);
  EXPECT_NE(key.detail.find("nvidia.conf"), std::string::npos) << key.detail;  // set, not active
  EXPECT_NE(key.fix.find("PeerMappingOverride=1"), std::string::npos);
  EXPECT_EQ(Find(r, "dmabuf").status, CheckStatus::kFail) << Dump(r);
  EXPECT_NE(Find(r, "dmabuf").detail.find("5.10"), std::string::npos);
  EXPECT_EQ(Find(r, "peermem").status, CheckStatus::kFail) << Dump(r);
  EXPECT_FALSE(r.ready());
}

TEST_F(DoctorTest, DmabufAloneMakesPeermemAWarning) {
  BuildReadyNode();
  std::filesystem::remove_all(root_ + "/sys/module/nvidia_peermem");
  DoctorReport r = RunDoctor(Options(), MatchingDaemon());
  EXPECT_EQ(Find(r, "peermem").status, CheckStatus::kWarn) << Dump(r);
  EXPECT_TRUE(r.ready()) << Dump(r);
}

TEST_F(DoctorTest, OneWayP2pAndPortsDownAndSmallMemlock) {
  BuildReadyNode();
  cuda_->setP2PAttribute(1, 0, drivers::kCuP2pAttrAccessSupported, 0);
  for (const char* ib : {"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"}) {
    sys_.AddPort(ib, 1, "1: DOWN", "3: Disabled", "InfiniBand", "400 Gb/sec (4X NDR)", "0x0");
  }
  Write("proc/self/limits",
        "Max open files            1024                 4096                 files\n"
        "Max locked memory         65536                65536                bytes\n");
  DoctorReport r = RunDoctor(Options(), MatchingDaemon());
  EXPECT_EQ(Find(r, "p2p").status, CheckStatus::kFail) << Dump(r);
  EXPECT_NE(Find(r, "p2p").detail.find("0<->1"), std::string::npos);
  EXPECT_EQ(Find(r, "nic-ports").status, CheckStatus::kFail) << Dump(r);
  EXPECT_NE(Find(r, "nic-ports").detail.find("DOWN"), std::string::npos);
  EXPECT_EQ(Find(r, "memlock").status, CheckStatus::kFail) << Dump(r);
  EXPECT_EQ(Find(r, "nofile").status, CheckStatus::kWarn) << Dump(r);
  EXPECT_FALSE(r.ready());
}

TEST_F(DoctorTest, DaemonViewMismatchAndUnreachableDaemonFail) {
  BuildReadyNode();
  DaemonFacts other = MatchingDaemon();
  other.topology->add_gpus()->set_uuid("GPU-not-on-this-node");
  DoctorReport r = RunDoctor(Options(), other);
  EXPECT_EQ(Find(r, "daemon-view").status, CheckStatus::kFail) << Dump(r);
  EXPECT_NE(Find(r, "daemon-view").detail.find("GPU-not-on-this-node"), std::string::npos);

  DoctorReport gone = RunDoctor(Options(), DaemonFacts{});
  EXPECT_EQ(Find(gone, "daemon-view").status, CheckStatus::kFail);
  const DoctorCheck& sock = Find(gone, "socket-access");
  EXPECT_EQ(sock.status, CheckStatus::kFail) << Dump(gone);
  EXPECT_NE(sock.detail.find("no-daemon.sock"), std::string::npos);
}

TEST_F(DoctorTest, BareMachineReportsEveryCheckWithoutCrashing) {
  // No GPU (the driver lists none), no NIC, nothing in proc.
  DoctorReport r = RunDoctor(Options(), DaemonFacts{});
  EXPECT_EQ(r.checks.size(), 13u);
  EXPECT_EQ(Find(r, "gpus").status, CheckStatus::kFail) << Dump(r);
  for (const char* name :
       {"p2p", "peermem", "dmabuf", "peer-mapping-regkey", "pcie-acs", "memlock", "nofile"}) {
    EXPECT_EQ(Find(r, name).status, CheckStatus::kSkip) << name << "\n" << Dump(r);
    EXPECT_FALSE(Find(r, name).detail.empty()) << name;
  }
  EXPECT_EQ(Find(r, "nic-ports").status, CheckStatus::kWarn) << Dump(r);
  EXPECT_FALSE(r.ready());
  EXPECT_NE(FormatDoctor(r).find("not ready"), std::string::npos);
}

TEST_F(DoctorTest, DriverMissingFails) {
  cuda_->setDriverVersion(0);
  cuda_->setInitResult(drivers::kCudaErrorNoDevice);
  DoctorReport r = RunDoctor(Options(), DaemonFacts{});
  EXPECT_EQ(Find(r, "driver").status, CheckStatus::kFail) << Dump(r);
  EXPECT_FALSE(Find(r, "driver").fix.empty());
}

TEST_F(DoctorTest, IommuTranslationWarns) {
  BuildReadyNode();
  std::filesystem::create_directories(root_ + "/sys/class/iommu/dmar0");
  Write("sys/bus/pci/devices/0000:03:00.0/iommu_group/type", "DMA-FQ\n");
  Write("proc/cmdline", "BOOT_IMAGE=/vmlinuz intel_iommu=on quiet\n");
  DoctorReport r = RunDoctor(Options(), MatchingDaemon());
  const DoctorCheck& c = Find(r, "iommu");
  EXPECT_EQ(c.status, CheckStatus::kWarn) << Dump(r);
  EXPECT_NE(c.detail.find("DMA-FQ"), std::string::npos);
  EXPECT_NE(c.detail.find("intel_iommu=on"), std::string::npos);
}

TEST_F(DoctorTest, JsonShapeAndEscaping) {
  BuildReadyNode();
  // A device string with a terminal escape: shown escaped, parsed back intact.
  Write("proc/sys/kernel/osrelease", "6.1.0-\x1b[31mred\n");
  DoctorReport r = RunDoctor(Options(), MatchingDaemon());
  const std::string json = DoctorJson(r);
  EXPECT_EQ(json.find('\x1b'), std::string::npos);
  EXPECT_EQ(FormatDoctor(r).find('\x1b'), std::string::npos);
  google::protobuf::Struct parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json, &parsed).ok()) << json;
  ASSERT_TRUE(parsed.fields().contains("checks"));
  const auto& checks = parsed.fields().at("checks").list_value();
  ASSERT_EQ(checks.values_size(), 13);
  for (const auto& v : checks.values()) {
    const auto& f = v.struct_value().fields();
    for (const char* key : {"name", "status", "detail", "fix"}) {
      EXPECT_TRUE(f.contains(key)) << key;
    }
  }
  EXPECT_TRUE(parsed.fields().at("ready").bool_value());
}

// The command line: exit status 0 when ready, 1 when not; -j is --json.
TEST_F(DoctorTest, CliExitStatusAndShortJsonFlag) {
  BuildReadyNode();
  McctlHooks hooks;
  hooks.cuda_driver = cuda_;
  hooks.daemon = MatchingDaemon();
  std::ostringstream out, err;
  EXPECT_EQ(RunMcctl({"doctor", "--root", root_, "-j"}, out, err, hooks), kExitOk) << out.str();
  google::protobuf::Struct parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(out.str(), &parsed).ok()) << out.str();
  EXPECT_TRUE(parsed.fields().at("ready").bool_value());

  SetAcs("0000:02:01.0", 0x0004);
  std::ostringstream out2, err2;
  EXPECT_EQ(RunMcctl({"--json", "doctor", "--root=" + root_}, out2, err2, hooks), kExitError);
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(out2.str(), &parsed).ok());
  EXPECT_FALSE(parsed.fields().at("ready").bool_value());

  std::ostringstream out3, err3;
  EXPECT_EQ(RunMcctl({"doctor", "--root", root_}, out3, err3, hooks), kExitError);
  EXPECT_NE(out3.str().find("fail pcie-acs"), std::string::npos) << out3.str();
  EXPECT_NE(out3.str().find("fix: "), std::string::npos);
}

TEST(DoctorHelpers, AcsControlFromConfig) {
  EXPECT_EQ(*AcsControlFromConfig(ConfigWithAcs(0x001d)), 0x001d);
  EXPECT_TRUE(absl::IsFailedPrecondition(AcsControlFromConfig(std::string(256, '\0')).status()));
  EXPECT_TRUE(absl::IsNotFound(AcsControlFromConfig(std::string(4096, '\0')).status()));
  // ACS second in the list: AER (0x0001) at 0x100 pointing to 0x148.
  std::string c(4096, '\0');
  c[0x100] = 0x01;
  c[0x102] = 0x81;  // version 1, next 0x148 (bits 20..31 = 0x148)
  c[0x103] = 0x14;
  c[0x148] = 0x0D;
  c[0x14e] = 0x04;
  EXPECT_EQ(*AcsControlFromConfig(c), 0x0004);
  // A list that points back at itself ends instead of looping.
  std::string loop(4096, '\0');
  loop[0x100] = 0x01;
  loop[0x102] = 0x01;
  loop[0x103] = 0x10;  // next = 0x100
  EXPECT_TRUE(absl::IsNotFound(AcsControlFromConfig(loop).status()));
}

TEST(DoctorHelpers, SoftLimitFromProcLimits) {
  const std::string text =
      "Limit                     Soft Limit           Hard Limit           Units\n"
      "Max open files            1024                 524288               files\n"
      "Max locked memory         unlimited            unlimited            bytes\n";
  EXPECT_EQ(*SoftLimitFromProcLimits(text, "Max open files"), 1024);
  EXPECT_EQ(*SoftLimitFromProcLimits(text, "Max locked memory"), -1);
  EXPECT_TRUE(absl::IsNotFound(SoftLimitFromProcLimits(text, "Max processes").status()));
}

}  // namespace
}  // namespace mooncake::mcctl
