# Finds the installed PyTorch for building against its stable ABI only: its headers and
# libtorch_cpu.so, nothing else (no find_package(Torch), no CUDA build of torch needed).
# Defines the imported target nvfp4kv::torch_stable and fails clearly on a too-old torch.
find_package(Python3 REQUIRED COMPONENTS Interpreter)
execute_process(
  COMMAND "${Python3_EXECUTABLE}" -c
          "import os, torch; print(os.path.dirname(torch.__file__)); print(torch.__version__.split('+')[0])"
  OUTPUT_VARIABLE _torch_info
  RESULT_VARIABLE _torch_result
  OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _torch_result EQUAL 0)
  message(FATAL_ERROR "nvfp4kv: cannot import torch with ${Python3_EXECUTABLE}; install torch >= "
                      "${NVFP4KV_TORCH_MIN_VERSION} first (and build with --no-build-isolation)")
endif()
string(REPLACE "\n" ";" _torch_info "${_torch_info}")
list(GET _torch_info 0 NVFP4KV_TORCH_DIR)
list(GET _torch_info 1 NVFP4KV_TORCH_VERSION)
if(NVFP4KV_TORCH_VERSION VERSION_LESS NVFP4KV_TORCH_MIN_VERSION)
  message(FATAL_ERROR "nvfp4kv targets the PyTorch ${NVFP4KV_TORCH_MIN_VERSION} stable ABI, but the torch "
                      "found at ${NVFP4KV_TORCH_DIR} is ${NVFP4KV_TORCH_VERSION}")
endif()
find_library(NVFP4KV_TORCH_CPU_LIBRARY torch_cpu PATHS "${NVFP4KV_TORCH_DIR}/lib" NO_DEFAULT_PATH REQUIRED)
message(STATUS "nvfp4kv: torch ${NVFP4KV_TORCH_VERSION} at ${NVFP4KV_TORCH_DIR}")

add_library(nvfp4kv::torch_stable INTERFACE IMPORTED)
target_include_directories(nvfp4kv::torch_stable INTERFACE "${NVFP4KV_TORCH_DIR}/include")
target_link_libraries(nvfp4kv::torch_stable INTERFACE "${NVFP4KV_TORCH_CPU_LIBRARY}")
