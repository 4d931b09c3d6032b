// The "4-over-6" block-scale search (an optional recipe on top of SPEC section 2): torch-free, shared
// by the CPU and CUDA kernels. The stored format is unchanged (one E4M3 scale byte per 16 values), so
// every reader decodes it as before.
//
// For each block, besides the standard scale sf6 = E4M3(a / (6 s)), form sf4 = E4M3(a / (4 s)) (4 s
// rounded first, same rounding and saturation), encode the block with each exactly as SPEC steps 5-7
// do, and keep sf4 only when its squared error is strictly smaller; ties and all-zero blocks keep sf6.
// Squared error, bit-exact on every device: d = (e2m1(code) * float(sf)) * s - x with every product and
// difference rounded to fp32, acc = acc + d * d in element order 0..15, no fused multiply-add.
#pragma once

#include "nvfp4kv/nvfp4_codec.h"

namespace nvfp4kv {
namespace codec {

constexpr float kFourOverSixTarget = 4.0f;

// A product no compiler may fuse with a following addition: the device intrinsic is never contracted;
// on the host the rounded product goes through a volatile (host compilers may contract a * b + c when
// the target has FMA, e.g. -march=native, whatever the project's flags).
NVFP4KV_HOST_DEVICE float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  const volatile float product = a * b;
  return product;
#endif
}

NVFP4KV_HOST_DEVICE float sub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

NVFP4KV_HOST_DEVICE float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

NVFP4KV_HOST_DEVICE float block_squared_error(const float (&x)[kBlockSize], uint64_t packed, uint8_t scale_byte,
                                              float global_scale) {
  const float sf = e4m3_to_float(scale_byte);
  float acc = 0.0f;
  NVFP4KV_UNROLL
  for (int j = 0; j < kBlockSize; ++j) {
    const float value = mul_rn(mul_rn(e2m1_to_float(uint8_t(packed >> (4 * j)) & 0xF), sf), global_scale);
    const float d = sub_rn(value, x[j]);
    acc = add_rn(acc, mul_rn(d, d));
  }
  return acc;
}

// quantize_block with the 4-over-6 search. Returns the scale byte, writes the 8 data bytes.
NVFP4KV_HOST_DEVICE uint8_t quantize_block_four_over_six(const float (&x)[kBlockSize], float global_scale,
                                                         uint64_t& packed) {
  float absmax;
  if (block_has_nan(x, absmax)) {
    packed = 0;
    return kE4M3NaN;
  }
  const BlockScale six = block_scale(absmax, global_scale);
  packed = encode_block(x, six.reciprocal);
  if (absmax == 0.0f) return six.byte;
  const BlockScale four = block_scale(absmax, global_scale, kFourOverSixTarget);
  const uint64_t packed_four = encode_block(x, four.reciprocal);
  if (block_squared_error(x, packed_four, four.byte, global_scale) <
      block_squared_error(x, packed, six.byte, global_scale)) {
    packed = packed_four;
    return four.byte;
  }
  return six.byte;
}

}  // namespace codec
}  // namespace nvfp4kv
