// The DLPack ABI (https://dmlc.github.io/dlpack/latest/c_api.html), the
// structs this module produces, written from the specification (v1.0) so
// the build needs neither dlpack.h nor torch. Only what a producer of
// one-dimensional byte tensors needs is declared; the layouts are those of
// the C header (enums are C ints), checked by the static_asserts below.
//
// Two capsule forms exist (the Python array API's __dlpack__ protocol):
//   "dltensor"            DLManagedTensor           (DLPack < 1.0 consumers:
//                                                    numpy 1.x, older torch)
//   "dltensor_versioned"  DLManagedTensorVersioned  (a consumer that passes
//                                                    max_version >= (1, 0))
// A consumer that takes ownership renames the capsule "used_dltensor" /
// "used_dltensor_versioned" and later calls the deleter itself; a capsule
// still carrying its original name when it is destroyed was never consumed,
// and its destructor calls the deleter.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mooncake::python::dlpack {

inline constexpr uint32_t kMajorVersion = 1;
inline constexpr uint32_t kMinorVersion = 0;

inline constexpr const char* kCapsuleName = "dltensor";
inline constexpr const char* kUsedCapsuleName = "used_dltensor";
inline constexpr const char* kVersionedCapsuleName = "dltensor_versioned";
inline constexpr const char* kUsedVersionedCapsuleName = "used_dltensor_versioned";

// DLDataTypeCode
inline constexpr uint8_t kDLUInt = 1;

// DLManagedTensorVersioned::flags
inline constexpr uint64_t kFlagReadOnly = 1ull << 0;
inline constexpr uint64_t kFlagIsCopied = 1ull << 1;

struct DLPackVersion {
  uint32_t major;
  uint32_t minor;
};

struct DLDevice {
  int32_t device_type;  // DLDeviceType: kDLCPU = 1, kDLCUDA = 2, ...
  int32_t device_id;
};

struct DLDataType {
  uint8_t code;  // DLDataTypeCode
  uint8_t bits;
  uint16_t lanes;
};

struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;  // in elements; null means compact row-major
  uint64_t byte_offset;
};

struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};

struct DLManagedTensorVersioned {
  DLPackVersion version;
  void* manager_ctx;
  void (*deleter)(DLManagedTensorVersioned* self);
  uint64_t flags;
  DLTensor dl_tensor;
};

static_assert(sizeof(DLDevice) == 8);
static_assert(sizeof(DLDataType) == 4);
static_assert(sizeof(DLTensor) == 48 && offsetof(DLTensor, shape) == 24);
static_assert(sizeof(DLManagedTensor) == 64 && offsetof(DLManagedTensor, deleter) == 56);
static_assert(sizeof(DLManagedTensorVersioned) == 80 &&
              offsetof(DLManagedTensorVersioned, dl_tensor) == 32);

}  // namespace mooncake::python::dlpack
