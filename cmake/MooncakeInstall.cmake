# Install layout: bin/mooncaked, bin/mcctl, lib/libmooncake_client.so,
# include/mooncake/..., lib/cmake/Mooncake/MooncakeConfig.cmake.
include(CMakePackageConfigHelpers)
if(TARGET mooncake_client)
  install(EXPORT MooncakeTargets NAMESPACE Mooncake::
          DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Mooncake)
  configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/MooncakeConfig.cmake.in
    ${CMAKE_BINARY_DIR}/MooncakeConfig.cmake
    INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Mooncake)
  write_basic_package_version_file(${CMAKE_BINARY_DIR}/MooncakeConfigVersion.cmake
    VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
  install(FILES ${CMAKE_BINARY_DIR}/MooncakeConfig.cmake ${CMAKE_BINARY_DIR}/MooncakeConfigVersion.cmake
          DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Mooncake)
endif()
