#include "mooncake/common/random.h"

#include <sys/random.h>

#include <cerrno>
#include <cstdlib>

namespace mooncake {

std::string RandomBytes(size_t n) {
  std::string out(n, '\0');
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::getrandom(out.data() + got, n - got, 0);
    if (r < 0) {
      if (errno == EINTR) continue;
      std::abort();
    }
    got += static_cast<size_t>(r);
  }
  return out;
}

}  // namespace mooncake
