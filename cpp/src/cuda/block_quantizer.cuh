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
#include "nvfp4kv/nvfp4_four_over_six.h"

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
    const __half2 r = __hmax2_nan(__habs2(*reinterpret_cast<const __half2*>(&x)),
                                  __habs2(*reinterpret_cast<const __half2*>(&y)));
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
__device__ __forceinline__ uint8_t scale_byte(float t) {
#if __CUDA_ARCH__ >= 890
  // The hardware conversion rounds to nearest even, keeps subnormals and saturates (+inf -> 448):
  // codec::e4m3_from_nonnegative bit for bit (tests/gpu/codec_check.cu checks every fp32).
  uint16_t pair;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(0.0f), "f"(t));
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

__device__ __forceinline__ float scale_quotient(float absmax, float six_s, float inverse) {
  if (inverse == 0.0f) return __fdiv_rn(absmax, six_s);
  const float q0 = __fmul_rn(absmax, inverse);
  const float residual = __fmaf_rn(-six_s, q0, absmax);
  return fminf(__fmaf_rn(residual, inverse, q0), 512.0f);
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

// ---------------------------------------------------------------------------------------------
// The optional 4-over-6 recipe (nvfp4_four_over_six.h) on the fast path. Both candidates are encoded
// exactly as encode8 does (so their codes are codec::e2m1_code's); which one is kept is decided by the
// recipe's squared errors (exact_squared_error), read from cheaper estimates whenever those provably
// agree (encode8_four_over_six). s >= 2^120 (s_up = inf) falls back to the codec's own code.
constexpr int kSfShift = 8;
constexpr float kSfUp = 256.0f;                     // 2^kSfShift
constexpr float kSfScaledFactor = 0x1p118f;  // 2^(126 - kSfShift)

// m of a scale byte (NaN for 0x7F, whose block is discarded).
__device__ __forceinline__ float scaled_scale_entry(uint8_t byte) { return scale_value(byte) * kSfScaledFactor; }

// The decision of most blocks comes from cheaper ESTIMATES of the two squared errors, in units scaled
// by g = 2^-c (c: the exponent of the block's absmax a, so the scaled absmax A = a g is in [1, 2)):
//   d'_k = RN(t_k (1 + w) - x_k g)  (one FMA: the code float's (bits << 22) = v 2^-126 times
//                                    W = RN(sf s 2^64) 2^(62 - c), so t_k (1 + w) = v sf s g, |w| <= u)
//   E'   = RN(d'_k d'_k + E')       (FMA), in element order,
// 3 instructions per value and candidate (+ 1 per value for x g) instead of the recipe's 6. Error bound
// (u = 2^-24; e_k = t_k - x_k exact, S = sum e_k^2; t_k >= 0 so t_k <= |e_k| + A): both the recipe's
// E (one rounding for t, the difference, the square and each of 15 sums) and E' (one for t (1 + w),
// the FMA difference and 16 FMA sums) are within u (20.01 S + 8.01 A sqrt(S)) of S g^2, hence with
// A sqrt(S) <= (S + A^2) / 2 and S <= E' (1 + 25 u) + 4.01 u A^2:
//   |E - E'| <= 48.01 u E' + 8.01 u A^2 <= 48.01 u E' + 32.04 u     (A < 2),
// plus at most 2^-59 from underflow in the scaled domain for a in [2^-40, 2^58] and s in [2^-60, 2^60]
// (outside those ranges, or when the two bytes are equal, the estimates are not used). So when
// |E'6 - E'4| > tau = u (64 (E'6 + E'4) + 128) (computed with two roundings; the margins cover them)
// its sign is the sign of E6 - E4; otherwise the block recomputes both sums exactly (rare: the
// candidates' errors then agree to ~1e-5 of the block's range). tests/gpu/codec_check.cu check 6
// compares the whole block result against codec::quantize_block_four_over_six.
template <bool kBF16, bool kSaturate>
__device__ __forceinline__ void encode8_four_over_six(const uint32_t* w, float r6, float w6, float r4, float w4,
                                                      float g, uint32_t& packed6, uint32_t& packed4, float& e6,
                                                      float& e4) {
  constexpr uint32_t kBias = codec::kCodeFloatZeroBits * 0x11111111u;
  uint32_t a6 = 0u - kBias, a4 = 0u - kBias;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float x[2];
    widen2<kBF16>(w[i], x[0], x[1]);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float u6 = fabsf(x[h] * r6), u4 = fabsf(x[h] * r4);
      if constexpr (kSaturate) {
        u6 = fminf(u6, codec::kE2M1MaxValue);
        u4 = fminf(u4, codec::kE2M1MaxValue);
      }
      const uint32_t f6 = __float_as_uint(codec::e2m1_code_float(u6));
      const uint32_t f4 = __float_as_uint(codec::e2m1_code_float(u4));
      a6 += f6 << (8 * i + 4 * h);
      a4 += f4 << (8 * i + 4 * h);
      const float scaled = __fmul_rn(fabsf(x[h]), g);
      const float d6 = __fmaf_rn(__uint_as_float(f6 << 22), w6, -scaled);
      const float d4 = __fmaf_rn(__uint_as_float(f4 << 22), w4, -scaled);
      e6 = __fmaf_rn(d6, d6, e6);
      e4 = __fmaf_rn(d4, d4, e4);
    }
  }
  const uint32_t x01 = prmt(w[0], w[1], 0xFBD9);
  const uint32_t x23 = prmt(w[2], w[3], 0xFBD9);
  const uint32_t even = prmt(x01, x23, 0x5410);
  const uint32_t odd = prmt(x01, x23, 0x7632);
  const uint32_t signs = ((even & 0x0F0F0F0Fu) | (odd & 0xF0F0F0F0u)) & 0x88888888u;
  packed6 = a6 | signs;
  packed4 = a4 | signs;
}

template <bool kBF16, bool kSaturate>
__device__ __forceinline__ void encode16_four_over_six(const uint32_t* w, float r6, float w6, float r4, float w4,
                                                       float g, uint2& data6, uint2& data4, float& e6, float& e4) {
  e6 = 0.0f;
  e4 = 0.0f;
  encode8_four_over_six<kBF16, kSaturate>(w, r6, w6, r4, w4, g, data6.x, data4.x, e6, e4);
  encode8_four_over_six<kBF16, kSaturate>(w + 4, r6, w6, r4, w4, g, data6.y, data4.y, e6, e4);
}

// The recipe's squared error of a block encoded as `data`: d = (e2m1(code) * float(sf)) * s - x, acc =
// acc + d * d, every operation a separately rounded __fmul_rn / __fsub_rn / __fadd_rn (never contracted),
// in element order 0..15.
//  * e2m1(code) * float(sf) is exact (2 x 4 significant bits), so its product with s is the single
//    rounding RN(v * sf * s) of the exact real v * sf * s. A magnitude code k's code float has the bits
//    0x4A800000 + k, so (k << 22) is the fp32 whose value is v(k) * 2^-126 (k = 0, 1 land on the
//    subnormals 0 and 2^-127: the E2M1 subnormals map exactly; --ftz=false). With
//    m = float(sf) * 2^(126 - kSfShift) (exact, < 2^128) and s_up = s * 2^kSfShift (exact while finite),
//    (k22 * m) = v * sf * 2^-kSfShift exactly (>= 2^-18, normal) and RN((k22 * m) * s_up) = RN(v * sf * s).
//  * The sign: the codec's dequantized value carries x's sign, so its d is sign(x) * (RN(v sf s) - |x|)
//    (RN is symmetric) and d * d is the same.
// Out of line (the rare path), its inputs by value so that the caller's words stay in registers.
template <bool kBF16>
__device__ __noinline__ float exact_squared_error(uint4 low, uint4 high, uint2 data, float m, float s_up) {
  const uint32_t w[8] = {low.x, low.y, low.z, low.w, high.x, high.y, high.z, high.w};
  float e = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    float x[2];
    widen2<kBF16>(w[i], x[0], x[1]);
    const uint32_t word = i < 4 ? data.x : data.y;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t k = (word >> (8 * (i % 4) + 4 * h)) & 7u;
      const float d = __fsub_rn(__fmul_rn(__fmul_rn(__uint_as_float(k << 22), m), s_up), fabsf(x[h]));
      e = __fadd_rn(e, __fmul_rn(d, d));
    }
  }
  return e;
}

// Whether quantize_block_four_over_six_fast handles global scale s (s * 2^kSfShift finite); otherwise
// (s >= 2^120, or s not a number, whose rows are not written) the codec's code does.
__device__ __forceinline__ bool four_over_six_fast_scale(float s) { return s * kSfUp <= 3.4028234663852886e38f; }

// One block of the 4-over-6 recipe: s, six_s = 6 s, four_s = 4 s, and the block's reciprocal table
// (1 / (sf s) or 0 by byte) and scaled-scale table (m by byte) when kTable.
template <bool kBF16, bool kTable>
__device__ __forceinline__ uint8_t quantize_block_four_over_six_fast(const uint32_t* w, float s, float six_s,
                                                                     float four_s, const float* reciprocal,
                                                                     const float* scaled, uint2& data) {
  const float s_up = s * kSfUp;  // finite: the caller checked four_over_six_fast_scale(s)
  const float absmax = block_abs_max<kBF16>(w);
  const uint8_t b6 = scale_byte(__fdiv_rn(absmax, six_s));
  const uint8_t b4 = scale_byte(__fdiv_rn(absmax, four_s));
  float r6, r4, m6, m4;
  if constexpr (kTable) {
    r6 = reciprocal[b6];
    r4 = reciprocal[b4];
    m6 = scaled[b6];
    m4 = scaled[b4];
  } else {
    r6 = reciprocal_entry(b6, s);
    r4 = reciprocal_entry(b4, s);
    m6 = scaled_scale_entry(b6);
    m4 = scaled_scale_entry(b4);
  }
  // The estimates' scaling (see encode8_four_over_six): g = 2^-c, W = RN(sf s 2^64) 2^(62 - c), with
  // m sf 2^-54 = sf s 2^64 (s 2^-54 exact for s >= 2^-72). The bit patterns are only meaningful for
  // the a and s of `estimable`; the other blocks ignore the estimates.
  const uint32_t exponent = __float_as_uint(absmax) >> 23;
  const float g = __uint_as_float((254u - exponent) << 23);
  const float lift = __uint_as_float((316u - exponent) << 23);
  const float s_low = s * 0x1p-54f;
  const float w6 = __fmul_rn(m6, s_low) * lift, w4 = __fmul_rn(m4, s_low) * lift;
  uint2 data6, data4;
  float e6, e4;
  // Rounding is monotone, so |x_j * r| <= RN(absmax * r); NaN compares false.
  if (absmax * r6 < 7.0f && absmax * r4 < 7.0f) {
    encode16_four_over_six<kBF16, false>(w, r6, w6, r4, w4, g, data6, data4, e6, e4);
  } else {
    encode16_four_over_six<kBF16, true>(w, r6, w6, r4, w4, g, data6, data4, e6, e4);
  }
  if (codec::is_nan(absmax)) {
    data = make_uint2(0, 0);
    return codec::kE4M3NaN;
  }
  bool four = false;  // equal bytes: equal candidates, a tie keeps sf6
  if (b4 != b6) {
    const bool estimable = absmax >= 0x1p-40f && absmax <= 0x1p58f && s >= 0x1p-60f && s <= 0x1p60f;
    constexpr float u = 0x1p-24f;
    const float tau = __fmaf_rn(__fadd_rn(e6, e4), 64.0f * u, 128.0f * u);
    const float gap = __fsub_rn(e6, e4);
    if (estimable && fabsf(gap) > tau) {
      four = gap > 0.0f;
    } else {
      const uint4 low = make_uint4(w[0], w[1], w[2], w[3]), high = make_uint4(w[4], w[5], w[6], w[7]);
      four = exact_squared_error<kBF16>(low, high, data4, m4, s_up) <
             exact_squared_error<kBF16>(low, high, data6, m6, s_up);
    }
  }
  data = four ? data4 : data6;
  return four ? b4 : b6;
}

// The optional 4-over-6 recipe (nvfp4_four_over_six.h) for one block: the codec's own code on the
// widened values (for the global scales four_over_six_fast_scale rejects).
template <bool kBF16>
__device__ __forceinline__ uint8_t quantize_block_four_over_six(uint4 lo, uint4 hi, float s, uint2& data) {
  const uint32_t w[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
  float x[codec::kBlockSize];
#pragma unroll
  for (int i = 0; i < 8; ++i) widen2<kBF16>(w[i], x[2 * i], x[2 * i + 1]);
  uint64_t packed;
  const uint8_t byte = codec::quantize_block_four_over_six(x, s, packed);
  data = make_uint2(uint32_t(packed), uint32_t(packed >> 32));
  return byte;
}

}  // namespace block_quantizer
}  // namespace nvfp4kv
