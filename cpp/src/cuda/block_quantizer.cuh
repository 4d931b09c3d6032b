// Device-side NVFP4 quantization of 16-value blocks held in registers as 8 packed fp16/bf16 words
// (2 values each, the low half is the even element): SPEC section 2 with the codec's arithmetic
// (nvfp4kv/nvfp4_codec.h), arranged for throughput. Shared by the append kernel and the exhaustive
// device check tests/gpu/codec_check.cu.
//
// Cost on sm_90 (SASS), per value: the exact widening, x * r, three roundings that read |y| through
// operand modifiers (FADD, FFMA, FFMA), two minima and one shift-add into the packed word: about 8.5
// instructions, most of them on the FP32 pipe so that the half-rate ALU pipe is not the limit (a third
// minimum saturates |y| in the rare blocks where some |y| >= 7). Per block: |max| over packed half2
// words (7 + 3 instructions), the quotient a / (6 s) (3 operations with a reciprocal hoisted per global
// scale), the E4M3 rounding (one hardware conversion on sm_89+), the reciprocal (a shared-memory table
// lookup, or computed), and the signs of 16 values from 10 byte permutes / logic ops on the input words.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "nvfp4kv/nvfp4_codec.h"

namespace nvfp4kv {
namespace block_quantizer {

// prmt.b32 in its default mode: selector nibble bit 3 replicates the sign bit of the chosen byte.
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t selector) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(selector));
  return d;
}

// Lane-wise max(|x|, |y|) of two packed pairs; a NaN in either propagates. The sign of each result
// lane is unspecified (the sm_86+ instruction takes |x|, |y| by operand modifier and xors the signs).
template <bool kBF16>
__device__ __forceinline__ uint32_t max_abs2(uint32_t x, uint32_t y) {
  uint32_t d;
#if __CUDA_ARCH__ >= 860
  if constexpr (kBF16) {
    asm("max.NaN.xorsign.abs.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(x), "r"(y));
  } else {
    asm("max.NaN.xorsign.abs.f16x2 %0, %1, %2;" : "=r"(d) : "r"(x), "r"(y));
  }
#else
  if constexpr (kBF16) {
    const __nv_bfloat162 r = __hmax2_nan(__habs2(*reinterpret_cast<const __nv_bfloat162*>(&x)),
                                         __habs2(*reinterpret_cast<const __nv_bfloat162*>(&y)));
    d = *reinterpret_cast<const uint32_t*>(&r);
  } else {
    const __half2 r =
        __hmax2_nan(__habs2(*reinterpret_cast<const __half2*>(&x)), __habs2(*reinterpret_cast<const __half2*>(&y)));
    d = *reinterpret_cast<const uint32_t*>(&r);
  }
#endif
  return d;
}

// Exact widening of the two values of a packed word.
template <bool kBF16>
__device__ __forceinline__ void widen2(uint32_t w, float& lo, float& hi) {
  if constexpr (kBF16) {
    lo = __uint_as_float(w << 16);
    hi = __uint_as_float(w & 0xFFFF0000u);
  } else {
    const float2 pair = __half22float2(*reinterpret_cast<const __half2*>(&w));
    lo = pair.x;
    hi = pair.y;
  }
}

// SPEC step 2 and the NaN test of step 1: max |x| of a block, NaN when the block holds a NaN.
template <bool kBF16>
__device__ __forceinline__ float block_abs_max(const uint32_t* w) {
  uint32_t m = max_abs2<kBF16>(max_abs2<kBF16>(max_abs2<kBF16>(w[0], w[1]), max_abs2<kBF16>(w[2], w[3])),
                               max_abs2<kBF16>(max_abs2<kBF16>(w[4], w[5]), max_abs2<kBF16>(w[6], w[7])));
  m = max_abs2<kBF16>(m, prmt(m, 0, 0x1032));  // both lanes now hold the block's maximum
  float lo, hi;
  widen2<kBF16>(m, lo, hi);
  return fabsf(lo);
}

// SPEC step 4: the E4M3 scale byte of t = a / (6 s) >= 0 (or +inf), nearest even, saturating at 448.
// t is NaN only for a = inf when 6 s overflows to inf; it saturates too, as in the codec.
__device__ __forceinline__ uint8_t scale_byte(float t) {
#if __CUDA_ARCH__ >= 890
  // The hardware conversion rounds to nearest even, keeps subnormals and saturates (+inf -> 448):
  // codec::e4m3_from_nonnegative bit for bit (tests/gpu/codec_check.cu checks every fp32). It turns
  // NaN into the NaN byte, so fminf first (NaN -> 448; every other t converts as before).
  uint16_t pair;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(0.0f), "f"(fminf(t, codec::kE4M3MaxValue)));
  return uint8_t(pair);
#else
  return codec::e4m3_from_nonnegative(t);
#endif
}

// float(sf) of a scale byte (exact; 0x7F is NaN).
__device__ __forceinline__ float scale_value(uint8_t byte) {
#if __CUDA_ARCH__ >= 890
  uint32_t halves;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(halves) : "h"(uint16_t(byte)));
  return __half2float(__ushort_as_half(uint16_t(halves)));
#else
  return codec::e4m3_to_float(byte);
#endif
}

// SPEC step 5 as a table: reciprocal_entry(byte, s) = 1 / (float(sf) * s), or 0 for sf == 0. A kernel
// fills one 128-entry table per global scale in shared memory (every byte scale_byte can return,
// 0x7F being the NaN of a NaN block, whose codes are discarded) and looks r up per block.
__device__ __forceinline__ float reciprocal_entry(uint8_t byte, float s) {
  return byte == 0 ? 0.0f : __frcp_rn(scale_value(byte) * s);
}

constexpr int kReciprocalTableSize = 128;

// SPEC step 3's division t = a / (6 s) without a division per block. inverse = RN(1 / (6 s)) is
// computed once per global scale (division_inverse); per block q0 = RN(a inverse), the residual
// a - 6s q0 is exact in one FMA, and q0 + residual * inverse rounded once is RN(a / 6s) (Markstein's
// theorem: inverse correctly rounded, q0 within one ulp). Every intermediate stays normal for
// 6 s in [2^-60, 2^60] whenever the quotient can reach a nonzero scale byte (t >= 2^-12 needs
// a >= 2^-72); smaller quotients stay far below 2^-10, which rounds to byte 0 either way. a = inf or
// a quotient beyond fp32 gives inf or NaN, which the minimum maps to 512: byte 448, as inf gives.
// division_inverse returns 0 outside that range and block_scale divides then. tests/gpu/codec_check.cu
// compares both against __fdiv_rn for every non-negative fp32 a and hundreds of scales.
__device__ __forceinline__ float division_inverse(float six_s) {
  return six_s >= 0x1p-60f && six_s <= 0x1p60f ? __frcp_rn(six_s) : 0.0f;
}

// RN(a / d) for a >= 0 with inverse = division_inverse(d) != 0; inf or NaN where the quotient overflows.
__device__ __forceinline__ float hoisted_quotient(float a, float d, float inverse) {
  const float q0 = __fmul_rn(a, inverse);
  const float residual = __fmaf_rn(-d, q0, a);
  return __fmaf_rn(residual, inverse, q0);
}

// The quotient with an inverse known to be division_inverse's nonzero result (no division fallback).
__device__ __forceinline__ float scale_quotient_hoisted(float absmax, float six_s, float inverse) {
  return fminf(hoisted_quotient(absmax, six_s, inverse), 512.0f);
}

__device__ __forceinline__ float scale_quotient(float absmax, float six_s, float inverse) {
  if (inverse == 0.0f) return __fdiv_rn(absmax, six_s);
  return scale_quotient_hoisted(absmax, six_s, inverse);
}

// SPEC section 4's E4M3(x / s): the quotient |x| / s through the hoisted reciprocal (scale_quotient:
// the IEEE quotient; inverse = division_inverse(s), 0 divides), rounded like a scale byte (saturating at
// 448, so inf too), the sign of x (-0.0 -> 0x80), NaN -> 0x7F.
__device__ __forceinline__ uint32_t quotient_byte(float x, float s, float inverse) {
  if (codec::is_nan(x)) return codec::kE4M3NaN;
  const uint32_t sign = (__float_as_uint(x) >> 24) & 0x80u;
  return sign | scale_byte(scale_quotient(fabsf(x), s, inverse));
}

// quotient_byte of two values as two bytes (x0 low), one hardware conversion for both on sm_89+.
__device__ __forceinline__ uint32_t quotient_bytes2(float x0, float x1, float s, float inverse) {
#if __CUDA_ARCH__ >= 890
  float t0, t1;  // scale_quotient of both, with one test of the inverse (the minimum below saturates)
  if (inverse != 0.0f) {
    t0 = hoisted_quotient(fabsf(x0), s, inverse);
    t1 = hoisted_quotient(fabsf(x1), s, inverse);
  } else {
    t0 = __fdiv_rn(fabsf(x0), s);
    t1 = __fdiv_rn(fabsf(x1), s);
  }
  t0 = fminf(t0, codec::kE4M3MaxValue);
  t1 = fminf(t1, codec::kE4M3MaxValue);
  uint16_t pair;  // the first operand goes to the high byte
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(t1), "f"(t0));
  uint32_t bytes = pair | ((__float_as_uint(x0) >> 24) & 0x80u) | ((__float_as_uint(x1) >> 16) & 0x8000u);
  if (codec::is_nan(x0)) bytes = (bytes & 0xFF00u) | codec::kE4M3NaN;
  if (codec::is_nan(x1)) bytes = (bytes & 0x00FFu) | uint32_t(codec::kE4M3NaN) << 8;
  return bytes;
#else
  return quotient_byte(x0, s, inverse) | quotient_byte(x1, s, inverse) << 8;
#endif
}

// quotient_bytes2 of the two 16-bit floats (bf16 or fp16) of `word`, low half first, for a word without a NaN and a
// nonzero inverse: the magnitudes' quotients (an overflowed one is inf or NaN, which the minimum saturates), one
// conversion, and the signs moved from bits 15 / 31 to bits 7 / 15 by one byte permute (-0.0 -> 0x80). About 14
// instructions per word on sm_90 against quotient_bytes2's 27 (its NaN patch and division fallback).
template <bool kBF16>
__device__ __forceinline__ uint32_t nan_free_quotient_bytes2(uint32_t word, float s, float inverse) {
#if __CUDA_ARCH__ >= 890
  const float t0 =
      fminf(hoisted_quotient(fabsf(codec::bits16_to_float(uint16_t(word), kBF16)), s, inverse), codec::kE4M3MaxValue);
  const float t1 = fminf(hoisted_quotient(fabsf(codec::bits16_to_float(uint16_t(word >> 16), kBF16)), s, inverse),
                         codec::kE4M3MaxValue);
  uint16_t pair;  // the first operand goes to the high byte
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(t1), "f"(t0));
  return pair | (prmt(word, 0u, 0x4431u) & 0x8080u);  // bytes 1 and 3 of the word: its halves' sign bits
#else
  return quotient_bytes2(codec::bits16_to_float(uint16_t(word), kBF16),
                         codec::bits16_to_float(uint16_t(word >> 16), kBF16), s, inverse);
#endif
}

struct Scale {
  float r;       // 1 / (sf * s), or 0 (SPEC step 5)
  uint8_t byte;  // E4M3 scale byte
  bool nan;      // the block holds a NaN (SPEC step 1)
  bool small;    // every |x * r| < 7: the codes need no saturation (see encode8)
};

// SPEC steps 3-5 for a block with absolute maximum `absmax` and global scale s (six_s = 6 * s,
// inverse = division_inverse(six_s)), with the reciprocal from the table of s (kTable) or computed here.
template <bool kTable>
__device__ __forceinline__ Scale block_scale(float absmax, float s, float six_s, float inverse,
                                             const float* reciprocal) {
  Scale scale;
  scale.byte = scale_byte(scale_quotient(absmax, six_s, inverse));
  // sf == 0 (also a == 0, which gives t == 0) -> r = 0.
  if constexpr (kTable) {
    scale.r = reciprocal[scale.byte];
  } else {
    scale.r = reciprocal_entry(scale.byte, s);
  }
  scale.nan = codec::is_nan(absmax);
  // Rounding is monotone, so |x_j * r| <= RN(absmax * r); NaN compares false.
  scale.small = absmax * scale.r < 7.0f;
  return scale;
}

// SPEC steps 6-7 for 8 values (4 words) as 4 packed bytes, low nibble = even element.
// The magnitude code comes from codec::e2m1_code_float(|y|), whose bits are kCodeFloatZeroBits + code:
// sum_j bits_j << 4j minus the constant sum_j kCodeFloatZeroBits << 4j (mod 2^32) is the packed word,
// with no masking. e2m1_code_float needs |y| <= 6 only for |y| >= 7 (it returns 7 on (6, 7)), so
// kSaturate = false skips the clamp when the block's `small` holds; |y| is then an operand modifier.
// The sign bits (bit 3 of each code) are the inputs' sign bits, gathered by byte permutes that
// replicate the sign of each value's high byte (codec::e2m1_code takes the sign from x too).
template <bool kBF16, bool kSaturate>
__device__ __forceinline__ uint32_t encode8(const uint32_t* w, float r) {
  constexpr uint32_t kBias = codec::kCodeFloatZeroBits * 0x11111111u;  // sum over j < 8 of bits << 4j
  uint32_t packed = 0u - kBias;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float lo, hi;
    widen2<kBF16>(w[i], lo, hi);
    float u_lo = fabsf(lo * r), u_hi = fabsf(hi * r);
    if constexpr (kSaturate) {
      u_lo = fminf(u_lo, codec::kE2M1MaxValue);  // NaN -> 6 (code 7), as codec::e2m1_code
      u_hi = fminf(u_hi, codec::kE2M1MaxValue);
    }
    packed += __float_as_uint(codec::e2m1_code_float(u_lo)) << (8 * i);
    packed += __float_as_uint(codec::e2m1_code_float(u_hi)) << (8 * i + 4);
  }
  // x01 = [sign(v0), sign(v2), sign(v1), sign(v3)] as 0x00/0xFF bytes (v_k = value k), x23 likewise.
  const uint32_t x01 = prmt(w[0], w[1], 0xFBD9);
  const uint32_t x23 = prmt(w[2], w[3], 0xFBD9);
  const uint32_t even = prmt(x01, x23, 0x5410);  // signs of values 0, 2, 4, 6 -> bytes 0..3
  const uint32_t odd = prmt(x01, x23, 0x7632);   // signs of values 1, 3, 5, 7
  const uint32_t signs = (even & 0x0F0F0F0Fu) | (odd & 0xF0F0F0F0u);
  return packed | (signs & 0x88888888u);
}

template <bool kBF16, bool kSaturate>
__device__ __forceinline__ uint2 encode16(const uint32_t* w, float r) {
  return make_uint2(encode8<kBF16, kSaturate>(w, r), encode8<kBF16, kSaturate>(w + 4, r));
}

// SPEC section 2 for kN blocks (words w[8 * kN]); block i uses global scale s[i], six_s[i] = 6 * s[i],
// inverse[i] = division_inverse(six_s[i]) (0: divide) and, with kTables, the reciprocal table
// reciprocal[i]. Writes the 8 data bytes of each block to data[i] (byte k in bits 8k..8k+7) and its
// scale byte to sf[i].
template <bool kBF16, int kN, bool kTables>
__device__ __forceinline__ void quantize_blocks(const uint32_t* w, const float* s, const float* six_s,
                                                const float* inverse, const float* const* reciprocal, uint2* data,
                                                uint8_t* sf) {
  Scale scale[kN];
  bool small = true;
#pragma unroll
  for (int i = 0; i < kN; ++i) {
    scale[i] = block_scale<kTables>(block_abs_max<kBF16>(w + 8 * i), s[i], six_s[i], inverse[i], reciprocal[i]);
    small = small && scale[i].small;
  }
  if (small) {
#pragma unroll
    for (int i = 0; i < kN; ++i) data[i] = encode16<kBF16, false>(w + 8 * i, scale[i].r);
  } else {
#pragma unroll
    for (int i = 0; i < kN; ++i) data[i] = encode16<kBF16, true>(w + 8 * i, scale[i].r);
  }
#pragma unroll
  for (int i = 0; i < kN; ++i) {
    sf[i] = scale[i].nan ? codec::kE4M3NaN : scale[i].byte;
    if (scale[i].nan) data[i] = make_uint2(0, 0);
  }
}

}  // namespace block_quantizer
}  // namespace nvfp4kv
