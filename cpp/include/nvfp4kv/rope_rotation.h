// Rotary embedding of one value pair and the roundings around it (docs/SPEC.md section 5), torch-free and
// shared by the CPU and CUDA kernels of the fused RoPE append: cos/sin widened exactly to fp32, each product
// and each sum rounded to fp32 (no fused multiply-add: the library is built with -ffp-contract=off and
// --fmad=false), the result rounded to the input's 16-bit type to nearest even.
#pragma once

#include <cstdint>

#include "nvfp4kv/nvfp4_codec.h"

namespace nvfp4kv {
namespace rope {

// A rotated value that is NaN is written as this quiet NaN whatever its fp32 sign and payload (CPU and GPU
// arithmetic produce different NaN bits), so that both devices write the same bytes.
constexpr uint16_t kBF16NaN = 0x7FC0;
constexpr uint16_t kFP16NaN = 0x7E00;

// float -> bfloat16 bits, round to nearest even (overflow -> inf).
NVFP4KV_HOST_DEVICE uint16_t bf16_bits_from_float(float f) {
  if (codec::is_nan(f)) return kBF16NaN;
  const uint32_t u = codec::float_bits(f);
  return uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// float -> float16 bits, round to nearest even (|f| >= 65520 -> inf), subnormals kept.
NVFP4KV_HOST_DEVICE uint16_t fp16_bits_from_float(float f) {
  const uint32_t u = codec::float_bits(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return kFP16NaN;
  if (a >= 0x477FF000u) return sign | 0x7C00u;  // 65520 and above round to inf
  if (a >= 0x38800000u) {                       // normal: rebias the exponent (127 -> 15), round 23 -> 10 bits
    const uint32_t r = a - 0x38000000u;
    return sign | uint16_t((r + 0xFFFu + ((r >> 13) & 1u)) >> 13);
  }
  // Subnormal (units of 2^-24): |f| * 2^24 is exact; adding 2^23 rounds it to an integer, to nearest even.
  // 1024 units is the smallest normal's encoding, so the carry needs no special case.
  const float units = codec::bits_float(a) * 16777216.0f;
#if defined(__CUDA_ARCH__)
  const float biased = __fadd_rn(units, 8388608.0f);
#else
  const float biased = units + 8388608.0f;
#endif
  return sign | uint16_t(codec::float_bits(biased) - 0x4B000000u);
}

NVFP4KV_HOST_DEVICE uint16_t bits_from_float(float f, bool bf16) {
  return bf16 ? bf16_bits_from_float(f) : fp16_bits_from_float(f);
}

// The element type of a cos/sin table (fp16 and bf16 widen to fp32 exactly).
enum class TableType : uint8_t { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

// Element j of a table row as stored (fp32 bits, or fp16 / bf16 bits in the low half), and its value: a kernel
// can keep the bits while the load is in flight and widen them when it needs the value.
NVFP4KV_HOST_DEVICE uint32_t table_bits(const void* row, int64_t j, TableType type) {
  if (type == TableType::kFloat32) return static_cast<const uint32_t*>(row)[j];
  return static_cast<const uint16_t*>(row)[j];
}

NVFP4KV_HOST_DEVICE float table_value_of_bits(uint32_t bits, TableType type) {
  switch (type) {
    case TableType::kFloat16: return codec::fp16_bits_to_float(uint16_t(bits));
    case TableType::kBFloat16: return codec::bf16_bits_to_float(uint16_t(bits));
    default: return codec::bits_float(bits);
  }
}

NVFP4KV_HOST_DEVICE float table_value(const void* row, int64_t j, TableType type) {
  return table_value_of_bits(table_bits(row, j, type), type);
}

// One pair (x at dim a, y at dim b) rotated by (c, s): a' = x c - y s, b' = y c + x s, each step rounded.
struct Pair {
  float a;
  float b;
};

NVFP4KV_HOST_DEVICE Pair rotate(float x, float y, float c, float s) {
#if defined(__CUDA_ARCH__)
  return {__fsub_rn(__fmul_rn(x, c), __fmul_rn(y, s)), __fadd_rn(__fmul_rn(y, c), __fmul_rn(x, s))};
#else
  const float xc = x * c, ys = y * s, yc = y * c, xs = x * s;
  return {xc - ys, yc + xs};
#endif
}

// Dim d < rotary_dim of a head: its pair index j (the table column of its cos; sin at m + j, m = rotary_dim / 2),
// and whether d is the pair's first member (NeoX: (j, j + m); GPT-J: (2j, 2j + 1)).
NVFP4KV_HOST_DEVICE int64_t pair_index(int64_t d, int64_t half, bool neox) {
  return neox ? (d < half ? d : d - half) : d >> 1;
}
NVFP4KV_HOST_DEVICE bool first_of_pair(int64_t d, int64_t half, bool neox) { return neox ? d < half : (d & 1) == 0; }
// The dim of d's partner in its pair.
NVFP4KV_HOST_DEVICE int64_t partner_dim(int64_t d, int64_t half, bool neox) {
  return neox ? (d < half ? d + half : d - half) : d ^ 1;
}

// The rotated value of dim d (< rotary_dim) given its own value v, its partner's value w and the pair's (c, s).
NVFP4KV_HOST_DEVICE float rotated_value(bool first, float v, float w, float c, float s) {
  return first ? rotate(v, w, c, s).a : rotate(w, v, c, s).b;
}

}  // namespace rope
}  // namespace nvfp4kv
