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
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace nvfp4kv {
namespace programmatic_launch {

__device__ __forceinline__ void wait_for_previous_kernel() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// A launch's parameters are new memory to the SM's constant cache, so each 64-byte line of them that
// a thread first touches after wait_for_previous_kernel() is a miss on the critical path of a short
// kernel (decode: ~0.1-0.2 us per launch, docs/PERFORMANCE.md v9a). One thread of the CTA reads a word of
// every line before the wait instead (while the previous kernel still runs, under programmatic
// launch); the volatile shared-memory store keeps the reads and keeps them before the wait.
template <typename... Params>
__device__ __forceinline__ void warm_parameter_cache(const Params&... params) {
  constexpr int kWordsPerLine = 16;
  __shared__ uint32_t sink;
  if (threadIdx.x != 0) return;
  uint32_t x = 0;
  const auto read_lines = [&x](const auto& param) {
    const uint32_t* words = reinterpret_cast<const uint32_t*>(&param);
#pragma unroll
    for (int i = 0; i < int(sizeof(param) / 4); i += kWordsPerLine) x ^= words[i];
  };
  (read_lines(params), ...);
  asm volatile("st.volatile.shared.u32 [%0], %1;" ::"r"(uint32_t(__cvta_generic_to_shared(&sink))), "r"(x) : "memory");
}

__device__ __forceinline__ void allow_next_kernel() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Whether launches on the current device get the attribute: sm_90+ (looked up once per device) and
// not turned off by NVFP4KV_PDL=0.
inline bool enabled_on_current_device() {
  static const bool allowed = [] {
    const char* v = std::getenv("NVFP4KV_PDL");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
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

// kernel<<<grid, threads, shared_bytes, stream>>>(args...), with the PDL attribute when `programmatic`.
template <typename... Params, typename... Args>
cudaError_t launch_with_shared(void (*kernel)(Params...), dim3 grid, dim3 threads, size_t shared_bytes,
                               cudaStream_t stream, bool programmatic, const Args&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = threads;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = programmatic ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, args...);
}

// The same without dynamic shared memory.
template <typename... Params, typename... Args>
cudaError_t launch(void (*kernel)(Params...), dim3 grid, dim3 threads, cudaStream_t stream, bool programmatic,
                   const Args&... args) {
  return launch_with_shared(kernel, grid, threads, 0, stream, programmatic, args...);
}

}  // namespace programmatic_launch
}  // namespace nvfp4kv
