# The one place the CUDA targets are chosen: real code for every architecture we promise, plus PTX
# of the oldest so newer GPUs can JIT it. The runtime is linked statically (no libcudart dependency).
set(NVFP4KV_CUDA_ARCHITECTURES "80-real;86-real;89-real;90-real;100-real;120-real;80-virtual"
    CACHE STRING "CUDA architectures of the fat binary")
set(CMAKE_CUDA_ARCHITECTURES "${NVFP4KV_CUDA_ARCHITECTURES}")
set(CMAKE_CUDA_RUNTIME_LIBRARY Static)
set(CMAKE_CUDA_STANDARD 17)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
