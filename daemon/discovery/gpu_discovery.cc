#include "discovery/gpu_discovery.h"

#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "discovery/sysfs_files.h"

namespace mooncake::daemon {
namespace {

using drivers::CudaDriver;
using drivers::CuDevice;
using drivers::CuResult;
using drivers::kCudaSuccess;

// "cuInit: CUDA_ERROR_NO_DEVICE (no CUDA-capable device is detected)"
std::string CudaError(CudaDriver& cu, const std::string& call, CuResult rc) {
  return std::string(drivers::CuStatus(cu, rc, call).message());
}

// What a failing cuInit usually means, for the note.
std::string CuInitAdvice(CuResult rc) {
  switch (rc) {
    case drivers::kCudaErrorNoDevice:
      return "the driver sees no GPU; check nvidia-smi, CUDA_VISIBLE_DEVICES and access to "
             "/dev/nvidia*";
    case drivers::kCudaErrorSystemDriverMismatch:
    case drivers::kCudaErrorCompatNotSupportedOnDevice:
      return "the kernel module and libcuda versions differ; reboot or reinstall the driver";
    case drivers::kCudaErrorStubLibrary:
      return "the libcuda found is the CUDA toolkit's stub; take the toolkit's stubs/ directory "
             "off the library path so the driver's libcuda.so.1 is loaded";
    case drivers::kCudaErrorUnknown:
      return "the driver failed to initialize; check dmesg and nvidia-smi";
    default: return "check nvidia-smi and dmesg";
  }
}

bool QueryFlag(CudaDriver& cu, CuDevice dev, int ordinal, int attr, absl::string_view attr_name,
               std::vector<std::string>* problems) {
  int value = 0;
  CuResult rc = cu.deviceGetAttribute(&value, attr, dev);
  if (rc != kCudaSuccess) {
    problems->push_back(
        absl::StrCat("GPU ", ordinal, ": ",
                     CudaError(cu, absl::StrCat("cuDeviceGetAttribute(", attr_name, ")"), rc),
                     "; reported as unsupported"));
    return false;
  }
  return value != 0;
}

int QueryInt(CudaDriver& cu, CuDevice dev, int ordinal, int attr, absl::string_view attr_name,
             std::vector<std::string>* problems) {
  int value = 0;
  CuResult rc = cu.deviceGetAttribute(&value, attr, dev);
  if (rc != kCudaSuccess) {
    problems->push_back(
        absl::StrCat("GPU ", ordinal, ": ",
                     CudaError(cu, absl::StrCat("cuDeviceGetAttribute(", attr_name, ")"), rc)));
    return 0;
  }
  return value;
}

// Core identity (name, UUID, bus id, memory); attributes never fail the GPU.
absl::StatusOr<v1::Gpu> QueryGpu(CudaDriver& cu, const GpuDiscoveryOptions& options, int ordinal,
                                 CuDevice dev, std::vector<std::string>* problems) {
  v1::Gpu gpu;
  gpu.set_index(ordinal);
  char name[256] = {};
  CuResult rc = cu.deviceGetName(name, sizeof(name) - 1, dev);
  if (rc != kCudaSuccess) return absl::InternalError(CudaError(cu, "cuDeviceGetName", rc));
  gpu.set_name(name);
  drivers::CuUuid uuid{};
  rc = cu.deviceGetUuid(&uuid, dev);
  if (rc != kCudaSuccess) return absl::InternalError(CudaError(cu, "cuDeviceGetUuid", rc));
  std::array<uint8_t, 16> bytes;
  std::memcpy(bytes.data(), uuid.bytes, bytes.size());
  gpu.set_uuid(FormatGpuUuid(bytes));
  char bus_id[64] = {};
  rc = cu.deviceGetPCIBusId(bus_id, sizeof(bus_id) - 1, dev);
  if (rc != kCudaSuccess) return absl::InternalError(CudaError(cu, "cuDeviceGetPCIBusId", rc));
  gpu.set_pci_bus_id(NormalizePciBusId(bus_id));
  size_t total = 0;
  rc = cu.deviceTotalMem(&total, dev);
  if (rc != kCudaSuccess) return absl::InternalError(CudaError(cu, "cuDeviceTotalMem", rc));
  gpu.set_total_memory_bytes(total);
  gpu.set_numa_node(ReadPciNumaNode(options.sysfs_root, gpu.pci_bus_id()));

  gpu.set_compute_capability_major(QueryInt(cu, dev, ordinal,
                                            drivers::kCuDeviceAttrComputeCapabilityMajor,
                                            "COMPUTE_CAPABILITY_MAJOR", problems));
  gpu.set_compute_capability_minor(QueryInt(cu, dev, ordinal,
                                            drivers::kCuDeviceAttrComputeCapabilityMinor,
                                            "COMPUTE_CAPABILITY_MINOR", problems));
  gpu.set_multiprocessor_count(QueryInt(cu, dev, ordinal, drivers::kCuDeviceAttrMultiprocessorCount,
                                        "MULTIPROCESSOR_COUNT", problems));
  gpu.set_vmm_supported(QueryFlag(cu, dev, ordinal,
                                  drivers::kCuDeviceAttrVirtualMemoryManagementSupported,
                                  "VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED", problems));
  gpu.set_posix_fd_handle_supported(
      QueryFlag(cu, dev, ordinal, drivers::kCuDeviceAttrHandleTypePosixFileDescriptorSupported,
                "HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED", problems));
  gpu.set_fabric_handle_supported(QueryFlag(cu, dev, ordinal,
                                            drivers::kCuDeviceAttrHandleTypeFabricSupported,
                                            "HANDLE_TYPE_FABRIC_SUPPORTED", problems));
  gpu.set_dmabuf_supported(QueryFlag(cu, dev, ordinal, drivers::kCuDeviceAttrDmaBufSupported,
                                     "DMA_BUF_SUPPORTED", problems));
  return gpu;
}

v1::GpuPair QueryPair(CudaDriver& cu, int src_ordinal, CuDevice src, int dst_ordinal, CuDevice dst,
                      std::vector<std::string>* problems) {
  v1::GpuPair pair;
  pair.set_src(src_ordinal);
  pair.set_dst(dst_ordinal);
  auto query = [&](int attr, absl::string_view attr_name) {
    int value = 0;
    CuResult rc = cu.deviceGetP2PAttribute(&value, attr, src, dst);
    if (rc != kCudaSuccess) {
      problems->push_back(
          absl::StrCat("GPU ", src_ordinal, "->", dst_ordinal, ": ",
                       CudaError(cu, absl::StrCat("cuDeviceGetP2PAttribute(", attr_name, ")"), rc),
                       "; reported as unsupported"));
      return 0;
    }
    return value;
  };
  pair.set_access_supported(query(drivers::kCuP2pAttrAccessSupported, "ACCESS_SUPPORTED") != 0);
  pair.set_native_atomics(
      query(drivers::kCuP2pAttrNativeAtomicSupported, "NATIVE_ATOMIC_SUPPORTED") != 0);
  pair.set_performance_rank(query(drivers::kCuP2pAttrPerformanceRank, "PERFORMANCE_RANK"));
  return pair;
}

}  // namespace

std::string FormatGpuUuid(const std::array<uint8_t, 16>& b) {
  char out[64];
  std::snprintf(out, sizeof(out),
                "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
                b[14], b[15]);
  return out;
}

GpuDiscoveryResult DiscoverGpus(const GpuDiscoveryOptions& options) {
  GpuDiscoveryResult result;
  std::shared_ptr<CudaDriver> driver = options.driver;
  if (driver == nullptr) {
    if (options.cuda_library.empty()) {
      result.note = "GPU discovery is disabled (no CUDA library configured)";
      return result;
    }
    absl::StatusOr<std::shared_ptr<CudaDriver>> loaded =
        drivers::LoadCudaDriver(options.cuda_library);
    if (!loaded.ok()) {
      result.note = std::string(loaded.status().message());
      return result;
    }
    driver = *std::move(loaded);
  }
  CudaDriver& cu = *driver;
  // The version is readable before cuInit, and worth reporting when cuInit
  // then fails (a driver/library mismatch shows up there).
  int version = 0;
  if (cu.driverGetVersion(&version) == kCudaSuccess) result.driver_version = version;

  CuResult rc = cu.init(0);
  if (rc != kCudaSuccess) {
    result.note = absl::StrCat(CudaError(cu, "cuInit", rc), ": ", CuInitAdvice(rc));
    return result;
  }
  int count = 0;
  rc = cu.deviceGetCount(&count);
  if (rc != kCudaSuccess) {
    result.note = CudaError(cu, "cuDeviceGetCount", rc);
    return result;
  }
  if (count == 0) {
    result.note = absl::StrCat("the NVIDIA driver ", cu.source(),
                               " reports no GPU; check nvidia-smi and CUDA_VISIBLE_DEVICES");
    return result;
  }

  std::vector<std::string> problems;
  std::vector<std::pair<int, CuDevice>> found;  // (ordinal, handle) of listed GPUs
  for (int ordinal = 0; ordinal < count; ++ordinal) {
    CuDevice dev = 0;
    rc = cu.deviceGet(&dev, ordinal);
    if (rc != kCudaSuccess) {
      problems.push_back(
          absl::StrCat("GPU ", ordinal, " skipped: ", CudaError(cu, "cuDeviceGet", rc)));
      continue;
    }
    absl::StatusOr<v1::Gpu> gpu = QueryGpu(cu, options, ordinal, dev, &problems);
    if (!gpu.ok()) {
      problems.push_back(absl::StrCat("GPU ", ordinal, " skipped: ", gpu.status().message()));
      continue;
    }
    result.gpus.push_back(*std::move(gpu));
    found.emplace_back(ordinal, dev);
  }
  for (const auto& [src_ordinal, src] : found) {
    for (const auto& [dst_ordinal, dst] : found) {
      if (src_ordinal == dst_ordinal) continue;
      result.pairs.push_back(QueryPair(cu, src_ordinal, src, dst_ordinal, dst, &problems));
    }
  }
  result.note = absl::StrJoin(problems, "; ");
  return result;
}

}  // namespace mooncake::daemon
