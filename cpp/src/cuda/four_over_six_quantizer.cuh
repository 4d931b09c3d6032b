// Device-side 4-over-6 recipe (nvfp4kv/nvfp4_four_over_six.h) for one 16-value block held in registers:
// both candidate scales encoded as block_quantizer.cuh encodes the plain recipe, the choice read from
// error estimates with a proven bound (exact sums only for close calls). Shared by the append kernel
// and tests/gpu/codec_check.cu (check 6).
#pragma once

#include "block_quantizer.cuh"
#include "nvfp4kv/nvfp4_four_over_six.h"

namespace nvfp4kv {
namespace block_quantizer {

// Both candidates are encoded exactly as encode8 does (so their codes are codec::e2m1_code's); which
// one is kept is decided by the recipe's squared errors (exact_squared_error), read from cheaper
// estimates whenever those provably agree (encode8_four_over_six). s >= 2^120 (s_up = inf) falls back
// to the codec's own code.
constexpr int kSfShift = 8;
constexpr float kSfUp = 256.0f;              // 2^kSfShift
constexpr float kSfScaledFactor = 0x1p118f;  // 2^(126 - kSfShift)

// m of a scale byte (NaN for 0x7F, whose block is discarded).
__device__ __forceinline__ float scaled_scale_entry(uint8_t byte) { return scale_value(byte) * kSfScaledFactor; }

// The decision of most blocks comes from cheaper ESTIMATES of the two squared errors, each in its own
// candidate's units y = |x| r (r = RN(1 / RN(sf s)), the reciprocal the codes are computed from):
//   d'_k = RN(v_k - y_k)             (one FFMA: the code float's (bits << 22) = v 2^-126 times 2^126)
//   E'   = RN(d'_k d'_k + E')        (FMA), in element order,
// then C = RN(E' sf^2) (sf^2 exact) compares the candidates in units of s^2: 2 instructions per value and
// candidate on top of the y and the code the encoding computes anyway, instead of the recipe's 6.
// Error bound (u = 2^-24; per candidate xi_k = |x_k| / (sf s) exactly, e_k = v_k - xi_k, S' = sf^2 sum e_k^2
// = S / s^2 with S the recipe's exact real error, a' = a / s): y_k = xi_k (1 + eta), |eta| <= 3.0002 u,
// so |d'_k - e_k| <= u |e_k| + 3.0003 u xi_max; with sum |e_k| <= 4 sqrt(sum e_k^2) and 16 FMA roundings,
// |C - S'| <= u (19.002 S' + 24.004 a' sqrt(S') + 0.0002 a'^2). The recipe's E (one rounding for t, the
// difference, the square and each of 15 sums) is within u (20.01 S + 8.01 a sqrt(S)) of S (plus 2^-59 a^2
// from underflow for a in [2^-40, 2^58] and s in [2^-60, 2^60]), so with a' sqrt(S') <= (S' + a'^2) / 2 and
// S' <= C (1 + 31.1 u) + 12.02 u a'^2:
//   |C - E / s^2| <= u (55.1 C + 16.1 a'^2)   per candidate,
// valid when sf6 > 0 (sf4 >= sf6; sf = 0 has r = 0, whose y say nothing) and the bytes differ (both
// xi_max <= 9 then: no overflow; a'^2 >= 2^-14: no underflow that matters). So when
// |C6 - C4| > tau = u (64 (C6 + C4) + 48 a'^2) (computed with a few roundings; the margins cover them)
// its sign is the sign of E6 - E4; otherwise the block recomputes both sums exactly (rare: the
// candidates' errors then agree to ~1e-5 of the block's range). tests/gpu/codec_check.cu check 6
// compares the whole block result against codec::quantize_block_four_over_six.
template <bool kBF16, bool kSaturate>
__device__ __forceinline__ void encode8_four_over_six(const uint32_t* w, float r6, float r4, uint32_t& packed6,
                                                      uint32_t& packed4, float& e6, float& e4) {
  constexpr uint32_t kBias = codec::kCodeFloatZeroBits * 0x11111111u;
  uint32_t a6 = 0u - kBias, a4 = 0u - kBias;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float x[2];
    widen2<kBF16>(w[i], x[0], x[1]);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float y6 = fabsf(x[h] * r6), y4 = fabsf(x[h] * r4);
      float u6 = y6, u4 = y4;
      if constexpr (kSaturate) {
        u6 = fminf(u6, codec::kE2M1MaxValue);
        u4 = fminf(u4, codec::kE2M1MaxValue);
      }
      const uint32_t f6 = __float_as_uint(codec::e2m1_code_float(u6));
      const uint32_t f4 = __float_as_uint(codec::e2m1_code_float(u4));
      a6 += f6 << (8 * i + 4 * h);
      a4 += f4 << (8 * i + 4 * h);
      const float d6 = __fmaf_rn(__uint_as_float(f6 << 22), 0x1p126f, -y6);
      const float d4 = __fmaf_rn(__uint_as_float(f4 << 22), 0x1p126f, -y4);
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
__device__ __forceinline__ void encode16_four_over_six(const uint32_t* w, float r6, float r4, uint2& data6,
                                                       uint2& data4, float& e6, float& e4) {
  e6 = 0.0f;
  e4 = 0.0f;
  encode8_four_over_six<kBF16, kSaturate>(w, r6, r4, data6.x, data4.x, e6, e4);
  encode8_four_over_six<kBF16, kSaturate>(w + 4, r6, r4, data6.y, data4.y, e6, e4);
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

// One block of the 4-over-6 recipe: s, six_s = 6 s, four_s = 4 s; with kTable the block's reciprocal
// table (1 / (sf s) or 0 by byte), scaled-scale table (m by byte) and inverse6 / inverse4 =
// division_inverse(six_s) / division_inverse(four_s) (0: divide; kInverses: never 0, the caller checked);
// without, all computed here.
template <bool kBF16, bool kTable, bool kInverses = false>
__device__ __forceinline__ uint8_t quantize_block_four_over_six_fast(const uint32_t* w, float s, float six_s,
                                                                     float four_s, float inverse6, float inverse4,
                                                                     const float* reciprocal, const float* scaled,
                                                                     uint2& data) {
  const float s_up = s * kSfUp;  // finite: the caller checked four_over_six_fast_scale(s)
  const float absmax = block_abs_max<kBF16>(w);
  static_assert(kTable || !kInverses, "the inverses come with the tables");
  const uint8_t b6 = scale_byte(kInverses ? scale_quotient_hoisted(absmax, six_s, inverse6)
                                          : scale_quotient(absmax, six_s, kTable ? inverse6 : 0.0f));
  const uint8_t b4 = scale_byte(kInverses ? scale_quotient_hoisted(absmax, four_s, inverse4)
                                          : scale_quotient(absmax, four_s, kTable ? inverse4 : 0.0f));
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
  uint2 data6, data4;
  float e6, e4;
  // Rounding is monotone, so |x_j * r| <= RN(absmax * r); NaN compares false.
  const float top6 = absmax * r6;
  if (top6 < 7.0f && absmax * r4 < 7.0f) {
    encode16_four_over_six<kBF16, false>(w, r6, r4, data6, data4, e6, e4);
  } else {
    encode16_four_over_six<kBF16, true>(w, r6, r4, data6, data4, e6, e4);
  }
  if (codec::is_nan(absmax)) {
    data = make_uint2(0, 0);
    return codec::kE4M3NaN;
  }
  bool four = false;  // equal bytes: equal candidates, a tie keeps sf6
  if (b4 != b6) {
    const bool estimable = b6 != 0 && absmax >= 0x1p-40f && absmax <= 0x1p58f && s >= 0x1p-60f && s <= 0x1p60f;
    constexpr float u = 0x1p-24f;
    // sf = m 2^-118 exactly (a normal float: sf >= 2^-9), sf^2 exact (<= 8 significant bits).
    const float sf6 = m6 * 0x1p-118f, sf4 = m4 * 0x1p-118f;
    const float c6 = __fmul_rn(e6, __fmul_rn(sf6, sf6)), c4 = __fmul_rn(e4, __fmul_rn(sf4, sf4));
    const float a_over_s = __fmul_rn(top6, sf6);
    const float tau = __fmaf_rn(__fadd_rn(c6, c4), 64.0f * u, __fmul_rn(__fmul_rn(a_over_s, a_over_s), 48.0f * u));
    const float gap = __fsub_rn(c6, c4);
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
