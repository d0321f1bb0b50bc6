// The CUDA build of the EP-style program: the same source, its kernel
// compiled by nvcc (tests/gpu/run.sh runs it on the GPU machine).
#include "ep_style.cc"
