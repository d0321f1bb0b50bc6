# Debian packages with CPack: `cpack -G DEB` in a configured and built tree
# (or deploy/build-packages.sh, which makes a release tree for it) writes
#   mooncaked                 bin/mooncaked, the systemd unit, the conffile
#                             /etc/mooncake/mooncaked.conf, the sysusers.d
#                             entry for the socket group, maintainer scripts
#                             (deploy/debian/mooncaked/), mooncaked(8)
#   libmooncake-client        lib/libmooncake_client.so.<version> + soname link
#   libmooncake-client-dev    headers, the .so link, lib/cmake/Mooncake,
#                             lib/pkgconfig/mooncake.pc (component development)
#   mooncake-tools            mcctl, device_transport_example, their man pages
#   python3-mooncake-client   lib/python3/dist-packages/mooncake_client
#                             (component python; only when it is built)
# each with usr/share/doc/<package>/{copyright,changelog.Debian.gz}. The
# package prefix is /usr (CPACK_PACKAGING_INSTALL_PREFIX).
#
# Components. The install components of MooncakeInstall.cmake (runtime,
# development, tests, python) stay what `cmake --install` uses. runtime
# holds three packages' files, so the programs and the library are installed
# a second time here, into packaging-only components (pkg_*) marked
# EXCLUDE_FROM_ALL: a plain `cmake --install` never sees them, nor the
# absolute /etc path of the conffile. Each package is a CPack component
# group: its pkg_* component, plus development or python where it has one.
#
# RPATH. MOONCAKE_BUNDLE_RPATH gives the programs DT_RPATH=$ORIGIN/../lib
# (for the relocatable GPU bundle) and the Python extension has a $ORIGIN
# RPATH to find the library from dist-packages. Packages install into /usr,
# where the dynamic loader looks anyway, so a CPack pre-build script
# (MooncakePackagingStripRpath.cmake) removes RPATH/RUNPATH from every
# staged ELF file: the packages carry none, whatever the build tree's
# option (lintian accepts $ORIGIN paths, but Debian prefers none at all).
# dpkg-shlibdeps finds the in-tree library through
# CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS instead.
if(NOT TARGET mooncake_client OR NOT TARGET mooncaked OR NOT TARGET mcctl)
  message(STATUS "Mooncake: Debian packaging off (mooncaked, mcctl or mooncake_client not built)")
  return()
endif()

set(MOONCAKE_PACKAGE_MAINTAINER "Mooncake maintainers <mooncake-packaging@example.com>" CACHE STRING
    "Maintainer field of the Debian packages (\"Name <address>\")")
set(MOONCAKE_PACKAGE_HOMEPAGE "https://github.com/kvcache-ai/Mooncake" CACHE STRING
    "Homepage field of the Debian packages")
set(MOONCAKE_PACKAGE_RELEASE "1" CACHE STRING "Debian revision of the packages (VERSION-RELEASE)")

set(_pkg_src ${PROJECT_SOURCE_DIR}/deploy)
set(_pkg_out ${CMAKE_BINARY_DIR}/packaging)
set(MOONCAKE_DEB_VERSION "${PROJECT_VERSION}-${MOONCAKE_PACKAGE_RELEASE}")
set_property(DIRECTORY ${PROJECT_SOURCE_DIR} APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS
  ${_pkg_src}/mooncaked.service ${_pkg_src}/mooncaked.conf.example ${_pkg_src}/debian/changelog.in
  ${_pkg_src}/debian/copyright.in
  ${_pkg_src}/man/mooncaked.8 ${_pkg_src}/man/mcctl.1 ${_pkg_src}/man/device_transport_example.1)

# gzip -9n (no name, no time stamp: lintian wants compressed, reproducible
# man pages and changelogs).
find_program(MOONCAKE_GZIP gzip REQUIRED)
function(_mooncake_gzip in out)
  execute_process(COMMAND ${MOONCAKE_GZIP} -9nc ${in} OUTPUT_FILE ${out} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "gzip ${in} failed (${rc})")
  endif()
endfunction()

# The unit exactly as deploy/install-service.sh installs it for --prefix /usr.
file(READ ${_pkg_src}/mooncaked.service _unit)
string(REPLACE "/usr/local/bin/mooncaked" "/usr/bin/mooncaked" _unit "${_unit}")
file(WRITE ${_pkg_out}/mooncaked.service "${_unit}")
# The config as install-service.sh writes a new one: the example, with the
# socket group the sysusers entry creates.
file(READ ${_pkg_src}/mooncaked.conf.example _conf)
string(REPLACE "\n# socket_group = mooncake\n" "\nsocket_group = mooncake\n" _conf_new "${_conf}")
if(_conf_new STREQUAL _conf)
  message(FATAL_ERROR "deploy/mooncaked.conf.example lost its '# socket_group = mooncake' line")
endif()
file(WRITE ${_pkg_out}/mooncaked.conf "${_conf_new}")

string(TIMESTAMP MOONCAKE_DEB_DATE "%a, %d %b %Y %H:%M:%S +0000" UTC)
string(TIMESTAMP MOONCAKE_COPYRIGHT_YEAR "%Y" UTC)
configure_file(${_pkg_src}/debian/changelog.in ${_pkg_out}/changelog.Debian @ONLY)
configure_file(${_pkg_src}/debian/copyright.in ${_pkg_out}/copyright @ONLY)
_mooncake_gzip(${_pkg_out}/changelog.Debian ${_pkg_out}/changelog.Debian.gz)
# Man pages from each program's --help (help2man; cmake/MooncakeManPages.cmake).
include(MooncakeManPages)
mooncake_man_page(TARGET mooncaked SECTION 8 NAME "Mooncake device-transport broker, one per node"
                  OUT_VAR _man_mooncaked)
mooncake_man_page(TARGET mcctl SECTION 1 NAME "query, watch and diagnose the local Mooncake daemon"
                  OUT_VAR _man_mcctl)
if(TARGET device_transport_example)
  mooncake_man_page(TARGET device_transport_example SECTION 1
                    NAME "run one rank of a Mooncake Device API example group"
                    OUT_VAR _man_example)
endif()

# _mooncake_package_docs(PACKAGE COMPONENT): copyright, changelog and the
# lintian overrides: deploy/debian/common.lintian-overrides, then
# deploy/debian/<package>.lintian-overrides where there is one.
function(_mooncake_package_docs package component)
  install(FILES ${_pkg_out}/copyright ${_pkg_out}/changelog.Debian.gz
          DESTINATION ${CMAKE_INSTALL_DATAROOTDIR}/doc/${package}
          COMPONENT ${component} EXCLUDE_FROM_ALL)
  file(READ ${_pkg_src}/debian/common.lintian-overrides overrides)
  set_property(DIRECTORY ${PROJECT_SOURCE_DIR} APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS
    ${_pkg_src}/debian/common.lintian-overrides)
  if(EXISTS ${_pkg_src}/debian/${package}.lintian-overrides)
    file(READ ${_pkg_src}/debian/${package}.lintian-overrides more)
    string(APPEND overrides "${more}")
    set_property(DIRECTORY ${PROJECT_SOURCE_DIR} APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS
      ${_pkg_src}/debian/${package}.lintian-overrides)
  endif()
  if(package STREQUAL "libmooncake-client-dev" AND CMAKE_INSTALL_LIBDIR STREQUAL "lib")
    string(APPEND overrides
      "# This build tree's libdir is lib, not Debian's multiarch one: configure with\n"
      "# -DCMAKE_INSTALL_PREFIX=/usr (deploy/build-packages.sh does) to get lib/<triplet>.\n"
      "pkg-config-unavailable-for-cross-compilation [usr/lib/pkgconfig/mooncake.pc]\n")
  endif()
  file(WRITE ${_pkg_out}/${package}.lintian-overrides "${overrides}")
  install(FILES ${_pkg_out}/${package}.lintian-overrides
          DESTINATION ${CMAKE_INSTALL_DATAROOTDIR}/lintian/overrides RENAME ${package}
          COMPONENT ${component} EXCLUDE_FROM_ALL)
endfunction()

# mooncaked
install(TARGETS mooncaked RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT pkg_daemon EXCLUDE_FROM_ALL)
install(FILES ${_pkg_out}/mooncaked.service DESTINATION lib/systemd/system
        COMPONENT pkg_daemon EXCLUDE_FROM_ALL)
install(FILES ${_pkg_out}/mooncaked.conf DESTINATION /etc/mooncake COMPONENT pkg_daemon EXCLUDE_FROM_ALL)
install(FILES ${_pkg_src}/mooncake.sysusers DESTINATION lib/sysusers.d RENAME mooncake.conf
        COMPONENT pkg_daemon EXCLUDE_FROM_ALL)
install(FILES ${_man_mooncaked} DESTINATION ${CMAKE_INSTALL_MANDIR}/man8
        COMPONENT pkg_daemon EXCLUDE_FROM_ALL)
_mooncake_package_docs(mooncaked pkg_daemon)

# libmooncake-client: the versioned library and its soname link (the .so
# link is the development component's).
install(TARGETS mooncake_client LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} NAMELINK_SKIP
        COMPONENT pkg_lib EXCLUDE_FROM_ALL)
_mooncake_package_docs(libmooncake-client pkg_lib)

# libmooncake-client-dev: component development + docs.
_mooncake_package_docs(libmooncake-client-dev pkg_dev)

# mooncake-tools
install(TARGETS mcctl RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT pkg_tools EXCLUDE_FROM_ALL)
install(FILES ${_man_mcctl} DESTINATION ${CMAKE_INSTALL_MANDIR}/man1
        COMPONENT pkg_tools EXCLUDE_FROM_ALL)
install(FILES ${PROJECT_SOURCE_DIR}/client/mcctl/completion/mcctl.bash
        DESTINATION ${CMAKE_INSTALL_DATAROOTDIR}/bash-completion/completions RENAME mcctl
        COMPONENT pkg_tools EXCLUDE_FROM_ALL)
if(TARGET device_transport_example)
  install(TARGETS device_transport_example RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
          COMPONENT pkg_tools EXCLUDE_FROM_ALL)
  install(FILES ${_man_example} DESTINATION ${CMAKE_INSTALL_MANDIR}/man1
          COMPONENT pkg_tools EXCLUDE_FROM_ALL)
endif()
_mooncake_package_docs(mooncake-tools pkg_tools)

set(CPACK_COMPONENTS_ALL pkg_daemon pkg_lib development pkg_dev pkg_tools)
set(CPACK_COMPONENT_PKG_DAEMON_GROUP daemon)
set(CPACK_COMPONENT_PKG_LIB_GROUP lib)
set(CPACK_COMPONENT_DEVELOPMENT_GROUP dev)
set(CPACK_COMPONENT_PKG_DEV_GROUP dev)
set(CPACK_COMPONENT_PKG_TOOLS_GROUP tools)
if(MOONCAKE_HAVE_PYTHON AND TARGET mooncake_python)
  _mooncake_package_docs(python3-mooncake-client pkg_py)
  list(APPEND CPACK_COMPONENTS_ALL python pkg_py)
  set(CPACK_COMPONENT_PYTHON_GROUP py)
  set(CPACK_COMPONENT_PKG_PY_GROUP py)
endif()

# --- CPack: what every package shares ---
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME mooncake)
set(CPACK_PACKAGE_VENDOR "Mooncake")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "${MOONCAKE_PACKAGE_MAINTAINER}")
set(CPACK_PACKAGE_HOMEPAGE_URL "${MOONCAKE_PACKAGE_HOMEPAGE}")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)
set(CPACK_PRE_BUILD_SCRIPTS ${CMAKE_CURRENT_LIST_DIR}/MooncakePackagingStripRpath.cmake)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_GROUPING ONE_PER_GROUP)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_RELEASE ${MOONCAKE_PACKAGE_RELEASE})
set(CPACK_DEBIAN_PACKAGE_SECTION misc)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_COMPRESSION_TYPE xz)
# Architecture: CPack asks dpkg --print-architecture.
# Depends from dpkg-shlibdeps (libc, libstdc++, gRPC, protobuf, Abseil ...);
# the in-tree library is found in the build tree's lib/ and its dependency
# is stated by hand below (it has no shlibs file until it is packaged).
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS ${CMAKE_LIBRARY_OUTPUT_DIRECTORY})
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
set(_same "(= ${MOONCAKE_DEB_VERSION})")

set(CPACK_DEBIAN_DAEMON_PACKAGE_NAME mooncaked)
set(CPACK_DEBIAN_DAEMON_PACKAGE_SECTION net)
set(CPACK_DEBIAN_DAEMON_PACKAGE_SUGGESTS "mooncake-tools")
set(CPACK_DEBIAN_DAEMON_PACKAGE_CONTROL_EXTRA
  ${_pkg_src}/debian/mooncaked/postinst ${_pkg_src}/debian/mooncaked/prerm
  ${_pkg_src}/debian/mooncaked/postrm ${_pkg_src}/debian/mooncaked/conffiles)
set(CPACK_DEBIAN_DAEMON_DESCRIPTION "Mooncake device-transport broker daemon
mooncaked is the per-node broker that sets up GPU-initiated transfers for
the processes of a job: it discovers the node's GPUs and RDMA NICs and their
PCIe affinity, brokers named groups of ranks (rendezvous with deadlines,
membership events), passes file descriptors between processes by ticket,
and cleans up after clients that exit or crash. Clients talk to it over a
UNIX socket in /run/mooncake; callers are identified by the kernel.
.
This package holds the daemon, its systemd unit, /etc/mooncake/mooncaked.conf
and the system group mooncake that owns the sockets. In a container or a
chroot its postinst creates the group but enables and starts nothing.")

set(CPACK_DEBIAN_LIB_PACKAGE_NAME libmooncake-client)
set(CPACK_DEBIAN_LIB_PACKAGE_SECTION libs)
# DEBIAN/shlibs for the library (only a file with a soname gets an entry,
# so the other packages have none), and the ldconfig trigger lintian wants;
# CPack adds ldconfig calls to postinst/postrm as well.
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY ">=")
set(CPACK_DEBIAN_LIB_PACKAGE_CONTROL_EXTRA ${_pkg_src}/debian/libmooncake-client/triggers)
set(CPACK_DEBIAN_LIB_DESCRIPTION "Mooncake client library (shared library)
libmooncake_client connects a process to mooncaked: sessions, groups of
ranks and their membership events, buffers shared across processes, and the
host side of the Device API (the tables GPU kernels read to put, signal and
wait over NVLink, PCIe P2P or RDMA).
.
This package holds the shared library.")

set(CPACK_DEBIAN_DEV_PACKAGE_NAME libmooncake-client-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_DEV_PACKAGE_SHLIBDEPS OFF)
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "libmooncake-client ${_same}, libabsl-dev")
set(CPACK_DEBIAN_DEV_DESCRIPTION "Mooncake client library (development files)
libmooncake_client connects a process to mooncaked: sessions, groups of
ranks and their membership events, buffers shared across processes, and the
host side of the Device API.
.
This package holds the C++ headers (C++17; the Device API's device headers
included), the CMake package (find_package(Mooncake), target
Mooncake::client) and the pkg-config file mooncake.pc.")

set(CPACK_DEBIAN_TOOLS_PACKAGE_NAME mooncake-tools)
set(CPACK_DEBIAN_TOOLS_PACKAGE_SECTION admin)
set(CPACK_DEBIAN_TOOLS_PACKAGE_DEPENDS "libmooncake-client ${_same}")
set(CPACK_DEBIAN_TOOLS_PACKAGE_SUGGESTS "mooncaked")
set(CPACK_DEBIAN_TOOLS_DESCRIPTION "Mooncake command-line tools: mcctl and an example
mcctl queries the node's mooncaked: status, GPUs, NICs, topology, sessions,
groups, queue pairs, memory regions and cluster peers, as tables or JSON;
streams group events (mcctl watch) and checks the node for GPU-initiated
transfers (mcctl doctor). With bash completion.
.
device_transport_example runs one rank of a Device API example group (on
CPU threads with --platform host, on GPUs with --platform cuda).")

set(CPACK_DEBIAN_PY_PACKAGE_NAME python3-mooncake-client)
set(CPACK_DEBIAN_PY_PACKAGE_SECTION python)
if(Python3_VERSION_MAJOR AND Python3_VERSION_MINOR)
  # The extension is built for this interpreter's ABI (cpython-3XY).
  math(EXPR _py_next "${Python3_VERSION_MINOR} + 1")
  set(_py_dep "python3 (>= ${Python3_VERSION_MAJOR}.${Python3_VERSION_MINOR}), python3 (<< ${Python3_VERSION_MAJOR}.${_py_next})")
else()
  set(_py_dep python3)
endif()
set(CPACK_DEBIAN_PY_PACKAGE_DEPENDS "${_py_dep}, libmooncake-client ${_same}")
set(CPACK_DEBIAN_PY_PACKAGE_RECOMMENDS "python3-numpy")
set(CPACK_DEBIAN_PY_DESCRIPTION "Mooncake client library (Python 3 bindings)
The Python package mooncake_client: Client and Communicator, group events
as an iterator, node information as dataclasses, and buffers exposed through
DLPack and the array interfaces, so torch.from_dlpack and numpy.asarray use
them without a copy.")

include(CPack)
