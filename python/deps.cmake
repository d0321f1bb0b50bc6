# What the Python package needs, found once for the whole project (included
# by the top-level CMakeLists.txt, and by python/CMakeLists.txt when python/
# is built on its own against an installed prefix):
#   - Python 3: interpreter and the headers for an extension module. Debian's
#     /usr/bin/python3 by default (not whatever `python3` is first on PATH,
#     e.g. a pyenv build without numpy), so CI on a clean Debian machine and
#     this build agree; pass -DPython3_EXECUTABLE=... for another one (the GPU
#     machine's /opt/torch/.venv/bin/python).
#   - pybind11 (CONFIG): Debian's pybind11-dev (2.10), or pybind11 3.x.
#
# MOONCAKE_BUILD_PYTHON: ON, OFF or AUTO (default: ON when both are found,
# except in a fuzzer build).
# Sets MOONCAKE_HAVE_PYTHON, which python/ and tests/python/ test.
set(MOONCAKE_BUILD_PYTHON AUTO CACHE STRING
    "Build the Python package mooncake_client (ON, OFF, AUTO: when pybind11 and the Python 3 headers are found)")
set(MOONCAKE_HAVE_PYTHON OFF)
if(MOONCAKE_BUILD_FUZZERS AND MOONCAKE_BUILD_PYTHON STREQUAL "AUTO")
  # Everything there is built with ASan, which a plain python cannot load.
  message(STATUS "Mooncake: Python package OFF (a fuzzer build; MOONCAKE_BUILD_PYTHON=AUTO)")
elseif(NOT MOONCAKE_BUILD_PYTHON STREQUAL "OFF")
  if(NOT Python3_EXECUTABLE AND EXISTS /usr/bin/python3)
    set(Python3_EXECUTABLE /usr/bin/python3 CACHE FILEPATH "The Python the mooncake_client extension is built for")
  endif()
  find_package(Python3 COMPONENTS Interpreter Development.Module QUIET)
  # pybind11 picks up the Python3 found above (its FindPython mode).
  find_package(pybind11 CONFIG QUIET)
  set(_mc_py_missing)
  if(NOT Python3_Interpreter_FOUND OR NOT Python3_Development.Module_FOUND)
    list(APPEND _mc_py_missing "the Python 3 headers (Debian: python3-dev)")
  endif()
  if(NOT pybind11_FOUND)
    list(APPEND _mc_py_missing "pybind11 (Debian: pybind11-dev)")
  endif()
  if(_mc_py_missing)
    list(JOIN _mc_py_missing " and " _mc_py_missing)
    if(MOONCAKE_BUILD_PYTHON STREQUAL "ON")
      message(FATAL_ERROR "MOONCAKE_BUILD_PYTHON=ON but ${_mc_py_missing} not found "
                          "(deploy/install-deps.sh installs them)")
    endif()
    message(STATUS "Mooncake: Python package OFF: ${_mc_py_missing} not found "
                   "(deploy/install-deps.sh installs them)")
  else()
    set(MOONCAKE_HAVE_PYTHON ON)
    message(STATUS "Mooncake: Python package ON (Python ${Python3_VERSION} at "
                   "${Python3_EXECUTABLE}, pybind11 ${pybind11_VERSION})")
  endif()
else()
  message(STATUS "Mooncake: Python package OFF (MOONCAKE_BUILD_PYTHON=OFF)")
endif()
