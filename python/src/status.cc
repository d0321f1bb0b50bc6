#include "status.h"

#include "bindings.h"

namespace mooncake::python {
namespace {

// mooncake_client.errors.from_status(code_name, code_value, message), set
// once by the package's __init__. A strong reference that is never released:
// it must outlive every exception translation, even at interpreter exit.
PyObject* g_error_factory = nullptr;

void SetErrorFactory(py::object factory) {
  if (!factory.is_none() && !PyCallable_Check(factory.ptr())) {
    throw py::type_error("_set_error_factory: expected a callable or None");
  }
  PyObject* old = g_error_factory;
  g_error_factory = factory.is_none() ? nullptr : factory.release().ptr();
  Py_XDECREF(old);
}

// Raises the Python exception for `e` (called with the GIL held, from the
// pybind11 translator).
void RaiseStatusError(const StatusError& e) {
  if (g_error_factory == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return;
  }
  // Messages quote what the daemon or the kernel said: never let a stray
  // byte turn the error into a UnicodeDecodeError.
  py::object message = py::reinterpret_steal<py::object>(PyUnicode_DecodeUTF8(
      e.message().data(), static_cast<Py_ssize_t>(e.message().size()), "replace"));
  if (!message) return;
  py::object exc = py::reinterpret_steal<py::object>(PyObject_CallFunction(
      g_error_factory, "siO", StatusCodeName(e.code()), static_cast<int>(e.code()), message.ptr()));
  if (!exc) return;  // the factory's own error stays set
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
}

}  // namespace

StatusError::StatusError(absl::StatusCode code, std::string message)
    : code_(code), message_(std::move(message)) {
  what_ = std::string(StatusCodeName(code_)) + ": " + message_;
}

const char* StatusCodeName(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk: return "OK";
    case absl::StatusCode::kCancelled: return "CANCELLED";
    case absl::StatusCode::kUnknown: return "UNKNOWN";
    case absl::StatusCode::kInvalidArgument: return "INVALID_ARGUMENT";
    case absl::StatusCode::kDeadlineExceeded: return "DEADLINE_EXCEEDED";
    case absl::StatusCode::kNotFound: return "NOT_FOUND";
    case absl::StatusCode::kAlreadyExists: return "ALREADY_EXISTS";
    case absl::StatusCode::kPermissionDenied: return "PERMISSION_DENIED";
    case absl::StatusCode::kResourceExhausted: return "RESOURCE_EXHAUSTED";
    case absl::StatusCode::kFailedPrecondition: return "FAILED_PRECONDITION";
    case absl::StatusCode::kAborted: return "ABORTED";
    case absl::StatusCode::kOutOfRange: return "OUT_OF_RANGE";
    case absl::StatusCode::kUnimplemented: return "UNIMPLEMENTED";
    case absl::StatusCode::kInternal: return "INTERNAL";
    case absl::StatusCode::kUnavailable: return "UNAVAILABLE";
    case absl::StatusCode::kDataLoss: return "DATA_LOSS";
    case absl::StatusCode::kUnauthenticated: return "UNAUTHENTICATED";
    default: break;
  }
  return "UNKNOWN";
}

void ThrowError(absl::StatusCode code, std::string message) {
  throw StatusError(code, std::move(message));
}

void RegisterStatus(py::module_& m) {
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      RaiseStatusError(e);
    }
  });
  m.def("_set_error_factory", &SetErrorFactory, py::arg("factory"),
        "Installs factory(code_name, code_value, message) -> exception instance, used for every "
        "failed status (mooncake_client/__init__.py installs errors.from_status).");
  m.def(
      "_raise_status",
      [](int code, const std::string& message) {
        ThrowError(static_cast<absl::StatusCode>(code), message);
      },
      py::arg("code"), py::arg("message"),
      "Raises the exception a failed status with this code maps to (tests the mapping).");
}

}  // namespace mooncake::python
