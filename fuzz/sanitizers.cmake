# Included by the root CMakeLists.txt, before any target, when
# MOONCAKE_BUILD_FUZZERS is ON: every library of this build directory is
# compiled with coverage and sanitizers, so the fuzzers (fuzz/CMakeLists.txt,
# linked with -fsanitize=fuzzer) see inside mooncake_daemon_lib,
# mooncake_common, mooncake_proto and the device handle code. Use a build
# directory of its own (fuzz/run.sh uses build-fuzz).
if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  message(FATAL_ERROR
    "MOONCAKE_BUILD_FUZZERS needs clang (libFuzzer), but the C++ compiler is "
    "${CMAKE_CXX_COMPILER_ID} (${CMAKE_CXX_COMPILER}). Configure a separate build "
    "directory with: CC=clang-14 CXX=clang++-14 cmake -S . -B build-fuzz -G Ninja "
    "-DMOONCAKE_BUILD_FUZZERS=ON -DMOONCAKE_BUILD_TESTS=OFF -DMOONCAKE_WITH_CUDA=OFF "
    "(Debian: apt-get install clang-14 libclang-rt-14-dev)")
endif()
if(NOT MOONCAKE_WITH_CUDA STREQUAL "OFF")
  # nvcc does not take these flags, and nothing fuzzed needs CUDA.
  message(STATUS "Mooncake: MOONCAKE_BUILD_FUZZERS forces MOONCAKE_WITH_CUDA=OFF")
  set(MOONCAKE_WITH_CUDA OFF CACHE STRING "Build CUDA device code (ON, OFF, AUTO)" FORCE)
endif()

# -fno-sanitize-recover: undefined behaviour aborts the run (a crash the
# fuzzer reports) instead of printing and carrying on.
set(MOONCAKE_SANITIZE_FLAGS
  "-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer")
string(APPEND CMAKE_C_FLAGS " ${MOONCAKE_SANITIZE_FLAGS}")
string(APPEND CMAKE_CXX_FLAGS " ${MOONCAKE_SANITIZE_FLAGS}")
