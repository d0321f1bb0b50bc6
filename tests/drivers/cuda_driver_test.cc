// LoadCudaDriver against missing, broken and stub libraries (no GPU
// needed), and CuStatus's mapping of results to canonical codes.
#include "mooncake/drivers/cuda_driver.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "fake_cuda_driver.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

#ifndef MC_STUB_CUDA_LIB
#error "MC_STUB_CUDA_LIB must name the stub libcuda built by tests/drivers"
#endif

namespace mooncake::drivers {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

std::string TempPath(const std::string& leaf) {
  return (std::filesystem::temp_directory_path() /
          ("mc-drivers-" + std::to_string(::getpid()) + "-" + leaf))
      .string();
}

TEST(LoadCudaDriverTest, MissingLibrarySaysTheDriverIsNotInstalled) {
  auto driver = LoadCudaDriver("libmc-no-such-cuda.so.1");
  ASSERT_FALSE(driver.ok());
  EXPECT_EQ(driver.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(driver.status().message(), AllOf(HasSubstr("libmc-no-such-cuda.so.1 not found"),
                                               HasSubstr("no NVIDIA driver on this node"),
                                               HasSubstr("install the NVIDIA driver")));
}

TEST(LoadCudaDriverTest, OutcomeIsCachedPerPath) {
  // Missing at the first call: still missing at the second, even once a
  // library appears there (the answer is cached, dlopen is not retried).
  const std::string path = TempPath("late-libcuda.so");
  auto first = LoadCudaDriver(path);
  ASSERT_EQ(first.status().code(), absl::StatusCode::kNotFound);
  std::filesystem::copy_file(MC_STUB_CUDA_LIB, path);
  auto second = LoadCudaDriver(path);
  std::filesystem::remove(path);
  EXPECT_EQ(second.status(), first.status());

  // A loaded driver is one object for every caller.
  auto a = LoadCudaDriver(MC_STUB_CUDA_LIB);
  auto b = LoadCudaDriver(MC_STUB_CUDA_LIB);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(a->get(), b->get());
}

TEST(LoadCudaDriverTest, BrokenLibraryIsFailedPrecondition) {
  const std::string path = TempPath("broken-libcuda.so.1");
  std::ofstream(path) << "not an ELF file\n";
  auto driver = LoadCudaDriver(path);
  std::filesystem::remove(path);
  ASSERT_FALSE(driver.ok());
  EXPECT_EQ(driver.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(driver.status().message(),
              AllOf(HasSubstr("could not be loaded"), HasSubstr("reinstall the NVIDIA driver")));
}

TEST(LoadCudaDriverTest, EmptyNameIsInvalidArgument) {
  EXPECT_EQ(LoadCudaDriver("").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(LoadCudaDriverTest, ResolvesVersionedSymbolsWithDlsym) {
  auto loaded = LoadCudaDriver(MC_STUB_CUDA_LIB);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  CudaDriver& cu = **loaded;
  EXPECT_EQ(cu.source(), std::string(MC_STUB_CUDA_LIB) + " (driver 12040)");
  ASSERT_EQ(cu.init(0), kCudaSuccess);
  CuUuid uuid{};
  ASSERT_EQ(cu.deviceGetUuid(&uuid, 0), kCudaSuccess);
  EXPECT_EQ(uuid.bytes[0], 0x22) << "cuDeviceGetUuid_v2, not the first version";
  size_t bytes = 0;
  ASSERT_EQ(cu.deviceTotalMem(&bytes, 0), kCudaSuccess);
  EXPECT_EQ(bytes, size_t{1} << 34) << "cuDeviceTotalMem_v2, not the 32-bit first version";
  int value = 0;
  EXPECT_EQ(cu.deviceGetAttribute(&value, kCuDeviceAttrDmaBufSupported, 0), kCudaSuccess);
  EXPECT_EQ(value, kCuDeviceAttrDmaBufSupported);
  EXPECT_EQ(cu.memMap(0, 0, 0, 0, 0), kCudaErrorNotSupported);
  // Copies and host registration resolve too (every stub entry point
  // answers "not supported", the first cuMemHostRegister "invalid value").
  EXPECT_EQ(cu.memcpy(0, 0, 0), kCudaErrorNotSupported);
  EXPECT_EQ(cu.memcpyDtoD(0, 0, 0), kCudaErrorNotSupported);
  EXPECT_EQ(cu.memHostRegister(nullptr, 0, 0), kCudaErrorNotSupported)
      << "cuMemHostRegister_v2, not the first version";
  EXPECT_EQ(cu.memHostUnregister(nullptr), kCudaErrorNotSupported);
  CuDevicePtr dptr = 0;
  EXPECT_EQ(cu.memHostGetDevicePointer(&dptr, nullptr, 0), kCudaErrorNotSupported);
}

TEST(LoadCudaDriverTest, PrefersCuGetProcAddressAndFallsBackToDlsym) {
  auto loaded = LoadCudaDriver(MC_STUB_CUDA_GETPROC_LIB);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  CudaDriver& cu = **loaded;
  CuUuid uuid{};
  ASSERT_EQ(cu.deviceGetUuid(&uuid, 0), kCudaSuccess);
  EXPECT_EQ(uuid.bytes[0], 0x33) << "the entry point cuGetProcAddress_v2 returned";
  // The stub's cuGetProcAddress_v2 does not know cuMemMap: found by dlsym.
  EXPECT_EQ(cu.memMap(0, 0, 0, 0, 0), kCudaErrorNotSupported);

  void* handle = dlopen(MC_STUB_CUDA_GETPROC_LIB, RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(handle, nullptr) << "the loader keeps the library loaded";
  EXPECT_EQ(*static_cast<int*>(dlsym(handle, "stub_requested_version")), 12000)
      << "the CUDA 12.0 ABI, whose signatures the interface declares";
  EXPECT_GE(*static_cast<int*>(dlsym(handle, "stub_get_proc_calls")), 20);
  dlclose(handle);  // only our extra reference
}

TEST(LoadCudaDriverTest, FallsBackToTheFirstUuidEntryPoint) {
  auto loaded = LoadCudaDriver(MC_STUB_CUDA_LEGACY_UUID_LIB);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  CuUuid uuid{};
  ASSERT_EQ((*loaded)->deviceGetUuid(&uuid, 0), kCudaSuccess);
  EXPECT_EQ(uuid.bytes[0], 0x11);
  EXPECT_EQ((*loaded)->memHostRegister(nullptr, 0, 0), kCudaErrorInvalidValue)
      << "the first cuMemHostRegister, when the driver has no _v2";
}

TEST(LoadCudaDriverTest, MissingEntryPointNamesItAndTheDriverAge) {
  auto loaded = LoadCudaDriver(MC_STUB_CUDA_NO_P2P_LIB);
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(loaded.status().message(),
              AllOf(HasSubstr("lacks cuDeviceGetP2PAttribute"),
                    HasSubstr("the NVIDIA driver is missing or older than"),
                    HasSubstr("update the driver"), Not(HasSubstr("cuDeviceGetName"))));
}

TEST(LoadCudaDriverTest, DescribeAsksTheDriverThenTheTable) {
  auto loaded = LoadCudaDriver(MC_STUB_CUDA_LIB);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ((*loaded)->describe(kCudaErrorNotSupported),
            "CUDA_ERROR_NOT_SUPPORTED (operation not supported)");
  // The stub's cuGetErrorName knows only 801, like a driver older than a code.
  EXPECT_EQ((*loaded)->describe(kCudaErrorOutOfMemory), "CUDA_ERROR_OUT_OF_MEMORY (out of memory)");
  EXPECT_EQ((*loaded)->describe(12345), "CUDA error 12345 (unknown error code)");
}

TEST(CuStatusTest, SuccessIsOk) {
  FakeCudaDriver cu;
  EXPECT_TRUE(CuStatus(cu, kCudaSuccess, "cuInit").ok());
}

TEST(CuStatusTest, MapsResultsToCanonicalCodes) {
  FakeCudaDriver cu;
  struct Case {
    CuResult r;
    absl::StatusCode code;
  };
  const Case cases[] = {
      {kCudaErrorOutOfMemory, absl::StatusCode::kResourceExhausted},
      {kCudaErrorInvalidValue, absl::StatusCode::kInvalidArgument},
      {kCudaErrorInvalidDevice, absl::StatusCode::kInvalidArgument},
      {kCudaErrorInvalidHandle, absl::StatusCode::kInvalidArgument},
      {kCudaErrorNotSupported, absl::StatusCode::kFailedPrecondition},
      {kCudaErrorNotPermitted, absl::StatusCode::kFailedPrecondition},
      {kCudaErrorNoDevice, absl::StatusCode::kFailedPrecondition},
      {kCudaErrorNotInitialized, absl::StatusCode::kFailedPrecondition},
      {kCudaErrorStubLibrary, absl::StatusCode::kFailedPrecondition},
      {kCudaErrorCallRequiresNewerDriver, absl::StatusCode::kFailedPrecondition},
      {kCudaErrorSystemDriverMismatch, absl::StatusCode::kFailedPrecondition},
      {kCudaErrorCompatNotSupportedOnDevice, absl::StatusCode::kFailedPrecondition},
      {kCudaErrorUnknown, absl::StatusCode::kInternal},
      {kCudaErrorAlreadyMapped, absl::StatusCode::kInternal},
      {12345, absl::StatusCode::kInternal},
  };
  for (const Case& c : cases) {
    absl::Status status = CuStatus(cu, c.r, "call");
    EXPECT_EQ(status.code(), c.code) << c.r << ": " << status;
    EXPECT_EQ(CuResultCode(c.r), c.code);
  }
}

TEST(CuStatusTest, MessageNamesTheCallAndTheResult) {
  FakeCudaDriver cu;
  std::string what = "cuMemCreate(2097152 bytes)";
  EXPECT_EQ(CuStatus(cu, kCudaErrorOutOfMemory, what).message(),
            "cuMemCreate(2097152 bytes): CUDA_ERROR_OUT_OF_MEMORY (out of memory)");
  EXPECT_EQ(CuStatus(cu, kCudaErrorInvalidValue, "cuMemMap").message(),
            "cuMemMap: CUDA_ERROR_INVALID_VALUE (invalid argument)");
  EXPECT_EQ(CuStatus(cu, 4242, "cuInit").message(), "cuInit: CUDA error 4242 (unknown error code)");
}

// The device the CUDA runtime would use: the current context's, else 0.
TEST(CurrentDeviceOrdinalTest, FollowsTheCurrentContextElseDeviceZero) {
  FakeCudaDriver cu;
  cu.addGpu(FakeGpu::Hopper(0));
  cu.addGpu(FakeGpu::Hopper(1));
  absl::StatusOr<int> none = CurrentDeviceOrdinal(cu);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(*none, 0) << "no current context: the runtime's default device";

  CuDevice dev1 = 0;
  ASSERT_EQ(cu.deviceGet(&dev1, 1), kCudaSuccess);
  CuContext ctx = nullptr;
  ASSERT_EQ(cu.devicePrimaryCtxRetain(&ctx, dev1), kCudaSuccess);
  ASSERT_EQ(cu.ctxSetCurrent(ctx), kCudaSuccess);  // as cudaSetDevice(1) does
  absl::StatusOr<int> one = CurrentDeviceOrdinal(cu);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(*one, 1) << "an ordinal, not the fake's device handle";
  ASSERT_EQ(cu.ctxSetCurrent(nullptr), kCudaSuccess);
  ASSERT_EQ(cu.devicePrimaryCtxRelease(dev1), kCudaSuccess);
  EXPECT_EQ(cu.primaryContextRefs(1), 0);
}

TEST(CurrentDeviceOrdinalTest, NoGpuIsFailedPrecondition) {
  FakeCudaDriver cu;
  absl::StatusOr<int> ordinal = CurrentDeviceOrdinal(cu);
  EXPECT_EQ(ordinal.status().code(), absl::StatusCode::kFailedPrecondition);
  cu.setInitResult(kCudaErrorNoDevice);
  EXPECT_THAT(CurrentDeviceOrdinal(cu).status().message(), HasSubstr("cuInit"));
}

}  // namespace
}  // namespace mooncake::drivers
