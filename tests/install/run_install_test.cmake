# cmake -P script: install, check the layout, configure + build the consumer,
# run it.
#   -DBUILD_DIR -DCONSUMER_SRC -DWORK_DIR -DLIBDIR -DCXX [-DINSTALL_TESTS=ON]
cmake_minimum_required(VERSION 3.25)
file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  set(last_output "${out}" PARENT_SCOPE)
endfunction()
function(fail)
  message(FATAL_ERROR "install layout: " ${ARGN})
endfunction()
# install_tree(DIR OUT [--component C]): installs into DIR, sets OUT to the
# files (and file links) under it, relative to it.
function(install_tree dir out)
  run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${dir} ${ARGN})
  file(GLOB_RECURSE files LIST_DIRECTORIES false RELATIVE ${dir} ${dir}/*)
  list(SORT files)
  set(${out} "${files}" PARENT_SCOPE)
endfunction()
function(require dir)
  foreach(f ${ARGN})
    if(NOT EXISTS ${dir}/${f})
      fail("${f} is missing from ${dir}")
    endif()
  endforeach()
endfunction()

set(runtime_bin "^bin/(mooncaked|mcctl|mcctl-selftest-gpu|device_transport_example)$")
set(runtime_lib "^${LIBDIR}/libmooncake_client\\.so\\.[0-9.]+$")
# mcctl's bash completion goes with mcctl.
set(runtime_share "^share/bash-completion/completions/mcctl$")
set(dev_files "^(include/mooncake/(client|device)/.*|include/transport/device/.*|include/(cuda_alike|transfer_engine)\\.h|include/mooncake/common/(unique_fd|export)\\.h|${LIBDIR}/libmooncake_client\\.so|${LIBDIR}/cmake/Mooncake/.*|${LIBDIR}/pkgconfig/mooncake\\.pc)$")

# 1. The whole install, as `cmake --install build` does it.
install_tree(${prefix} all)
require(${prefix} bin/mooncaked bin/mcctl bin/device_transport_example ${LIBDIR}/libmooncake_client.so
  ${LIBDIR}/cmake/Mooncake/MooncakeConfig.cmake ${LIBDIR}/cmake/Mooncake/MooncakeTargets.cmake
  ${LIBDIR}/pkgconfig/mooncake.pc
  include/mooncake/client/client.h include/mooncake/client/communicator.h
  include/mooncake/device/comm_device.h include/mooncake/device/device_transport.h
  include/mooncake/common/unique_fd.h include/mooncake/common/export.h)
# common/'s internal headers (status helpers, logging, gRPC status mapping,
# fd passing, paths, the generated version): the public headers include
# unique_fd.h and export.h only.
foreach(h status.h log.h grpc_status.h fd_passing.h paths.h version.h)
  if(EXISTS ${prefix}/include/mooncake/common/${h})
    fail("internal header include/mooncake/common/${h} is installed")
  endif()
endforeach()
foreach(f IN LISTS all)
  if(f MATCHES "\\.a$")
    fail("static library ${f} is installed")
  elseif(f MATCHES "^include/mooncake/common/" AND NOT f MATCHES "^include/mooncake/common/(unique_fd|export)\\.h$")
    fail("internal header ${f} is installed (of common/, only unique_fd.h and export.h are public)")
  elseif(NOT INSTALL_TESTS AND (f MATCHES "^bin/" AND NOT f MATCHES "${runtime_bin}" OR f MATCHES "^share/mooncake/gpu/"))
    fail("${f} (a test or benchmark) is installed without MOONCAKE_INSTALL_TESTS")
  endif()
endforeach()

# 2. Each component apart.
install_tree(${WORK_DIR}/runtime rt --component runtime)
foreach(f IN LISTS rt)
  if(NOT f MATCHES "${runtime_bin}" AND NOT f MATCHES "${runtime_lib}" AND NOT f MATCHES "${runtime_share}")
    fail("component runtime has ${f}")
  endif()
endforeach()
require(${WORK_DIR}/runtime bin/mcctl bin/device_transport_example)
if(NOT rt MATCHES "${LIBDIR}/libmooncake_client\\.so\\.")
  fail("component runtime lacks ${LIBDIR}/libmooncake_client.so.<version>")
endif()
install_tree(${WORK_DIR}/development dev --component development)
foreach(f IN LISTS dev)
  if(NOT f MATCHES "${dev_files}")
    fail("component development has ${f}")
  endif()
endforeach()
require(${WORK_DIR}/development ${LIBDIR}/pkgconfig/mooncake.pc ${LIBDIR}/cmake/Mooncake/MooncakeConfig.cmake
  include/mooncake/client/client.h include/mooncake/device/device_transport.h include/mooncake/common/unique_fd.h)
# Every install rule names its component.
install_tree(${WORK_DIR}/unspecified unspecified --component Unspecified)
foreach(f IN LISTS unspecified)
  if(f STREQUAL "bin/mooncaked")
    # daemon/CMakeLists.txt: install(TARGETS mooncaked ... COMPONENT runtime)
    message(WARNING "bin/mooncaked has no install component (belongs to runtime)")
  else()
    fail("${f} is installed without a component")
  endif()
endforeach()
if(NOT EXISTS ${WORK_DIR}/runtime/bin/mooncaked AND NOT "bin/mooncaked" IN_LIST unspecified)
  fail("bin/mooncaked is in no component")
endif()

# 3. A C++17 consumer without CUDA: find_package(Mooncake) must not look for
# CUDAToolkit, and Mooncake::client must not raise the C++ standard.
run(${CMAKE_COMMAND} -S ${CONSUMER_SRC} -B ${WORK_DIR}/consumer-build -G Ninja
    -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON)
run(${CMAKE_COMMAND} --build ${WORK_DIR}/consumer-build)
file(READ ${WORK_DIR}/consumer-build/compile_commands.json commands)
if(NOT commands MATCHES "-std=c\\+\\+17" OR commands MATCHES "-std=(c|gnu)\\+\\+(2|1z)")
  fail("the consumer does not compile as C++17:\n${commands}")
endif()
run(${WORK_DIR}/consumer-build/consumer ${WORK_DIR}/no-daemon.sock)
message(STATUS "consumer said: ${last_output}")

# 4. The same program through pkg-config.
find_program(PKG_CONFIG pkg-config)
if(PKG_CONFIG)
  set(ENV{PKG_CONFIG_PATH} ${prefix}/${LIBDIR}/pkgconfig)
  run(${PKG_CONFIG} --cflags --libs mooncake)
  string(STRIP "${last_output}" pc_flags)
  if(NOT pc_flags MATCHES "-lmooncake_client")
    fail("pkg-config --libs mooncake: ${pc_flags}")
  endif()
  separate_arguments(pc_flags UNIX_COMMAND "${pc_flags}")
  run(${CXX} -std=c++17 ${CONSUMER_SRC}/main.cc ${pc_flags} -Wl,-rpath,${prefix}/${LIBDIR}
      -o ${WORK_DIR}/consumer-pc)
  run(${WORK_DIR}/consumer-pc ${WORK_DIR}/no-daemon.sock)
  message(STATUS "pkg-config consumer said: ${last_output}")
else()
  message(STATUS "pkg-config not found: mooncake.pc installed but not exercised")
endif()
