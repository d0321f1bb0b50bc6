# cmake -P script: writes a C++ source that holds a binary file as a byte
# array, for code that must carry a blob inside a library (the CUDA
# verification kernel's fatbin, loaded with cuModuleLoadData).
#   -DINPUT=file -DOUTPUT=file.cc -DNAMESPACE=a::b -DSYMBOL=kName
# defines `alignas(16) extern const unsigned char SYMBOL[]` and
# `extern const size_t SYMBOL##Size` in NAMESPACE.
cmake_minimum_required(VERSION 3.25)
foreach(var INPUT OUTPUT NAMESPACE SYMBOL)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "EmbedBinary.cmake: -D${var}=... is required")
  endif()
endforeach()
file(READ "${INPUT}" hex HEX)
string(LENGTH "${hex}" hex_length)
math(EXPR size "${hex_length} / 2")
if(size EQUAL 0)
  message(FATAL_ERROR "EmbedBinary.cmake: ${INPUT} is empty")
endif()
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
string(REGEX REPLACE "((0x[0-9a-f][0-9a-f],){16})" "\\1\n    " bytes "${bytes}")
get_filename_component(input_name "${INPUT}" NAME)
file(WRITE "${OUTPUT}.tmp" "// Generated from ${input_name} by cmake/EmbedBinary.cmake; do not edit.
// clang-format off
#include <cstddef>

namespace ${NAMESPACE} {

alignas(16) extern const unsigned char ${SYMBOL}[] = {
    ${bytes}
};
extern const size_t ${SYMBOL}Size = ${size};

}  // namespace ${NAMESPACE}
")
file(COPY_FILE "${OUTPUT}.tmp" "${OUTPUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUTPUT}.tmp")
