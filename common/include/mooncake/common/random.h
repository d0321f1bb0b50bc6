// Bytes from the kernel's CSPRNG (getrandom), for everything that must not
// be guessed: session tokens, export secrets, fd tickets, instance ids,
// cross-node connection secrets, softnic memory keys.
#pragma once

#include <cstddef>
#include <string>

namespace mooncake {

// `n` random bytes. Aborts when the kernel has no entropy source: nothing
// safe could be handed out then.
std::string RandomBytes(size_t n);

}  // namespace mooncake
