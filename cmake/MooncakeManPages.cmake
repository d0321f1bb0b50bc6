# Man pages, one per program, generated at build time from the program's
# own --help and --version by help2man (deploy/install-deps.sh installs
# it), so a page never disagrees with the program it describes. Extra
# sections (FILES, EXIT STATUS, SEE ALSO, ...) come from
# deploy/man/<program>.h2m. Without help2man the hand-written pages in
# deploy/man/ are used instead.
#
#   mooncake_man_page(TARGET mcctl SECTION 1 NAME "..." OUT_VAR var)
#
# sets <var> to the gzipped page (-9n: no name or time stamp, as lintian
# wants) in ${CMAKE_BINARY_DIR}/man/, built by the target mooncake_man_pages
# (part of ALL). SOURCE_DATE_EPOCH pins help2man's date for reproducible
# packages.
find_program(MOONCAKE_HELP2MAN help2man)
find_program(MOONCAKE_GZIP gzip REQUIRED)
if(MOONCAKE_HELP2MAN)
  message(STATUS "Mooncake: man pages generated with ${MOONCAKE_HELP2MAN}")
else()
  message(STATUS "Mooncake: help2man not found: packaging the hand-written deploy/man pages")
endif()
if(NOT TARGET mooncake_man_pages)
  add_custom_target(mooncake_man_pages ALL)
endif()

function(mooncake_man_page)
  cmake_parse_arguments(M "" "TARGET;SECTION;NAME;OUT_VAR" "" ${ARGN})
  set(page ${M_TARGET}.${M_SECTION})
  set(src ${PROJECT_SOURCE_DIR}/deploy/man)
  set(dir ${CMAKE_BINARY_DIR}/man)
  if(NOT MOONCAKE_HELP2MAN OR NOT TARGET ${M_TARGET})
    file(MAKE_DIRECTORY ${dir})
    execute_process(COMMAND ${MOONCAKE_GZIP} -9nc ${src}/${page} OUTPUT_FILE ${dir}/${page}.gz
                    RESULT_VARIABLE rc)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "gzip ${src}/${page} failed (${rc})")
    endif()
    set(${M_OUT_VAR} ${dir}/${page}.gz PARENT_SCOPE)
    return()
  endif()
  set(include_args)
  set(depends ${M_TARGET})
  if(EXISTS ${src}/${M_TARGET}.h2m)
    set(include_args --include=${src}/${M_TARGET}.h2m)
    list(APPEND depends ${src}/${M_TARGET}.h2m)
  endif()
  string(TIMESTAMP epoch "%s" UTC)
  add_custom_command(
    OUTPUT ${dir}/${page}.gz
    COMMAND ${CMAKE_COMMAND} -E make_directory ${dir}
    COMMAND ${CMAKE_COMMAND} -E env SOURCE_DATE_EPOCH=${epoch} MOONCAKE_SOCKET=
            ${MOONCAKE_HELP2MAN} --no-info --no-discard-stderr --section=${M_SECTION}
            --name=${M_NAME} --source=Mooncake ${include_args}
            --output=${dir}/${page} $<TARGET_FILE:${M_TARGET}>
    COMMAND ${MOONCAKE_GZIP} -9nf ${dir}/${page}
    DEPENDS ${depends}
    COMMENT "help2man ${page}"
    VERBATIM)
  add_custom_target(mooncake_man_${M_TARGET} DEPENDS ${dir}/${page}.gz)
  add_dependencies(mooncake_man_pages mooncake_man_${M_TARGET})
  set(${M_OUT_VAR} ${dir}/${page}.gz PARENT_SCOPE)
endfunction()
