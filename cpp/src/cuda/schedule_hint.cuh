// A scheduling hint for the kernels' address arithmetic.
#pragma once

#include <cstdint>
#include <cstring>

namespace nvfp4kv {

// Makes each 32- or 64-bit value (pointer, offset, float) be computed where this is called instead of
// being sunk by the compiler to its first use: an empty volatile asm reads and rewrites each one. Used to get
// address arithmetic done before a wait (the programmatic wait, a load in flight) rather than after.
template <typename T>
__device__ __forceinline__ void compute_here_one(T& value) {
  static_assert(sizeof(T) == 8 || sizeof(T) == 4, "32- or 64-bit values");
  if constexpr (sizeof(T) == 8) {
    uint64_t bits;
    std::memcpy(&bits, &value, 8);
    asm volatile("" : "+l"(bits));
    std::memcpy(&value, &bits, 8);
  } else {
    uint32_t bits;
    std::memcpy(&bits, &value, 4);
    asm volatile("" : "+r"(bits));
    std::memcpy(&value, &bits, 4);
  }
}

template <typename... Values>
__device__ __forceinline__ void compute_here(Values&... values) {
  (compute_here_one(values), ...);
}

}  // namespace nvfp4kv
