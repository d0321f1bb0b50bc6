// GPU memory for softnic tests without a GPU: a FakeCudaDriver as the
// daemon's driver, host atomics in place of the embedded kernel (the fake's
// device pointers are host addresses; it cannot launch kernels), and a
// client-side allocation exported as a cuMem POSIX fd by a second fake, as a
// client process does.
#pragma once

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <utility>

#include "fake_cuda_driver.h"
#include "gtest/gtest.h"
#include "softnic/cuda_atomics_kernel.h"
#include "softnic/cuda_memory.h"

namespace mooncake::softnic::test_util {

using drivers::CuDevicePtr;
using drivers::FakeCudaDriver;
using drivers::FakeGpu;

inline constexpr size_t kGran = size_t{64} << 10;  // the fakes' allocation granularity

inline void* Ptr(uint64_t p) { return reinterpret_cast<void*>(static_cast<uintptr_t>(p)); }

// What a GPU's atomic units do, on the fake's device pointers (host
// addresses). Fails the next `fail_next` calls.
class HostAtomics final : public CudaAtomics {
 public:
  explicit HostAtomics(std::shared_ptr<std::atomic<int>> fail_next)
      : fail_next_(std::move(fail_next)) {}
  absl::StatusOr<uint64_t> FetchAdd64(const CudaLane&, CuDevicePtr word, uint64_t add) override {
    if (Failing()) return absl::InternalError("injected atomic failure");
    return std::atomic_ref<uint64_t>(*static_cast<uint64_t*>(Ptr(word)))
        .fetch_add(add, std::memory_order_acq_rel);
  }
  absl::StatusOr<uint32_t> MaskedFetchAdd32(const CudaLane&, CuDevicePtr word, uint32_t add,
                                            uint32_t boundary) override {
    if (Failing()) return absl::InternalError("injected atomic failure");
    std::atomic_ref<uint32_t> w(*static_cast<uint32_t*>(Ptr(word)));
    uint32_t old = w.load(std::memory_order_relaxed);
    while (!w.compare_exchange_weak(old, MaskedAdd(old, add, boundary))) {
    }
    return old;
  }

 private:
  bool Failing() {
    int n = fail_next_->load();
    while (n > 0) {
      if (fail_next_->compare_exchange_weak(n, n - 1)) return true;
    }
    return false;
  }
  const std::shared_ptr<std::atomic<int>> fail_next_;
};

inline CudaMemoryOptions FakeOptions(std::shared_ptr<FakeCudaDriver> cu,
                                     std::shared_ptr<std::atomic<int>> atomic_failures = nullptr) {
  if (!atomic_failures) atomic_failures = std::make_shared<std::atomic<int>>(0);
  CudaMemoryOptions o;
  o.driver = std::move(cu);
  o.atomics = [atomic_failures](drivers::CudaDriver&) {
    return absl::StatusOr<std::unique_ptr<CudaAtomics>>(
        std::make_unique<HostAtomics>(atomic_failures));
  };
  return o;
}

inline std::shared_ptr<FakeCudaDriver> FakeWithGpus(int gpus) {
  auto cu = std::make_shared<FakeCudaDriver>();
  for (int i = 0; i < gpus; ++i) cu->addGpu(FakeGpu::Hopper(i));
  cu->setGranularity(kGran);
  return cu;
}

// The client process's side of one allocation: created, mapped and exported
// through its own driver, as a client library does.
class ClientAllocation {
 public:
  ClientAllocation(FakeCudaDriver& cu, size_t bytes) : cu_(cu), bytes_(bytes) {
    drivers::CuMemAllocationProp prop{};
    prop.type = drivers::kCuMemAllocationTypePinned;
    prop.location = {drivers::kCuMemLocationTypeDevice, 0};
    prop.requestedHandleTypes = drivers::kCuMemHandleTypePosixFileDescriptor;
    EXPECT_EQ(cu.memCreate(&handle_, bytes, &prop, 0), drivers::kCudaSuccess);
    EXPECT_EQ(cu.memAddressReserve(&va_, bytes, 0, 0, 0), drivers::kCudaSuccess);
    EXPECT_EQ(cu.memMap(va_, bytes, 0, handle_, 0), drivers::kCudaSuccess);
    drivers::CuMemAccessDesc access{{drivers::kCuMemLocationTypeDevice, 0},
                                    drivers::kCuMemAccessFlagsProtReadWrite};
    EXPECT_EQ(cu.memSetAccess(va_, bytes, &access, 1), drivers::kCudaSuccess);
    EXPECT_EQ(cu.memExportToShareableHandle(&fd_, handle_,
                                            drivers::kCuMemHandleTypePosixFileDescriptor, 0),
              drivers::kCudaSuccess);
  }
  ~ClientAllocation() {
    ::close(fd_);
    cu_.memUnmap(va_, bytes_);
    cu_.memAddressFree(va_, bytes_);
    cu_.memRelease(handle_);
  }
  ClientAllocation(const ClientAllocation&) = delete;
  ClientAllocation& operator=(const ClientAllocation&) = delete;

  int fd() const { return fd_; }
  uint64_t va() const { return va_; }  // the client's address: the region's iova
  uint8_t* data() const { return static_cast<uint8_t*>(Ptr(va_)); }
  size_t size() const { return bytes_; }

 private:
  FakeCudaDriver& cu_;
  const size_t bytes_;
  drivers::CuMemHandle handle_ = 0;
  CuDevicePtr va_ = 0;
  int fd_ = -1;
};

// The region a client registers for the whole of `alloc` (iova = its
// address in the client), as the daemon imported it (`buffer`).
inline RegionSpec WholeAllocation(PdId pd, const ClientAllocation& alloc,
                                  std::shared_ptr<CudaBuffer> buffer, uint32_t access) {
  RegionSpec spec;
  spec.pd = pd;
  spec.iova = alloc.va();
  spec.length = alloc.size();
  spec.access = access;
  spec.kind = MemoryKind::kCuda;
  spec.cuda = std::move(buffer);
  return spec;
}

}  // namespace mooncake::softnic::test_util
