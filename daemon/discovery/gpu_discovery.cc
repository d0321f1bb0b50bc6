#include "discovery/gpu_discovery.h"

#include <dlfcn.h>

#include <cstddef>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "discovery/sysfs_files.h"

namespace mooncake::daemon {
namespace {

// The few CUDA driver API types and values used here, declared locally so
// the daemon needs no CUDA headers. Values are from cuda.h (CUDA 13.0) and
// have been stable since they were introduced; tests/discovery builds a fake
// libcuda from the real cuda.h, so a wrong value here fails a test.
using CUresult = int;
using CUdevice = int;
struct CUuuid {
  unsigned char bytes[16];
};
constexpr CUresult kCudaSuccess = 0;

// CUdevice_attribute
constexpr int kAttrMultiprocessorCount = 16;
constexpr int kAttrComputeCapabilityMajor = 75;
constexpr int kAttrComputeCapabilityMinor = 76;
constexpr int kAttrVirtualMemoryManagementSupported = 102;
constexpr int kAttrHandleTypePosixFileDescriptorSupported = 103;
constexpr int kAttrDmaBufSupported = 124;
constexpr int kAttrHandleTypeFabricSupported = 128;

// CUdevice_P2PAttribute
constexpr int kP2pPerformanceRank = 1;
constexpr int kP2pAccessSupported = 2;
constexpr int kP2pNativeAtomicSupported = 3;

// The enum parameters are passed as int: a C enum with these values has
// int's size and calling convention on every ABI the driver ships for.
struct CudaDriverApi {
  CUresult (*cuInit)(unsigned int flags) = nullptr;
  CUresult (*cuDriverGetVersion)(int* version) = nullptr;
  CUresult (*cuDeviceGetCount)(int* count) = nullptr;
  CUresult (*cuDeviceGet)(CUdevice* device, int ordinal) = nullptr;
  CUresult (*cuDeviceGetName)(char* name, int len, CUdevice dev) = nullptr;
  CUresult (*cuDeviceGetUuid)(CUuuid* uuid, CUdevice dev) = nullptr;
  CUresult (*cuDeviceGetPCIBusId)(char* bus_id, int len, CUdevice dev) = nullptr;
  CUresult (*cuDeviceTotalMem)(size_t* bytes, CUdevice dev) = nullptr;
  CUresult (*cuDeviceGetAttribute)(int* value, int attrib, CUdevice dev) = nullptr;
  CUresult (*cuDeviceGetP2PAttribute)(int* value, int attrib, CUdevice src,
                                      CUdevice dst) = nullptr;
  // Optional: only used to word error messages.
  CUresult (*cuGetErrorName)(CUresult error, const char** name) = nullptr;
  CUresult (*cuGetErrorString)(CUresult error, const char** text) = nullptr;
};

template <typename Fn>
bool Resolve(void* handle, const char* symbol, Fn* out) {
  void* sym = dlsym(handle, symbol);
  if (sym == nullptr) return false;
  *out = reinterpret_cast<Fn>(sym);
  return true;
}

absl::StatusOr<CudaDriverApi> LoadCudaDriver(const std::string& library) {
  // Deliberately never dlclose()d: see gpu_discovery.h.
  void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* err = dlerror();
    std::string why = err != nullptr ? err : "unknown dlopen error";
    // glibc's wording for "searched everywhere, no such file" (ENOENT);
    // anything else means a file was found but is unusable.
    if (absl::StrContains(why, "No such file")) {
      return absl::NotFoundError(absl::StrCat(
          library, " not found: no NVIDIA driver on this node, or it is not on the library "
          "search path; install the NVIDIA driver (or set the CUDA library path) to use GPUs"));
    }
    return absl::FailedPreconditionError(absl::StrCat(
        library, " could not be loaded (", why, "); reinstall the NVIDIA driver or point the "
        "CUDA library option at a working libcuda"));
  }
  CudaDriverApi api;
  std::vector<std::string> missing;
  auto need = [&](const char* symbol, auto* fn) {
    if (!Resolve(handle, symbol, fn)) missing.push_back(symbol);
  };
  need("cuInit", &api.cuInit);
  need("cuDriverGetVersion", &api.cuDriverGetVersion);
  need("cuDeviceGetCount", &api.cuDeviceGetCount);
  need("cuDeviceGet", &api.cuDeviceGet);
  need("cuDeviceGetName", &api.cuDeviceGetName);
  // The _v2 entry point (CUDA 11.4+) returns the same UUID nvidia-smi shows
  // also for MIG instances; older drivers only have the first version.
  if (!Resolve(handle, "cuDeviceGetUuid_v2", &api.cuDeviceGetUuid)) {
    need("cuDeviceGetUuid", &api.cuDeviceGetUuid);
  }
  need("cuDeviceGetPCIBusId", &api.cuDeviceGetPCIBusId);
  need("cuDeviceTotalMem_v2", &api.cuDeviceTotalMem);
  need("cuDeviceGetAttribute", &api.cuDeviceGetAttribute);
  need("cuDeviceGetP2PAttribute", &api.cuDeviceGetP2PAttribute);
  Resolve(handle, "cuGetErrorName", &api.cuGetErrorName);
  Resolve(handle, "cuGetErrorString", &api.cuGetErrorString);
  if (!missing.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        library, " lacks ", absl::StrJoin(missing, ", "),
        ": the NVIDIA driver is older than this daemon needs; update the driver"));
  }
  return api;
}

// "cuInit: CUDA_ERROR_NO_DEVICE (100): no CUDA-capable device is detected"
std::string CudaError(const CudaDriverApi& api, absl::string_view call, CUresult rc) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (api.cuGetErrorName == nullptr || api.cuGetErrorName(rc, &name) != kCudaSuccess) name = nullptr;
  if (api.cuGetErrorString == nullptr || api.cuGetErrorString(rc, &text) != kCudaSuccess) text = nullptr;
  return absl::StrCat(call, ": ", name != nullptr ? name : "CUDA error", " (", rc, ")",
                      text != nullptr ? absl::StrCat(": ", text) : "");
}

// What a failing cuInit usually means, for the note.
std::string CuInitAdvice(CUresult rc) {
  switch (rc) {
    case 100:  // CUDA_ERROR_NO_DEVICE
      return "the driver sees no GPU; check nvidia-smi, CUDA_VISIBLE_DEVICES and access to "
             "/dev/nvidia*";
    case 35:   // CUDA_ERROR_INSUFFICIENT_DRIVER
    case 803:  // CUDA_ERROR_SYSTEM_DRIVER_MISMATCH
      return "the kernel module and libcuda versions differ; reboot or reinstall the driver";
    case 999:  // CUDA_ERROR_UNKNOWN
      return "the driver failed to initialize; check dmesg and nvidia-smi";
    default:
      return "check nvidia-smi and dmesg";
  }
}

bool QueryFlag(const CudaDriverApi& api, CUdevice dev, int ordinal, int attr,
               absl::string_view attr_name, std::vector<std::string>* problems) {
  int value = 0;
  CUresult rc = api.cuDeviceGetAttribute(&value, attr, dev);
  if (rc != kCudaSuccess) {
    problems->push_back(absl::StrCat(
        "GPU ", ordinal, ": ", CudaError(api, absl::StrCat("cuDeviceGetAttribute(", attr_name, ")"), rc),
        "; reported as unsupported"));
    return false;
  }
  return value != 0;
}

int QueryInt(const CudaDriverApi& api, CUdevice dev, int ordinal, int attr,
             absl::string_view attr_name, std::vector<std::string>* problems) {
  int value = 0;
  CUresult rc = api.cuDeviceGetAttribute(&value, attr, dev);
  if (rc != kCudaSuccess) {
    problems->push_back(absl::StrCat(
        "GPU ", ordinal, ": ", CudaError(api, absl::StrCat("cuDeviceGetAttribute(", attr_name, ")"), rc)));
    return 0;
  }
  return value;
}

// Core identity (name, UUID, bus id, memory); attributes never fail the GPU.
absl::StatusOr<v1::Gpu> QueryGpu(const CudaDriverApi& api, const GpuDiscoveryOptions& options,
                                 int ordinal, CUdevice dev, std::vector<std::string>* problems) {
  v1::Gpu gpu;
  gpu.set_index(ordinal);
  char name[256] = {};
  CUresult rc = api.cuDeviceGetName(name, sizeof(name) - 1, dev);
  if (rc != kCudaSuccess) return absl::InternalError(CudaError(api, "cuDeviceGetName", rc));
  gpu.set_name(name);
  CUuuid uuid{};
  rc = api.cuDeviceGetUuid(&uuid, dev);
  if (rc != kCudaSuccess) return absl::InternalError(CudaError(api, "cuDeviceGetUuid", rc));
  std::array<uint8_t, 16> bytes;
  std::memcpy(bytes.data(), uuid.bytes, bytes.size());
  gpu.set_uuid(FormatGpuUuid(bytes));
  char bus_id[64] = {};
  rc = api.cuDeviceGetPCIBusId(bus_id, sizeof(bus_id) - 1, dev);
  if (rc != kCudaSuccess) return absl::InternalError(CudaError(api, "cuDeviceGetPCIBusId", rc));
  gpu.set_pci_bus_id(NormalizePciBusId(bus_id));
  size_t total = 0;
  rc = api.cuDeviceTotalMem(&total, dev);
  if (rc != kCudaSuccess) return absl::InternalError(CudaError(api, "cuDeviceTotalMem", rc));
  gpu.set_total_memory_bytes(total);
  gpu.set_numa_node(ReadPciNumaNode(options.sysfs_root, gpu.pci_bus_id()));

  gpu.set_compute_capability_major(QueryInt(api, dev, ordinal, kAttrComputeCapabilityMajor,
                                            "COMPUTE_CAPABILITY_MAJOR", problems));
  gpu.set_compute_capability_minor(QueryInt(api, dev, ordinal, kAttrComputeCapabilityMinor,
                                            "COMPUTE_CAPABILITY_MINOR", problems));
  gpu.set_multiprocessor_count(QueryInt(api, dev, ordinal, kAttrMultiprocessorCount,
                                        "MULTIPROCESSOR_COUNT", problems));
  gpu.set_vmm_supported(QueryFlag(api, dev, ordinal, kAttrVirtualMemoryManagementSupported,
                                  "VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED", problems));
  gpu.set_posix_fd_handle_supported(
      QueryFlag(api, dev, ordinal, kAttrHandleTypePosixFileDescriptorSupported,
                "HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED", problems));
  gpu.set_fabric_handle_supported(QueryFlag(api, dev, ordinal, kAttrHandleTypeFabricSupported,
                                            "HANDLE_TYPE_FABRIC_SUPPORTED", problems));
  gpu.set_dmabuf_supported(
      QueryFlag(api, dev, ordinal, kAttrDmaBufSupported, "DMA_BUF_SUPPORTED", problems));
  return gpu;
}

v1::GpuPair QueryPair(const CudaDriverApi& api, int src_ordinal, CUdevice src, int dst_ordinal,
                      CUdevice dst, std::vector<std::string>* problems) {
  v1::GpuPair pair;
  pair.set_src(src_ordinal);
  pair.set_dst(dst_ordinal);
  auto query = [&](int attr, absl::string_view attr_name) {
    int value = 0;
    CUresult rc = api.cuDeviceGetP2PAttribute(&value, attr, src, dst);
    if (rc != kCudaSuccess) {
      problems->push_back(absl::StrCat(
          "GPU ", src_ordinal, "->", dst_ordinal, ": ",
          CudaError(api, absl::StrCat("cuDeviceGetP2PAttribute(", attr_name, ")"), rc),
          "; reported as unsupported"));
      return 0;
    }
    return value;
  };
  pair.set_access_supported(query(kP2pAccessSupported, "ACCESS_SUPPORTED") != 0);
  pair.set_native_atomics(query(kP2pNativeAtomicSupported, "NATIVE_ATOMIC_SUPPORTED") != 0);
  pair.set_performance_rank(query(kP2pPerformanceRank, "PERFORMANCE_RANK"));
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
  if (options.cuda_library.empty()) {
    result.note = "GPU discovery is disabled (no CUDA library configured)";
    return result;
  }
  absl::StatusOr<CudaDriverApi> loaded = LoadCudaDriver(options.cuda_library);
  if (!loaded.ok()) {
    result.note = std::string(loaded.status().message());
    return result;
  }
  const CudaDriverApi& api = *loaded;
  // The version is readable before cuInit, and worth reporting when cuInit
  // then fails (a driver/library mismatch shows up there).
  int version = 0;
  if (api.cuDriverGetVersion(&version) == kCudaSuccess) result.driver_version = version;

  CUresult rc = api.cuInit(0);
  if (rc != kCudaSuccess) {
    result.note = absl::StrCat(CudaError(api, "cuInit", rc), ": ", CuInitAdvice(rc));
    return result;
  }
  int count = 0;
  rc = api.cuDeviceGetCount(&count);
  if (rc != kCudaSuccess) {
    result.note = CudaError(api, "cuDeviceGetCount", rc);
    return result;
  }
  if (count == 0) {
    result.note = absl::StrCat("the NVIDIA driver (", options.cuda_library,
                               ") reports no GPU; check nvidia-smi and CUDA_VISIBLE_DEVICES");
    return result;
  }

  std::vector<std::string> problems;
  std::vector<std::pair<int, CUdevice>> found;  // (ordinal, handle) of listed GPUs
  for (int ordinal = 0; ordinal < count; ++ordinal) {
    CUdevice dev = 0;
    rc = api.cuDeviceGet(&dev, ordinal);
    if (rc != kCudaSuccess) {
      problems.push_back(absl::StrCat("GPU ", ordinal, " skipped: ", CudaError(api, "cuDeviceGet", rc)));
      continue;
    }
    absl::StatusOr<v1::Gpu> gpu = QueryGpu(api, options, ordinal, dev, &problems);
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
      result.pairs.push_back(QueryPair(api, src_ordinal, src, dst_ordinal, dst, &problems));
    }
  }
  result.note = absl::StrJoin(problems, "; ");
  return result;
}

}  // namespace mooncake::daemon
