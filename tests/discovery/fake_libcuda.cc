// A stand-in for libcuda.so.1 so GPU discovery can be tested on machines
// without a GPU. Built from the real cuda.h: the attribute and P2P enum
// values it answers to are the driver's, so a wrong hand-declared value in
// daemon/discovery/gpu_discovery.cc makes a test fail.
//
// Behaviour is steered by environment variables, read at each call:
//   MC_FAKE_CUDA_INIT_RESULT     CUresult cuInit returns (default 0)
//   MC_FAKE_CUDA_BUS_IDS         comma-separated PCI bus ids, one GPU each
//                                (default "0000:1B:00.0,0000:3C:00.0"; "" = none)
//   MC_FAKE_CUDA_FAIL_ATTRIBUTE  a CUdevice_attribute that fails with
//                                CUDA_ERROR_INVALID_VALUE
// Variants: FAKE_CUDA_LEGACY_UUID exports only cuDeviceGetUuid (pre-11.4
// drivers); FAKE_CUDA_NO_P2P leaves out cuDeviceGetP2PAttribute.
#include <cuda.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

bool g_initialized = false;
constexpr CUdevice kHandleBase = 100;  // handles differ from ordinals on purpose

std::vector<std::string> BusIds() {
  const char* env = std::getenv("MC_FAKE_CUDA_BUS_IDS");
  std::string list = env != nullptr ? env : "0000:1B:00.0,0000:3C:00.0";
  std::vector<std::string> ids;
  size_t start = 0;
  while (start < list.size()) {
    size_t comma = list.find(',', start);
    if (comma == std::string::npos) comma = list.size();
    if (comma > start) ids.push_back(list.substr(start, comma - start));
    start = comma + 1;
  }
  return ids;
}

int EnvInt(const char* name, int fallback) {
  const char* env = std::getenv(name);
  return env != nullptr ? std::atoi(env) : fallback;
}

// The ordinal of a device handle, or -1.
int Ordinal(CUdevice dev) {
  int ordinal = dev - kHandleBase;
  return ordinal >= 0 && ordinal < static_cast<int>(BusIds().size()) ? ordinal : -1;
}

}  // namespace

extern "C" {

CUresult CUDAAPI cuInit(unsigned int flags) {
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  CUresult rc = static_cast<CUresult>(EnvInt("MC_FAKE_CUDA_INIT_RESULT", 0));
  g_initialized = rc == CUDA_SUCCESS;
  return rc;
}

CUresult CUDAAPI cuDriverGetVersion(int* version) {
  if (version == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *version = 13000;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGetErrorName(CUresult error, const char** name) {
  switch (error) {
    case CUDA_SUCCESS: *name = "CUDA_SUCCESS"; return CUDA_SUCCESS;
    case CUDA_ERROR_INVALID_VALUE: *name = "CUDA_ERROR_INVALID_VALUE"; return CUDA_SUCCESS;
    case CUDA_ERROR_NOT_INITIALIZED: *name = "CUDA_ERROR_NOT_INITIALIZED"; return CUDA_SUCCESS;
    case CUDA_ERROR_INVALID_DEVICE: *name = "CUDA_ERROR_INVALID_DEVICE"; return CUDA_SUCCESS;
    case CUDA_ERROR_NO_DEVICE: *name = "CUDA_ERROR_NO_DEVICE"; return CUDA_SUCCESS;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
}

CUresult CUDAAPI cuGetErrorString(CUresult error, const char** text) {
  switch (error) {
    case CUDA_ERROR_INVALID_VALUE: *text = "invalid argument"; return CUDA_SUCCESS;
    case CUDA_ERROR_NO_DEVICE: *text = "no CUDA-capable device is detected"; return CUDA_SUCCESS;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
}

CUresult CUDAAPI cuDeviceGetCount(int* count) {
  if (!g_initialized) return CUDA_ERROR_NOT_INITIALIZED;
  *count = static_cast<int>(BusIds().size());
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGet(CUdevice* device, int ordinal) {
  if (!g_initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (ordinal < 0 || ordinal >= static_cast<int>(BusIds().size())) return CUDA_ERROR_INVALID_DEVICE;
  *device = kHandleBase + ordinal;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetName(char* name, int len, CUdevice dev) {
  if (!g_initialized) return CUDA_ERROR_NOT_INITIALIZED;
  int i = Ordinal(dev);
  if (i < 0) return CUDA_ERROR_INVALID_DEVICE;
  std::string text = "Fake GPU " + std::to_string(i);
  if (len <= static_cast<int>(text.size())) return CUDA_ERROR_INVALID_VALUE;
  std::memcpy(name, text.c_str(), text.size() + 1);
  return CUDA_SUCCESS;
}

#if FAKE_CUDA_LEGACY_UUID
#undef cuDeviceGetUuid
CUresult CUDAAPI cuDeviceGetUuid(CUuuid* uuid, CUdevice dev);
#endif
// Under cuda.h's macros this defines cuDeviceGetUuid_v2, unless undefined above.
CUresult CUDAAPI cuDeviceGetUuid(CUuuid* uuid, CUdevice dev) {
  if (!g_initialized) return CUDA_ERROR_NOT_INITIALIZED;
  int i = Ordinal(dev);
  if (i < 0) return CUDA_ERROR_INVALID_DEVICE;
  // High bytes, so a signed-char mishandling in the formatter shows.
  for (int k = 0; k < 16; ++k) uuid->bytes[k] = static_cast<char>(0xf0 - 16 * i + k);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetPCIBusId(char* bus_id, int len, CUdevice dev) {
  if (!g_initialized) return CUDA_ERROR_NOT_INITIALIZED;
  int i = Ordinal(dev);
  if (i < 0) return CUDA_ERROR_INVALID_DEVICE;
  std::string id = BusIds()[i];
  if (len <= static_cast<int>(id.size())) return CUDA_ERROR_INVALID_VALUE;
  std::memcpy(bus_id, id.c_str(), id.size() + 1);
  return CUDA_SUCCESS;
}

// cuda.h maps this name to cuDeviceTotalMem_v2.
CUresult CUDAAPI cuDeviceTotalMem(size_t* bytes, CUdevice dev) {
  if (!g_initialized) return CUDA_ERROR_NOT_INITIALIZED;
  int i = Ordinal(dev);
  if (i < 0) return CUDA_ERROR_INVALID_DEVICE;
  *bytes = static_cast<size_t>(i + 1) * 80 * (size_t{1} << 30);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetAttribute(int* value, CUdevice_attribute attrib, CUdevice dev) {
  if (!g_initialized) return CUDA_ERROR_NOT_INITIALIZED;
  int i = Ordinal(dev);
  if (i < 0) return CUDA_ERROR_INVALID_DEVICE;
  if (static_cast<int>(attrib) == EnvInt("MC_FAKE_CUDA_FAIL_ATTRIBUTE", -1)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *value = 9; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *value = 0; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *value = 132 - i; break;
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: *value = 1; break;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED: *value = 1; break;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED: *value = i == 0 ? 1 : 0; break;
    case CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED: *value = 1; break;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

#if !FAKE_CUDA_NO_P2P
CUresult CUDAAPI cuDeviceGetP2PAttribute(int* value, CUdevice_P2PAttribute attrib,
                                         CUdevice src, CUdevice dst) {
  if (!g_initialized) return CUDA_ERROR_NOT_INITIALIZED;
  int s = Ordinal(src);
  int d = Ordinal(dst);
  if (s < 0 || d < 0 || s == d) return CUDA_ERROR_INVALID_DEVICE;
  switch (attrib) {
    case CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK: *value = s + d; break;
    case CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED: *value = 1; break;
    case CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED: *value = s == 0 ? 1 : 0; break;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}
#endif

}  // extern "C"
