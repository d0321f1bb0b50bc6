// The pieces of the _mooncake_client extension module, one file per concern:
//   status.cc                 absl::Status -> mooncake_client.MooncakeError
//   buffer.cc                 Buffer: buffer protocol, __array_interface__,
//                             __cuda_array_interface__, DLPack
//   client_bindings.cc        Client (a session with mooncaked)
//   communicator_bindings.cc  Communicator, its CommCtx, the host-platform
//                             testing aids (put / signal / wait_signal)
// module.cc registers them in this order. Everything returns plain Python
// values (dicts, lists, ints); mooncake_client/*.py turns them into
// dataclasses.
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "mooncake/client/client.h"

namespace mooncake::python {

namespace py = pybind11;

void RegisterStatus(py::module_& m);
void RegisterBuffer(py::module_& m);
void RegisterClient(py::module_& m);
void RegisterCommunicator(py::module_& m);

// DLPack device types (dlpack.h DLDeviceType) used here.
inline constexpr int32_t kDlCpu = 1;
inline constexpr int32_t kDlCuda = 2;

// A span of memory shared with Python without copying: this rank's symmetric
// buffer, or a peer's buffer as mapped into this process. `owner` keeps the
// memory alive (the Communicator that allocated or mapped it) for as long as
// any Buffer, numpy array, memoryview or DLPack capsule made from it exists.
struct BufferSpan {
  std::shared_ptr<void> owner;
  uintptr_t address = 0;
  size_t nbytes = 0;
  int32_t device_type = kDlCpu;  // kDlCpu or kDlCuda
  int32_t device_id = 0;         // CUDA ordinal in this process; 0 on CPU
};
// A new Python Buffer object over `span`.
py::object MakeBuffer(BufferSpan span);

// A Client kept alive for the length of one call: a call that releases the
// GIL holds one, so a close() from another thread cannot free the client
// under it.
struct ClientLease {
  std::shared_ptr<void> keep;
  Client* client;
  Client* operator->() const { return client; }
  Client& operator*() const { return *client; }
};

// A session with mooncaked, owned by a Client.connect() or borrowed from a
// Communicator (`owner` keeps that Communicator alive).
class ClientHandle {
 public:
  ClientHandle(std::shared_ptr<void> owner, Client* client)
      : owner_(std::move(owner)), client_(client) {}
  // The client; FailedPrecondition (raised) after close(). Take it with the
  // GIL held.
  ClientLease lease() const;
  // Drops this handle's reference: an owned client disconnects once no call
  // still runs on it (its groups' peers see LOST/LEFT); a borrowed one stays
  // with its Communicator.
  void close();
  bool closed() const { return client_ == nullptr; }

 private:
  std::shared_ptr<void> owner_;
  Client* client_;
};

// Plain-Python forms of the client structs (shared with the communicator).
py::dict GroupViewToDict(const GroupView& view);
py::dict SessionEventToDict(const SessionEvent& event);

}  // namespace mooncake::python
