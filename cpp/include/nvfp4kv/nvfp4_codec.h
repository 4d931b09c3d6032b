// The NVFP4 block codec of SPEC section 2: torch-free, shared by the CPU and CUDA kernels.
//
// A block is 16 consecutive values of one head row. It is stored as
//   8 data bytes: byte k = code[2k] | code[2k+1] << 4   (E2M1 codes, low nibble = even element)
//   1 scale byte: float8_e4m3fn block scale
// and decodes as e2m1(code) * float(scale) * global_scale.
//
// Every operation here is a single IEEE fp32 operation rounded to nearest even, in the order the
// spec gives; there is no addition next to a product, so no compiler can contract a multiply-add.
// Build without fast-math (the build sets -ffp-contract=off and nvcc's IEEE defaults).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define NVFP4KV_HOST_DEVICE __host__ __device__ __forceinline__
#define NVFP4KV_UNROLL _Pragma("unroll")
#else
#define NVFP4KV_HOST_DEVICE inline
#define NVFP4KV_UNROLL
#endif

namespace nvfp4kv {
namespace codec {

constexpr int kBlockSize = 16;      // values per block scale
constexpr int kBlockBytes = 8;      // packed data bytes per block
constexpr uint8_t kE4M3Max = 0x7E;  // 448.0, the largest finite float8_e4m3fn
constexpr uint8_t kE4M3NaN = 0x7F;  // scale byte of a block holding a NaN (SPEC step 1)
constexpr float kE4M3MaxValue = 448.0f;
constexpr float kE2M1MaxValue = 6.0f;

NVFP4KV_HOST_DEVICE uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

NVFP4KV_HOST_DEVICE float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

NVFP4KV_HOST_DEVICE bool is_nan(float f) { return (float_bits(f) & 0x7FFFFFFFu) > 0x7F800000u; }

// Exact widening of bfloat16 bits: bf16 is the top half of an fp32.
NVFP4KV_HOST_DEVICE float bf16_bits_to_float(uint16_t h) { return bits_float(uint32_t(h) << 16); }

// Exact widening of IEEE binary16 bits (normals, subnormals, inf and NaN).
NVFP4KV_HOST_DEVICE float fp16_bits_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1Fu;
  const uint32_t mantissa = h & 0x3FFu;
  if (exponent == 0x1Fu) return bits_float(sign | 0x7F800000u | (mantissa << 13));
  if (exponent != 0) return bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
  // Subnormal or zero: mantissa * 2^-24, exact in fp32.
  const float magnitude = float(mantissa) * 5.9604644775390625e-8f;
  return bits_float(sign | float_bits(magnitude));
}

// Exact widening of 16-bit float bits, bfloat16 or IEEE binary16.
NVFP4KV_HOST_DEVICE float bits16_to_float(uint16_t h, bool bf16) {
  return bf16 ? bf16_bits_to_float(h) : fp16_bits_to_float(h);
}

// Round a non-negative fp32 (or +inf) to float8_e4m3fn: nearest even, subnormals kept,
// everything at or above 448 (including +inf) saturates to 448, and so does NaN (inf / inf, when a
// block holding an infinity meets a 6 s that overflows).
NVFP4KV_HOST_DEVICE uint8_t e4m3_from_nonnegative(float t) {
  if (!(t < kE4M3MaxValue)) return kE4M3Max;
  const uint32_t bits = float_bits(t);
  if (bits < 0x3C800000u) {
    // t < 2^-6: the subnormal grid of E4M3 is k * 2^-9 with k in 0..8; code k is k (0x08 = 2^-6).
    // t * 512 is exact; round it to the nearest even integer with integer arithmetic on its bits.
    const float scaled = t * 512.0f;  // < 8, exact
    const uint32_t s = float_bits(scaled);
    if (s < 0x3F000000u) return 0;            // scaled < 0.5 rounds to 0 (and 0.5 rounds to even 0)
    const int exponent = int(s >> 23) - 127;  // -1 .. 2
    const uint32_t significand = (s & 0x7FFFFFu) | 0x800000u;
    const int shift = 23 - exponent;  // bits below the integer point
    const uint32_t integer = significand >> shift;
    const uint32_t remainder = significand & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1);
    const bool round_up = remainder > half || (remainder == half && (integer & 1u));
    return uint8_t(integer + (round_up ? 1u : 0u));
  }
  // Normal: keep 3 mantissa bits, round to nearest even on the dropped 20 bits. A carry out of the
  // mantissa moves into the exponent, which is the right result. Rebias exponent 127 -> 7.
  const uint32_t rounded = (bits + 0x7FFFFu + ((bits >> 20) & 1u)) >> 20;
  return uint8_t(rounded - (120u << 3));
}

// Round any fp32 to float8_e4m3fn: nearest even, saturating to +-448 (so +-inf -> +-448), the sign
// kept (-0.0 -> 0x80), any NaN -> 0x7F (the MLA kpe bytes, SPEC section 4).
NVFP4KV_HOST_DEVICE uint8_t e4m3_from_float(float y) {
  if (is_nan(y)) return kE4M3NaN;
  const uint32_t bits = float_bits(y);
  return uint8_t(((bits >> 24) & 0x80u) | e4m3_from_nonnegative(bits_float(bits & 0x7FFFFFFFu)));
}

// Decode a float8_e4m3fn byte (sign included). 0x7F / 0xFF are NaN.
NVFP4KV_HOST_DEVICE float e4m3_to_float(uint8_t byte) {
  const uint32_t sign = uint32_t(byte & 0x80u) << 24;
  const uint32_t exponent = (byte >> 3) & 0xFu;
  const uint32_t mantissa = byte & 0x7u;
  if (exponent == 0xFu && mantissa == 0x7u) return bits_float(sign | 0x7FC00000u);
  if (exponent == 0) return bits_float(sign | float_bits(float(mantissa) * 0.001953125f));
  return bits_float(sign | ((exponent + 120u) << 23) | (mantissa << 20));
}

// a * b + c rounded once, for products a * b that are exact (b a power of two, a not tiny): one
// fused instruction on the GPU, the same value as the two host operations.
NVFP4KV_HOST_DEVICE float add_exact_product(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return a * b + c;
#endif
}

NVFP4KV_HOST_DEVICE float min_float(float a, float b) {
#if defined(__CUDA_ARCH__)
  return fminf(a, b);
#else
  return a < b ? a : b;
#endif
}

// The "code float" of E2M1 magnitude code k is 2^22 + k/2: fp32 spacing is 0.5 at 2^22, so its bits
// are kCodeFloatZeroBits + k.
constexpr uint32_t kCodeFloatZeroBits = 0x4A800000u;  // bits of 2^22

// E2M1 magnitude code (SPEC step 6: nearest, ties to even, saturating) of u in [0, 6], as a code
// float (u in (6, 7) also gives code 7, so callers may skip the clamp when u < 7 is known). Adding a constant of
// spacing g rounds to the grid of step g with ties to even in ONE IEEE addition, so with c0 = RNE(2u), c1 = RNE(u), c2
// = RNE(u/2) (the E2M1 grids of [0,2), [2,4), [4,8)):
//   a = 2^22 + c0/2,  b = 2^22 + (2 + c1)/2,  c = 2^22 + (4 + c2)/2      (even offsets keep ties even)
// and the code is min(c0, 2 + c1, 4 + c2): each candidate is the code on its own binade and no smaller
// than it elsewhere. Three FP additions and two minima instead of branches and integer rounding;
// equal to the direct definition for every fp32 u (checked exhaustively, tests/gpu/codec_check.cu).
NVFP4KV_HOST_DEVICE float e2m1_code_float(float u) {
  const float a = u + 4194304.0f;                           // u * 1 exact
  const float b = add_exact_product(u, 0.5f, 4194305.0f);   // 2^22 + 1 + RNE(u)/2
  const float c = add_exact_product(u, 0.25f, 4194306.0f);  // 2^22 + 2 + RNE(u/2)/2
  return min_float(a, min_float(b, c));
}

// E2M1 code of y (SPEC step 6): bit 3 = sign, bits 0-2 = magnitude, round half to even, saturating.
// The sign is taken from the unscaled input: it equals signbit(y) whenever y is not NaN (r > 0), and
// stays deterministic in the one case y can be NaN (0 * inf when r overflows). A NaN magnitude takes
// the spec's "otherwise" branch: 7.
NVFP4KV_HOST_DEVICE uint8_t e2m1_code(float y, float x) {
  const float magnitude = bits_float(float_bits(y) & 0x7FFFFFFFu);
  const float m = magnitude < kE2M1MaxValue ? magnitude : kE2M1MaxValue;  // saturate; NaN -> 6
  const uint32_t sign = (float_bits(x) >> 31) << 3;
  return uint8_t(sign | (float_bits(e2m1_code_float(m)) - kCodeFloatZeroBits));
}

// Value of an E2M1 code (bit 3 = sign).
NVFP4KV_HOST_DEVICE float e2m1_to_float(uint8_t code) {
  // Magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 as (code & 7) -> value without a table (device friendly).
  const uint32_t c = code & 7u;
  const float magnitude = c < 4u ? 0.5f * float(c) : float(2u << ((c - 4u) >> 1)) * ((c & 1u) ? 1.5f : 1.0f);
  return (code & 8u) ? -magnitude : magnitude;
}

// Block scale byte and reciprocal factor of one block given its absolute maximum a (not NaN).
// Steps 3-5: t = a / (target s) with target s rounded first; sf = E4M3(t); r = 1 / (float(sf) * s) or 0.
// target is 6 (the largest E2M1 value) in SPEC section 2; the 4-over-6 search also tries 4.
struct BlockScale {
  uint8_t byte;
  float reciprocal;
};

NVFP4KV_HOST_DEVICE BlockScale block_scale(float absmax, float global_scale, float target = kE2M1MaxValue) {
  const float target_s = target * global_scale;
  const float t = absmax / target_s;
  BlockScale result;
  result.byte = e4m3_from_nonnegative(t);
  const float sf = e4m3_to_float(result.byte);
  const float sf_s = sf * global_scale;
  result.reciprocal = (absmax == 0.0f || sf == 0.0f) ? 0.0f : 1.0f / sf_s;
  return result;
}

// Steps 1-2: true when the block holds a NaN; otherwise absmax = max_j |x[j]| (may be +inf).
NVFP4KV_HOST_DEVICE bool block_has_nan(const float (&x)[kBlockSize], float& absmax) {
  bool has_nan = false;
  absmax = 0.0f;
  NVFP4KV_UNROLL
  for (int j = 0; j < kBlockSize; ++j) {
    has_nan |= is_nan(x[j]);
    const float magnitude = bits_float(float_bits(x[j]) & 0x7FFFFFFFu);
    absmax = magnitude > absmax ? magnitude : absmax;
  }
  return has_nan;
}

// Steps 6-7: the 16 codes of x scaled by r, packed little-endian (byte k in bits 8k..8k+7, low nibble
// = even element).
NVFP4KV_HOST_DEVICE uint64_t encode_block(const float (&x)[kBlockSize], float reciprocal) {
  uint64_t packed = 0;
  NVFP4KV_UNROLL
  for (int j = 0; j < kBlockSize; ++j) packed |= uint64_t(e2m1_code(x[j] * reciprocal, x[j])) << (4 * j);
  return packed;
}

// Quantize one block of 16 fp32 values (SPEC section 2). Writes the 8 data bytes as one
// little-endian uint64 and returns the scale byte.
NVFP4KV_HOST_DEVICE uint8_t quantize_block(const float (&x)[kBlockSize], float global_scale, uint64_t& packed) {
  float absmax;
  if (block_has_nan(x, absmax)) {
    packed = 0;
    return kE4M3NaN;
  }
  const BlockScale scale = block_scale(absmax, global_scale);
  packed = encode_block(x, scale.reciprocal);
  return scale.byte;
}

// Dequantize one packed byte pair element: e2m1(code) * float(sf) * s, left to right.
NVFP4KV_HOST_DEVICE float dequantize_value(uint8_t code, float block_scale_value, float global_scale) {
  const float scaled = e2m1_to_float(code) * block_scale_value;
  return scaled * global_scale;
}

}  // namespace codec
}  // namespace nvfp4kv
