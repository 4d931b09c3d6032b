// Named barriers (bar.sync / bar.arrive with immediate operands, so that a CTA reserves only the ids it
// uses; id 0 is __syncthreads'). The chain-warp kernels publish each row's target with an arrive on one
// side and a sync on the other: kThreads counts the threads of both sides.
#pragma once

#include <cstdint>

namespace nvfp4kv {

template <uint32_t kId, uint32_t kThreads>
__device__ __forceinline__ void named_barrier_sync() {
  asm volatile("bar.sync %0, %1;" ::"n"(kId), "n"(kThreads) : "memory");
}

template <uint32_t kId, uint32_t kThreads>
__device__ __forceinline__ void named_barrier_arrive() {
  asm volatile("bar.arrive %0, %1;" ::"n"(kId), "n"(kThreads) : "memory");
}

}  // namespace nvfp4kv
