// Programmatic dependent launch (PDL, sm_90+) for the append kernels.
//
// A kernel launched with the programmatic-stream-serialization attribute may start while the previous
// kernel of its stream is still running. Contract kept by every kernel that uses this header:
//   * wait_for_previous_kernel() runs before the kernel's first global memory access, so everything
//     written by earlier work of the stream (keys, values, indices, caches, device scales) is visible;
//   * allow_next_kernel() lets the next programmatic kernel of the stream start early; that kernel still
//     waits for this one's completion before it reads anything.
// Results are therefore the same as with plain stream order; what is saved is the launch gap (about
// 0.4 us per decode launch on an H200). Both instructions are no-ops when the launch was not
// programmatic, and compile to nothing below sm_90. NVFP4KV_PDL=0 turns the attribute off (a tuning aid).
#pragma once

#include <cuda_runtime.h>

#include <atomic>

#include "append_tuning.h"

namespace nvfp4kv {
namespace programmatic_launch {

__device__ __forceinline__ void wait_for_previous_kernel() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void allow_next_kernel() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Whether launches on the current device get the attribute: sm_90+ (looked up once per device) and
// not turned off by NVFP4KV_PDL=0.
inline bool enabled_on_current_device() {
  static const bool allowed = append_tuning::on_unless_zero("NVFP4KV_PDL");
  if (!allowed) return false;
  constexpr int kMaxDevices = 64;
  static std::atomic<int> known[kMaxDevices];  // 0: not looked up yet; 1: no; 2: yes
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevices) return false;
  int state = known[device].load(std::memory_order_relaxed);
  if (state == 0) {
    int major = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    state = major >= 9 ? 2 : 1;
    known[device].store(state, std::memory_order_relaxed);
  }
  return state == 2;
}

// kernel<<<grid, threads, 0, stream>>>(args...), with the PDL attribute when `programmatic`.
template <typename... Params, typename... Args>
cudaError_t launch(void (*kernel)(Params...), dim3 grid, dim3 threads, cudaStream_t stream, bool programmatic,
                   const Args&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = threads;
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = programmatic ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, args...);
}

}  // namespace programmatic_launch
}  // namespace nvfp4kv
