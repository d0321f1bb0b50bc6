// MOONCAKE_API: marks what libmooncake_client exports.
//
// The library is built with hidden visibility (-fvisibility=hidden,
// -fvisibility-inlines-hidden) and a linker version script
// (client/libmooncake_client.map), so only declarations marked here are in
// its dynamic symbol table: the classes and functions of the public headers
// (mooncake/client/*.h, mooncake/device/device_transport.h). Everything the
// library carries inside — protobuf/gRPC code, mooncake::v1 messages, the
// internal helpers — stays private to it, and an application may use its
// own protobuf, gRPC or Abseil build next to it.
//
//   class MOONCAKE_API Client { ... };                 // the class, its vtable, typeinfo
//   MOONCAKE_API const char* SessionEventKindName(...);  // one function
//
// Applications include this through the public headers; they never need it
// themselves. Compiles as C++17 (and C), with GCC and Clang.
#pragma once

#if defined(__GNUC__) || defined(__clang__)
#define MOONCAKE_API __attribute__((visibility("default")))
#define MOONCAKE_INTERNAL __attribute__((visibility("hidden")))
#else
#define MOONCAKE_API
#define MOONCAKE_INTERNAL
#endif
