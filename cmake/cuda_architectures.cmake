# The one place the CUDA targets are chosen: real code for every architecture we promise, plus PTX
# of the oldest so newer GPUs can JIT it. The runtime is linked statically (no libcudart dependency).
set(NVFP4KV_CUDA_ARCHITECTURES "80-real;86-real;89-real;90-real;100-real;120-real;80-virtual"
    CACHE STRING "CUDA architectures of the fat binary")
set(CMAKE_CUDA_ARCHITECTURES "${NVFP4KV_CUDA_ARCHITECTURES}")
set(CMAKE_CUDA_RUNTIME_LIBRARY Static)
set(CMAKE_CUDA_STANDARD 17)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)

# What each cubin carries: line tables for the profilers (ncu source view; the sm_90 cubin of the K/V append
# kernel is 4x larger with them, its SASS identical), and compression of the cubins too, not only of the PTX
# (the driver decompresses them when it loads the module). docs/WHEEL.md has the sizes.
option(NVFP4KV_CUDA_LINEINFO "Line tables in the cubins (-lineinfo)" ON)
option(NVFP4KV_COMPRESS_FATBIN "Compress every image of the fat binary, cubins included" OFF)
set(NVFP4KV_CUDA_FATBIN_OPTIONS "")
if(NVFP4KV_CUDA_LINEINFO)
  list(APPEND NVFP4KV_CUDA_FATBIN_OPTIONS -lineinfo)
endif()
if(NVFP4KV_COMPRESS_FATBIN)
  list(APPEND NVFP4KV_CUDA_FATBIN_OPTIONS -Xfatbin=-compress-all)
endif()
