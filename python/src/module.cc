// _mooncake_client: the compiled half of the mooncake_client package.
// Import mooncake_client, not this module: the package installs the error
// factory and wraps the results in dataclasses.
#include "bindings.h"

PYBIND11_MODULE(_mooncake_client, m) {
  m.doc() = "Mooncake client bindings (use the mooncake_client package)";
  mooncake::python::RegisterStatus(m);
  mooncake::python::RegisterBuffer(m);
  mooncake::python::RegisterClient(m);
  mooncake::python::RegisterCommunicator(m);
}
