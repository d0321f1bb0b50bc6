# mooncake_test(NAME SOURCES ... LIBS ... [LABELS ...])
# One GoogleTest executable registered with CTest; every test gets a timeout
# so a hang can never stall CI.
function(mooncake_test name)
  cmake_parse_arguments(T "" "TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE ${T_LIBS} GTest::gtest GTest::gtest_main Threads::Threads)
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 120)
  endif()
  add_test(NAME ${name} COMMAND ${name})
  set_tests_properties(${name} PROPERTIES TIMEOUT ${T_TIMEOUT}
    ENVIRONMENT "MOONCAKE_BIN_DIR=${CMAKE_BINARY_DIR}/bin")
  if(T_LABELS)
    set_tests_properties(${name} PROPERTIES LABELS "${T_LABELS}")
  endif()
endfunction()

# Compiles one .cu file with nvcc into a fatbin (SASS for each of
# MOONCAKE_CUDA_ARCHITECTURES plus PTX of the newest, so newer GPUs JIT it)
# and embeds it as a byte array (EmbedBinary.cmake) that code loads with
# cuModuleLoadData through the driver wrapper: no CUDA runtime, no libcuda
# link. Sets <out_var> to the generated .cc to add to a target's sources.
#   mooncake_embed_cuda_kernel(out_var SOURCE k.cu NAME n NAMESPACE ns SYMBOL s
#                              [DEPENDS ...] [INCLUDES dir...])
function(mooncake_embed_cuda_kernel out_var)
  cmake_parse_arguments(K "" "SOURCE;NAME;NAMESPACE;SYMBOL" "DEPENDS;INCLUDES" ${ARGN})
  set(fatbin ${CMAKE_CURRENT_BINARY_DIR}/${K_NAME}.fatbin)
  set(image ${CMAKE_CURRENT_BINARY_DIR}/${K_NAME}_image.cc)
  set(gencode)
  foreach(arch IN LISTS MOONCAKE_CUDA_ARCHITECTURES)
    string(REGEX REPLACE "-(real|virtual)$" "" arch "${arch}")
    list(APPEND gencode "-gencode=arch=compute_${arch},code=sm_${arch}")
  endforeach()
  list(GET MOONCAKE_CUDA_ARCHITECTURES -1 newest)
  string(REGEX REPLACE "-(real|virtual)$" "" newest "${newest}")
  list(APPEND gencode "-gencode=arch=compute_${newest},code=compute_${newest}")
  set(ccbin)
  if(CMAKE_CUDA_HOST_COMPILER)
    set(ccbin -ccbin ${CMAKE_CUDA_HOST_COMPILER})
  endif()
  set(includes)
  foreach(dir IN LISTS K_INCLUDES)
    list(APPEND includes -I${dir})
  endforeach()
  # nvcc writes the headers it read into a depfile, so a change to any of
  # them (the Device API's ordered ops, say) rebuilds the image: DEPENDS
  # alone would list only what someone remembered.
  add_custom_command(OUTPUT ${fatbin}
    COMMAND ${CMAKE_CUDA_COMPILER} ${ccbin} -fatbin -std=c++20 -O3 ${gencode} ${includes}
            -MD -MF ${fatbin}.d -o ${fatbin} ${K_SOURCE}
    DEPENDS ${K_SOURCE} ${K_DEPENDS}
    DEPFILE ${fatbin}.d
    COMMENT "nvcc: ${K_NAME} fatbin (${MOONCAKE_CUDA_ARCHITECTURES})"
    VERBATIM)
  add_custom_command(OUTPUT ${image}
    COMMAND ${CMAKE_COMMAND} -DINPUT=${fatbin} -DOUTPUT=${image}
            -DNAMESPACE=${K_NAMESPACE} -DSYMBOL=${K_SYMBOL}
            -P ${PROJECT_SOURCE_DIR}/cmake/EmbedBinary.cmake
    DEPENDS ${fatbin} ${PROJECT_SOURCE_DIR}/cmake/EmbedBinary.cmake
    VERBATIM)
  set(${out_var} ${image} PARENT_SCOPE)
endfunction()
