// Links Mooncake::client from an installed tree and uses the public headers
// (Client, Communicator, Device API host types) as a C++17 program. With no
// daemon at argv[1] it must fail fast with the actionable message.
#include <iostream>
#include <string>

#include "mooncake/client/client.h"
#include "mooncake/client/communicator.h"
#include "mooncake/device/contexts_device.h"
#include "mooncake/device/device_transport.h"

int main(int argc, char** argv) {
  if (argc < 2) return 64;
  mooncake::device::CommCtx ctx{};
  (void)ctx;
  mooncake::CommunicatorOptions copt;
  copt.platform = mooncake::Platform::kHost;
  copt.cuda_handle = mooncake::device::CudaHandleKind::kAuto;
  (void)copt;
  // Links the Communicator without calling it (that needs a daemon).
  auto create = &mooncake::Communicator::Create;
  if (create == nullptr) return 1;

  mooncake::ClientOptions options;
  options.socket_path = argv[1];
  auto c = mooncake::Client::Connect(options);
  if (c.ok()) {
    std::cerr << "unexpectedly connected\n";
    return 1;
  }
  std::string msg(c.status().message());
  std::cout << msg << "\n";
  return msg.find("is the service running?") != std::string::npos ? 0 : 1;
}
