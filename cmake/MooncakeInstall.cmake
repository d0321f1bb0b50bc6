# Install layout, by component (cmake --install BUILD [--component C]):
#   runtime      bin/mooncaked, bin/mcctl, bin/device_transport_example,
#                lib/libmooncake_client.so.<version>
#   development  include/mooncake/{client,device}/... and the two common headers
#                they include (mooncake/common/unique_fd.h, export.h), the
#                libmooncake_client.so link, lib/cmake/Mooncake/ (find_package)
#                and lib/pkgconfig/mooncake.pc (pkg-config)
#   tests        GPU tests and benchmarks, bin/rendezvous_bench and
#                share/mooncake/gpu/ (run.sh and its sources), only with
#                -DMOONCAKE_INSTALL_TESTS=ON (deploy/make-gpu-bundle.sh)
# No static library and no internal header (common/: status.h, log.h,
# grpc_status.h, fd_passing.h, paths.h) is installed.
#
# The tests/ and bench/ install rules read MOONCAKE_INSTALL_TESTS when they
# are processed, before this file: pass it with -D (it is declared here so
# that it is documented in the cache).
option(MOONCAKE_INSTALL_TESTS "Install the test and benchmark executables (component tests)" OFF)

include(CMakePackageConfigHelpers)
if(TARGET mooncake_client)
  # The export holds Mooncake::client only: its Mooncake dependencies are
  # build-only (folded into the shared library or installed as headers).
  install(EXPORT MooncakeTargets NAMESPACE Mooncake::
          DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Mooncake COMPONENT development)
  configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/MooncakeConfig.cmake.in
    ${CMAKE_BINARY_DIR}/MooncakeConfig.cmake
    INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Mooncake)
  write_basic_package_version_file(${CMAKE_BINARY_DIR}/MooncakeConfigVersion.cmake
    VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
  install(FILES ${CMAKE_BINARY_DIR}/MooncakeConfig.cmake ${CMAKE_BINARY_DIR}/MooncakeConfigVersion.cmake
          DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Mooncake COMPONENT development)

  # pkg-config, relocatable: the prefix is found from the .pc file's place.
  if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
    set(MOONCAKE_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
  else()
    file(RELATIVE_PATH _up "/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/")
    string(REGEX REPLACE "/$" "" _up "${_up}")
    set(MOONCAKE_PC_PREFIX "\${pcfiledir}/${_up}")
  endif()
  file(CONFIGURE OUTPUT ${CMAKE_BINARY_DIR}/mooncake.pc @ONLY CONTENT [[
prefix=@MOONCAKE_PC_PREFIX@
libdir=${prefix}/@CMAKE_INSTALL_LIBDIR@
includedir=${prefix}/@CMAKE_INSTALL_INCLUDEDIR@

Name: mooncake
Description: Mooncake client library (mooncaked client, Communicator, Device API host code)
Version: @PROJECT_VERSION@
Requires: absl_status absl_statusor absl_time
Libs: -L${libdir} -lmooncake_client
Cflags: -I${includedir}
]])
  install(FILES ${CMAKE_BINARY_DIR}/mooncake.pc
          DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT development)
endif()
# find_package(Mooncake) then target_link_libraries(app PRIVATE Mooncake::client)
