#include "gpu_doorbell.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace mooncake {

absl::StatusOr<GpuUar> MapUarForGpu(const DoorbellAccess& access, drivers::CudaDriver& cuda) {
  const uint64_t page = access.uar_page_bytes;
  if (page == 0 || page > (uint64_t{1} << 21) || (page & (page - 1)) != 0 ||
      access.uar_reg_offset + 8 > page || access.uar_reg_offset % 8 != 0 ||
      access.uar_mmap_offset <= 0 || !access.command_fd.valid()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "doorbell hand-off from ", access.device, ": UAR page of ", page, " bytes with the ",
        "register at ", access.uar_reg_offset, " at mmap offset ", access.uar_mmap_offset,
        " is not a usable mapping (offset 0 would map the context's legacy UAR, not the "
        "session's)"));
  }
  // Write-only: a UAR is never read, and a read may fault on some NICs.
  void* p = ::mmap(nullptr, page, PROT_WRITE, MAP_SHARED, access.command_fd.get(),
                   static_cast<off_t>(access.uar_mmap_offset));
  if (p == MAP_FAILED) {
    const int err = errno;
    return absl::UnavailableError(absl::StrCat("mmap of the UAR page of ", access.device,
                                               " on the command fd: ", std::strerror(err)));
  }
  GpuUar uar;
  uar.page = p;
  uar.page_bytes = page;
  const unsigned flags = drivers::kCuMemHostRegisterIoMemory |
                         drivers::kCuMemHostRegisterDeviceMap | drivers::kCuMemHostRegisterPortable;
  const drivers::CuResult r = cuda.memHostRegister(p, page, flags);
  if (r != drivers::kCudaSuccess) {
    absl::Status s = drivers::CuStatus(cuda, r, "cuMemHostRegister(IOMEMORY) of the NIC's UAR");
    ::munmap(p, page);
    return absl::Status(
        s.code(), absl::StrCat(s.message(),
                               ": this GPU cannot map the NIC's doorbell page (enable peer "
                               "mapping: NVreg_RegistryDwords=\"PeerMappingOverride=1;\" for the "
                               "nvidia module, or load nvidia-peermem)"));
  }
  drivers::CuDevicePtr dev = 0;
  if (drivers::CuResult g = cuda.memHostGetDevicePointer(&dev, p, 0); g != drivers::kCudaSuccess) {
    absl::Status s = drivers::CuStatus(cuda, g, "cuMemHostGetDevicePointer (the NIC's UAR)");
    (void)cuda.memHostUnregister(p);
    ::munmap(p, page);
    return s;
  }
  uar.device_register = dev + access.uar_reg_offset;
  return uar;
}

absl::Status DetachUarFromCommandFd(GpuUar& uar) {
  if (uar.page == nullptr || uar.detached) return absl::OkStatus();
  // MAP_FIXED replaces the old mapping atomically: no moment where the
  // address is unmapped and another mapping could take it.
  void* p =
      ::mmap(uar.page, uar.page_bytes, PROT_WRITE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    return absl::InternalError(absl::StrCat(
        "mmap(MAP_FIXED) of anonymous memory over the UAR page (to release the daemon's verbs "
        "context): ",
        std::strerror(err)));
  }
  uar.detached = true;
  return absl::OkStatus();
}

void UnmapUarForGpu(GpuUar& uar, drivers::CudaDriver& cuda) {
  if (uar.page == nullptr) return;
  (void)cuda.memHostUnregister(uar.page);
  ::munmap(uar.page, uar.page_bytes);
  uar = GpuUar{};
}

absl::Status DetachThenFailRings(GpuUar& uar, absl::FunctionRef<void()> fail_rings) {
  absl::Status detached = DetachUarFromCommandFd(uar);
  fail_rings();
  return detached;
}

}  // namespace mooncake
