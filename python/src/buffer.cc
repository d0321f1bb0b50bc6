// Buffer: a Communicator's memory handed to Python without a copy.
//
//   numpy.asarray(buf)       buffer protocol / __array_interface__ (host)
//   torch.as_tensor(buf, device="cuda"), cupy.asarray(buf)
//                            __cuda_array_interface__ (CUDA, version 3)
//   numpy.from_dlpack(buf), torch.from_dlpack(buf)
//                            __dlpack__ / __dlpack_device__
//
// Every view is a one-dimensional uint8 array of `nbytes` over the same
// memory (reinterpret with .view(dtype)). Each one keeps the owning
// Communicator alive through the span's shared_ptr: the memory stays valid
// while any array, tensor or capsule made from it exists, even after
// comm.close(). A CUDA buffer refuses the host protocols (the buffer
// protocol raises BufferError; __array_interface__ is absent), and a host
// buffer has no __cuda_array_interface__, so consumers pick the right one.
#include <cstdio>
#include <exception>
#include <string>

#include "bindings.h"
#include "dlpack.h"
#include "status.h"

namespace mooncake::python {
namespace {

class Buffer {
 public:
  explicit Buffer(BufferSpan span) : span_(std::move(span)) {}
  const BufferSpan& span() const { return span_; }
  bool isCuda() const { return span_.device_type == kDlCuda; }

 private:
  BufferSpan span_;
};

// Both DLPack forms with the storage their pointers refer to. Deleting it
// drops the reference on the owner; no Python object is involved, so a
// consumer may call the deleter from any thread without the GIL.
struct DlpackExport {
  dlpack::DLManagedTensor legacy{};
  dlpack::DLManagedTensorVersioned versioned{};
  int64_t shape[1] = {0};
  int64_t strides[1] = {1};
  std::shared_ptr<void> owner;
};

void DeleteLegacy(dlpack::DLManagedTensor* self) {
  delete static_cast<DlpackExport*>(self->manager_ctx);
}
void DeleteVersioned(dlpack::DLManagedTensorVersioned* self) {
  delete static_cast<DlpackExport*>(self->manager_ctx);
}

// Capsule destructors: run the deleter only for a capsule nobody consumed
// (a consumer renames it to "used_..."). They may run while an exception is
// being raised, so they keep the error indicator as it was.
void LegacyCapsuleDestructor(PyObject* capsule) {
  if (PyCapsule_IsValid(capsule, dlpack::kCapsuleName) == 0) return;
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  auto* t =
      static_cast<dlpack::DLManagedTensor*>(PyCapsule_GetPointer(capsule, dlpack::kCapsuleName));
  if (t != nullptr && t->deleter != nullptr) t->deleter(t);
  PyErr_Restore(type, value, traceback);
}
void VersionedCapsuleDestructor(PyObject* capsule) {
  if (PyCapsule_IsValid(capsule, dlpack::kVersionedCapsuleName) == 0) return;
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  auto* t = static_cast<dlpack::DLManagedTensorVersioned*>(
      PyCapsule_GetPointer(capsule, dlpack::kVersionedCapsuleName));
  if (t != nullptr && t->deleter != nullptr) t->deleter(t);
  PyErr_Restore(type, value, traceback);
}

dlpack::DLTensor TensorOf(const BufferSpan& s, DlpackExport* e) {
  e->shape[0] = static_cast<int64_t>(s.nbytes);
  dlpack::DLTensor t{};
  t.data = reinterpret_cast<void*>(s.address);
  t.device = {s.device_type, s.device_id};
  t.ndim = 1;
  t.dtype = {dlpack::kDLUInt, 8, 1};
  t.shape = e->shape;
  t.strides = e->strides;
  t.byte_offset = 0;
  return t;
}

// __dlpack__(*, stream=None, max_version=None, dl_device=None, copy=None)
// (Python array API 2023.12). `stream` needs no synchronisation here: the
// buffer has no producer stream, and the consumer orders its own work.
py::object Dlpack(const Buffer& b, const py::object& stream, const py::object& max_version,
                  const py::object& dl_device, const py::object& copy) {
  (void)stream;
  const BufferSpan& s = b.span();
  if (!copy.is_none() && copy.cast<bool>()) {
    throw py::buffer_error(
        "mooncake_client.Buffer: __dlpack__(copy=True) is not supported: it "
        "exports the communicator's memory itself (copy the tensor instead)");
  }
  if (!dl_device.is_none()) {
    auto want = dl_device.cast<std::pair<int, int>>();
    if (want.first != s.device_type || want.second != s.device_id) {
      throw py::buffer_error("mooncake_client.Buffer: __dlpack__(dl_device=(" +
                             std::to_string(want.first) + ", " + std::to_string(want.second) +
                             ")): the buffer lives on device (" + std::to_string(s.device_type) +
                             ", " + std::to_string(s.device_id) + ") and is not copied");
    }
  }
  bool versioned = false;
  if (!max_version.is_none()) {
    auto v = max_version.cast<std::pair<int, int>>();
    versioned = v.first >= static_cast<int>(dlpack::kMajorVersion);
  }
  auto* e = new DlpackExport();
  e->owner = s.owner;
  PyObject* capsule;
  if (versioned) {
    e->versioned.version = {dlpack::kMajorVersion, dlpack::kMinorVersion};
    e->versioned.manager_ctx = e;
    e->versioned.deleter = &DeleteVersioned;
    e->versioned.flags = 0;  // writable, not a copy
    e->versioned.dl_tensor = TensorOf(s, e);
    capsule =
        PyCapsule_New(&e->versioned, dlpack::kVersionedCapsuleName, &VersionedCapsuleDestructor);
  } else {
    e->legacy.dl_tensor = TensorOf(s, e);
    e->legacy.manager_ctx = e;
    e->legacy.deleter = &DeleteLegacy;
    capsule = PyCapsule_New(&e->legacy, dlpack::kCapsuleName, &LegacyCapsuleDestructor);
  }
  if (capsule == nullptr) {
    delete e;
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::object>(capsule);
}

// The dict both array interfaces share (version 3).
py::dict ArrayInterface(const BufferSpan& s) {
  py::dict d;
  d["shape"] = py::make_tuple(s.nbytes);
  d["typestr"] = "|u1";
  py::list descr;
  descr.append(py::make_tuple("", "|u1"));
  d["descr"] = descr;
  d["data"] = py::make_tuple(s.address, false);
  d["strides"] = py::none();
  d["version"] = 3;
  return d;
}

std::string DeviceName(const BufferSpan& s) {
  return s.device_type == kDlCuda ? "cuda:" + std::to_string(s.device_id) : "cpu";
}

}  // namespace

py::object MakeBuffer(BufferSpan span) { return py::cast(Buffer(std::move(span))); }

void RegisterBuffer(py::module_& m) {
  py::class_<Buffer>(m, "Buffer", py::buffer_protocol(), R"doc(
Memory of a Communicator (its symmetric buffer, or a peer's as mapped here),
shared without copying: numpy.asarray / memoryview (host), __cuda_array_interface__
(CUDA), and DLPack (numpy.from_dlpack, torch.from_dlpack). A 1-D uint8 view of
`nbytes`; the memory stays valid while any view made from it exists.)doc")
      .def_buffer([](Buffer& b) -> py::buffer_info {
        if (b.isCuda()) {
          throw py::buffer_error(
              "mooncake_client.Buffer: this buffer is CUDA device memory; use "
              "torch.from_dlpack(buf) or __cuda_array_interface__, not the buffer protocol");
        }
        const BufferSpan& s = b.span();
        return py::buffer_info(reinterpret_cast<void*>(s.address), 1, "B", 1,
                               {static_cast<py::ssize_t>(s.nbytes)}, {py::ssize_t{1}}, false);
      })
      .def_property_readonly(
          "address", [](const Buffer& b) { return b.span().address; },
          "The first byte's address in this process (a device pointer for CUDA).")
      .def_property_readonly(
          "nbytes", [](const Buffer& b) { return b.span().nbytes; }, "Size in bytes.")
      .def_property_readonly(
          "is_cuda", [](const Buffer& b) { return b.isCuda(); }, "True for CUDA device memory.")
      .def_property_readonly(
          "device", [](const Buffer& b) { return DeviceName(b.span()); },
          "'cpu' or 'cuda:N' (torch's spelling).")
      .def("__len__", [](const Buffer& b) { return b.span().nbytes; })
      .def_property_readonly(
          "__array_interface__",
          [](const Buffer& b) -> py::dict {
            if (b.isCuda()) throw py::attribute_error("a CUDA buffer has no __array_interface__");
            return ArrayInterface(b.span());
          })
      .def_property_readonly(
          "__cuda_array_interface__",
          [](const Buffer& b) -> py::dict {
            if (!b.isCuda()) {
              throw py::attribute_error("a host buffer has no __cuda_array_interface__");
            }
            py::dict d = ArrayInterface(b.span());
            d.attr("pop")("descr");
            // No stream: the buffer has no pending work of its own to order.
            d["stream"] = py::none();
            return d;
          })
      .def("__dlpack__", &Dlpack, py::kw_only(), py::arg("stream") = py::none(),
           py::arg("max_version") = py::none(), py::arg("dl_device") = py::none(),
           py::arg("copy") = py::none(),
           "A DLPack capsule over the buffer (versioned when max_version >= (1, 0)).")
      .def(
          "__dlpack_device__",
          [](const Buffer& b) { return py::make_tuple(b.span().device_type, b.span().device_id); },
          "(device_type, device_id): (1, 0) for host memory, (2, N) for CUDA device N.")
      .def("__repr__", [](const Buffer& b) {
        const BufferSpan& s = b.span();
        char addr[32];
        std::snprintf(addr, sizeof(addr), "0x%llx", static_cast<unsigned long long>(s.address));
        return "<mooncake_client.Buffer " + std::to_string(s.nbytes) + " bytes at " + addr +
               " on " + DeviceName(s) + ">";
      });
}

}  // namespace mooncake::python
