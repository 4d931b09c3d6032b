// C entry points for tests and tools, found with dlsym / ctypes (not part of the op API).
#include <cstring>

#include "kernel_mode.h"

#ifndef NVFP4KV_CUDA_ARCHITECTURES
#error "CMake defines NVFP4KV_CUDA_ARCHITECTURES (cmake/cuda_architectures.cmake)"
#endif

extern "C" {

// The CUDA architectures of this build's fat binary, as cmake/cuda_architectures.cmake lists them
// ("80-real 86-real ... 80-virtual").
__attribute__((visibility("default"))) const char* nvfp4kv_cuda_architectures() { return NVFP4KV_CUDA_ARCHITECTURES; }

// Test hook: force every vector-aligned append onto one kernel mode ("pair", "split", "oneshot") or
// back to the automatic choice ("auto"). Returns 0, or -1 for an unknown mode (nothing changed).
__attribute__((visibility("default"))) int nvfp4kv_test_force_kernel_mode(const char* mode) {
  using namespace nvfp4kv::kernel_mode;
  int value;
  if (std::strcmp(mode, "auto") == 0) value = kAuto;
  else if (std::strcmp(mode, "pair") == 0) value = kForcePair;
  else if (std::strcmp(mode, "split") == 0) value = kForceSplit;
  else if (std::strcmp(mode, "oneshot") == 0) value = kForceOneShot;
  else return -1;
  forced_storage().store(value, std::memory_order_relaxed);
  return 0;
}

}  // extern "C"
