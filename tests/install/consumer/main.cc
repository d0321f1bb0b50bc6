// Links Mooncake::client from an installed tree and uses the Client and the
// Device API headers. With no daemon at argv[1] it must fail fast with the
// actionable message.
#include <iostream>
#include <string>

#include "mooncake/client/client.h"
#include "mooncake/device/contexts_device.h"

int main(int argc, char** argv) {
  if (argc < 2) return 64;
  mooncake::device::CommCtx ctx{};
  (void)ctx;
  auto c = mooncake::Client::Connect({.socket_path = argv[1]});
  if (c.ok()) {
    std::cerr << "unexpectedly connected\n";
    return 1;
  }
  std::string msg(c.status().message());
  std::cout << msg << "\n";
  return msg.find("is the service running?") != std::string::npos ? 0 : 1;
}
