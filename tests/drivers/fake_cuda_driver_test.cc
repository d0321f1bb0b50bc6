// FakeCudaDriver itself: device queries, failure injection, and the VMM
// calls backed by host memory (export/import across instances and across
// processes), with the driver's rules the fake enforces.
#include "fake_cuda_driver.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mooncake::drivers {
namespace {

constexpr size_t kGran = size_t{2} << 20;

class FakeCudaDriverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cu_.addGpu(FakeGpu::Hopper(0));
    cu_.addGpu(FakeGpu::Hopper(1));
  }

  CuMemAllocationProp Prop(int ordinal = 0) {
    CuMemAllocationProp prop{};
    prop.type = kCuMemAllocationTypePinned;
    prop.location.type = kCuMemLocationTypeDevice;
    prop.location.id = ordinal;
    prop.requestedHandleTypes = kCuMemHandleTypePosixFileDescriptor;
    prop.allocFlags.gpuDirectRDMACapable = 1;
    return prop;
  }

  // reserve + map + setAccess(read-write) of `handle`; returns the address.
  static CuDevicePtr MapReadWrite(FakeCudaDriver& cu, CuMemHandle handle, size_t size) {
    CuDevicePtr va = 0;
    EXPECT_EQ(cu.memAddressReserve(&va, size, 0, 0, 0), kCudaSuccess);
    EXPECT_EQ(cu.memMap(va, size, 0, handle, 0), kCudaSuccess);
    CuMemAccessDesc access{};
    access.location = {kCuMemLocationTypeDevice, 0};
    access.flags = kCuMemAccessFlagsProtReadWrite;
    EXPECT_EQ(cu.memSetAccess(va, size, &access, 1), kCudaSuccess);
    return va;
  }

  static void Unmap(FakeCudaDriver& cu, CuDevicePtr va, size_t size) {
    EXPECT_EQ(cu.memUnmap(va, size), kCudaSuccess);
    EXPECT_EQ(cu.memAddressFree(va, size), kCudaSuccess);
  }

  FakeCudaDriver cu_;
};

TEST_F(FakeCudaDriverTest, QueriesNeedInitExceptTheVersion) {
  int version = 0;
  EXPECT_EQ(cu_.driverGetVersion(&version), kCudaSuccess);
  EXPECT_EQ(version, 13000);
  int count = -1;
  EXPECT_EQ(cu_.deviceGetCount(&count), kCudaErrorNotInitialized);
  ASSERT_EQ(cu_.init(0), kCudaSuccess);
  EXPECT_EQ(cu_.deviceGetCount(&count), kCudaSuccess);
  EXPECT_EQ(count, 2);
}

TEST_F(FakeCudaDriverTest, InitFailureLeavesItUninitialized) {
  cu_.setInitResult(kCudaErrorNoDevice);
  EXPECT_EQ(cu_.init(0), kCudaErrorNoDevice);
  int count = 0;
  EXPECT_EQ(cu_.deviceGetCount(&count), kCudaErrorNotInitialized);
  EXPECT_EQ(cu_.describe(kCudaErrorNoDevice),
            "CUDA_ERROR_NO_DEVICE (no CUDA-capable device is detected)");
  EXPECT_EQ(cu_.source(), "fake");
}

TEST_F(FakeCudaDriverTest, AnswersFromTheConfiguredGpus) {
  ASSERT_EQ(cu_.init(0), kCudaSuccess);
  CuDevice dev = 0;
  ASSERT_EQ(cu_.deviceGet(&dev, 1), kCudaSuccess);
  EXPECT_EQ(dev, FakeCudaDriver::kHandleBase + 1) << "handles are not ordinals";
  EXPECT_EQ(cu_.deviceGet(&dev, 2), kCudaErrorInvalidDevice);
  ASSERT_EQ(cu_.deviceGet(&dev, 0), kCudaSuccess);

  char name[64];
  ASSERT_EQ(cu_.deviceGetName(name, sizeof(name), dev), kCudaSuccess);
  EXPECT_STREQ(name, "Fake GPU 0");
  ASSERT_EQ(cu_.deviceGetName(name, 5, dev), kCudaSuccess);
  EXPECT_STREQ(name, "Fake") << "truncated like the driver";
  EXPECT_EQ(cu_.deviceGetName(name, sizeof(name), 0), kCudaErrorInvalidDevice)
      << "an ordinal is not a handle";

  CuUuid uuid{};
  ASSERT_EQ(cu_.deviceGetUuid(&uuid, dev), kCudaSuccess);
  EXPECT_EQ(uuid.bytes[0], 0xf0);
  EXPECT_EQ(uuid.bytes[15], 0xff);
  char bus_id[32];
  ASSERT_EQ(cu_.deviceGetPCIBusId(bus_id, sizeof(bus_id), dev), kCudaSuccess);
  EXPECT_STREQ(bus_id, "0000:1B:00.0");
  EXPECT_EQ(cu_.deviceGetPCIBusId(bus_id, 4, dev), kCudaErrorInvalidValue);
  size_t bytes = 0;
  ASSERT_EQ(cu_.deviceTotalMem(&bytes, dev), kCudaSuccess);
  EXPECT_EQ(bytes, size_t{80} << 30);

  int value = 0;
  ASSERT_EQ(cu_.deviceGetAttribute(&value, kCuDeviceAttrMultiprocessorCount, dev), kCudaSuccess);
  EXPECT_EQ(value, 132);
  EXPECT_EQ(cu_.deviceGetAttribute(&value, 9999, dev), kCudaErrorInvalidValue);
  cu_.gpu(0).attributes.erase(kCuDeviceAttrDmaBufSupported);
  EXPECT_EQ(cu_.deviceGetAttribute(&value, kCuDeviceAttrDmaBufSupported, dev),
            kCudaErrorInvalidValue);
}

TEST_F(FakeCudaDriverTest, P2PMatrix) {
  ASSERT_EQ(cu_.init(0), kCudaSuccess);
  cu_.setP2PAttribute(0, 1, kCuP2pAttrAccessSupported, 1);
  const CuDevice d0 = FakeCudaDriver::kHandleBase, d1 = FakeCudaDriver::kHandleBase + 1;
  int value = -1;
  ASSERT_EQ(cu_.deviceGetP2PAttribute(&value, kCuP2pAttrAccessSupported, d0, d1), kCudaSuccess);
  EXPECT_EQ(value, 1);
  ASSERT_EQ(cu_.deviceGetP2PAttribute(&value, kCuP2pAttrAccessSupported, d1, d0), kCudaSuccess);
  EXPECT_EQ(value, 0) << "unset pairs read 0";
  EXPECT_EQ(cu_.deviceGetP2PAttribute(&value, kCuP2pAttrAccessSupported, d0, d0),
            kCudaErrorInvalidDevice);
  EXPECT_EQ(cu_.deviceGetP2PAttribute(&value, 77, d0, d1), kCudaErrorInvalidValue);
}

TEST_F(FakeCudaDriverTest, FailNextAndResultOverrides) {
  ASSERT_EQ(cu_.init(0), kCudaSuccess);
  CuDevice dev = 0;
  cu_.failNext("deviceGet", kCudaErrorUnknown, 2);
  EXPECT_EQ(cu_.deviceGet(&dev, 0), kCudaErrorUnknown);
  EXPECT_EQ(cu_.deviceGet(&dev, 0), kCudaErrorUnknown);
  EXPECT_EQ(cu_.deviceGet(&dev, 0), kCudaSuccess);
  EXPECT_EQ(cu_.calls("deviceGet"), 3);

  cu_.setResult("deviceTotalMem", kCudaErrorNotPermitted);
  cu_.failNext("deviceTotalMem", kCudaErrorOutOfMemory);
  size_t bytes = 0;
  EXPECT_EQ(cu_.deviceTotalMem(&bytes, dev), kCudaErrorOutOfMemory) << "failNext first";
  EXPECT_EQ(cu_.deviceTotalMem(&bytes, dev), kCudaErrorNotPermitted);
  EXPECT_EQ(cu_.deviceTotalMem(&bytes, dev), kCudaErrorNotPermitted);
  cu_.clearResult("deviceTotalMem");
  EXPECT_EQ(cu_.deviceTotalMem(&bytes, dev), kCudaSuccess);
  EXPECT_EQ(cu_.calls("memCreate"), 0);
}

TEST_F(FakeCudaDriverTest, UnknownMethodNameAborts) {
  EXPECT_DEATH(cu_.failNext("cuDeviceGet", kCudaErrorUnknown), "not a CudaDriver method");
}

TEST_F(FakeCudaDriverTest, VmmRoundTripThroughAnExportedFd) {
  ASSERT_EQ(cu_.init(0), kCudaSuccess);
  CuMemAllocationProp prop = Prop();
  size_t gran = 0;
  ASSERT_EQ(cu_.memGetAllocationGranularity(&gran, &prop, kCuMemAllocGranularityRecommended),
            kCudaSuccess);
  EXPECT_EQ(gran, kGran);
  const size_t size = 2 * gran;

  CuMemHandle handle = 0;
  ASSERT_EQ(cu_.memCreate(&handle, size, &prop, 0), kCudaSuccess);
  CuDevicePtr va = MapReadWrite(cu_, handle, size);
  ASSERT_NE(va, 0u);
  EXPECT_EQ(va % gran, 0u) << "reservations are aligned to the granularity";
  auto* p = reinterpret_cast<uint32_t*>(static_cast<uintptr_t>(va));
  p[0] = 0xc0ffee;
  p[size / sizeof(uint32_t) - 1] = 7;

  int fd = -1;
  ASSERT_EQ(cu_.memExportToShareableHandle(&fd, handle, kCuMemHandleTypePosixFileDescriptor, 0),
            kCudaSuccess);
  ASSERT_GE(fd, 0);

  // Another driver instance (another process, as far as the fake can tell).
  FakeCudaDriver other;
  other.addGpu(FakeGpu::Hopper(0));
  ASSERT_EQ(other.init(0), kCudaSuccess);
  CuMemHandle imported = 0;
  ASSERT_EQ(other.memImportFromShareableHandle(&imported,
                                               reinterpret_cast<void*>(static_cast<uintptr_t>(fd)),
                                               kCuMemHandleTypePosixFileDescriptor),
            kCudaSuccess);
  ::close(fd);  // the import holds its own reference
  CuDevicePtr peer_va = MapReadWrite(other, imported, size);
  auto* q = reinterpret_cast<uint32_t*>(static_cast<uintptr_t>(peer_va));
  EXPECT_EQ(q[0], 0xc0ffeeu);
  EXPECT_EQ(q[size / sizeof(uint32_t) - 1], 7u);
  q[1] = 42;
  EXPECT_EQ(p[1], 42u) << "one memory behind both mappings";

  // The handle can go while mapped: the mapping keeps the memory.
  ASSERT_EQ(cu_.memRelease(handle), kCudaSuccess);
  EXPECT_EQ(p[1], 42u);
  Unmap(cu_, va, size);
  ASSERT_EQ(other.memRelease(imported), kCudaSuccess);
  Unmap(other, peer_va, size);
  for (FakeCudaDriver* d : {&cu_, &other}) {
    EXPECT_EQ(d->liveHandles(), 0u);
    EXPECT_EQ(d->liveReservations(), 0u);
    EXPECT_EQ(d->liveMappings(), 0u);
  }
}

TEST_F(FakeCudaDriverTest, ImportWorksInAnotherProcess) {
  ASSERT_EQ(cu_.init(0), kCudaSuccess);
  CuMemAllocationProp prop = Prop();
  CuMemHandle handle = 0;
  ASSERT_EQ(cu_.memCreate(&handle, kGran, &prop, 0), kCudaSuccess);
  CuDevicePtr va = MapReadWrite(cu_, handle, kGran);
  int fd = -1;
  ASSERT_EQ(cu_.memExportToShareableHandle(&fd, handle, kCuMemHandleTypePosixFileDescriptor, 0),
            kCudaSuccess);

  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Only async-signal-safe-ish work and _exit: no gtest in the child.
    FakeCudaDriver mine;
    mine.addGpu(FakeGpu::Hopper(0));
    CuMemHandle h = 0;
    CuDevicePtr p = 0;
    CuMemAccessDesc access{{kCuMemLocationTypeDevice, 0}, kCuMemAccessFlagsProtReadWrite};
    if (mine.init(0) != kCudaSuccess ||
        mine.memImportFromShareableHandle(&h, reinterpret_cast<void*>(static_cast<uintptr_t>(fd)),
                                          kCuMemHandleTypePosixFileDescriptor) != kCudaSuccess ||
        mine.memAddressReserve(&p, kGran, 0, 0, 0) != kCudaSuccess ||
        mine.memMap(p, kGran, 0, h, 0) != kCudaSuccess ||
        mine.memSetAccess(p, kGran, &access, 1) != kCudaSuccess) {
      ::_exit(1);
    }
    reinterpret_cast<volatile uint64_t*>(static_cast<uintptr_t>(p))[3] = 0x5eed;
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_EQ(reinterpret_cast<uint64_t*>(static_cast<uintptr_t>(va))[3], 0x5eedu);
  ::close(fd);
  Unmap(cu_, va, kGran);
  EXPECT_EQ(cu_.memRelease(handle), kCudaSuccess);
}

TEST_F(FakeCudaDriverTest, EnforcesTheDriversVmmRules) {
  CuMemAllocationProp prop = Prop();
  CuMemHandle handle = 0;
  EXPECT_EQ(cu_.memCreate(&handle, kGran, &prop, 0), kCudaErrorNotInitialized);
  ASSERT_EQ(cu_.init(0), kCudaSuccess);
  EXPECT_EQ(cu_.memCreate(&handle, kGran + 4096, &prop, 0), kCudaErrorInvalidValue)
      << "not a multiple of the granularity";
  CuMemAllocationProp bad = prop;
  bad.location.id = 5;
  EXPECT_EQ(cu_.memCreate(&handle, kGran, &bad, 0), kCudaErrorInvalidDevice);
  bad = prop;
  bad.location.id = FakeCudaDriver::kHandleBase + 1;
  EXPECT_EQ(cu_.memCreate(&handle, kGran, &bad, 0), kCudaSuccess)
      << "a CUdevice in location.id is accepted, as the driver's equal ordinals";
  EXPECT_EQ(cu_.memRelease(handle), kCudaSuccess);
  cu_.gpu(1).attributes[kCuDeviceAttrGpuDirectRdmaWithCudaVmmSupported] = 0;
  bad.location.id = 1;
  EXPECT_EQ(cu_.memCreate(&handle, kGran, &bad, 0), kCudaErrorNotSupported)
      << "gpuDirectRDMACapable needs GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED";

  prop.requestedHandleTypes = kCuMemHandleTypeNone;
  ASSERT_EQ(cu_.memCreate(&handle, 2 * kGran, &prop, 0), kCudaSuccess);
  int fd = -1;
  EXPECT_EQ(cu_.memExportToShareableHandle(&fd, handle, kCuMemHandleTypePosixFileDescriptor, 0),
            kCudaErrorInvalidValue)
      << "the handle type was not requested at creation";

  CuDevicePtr va = 0;
  ASSERT_EQ(cu_.memAddressReserve(&va, 2 * kGran, 0, 0, 0), kCudaSuccess);
  EXPECT_EQ(cu_.memMap(va, 4 * kGran, 0, handle, 0), kCudaErrorInvalidValue) << "too large";
  EXPECT_EQ(cu_.memMap(va, kGran, 0, 12345, 0), kCudaErrorInvalidValue) << "unknown handle";
  ASSERT_EQ(cu_.memMap(va, kGran, 0, handle, 0), kCudaSuccess);
  EXPECT_EQ(cu_.memMap(va, kGran, kGran, handle, 0), kCudaErrorInvalidValue) << "overlap";
  CuMemAccessDesc access{{kCuMemLocationTypeDevice, 0}, kCuMemAccessFlagsProtReadWrite};
  EXPECT_EQ(cu_.memSetAccess(va, 2 * kGran, &access, 1), kCudaErrorInvalidValue)
      << "half of the range is not mapped";
  ASSERT_EQ(cu_.memMap(va + kGran, kGran, kGran, handle, 0), kCudaSuccess);
  EXPECT_EQ(cu_.memSetAccess(va, 2 * kGran, &access, 1), kCudaSuccess) << "two mappings, no gap";
  EXPECT_EQ(cu_.memAddressFree(va, 2 * kGran), kCudaErrorInvalidValue) << "still mapped";
  EXPECT_EQ(cu_.memUnmap(va, kGran / 2), kCudaErrorInvalidValue) << "part of a mapping";
  EXPECT_EQ(cu_.memUnmap(va, 2 * kGran), kCudaSuccess) << "both mappings at once";
  EXPECT_EQ(cu_.memAddressFree(va, kGran), kCudaErrorInvalidValue) << "not the reserved size";
  EXPECT_EQ(cu_.memAddressFree(va, 2 * kGran), kCudaSuccess);
  EXPECT_EQ(cu_.memRelease(handle), kCudaSuccess);
  EXPECT_EQ(cu_.memRelease(handle), kCudaErrorInvalidValue) << "released twice";
}

TEST_F(FakeCudaDriverTest, FabricExportIsNotSupported) {
  ASSERT_EQ(cu_.init(0), kCudaSuccess);
  CuMemAllocationProp prop = Prop(0);
  prop.requestedHandleTypes = kCuMemHandleTypePosixFileDescriptor | kCuMemHandleTypeFabric;
  CuMemHandle handle = 0;
  ASSERT_EQ(cu_.memCreate(&handle, kGran, &prop, 0), kCudaSuccess);
  char fabric[64];
  EXPECT_EQ(cu_.memExportToShareableHandle(fabric, handle, kCuMemHandleTypeFabric, 0),
            kCudaErrorNotSupported);
  EXPECT_EQ(cu_.memRelease(handle), kCudaSuccess);
  prop.location.id = 1;  // Hopper(1) has no fabric handles
  EXPECT_EQ(cu_.memCreate(&handle, kGran, &prop, 0), kCudaErrorNotSupported);
}

// With an IMEX channel, a fabric handle names the allocation: importing
// it maps the same memory (also after the exporter released its handle,
// while a mapping keeps it), and anything else is refused.
TEST_F(FakeCudaDriverTest, FabricHandlesWorkWithAnImexChannel) {
  ASSERT_EQ(cu_.init(0), kCudaSuccess);
  cu_.setImexChannel(true);
  CuMemAllocationProp prop = Prop(0);
  prop.requestedHandleTypes = kCuMemHandleTypePosixFileDescriptor | kCuMemHandleTypeFabric;
  CuMemHandle handle = 0;
  ASSERT_EQ(cu_.memCreate(&handle, kGran, &prop, 0), kCudaSuccess);
  CuMemFabricHandle fabric{};
  ASSERT_EQ(cu_.memExportToShareableHandle(&fabric, handle, kCuMemHandleTypeFabric, 0),
            kCudaSuccess);
  CuMemHandle imported = 0;
  ASSERT_EQ(cu_.memImportFromShareableHandle(&imported, &fabric, kCuMemHandleTypeFabric),
            kCudaSuccess);
  EXPECT_NE(imported, handle);
  EXPECT_EQ(cu_.liveHandles(), 2u);

  CuDevicePtr a = 0, b = 0;
  ASSERT_EQ(cu_.memAddressReserve(&a, kGran, 0, 0, 0), kCudaSuccess);
  ASSERT_EQ(cu_.memAddressReserve(&b, kGran, 0, 0, 0), kCudaSuccess);
  ASSERT_EQ(cu_.memMap(a, kGran, 0, handle, 0), kCudaSuccess);
  ASSERT_EQ(cu_.memMap(b, kGran, 0, imported, 0), kCudaSuccess);
  CuMemAccessDesc rw{{kCuMemLocationTypeDevice, 0}, kCuMemAccessFlagsProtReadWrite};
  ASSERT_EQ(cu_.memSetAccess(a, kGran, &rw, 1), kCudaSuccess);
  ASSERT_EQ(cu_.memSetAccess(b, kGran, &rw, 1), kCudaSuccess);
  *reinterpret_cast<volatile uint64_t*>(a) = 0x0123456789abcdefull;
  EXPECT_EQ(*reinterpret_cast<volatile uint64_t*>(b), 0x0123456789abcdefull);

  CuMemFabricHandle forged = fabric;
  forged.data[0] ^= 0xff;
  CuMemHandle bad = 0;
  EXPECT_EQ(cu_.memImportFromShareableHandle(&bad, &forged, kCuMemHandleTypeFabric),
            kCudaErrorInvalidValue);
  // A POSIX-fd-only allocation has no fabric handle to export.
  CuMemHandle fd_only = 0;
  prop.requestedHandleTypes = kCuMemHandleTypePosixFileDescriptor;
  ASSERT_EQ(cu_.memCreate(&fd_only, kGran, &prop, 0), kCudaSuccess);
  EXPECT_EQ(cu_.memExportToShareableHandle(&forged, fd_only, kCuMemHandleTypeFabric, 0),
            kCudaErrorInvalidValue);
  // Without the channel, import fails as export does.
  cu_.setImexChannel(false);
  EXPECT_EQ(cu_.memImportFromShareableHandle(&bad, &fabric, kCuMemHandleTypeFabric),
            kCudaErrorNotSupported);

  EXPECT_EQ(cu_.memUnmap(a, kGran), kCudaSuccess);
  EXPECT_EQ(cu_.memUnmap(b, kGran), kCudaSuccess);
  EXPECT_EQ(cu_.memAddressFree(a, kGran), kCudaSuccess);
  EXPECT_EQ(cu_.memAddressFree(b, kGran), kCudaSuccess);
  EXPECT_EQ(cu_.memRelease(handle), kCudaSuccess);
  EXPECT_EQ(cu_.memRelease(imported), kCudaSuccess);
  EXPECT_EQ(cu_.memRelease(fd_only), kCudaSuccess);
  EXPECT_EQ(cu_.liveHandles(), 0u);
}

TEST_F(FakeCudaDriverTest, ModulesLoadOnlyWhenAllowed) {
  ASSERT_EQ(cu_.init(0), kCudaSuccess);
  static const char kImage[] = "not a fatbin";
  CuModule module = nullptr;
  EXPECT_EQ(cu_.moduleLoadData(&module, kImage), kCudaErrorNotSupported);
  cu_.setModulesLoadable(true);
  ASSERT_EQ(cu_.moduleLoadData(&module, kImage), kCudaSuccess);
  CuFunction f = nullptr;
  ASSERT_EQ(cu_.moduleGetFunction(&f, module, "kernel"), kCudaSuccess);
  EXPECT_NE(f, nullptr);
  EXPECT_EQ(cu_.launchKernel(f, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr),
            kCudaErrorNotSupported)
      << "nothing runs device code on the host";
  EXPECT_EQ(cu_.moduleUnload(module), kCudaSuccess);
}

// A registered stand-in runs on its stream's thread, in launch order, with
// the launch's arguments; while streams are held, only once the hold ends;
// a paused submission waits in its call.
TEST_F(FakeCudaDriverTest, RegisteredKernelsRunInStreamOrderAndSubmissionsCanBePaused) {
  ASSERT_EQ(cu_.init(0), kCudaSuccess);
  cu_.setModulesLoadable(true);
  std::vector<int> ran;  // read once streamQuery (under the fake's lock) said done
  cu_.registerKernel("record", [&ran](unsigned grid, unsigned block, void** args) {
    const int v = *static_cast<int*>(args[0]);
    EXPECT_EQ(grid, 2u);
    EXPECT_EQ(block, 32u);
    return FakeCudaDriver::FakeKernelBody([&ran, v] { ran.push_back(v); });
  });
  static const char kImage[] = "not a fatbin";
  CuModule module = nullptr;
  ASSERT_EQ(cu_.moduleLoadData(&module, kImage), kCudaSuccess);
  CuFunction f = nullptr;
  ASSERT_EQ(cu_.moduleGetFunction(&f, module, "record"), kCudaSuccess);
  const auto drain = [&] {
    while (cu_.streamQuery(nullptr) == kCudaErrorNotReady) std::this_thread::yield();
  };
  int v = 1;
  void* args[] = {&v};
  ASSERT_EQ(cu_.launchKernel(f, 2, 1, 1, 32, 1, 1, 0, nullptr, args, nullptr), kCudaSuccess);
  v = 2;
  ASSERT_EQ(cu_.launchKernel(f, 2, 1, 1, 32, 1, 1, 0, nullptr, args, nullptr), kCudaSuccess);
  drain();
  EXPECT_EQ(ran, std::vector<int>({1, 2}));
  cu_.holdStreams(true);
  v = 3;
  ASSERT_EQ(cu_.launchKernel(f, 2, 1, 1, 32, 1, 1, 0, nullptr, args, nullptr), kCudaSuccess);
  v = 4;  // the launch read its arguments already
  EXPECT_EQ(cu_.streamQuery(nullptr), kCudaErrorNotReady);
  cu_.holdStreams(false);
  drain();
  EXPECT_EQ(ran, std::vector<int>({1, 2, 3}));
  cu_.pauseSubmissions(true);
  std::thread launcher([&] {
    EXPECT_EQ(cu_.launchKernel(f, 2, 1, 1, 32, 1, 1, 0, nullptr, args, nullptr), kCudaSuccess);
  });
  while (cu_.pausedSubmissions() == 0) std::this_thread::yield();
  drain();
  EXPECT_EQ(ran, std::vector<int>({1, 2, 3})) << "a paused submission ran";
  cu_.pauseSubmissions(false);
  launcher.join();
  drain();
  EXPECT_EQ(ran, std::vector<int>({1, 2, 3, 4}));
  EXPECT_EQ(cu_.moduleUnload(module), kCudaSuccess);
}

// Stream order across a hold: a kernel held before a copy on the same
// stream runs first when the hold ends, and a device-to-host copy held
// behind it reads what the kernel wrote.
TEST_F(FakeCudaDriverTest, AHeldKernelRunsBeforeTheCopiesHeldBehindIt) {
  ASSERT_EQ(cu_.init(0), kCudaSuccess);
  CuContext ctx = nullptr;
  ASSERT_EQ(cu_.devicePrimaryCtxRetain(&ctx, FakeCudaDriver::kHandleBase), kCudaSuccess);
  ASSERT_EQ(cu_.ctxSetCurrent(ctx), kCudaSuccess);
  cu_.setModulesLoadable(true);
  CuDevicePtr word = 0;
  ASSERT_EQ(cu_.memAlloc(&word, 8), kCudaSuccess);
  cu_.registerKernel("store", [this](unsigned, unsigned, void** args) {
    const CuDevicePtr at = *static_cast<CuDevicePtr*>(args[0]);
    const uint64_t v = *static_cast<uint64_t*>(args[1]);
    return FakeCudaDriver::FakeKernelBody([this, at, v] { cu_.memcpyHtoD(at, &v, 8); });
  });
  static const char kImage[] = "not a fatbin";
  CuModule module = nullptr;
  ASSERT_EQ(cu_.moduleLoadData(&module, kImage), kCudaSuccess);
  CuFunction f = nullptr;
  ASSERT_EQ(cu_.moduleGetFunction(&f, module, "store"), kCudaSuccess);
  CuStream stream = nullptr;
  ASSERT_EQ(cu_.streamCreate(&stream, 0x1), kCudaSuccess);
  cu_.holdStreams(true);
  uint64_t v = 7;
  void* args[] = {&word, &v};
  ASSERT_EQ(cu_.launchKernel(f, 1, 1, 1, 1, 1, 1, 0, stream, args, nullptr), kCudaSuccess);
  uint64_t back = 0;
  ASSERT_EQ(cu_.memcpyDtoHAsync(&back, word, 8, stream), kCudaSuccess);
  const uint64_t nine = 9;
  ASSERT_EQ(cu_.memcpyHtoDAsync(word, &nine, 8, stream), kCudaSuccess);
  EXPECT_EQ(back, 0u) << "a held copy read early";
  cu_.holdStreams(false);
  while (cu_.streamQuery(stream) == kCudaErrorNotReady) std::this_thread::yield();
  EXPECT_EQ(back, 7u) << "the held copy did not read behind the kernel";
  uint64_t last = 0;
  ASSERT_EQ(cu_.memcpyDtoH(&last, word, 8), kCudaSuccess);
  EXPECT_EQ(last, 9u) << "the kernel ran after the copy held behind it";
  EXPECT_EQ(cu_.streamDestroy(stream), kCudaSuccess);
  EXPECT_EQ(cu_.memFree(word), kCudaSuccess);
  EXPECT_EQ(cu_.moduleUnload(module), kCudaSuccess);
}

TEST_F(FakeCudaDriverTest, CopiesBetweenEveryKindOfDeviceMemory) {
  ASSERT_EQ(cu_.init(0), kCudaSuccess);
  CuContext ctx = nullptr;
  ASSERT_EQ(cu_.devicePrimaryCtxRetain(&ctx, FakeCudaDriver::kHandleBase), kCudaSuccess);
  ASSERT_EQ(cu_.ctxSetCurrent(ctx), kCudaSuccess);
  CuMemAllocationProp prop = Prop();
  CuMemHandle handle = 0;
  ASSERT_EQ(cu_.memCreate(&handle, kGran, &prop, 0), kCudaSuccess);
  const CuDevicePtr vmm = MapReadWrite(cu_, handle, kGran);
  CuDevicePtr linear = 0;
  ASSERT_EQ(cu_.memAlloc(&linear, 256), kCudaSuccess);
  std::vector<uint8_t> host(256);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<uint8_t>(i);

  // Host -> VMM -> linear (DtoD) -> VMM again (unified memcpy) -> host.
  ASSERT_EQ(cu_.memcpyHtoD(vmm + 64, host.data(), 256), kCudaSuccess);
  ASSERT_EQ(cu_.memcpyDtoD(linear, vmm + 64, 256), kCudaSuccess);
  ASSERT_EQ(cu_.memcpy(vmm + 4096, linear, 256), kCudaSuccess);
  std::vector<uint8_t> back(256);
  ASSERT_EQ(cu_.memcpyDtoH(back.data(), vmm + 4096, 256), kCudaSuccess);
  EXPECT_EQ(back, host);
  // Overlapping ranges copy as memmove does.
  ASSERT_EQ(cu_.memcpyDtoD(vmm + 65, vmm + 64, 16), kCudaSuccess);
  ASSERT_EQ(cu_.memcpyDtoH(back.data(), vmm + 64, 17), kCudaSuccess);
  EXPECT_EQ(back[0], 0);
  EXPECT_EQ(back[1], 0);
  EXPECT_EQ(back[16], 15);

  // Unknown addresses and ranges past an allocation are refused.
  EXPECT_EQ(cu_.memcpyDtoD(linear, 0x10, 8), kCudaErrorInvalidValue);
  EXPECT_EQ(cu_.memcpy(linear + 200, vmm, 100), kCudaErrorInvalidValue);
  const auto pageable = reinterpret_cast<uintptr_t>(host.data());
  EXPECT_EQ(cu_.memcpy(linear, pageable, 8), kCudaErrorInvalidValue)
      << "host memory only once registered";

  ASSERT_EQ(cu_.memFree(linear), kCudaSuccess);
  Unmap(cu_, vmm, kGran);
  ASSERT_EQ(cu_.memRelease(handle), kCudaSuccess);
  ASSERT_EQ(cu_.ctxSetCurrent(nullptr), kCudaSuccess);
  ASSERT_EQ(cu_.devicePrimaryCtxRelease(FakeCudaDriver::kHandleBase), kCudaSuccess);
}

TEST_F(FakeCudaDriverTest, RegisteredHostMemoryIsDeviceVisible) {
  ASSERT_EQ(cu_.init(0), kCudaSuccess);
  std::vector<uint64_t> words(512, 0);
  void* p = words.data();
  const size_t bytes = words.size() * sizeof(uint64_t);
  EXPECT_EQ(cu_.memHostRegister(p, bytes, kCuMemHostRegisterPortable), kCudaErrorInvalidContext)
      << "registration needs a current context";
  CuContext ctx = nullptr;
  ASSERT_EQ(cu_.devicePrimaryCtxRetain(&ctx, FakeCudaDriver::kHandleBase), kCudaSuccess);
  ASSERT_EQ(cu_.ctxSetCurrent(ctx), kCudaSuccess);
  EXPECT_EQ(cu_.memHostRegister(p, bytes, 0x100), kCudaErrorInvalidValue) << "unknown flag";
  ASSERT_EQ(cu_.memHostRegister(p, bytes, kCuMemHostRegisterPortable | kCuMemHostRegisterDeviceMap),
            kCudaSuccess);
  EXPECT_EQ(cu_.memHostRegister(&words[100], 8, 0), kCudaErrorHostMemoryAlreadyRegistered);
  EXPECT_EQ(cu_.liveHostRegistrations(), 1u);

  CuDevicePtr dptr = 0;
  EXPECT_EQ(cu_.memHostGetDevicePointer(&dptr, p, 1), kCudaErrorInvalidValue) << "flags must be 0";
  ASSERT_EQ(cu_.memHostGetDevicePointer(&dptr, &words[8], 0), kCudaSuccess);
  EXPECT_EQ(dptr, reinterpret_cast<uintptr_t>(&words[8]));
  const uint64_t value = 0xfeedface;
  ASSERT_EQ(cu_.memcpyHtoD(dptr, &value, sizeof(value)), kCudaSuccess);
  EXPECT_EQ(words[8], value);
  CuDevicePtr linear = 0;
  ASSERT_EQ(cu_.memAlloc(&linear, 64), kCudaSuccess);
  ASSERT_EQ(cu_.memcpy(linear, dptr, 8), kCudaSuccess);
  ASSERT_EQ(cu_.memcpyDtoD(dptr + 8, linear, 8), kCudaSuccess);
  EXPECT_EQ(words[9], value);
  ASSERT_EQ(cu_.memFree(linear), kCudaSuccess);

  EXPECT_EQ(cu_.memHostUnregister(&words[8]), kCudaErrorHostMemoryNotRegistered)
      << "the start of the range only";
  ASSERT_EQ(cu_.memHostUnregister(p), kCudaSuccess);
  EXPECT_EQ(cu_.memHostUnregister(p), kCudaErrorHostMemoryNotRegistered);
  EXPECT_EQ(cu_.memHostGetDevicePointer(&dptr, p, 0), kCudaErrorInvalidValue);
  EXPECT_EQ(cu_.liveHostRegistrations(), 0u);
  ASSERT_EQ(cu_.ctxSetCurrent(nullptr), kCudaSuccess);
  ASSERT_EQ(cu_.devicePrimaryCtxRelease(FakeCudaDriver::kHandleBase), kCudaSuccess);
}

TEST_F(FakeCudaDriverTest, DestructorFreesWhatIsLeft) {
  auto cu = std::make_unique<FakeCudaDriver>();
  cu->addGpu(FakeGpu::Hopper(0));
  ASSERT_EQ(cu->init(0), kCudaSuccess);
  CuMemAllocationProp prop = Prop();
  CuMemHandle handle = 0;
  ASSERT_EQ(cu->memCreate(&handle, kGran, &prop, 0), kCudaSuccess);
  MapReadWrite(*cu, handle, kGran);
  EXPECT_EQ(cu->liveMappings(), 1u);
  cu.reset();  // no leak reported by sanitizers, no crash
}

TEST_F(FakeCudaDriverTest, ConcurrentCallsAreSafe) {
  ASSERT_EQ(cu_.init(0), kCudaSuccess);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([this] {
      CuMemAllocationProp prop = Prop();
      for (int i = 0; i < 50; ++i) {
        CuMemHandle h = 0;
        ASSERT_EQ(cu_.memCreate(&h, kGran, &prop, 0), kCudaSuccess);
        CuDevicePtr va = MapReadWrite(cu_, h, kGran);
        reinterpret_cast<int*>(static_cast<uintptr_t>(va))[0] = i;
        Unmap(cu_, va, kGran);
        ASSERT_EQ(cu_.memRelease(h), kCudaSuccess);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(cu_.calls("memCreate"), 200);
  EXPECT_EQ(cu_.liveHandles(), 0u);
}

}  // namespace
}  // namespace mooncake::drivers
