// Populating shared memory the caller owns, so that its pages are
// allocated now and charged to the caller's cgroup (issue 23 item 5).
// mooncaked registers only memfds whose pages are all in memory, and never
// faults a page of an application's in: that page would be charged to the
// daemon. fallocate() is not enough: tmpfs keeps a fallocated page "not up
// to date" until it is written, and mincore reports it absent.
#pragma once

#include <sys/mman.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

namespace mooncake {

// Faults in every page of the writable shared mapping [addr, addr + bytes)
// (page-aligned addr) for writing, without changing its contents:
// MADV_POPULATE_WRITE (Linux 5.14), else one write of each page's first
// byte back to itself. Returns 0 or an errno.
inline int PopulateForWrite(void* addr, uint64_t bytes) {
  if (bytes == 0) return 0;
  if (::madvise(addr, bytes, MADV_POPULATE_WRITE) == 0) return 0;
  if (errno != EINVAL) return errno;
  auto* p = static_cast<volatile uint8_t*>(addr);
  for (uint64_t off = 0; off < bytes; off += 4096) p[off] = p[off];
  return 0;
}

// The same for [offset, offset + bytes) of memfd `fd` (mapped for the call).
inline int PopulateMemfd(int fd, uint64_t offset, uint64_t bytes) {
  if (bytes == 0) return 0;
  void* p =
      ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(offset));
  if (p == MAP_FAILED) return errno;
  const int err = PopulateForWrite(p, bytes);
  ::munmap(p, bytes);
  return err;
}

}  // namespace mooncake
