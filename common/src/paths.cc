#include "mooncake/common/paths.h"

#include <cstdlib>

namespace mooncake {

std::string ResolveSocketPath(const std::string& explicit_path) {
  if (!explicit_path.empty()) return explicit_path;
  if (const char* env = std::getenv(kSocketEnvVar); env != nullptr && *env != '\0') return env;
  return kDefaultSocketPath;
}

}  // namespace mooncake
