# CPack pre-build script (CPACK_PRE_BUILD_SCRIPTS, set by
# MooncakePackaging.cmake): removes RPATH/RUNPATH from every ELF file staged
# for a package. The packages install into /usr, where the dynamic loader
# looks anyway; the build tree's $ORIGIN RPATHs are for the relocatable
# bundle and the cmake --install layout.
set(_root "${CPACK_TEMPORARY_INSTALL_DIRECTORY}")
if(NOT _root OR NOT IS_DIRECTORY "${_root}")
  set(_root "${CPACK_TOPLEVEL_DIRECTORY}")
endif()
file(GLOB_RECURSE _files LIST_DIRECTORIES false "${_root}/*")
foreach(f IN LISTS _files)
  if(IS_SYMLINK "${f}")
    continue()
  endif()
  file(READ "${f}" _magic LIMIT 4 HEX)
  if(_magic STREQUAL "7f454c46")
    file(RPATH_REMOVE FILE "${f}")
  endif()
endforeach()
