#include "discovery/sysfs_files.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "mooncake/common/status.h"

namespace mooncake::daemon {
namespace fs = std::filesystem;

absl::StatusOr<std::string> ReadSysfsLine(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("open ", path));
  std::string text;
  char buf[4096];
  // Some attributes (gid_attrs/types of an unused GID) open fine but fail
  // on read with EINVAL, so read errors are reported, not treated as "".
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      return ErrnoStatus(err, absl::StrCat("read ", path));
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  absl::StripTrailingAsciiWhitespace(&text);
  return text;
}

absl::StatusOr<std::string> ReadSymlinkBasename(const std::string& path) {
  std::error_code ec;
  fs::path target = fs::read_symlink(path, ec);
  if (ec) return ErrnoStatus(ec.value(), absl::StrCat("readlink ", path));
  // A target such as "../../mlx5_core/" would have an empty filename.
  std::string name = target.lexically_normal().filename().string();
  if (name.empty()) name = target.lexically_normal().parent_path().filename().string();
  return name;
}

namespace {
bool NumericLess(const std::string& a, const std::string& b) {
  unsigned long long na = 0, nb = 0;
  bool a_num = absl::SimpleAtoi(a, &na);
  bool b_num = absl::SimpleAtoi(b, &nb);
  if (a_num && b_num) return na < nb;
  if (a_num != b_num) return a_num;  // numbers first
  return a < b;
}
}  // namespace

absl::StatusOr<std::vector<std::string>> ListSysfsDir(const std::string& path) {
  std::error_code ec;
  fs::directory_iterator it(path, ec);
  if (ec) return ErrnoStatus(ec.value(), absl::StrCat("list ", path));
  std::vector<std::string> names;
  for (const fs::directory_entry& entry : it) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end(), NumericLess);
  return names;
}

int ReadPciNumaNode(absl::string_view sysfs_root, absl::string_view bdf) {
  absl::StatusOr<std::string> text =
      ReadSysfsLine(absl::StrCat(sysfs_root, "/bus/pci/devices/", bdf, "/numa_node"));
  int node = -1;
  if (!text.ok() || !absl::SimpleAtoi(*text, &node) || node < 0) return -1;
  return node;
}

bool IsPciBusId(absl::string_view text) {
  // domain:bus:device.function
  std::vector<absl::string_view> parts = absl::StrSplit(text, ':');
  if (parts.size() != 3) return false;
  auto all_hex = [](absl::string_view s) {
    if (s.empty()) return false;
    for (char c : s)
      if (!absl::ascii_isxdigit(static_cast<unsigned char>(c))) return false;
    return true;
  };
  std::vector<absl::string_view> dev_fn = absl::StrSplit(parts[2], '.');
  return parts[0].size() >= 4 && all_hex(parts[0]) && parts[1].size() == 2 && all_hex(parts[1]) &&
         dev_fn.size() == 2 && dev_fn[0].size() == 2 && all_hex(dev_fn[0]) &&
         dev_fn[1].size() == 1 && all_hex(dev_fn[1]);
}

std::string NormalizePciBusId(absl::string_view bus_id) {
  std::string id = absl::AsciiStrToLower(bus_id);
  if (!IsPciBusId(id)) return id;
  // nvidia-smi and NVML print an 8-digit domain; sysfs names use 4 digits
  // unless the domain really needs more (VMD), so only strip zero padding.
  size_t colon = id.find(':');
  while (colon > 4 && id[0] == '0') {
    id.erase(0, 1);
    --colon;
  }
  return id;
}

}  // namespace mooncake::daemon
