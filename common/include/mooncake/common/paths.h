// Default locations shared by the daemon, the client and mcctl.
#pragma once

#include <string>

namespace mooncake {

inline constexpr char kDefaultSocketPath[] = "/run/mooncake/mooncaked.sock";
inline constexpr char kSocketEnvVar[] = "MOONCAKE_SOCKET";

// The fd side channel lives next to the gRPC socket.
inline std::string FdSocketPath(const std::string& grpc_socket) { return grpc_socket + ".fd"; }

// Explicit argument, else $MOONCAKE_SOCKET, else the default.
std::string ResolveSocketPath(const std::string& explicit_path);

}  // namespace mooncake
