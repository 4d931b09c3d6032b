// Unit tests of the torch-free NVFP4 codec (cpp/include/nvfp4kv/nvfp4_codec.h, SPEC section 2) and of the fused
// RoPE append's 16-bit rounding (rope_rotation.h),
// against brute-force references written here: nearest representable value, ties to the even code.
#include <gtest/gtest.h>
#include <nvfp4kv/nvfp4_codec.h>
#include <nvfp4kv/rope_rotation.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {

using namespace nvfp4kv::codec;

constexpr float kE2M1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
const float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();

// E2M1 magnitude code of |y| by brute force: nearest table value, a tie goes to the even code,
// beyond 6 saturates.
uint8_t reference_e2m1_magnitude(float magnitude) {
  if (!(magnitude < 6.0f)) return 7;
  int best = 0;
  for (int c = 1; c < 8; ++c) {
    const double d = std::fabs(double(magnitude) - kE2M1[c]), best_d = std::fabs(double(magnitude) - kE2M1[best]);
    if (d < best_d || (d == best_d && c % 2 == 0)) best = c;
  }
  return uint8_t(best);
}

// float8_e4m3fn value of a non-NaN byte, from its definition (bias 7, subnormals m * 2^-9).
double reference_e4m3_value(uint8_t byte) {
  const int exponent = (byte >> 3) & 0xF, mantissa = byte & 7;
  const double magnitude = exponent == 0 ? std::ldexp(mantissa, -9) : std::ldexp(1.0 + mantissa / 8.0, exponent - 7);
  return (byte & 0x80) ? -magnitude : magnitude;
}

// E4M3 byte of t >= 0 by brute force: nearest of the 127 finite non-negative values, ties to the
// even byte, at or above 448 saturating.
uint8_t reference_e4m3(float t) {
  if (!(t < 448.0f)) return 0x7E;
  int best = 0;
  for (int b = 1; b <= 0x7E; ++b) {
    const double d = std::fabs(t - reference_e4m3_value(uint8_t(b))),
                 best_d = std::fabs(t - reference_e4m3_value(uint8_t(best)));
    if (d < best_d || (d == best_d && b % 2 == 0)) best = b;
  }
  return uint8_t(best);
}

float next_up(float x) { return std::nextafter(x, kInf); }
float next_down(float x) { return std::nextafter(x, -kInf); }

TEST(E2M1, EveryCodeDecodesToItsValueAndEncodesBack) {
  for (uint8_t code = 0; code < 16; ++code) {
    const float value = e2m1_to_float(code);
    EXPECT_EQ(value, (code & 8) ? -kE2M1[code & 7] : kE2M1[code & 7]) << int(code);
    EXPECT_EQ(std::signbit(value), bool(code & 8)) << int(code);  // code 8 is -0.0
    EXPECT_EQ(e2m1_code(value, value), code) << int(code);
  }
}

TEST(E2M1, EveryTieRoundsHalfToEven) {
  // The midpoint between magnitude codes low and low + 1 goes to the even one of the two; one fp32
  // ulp below it rounds down to low, one ulp above rounds up to low + 1.
  for (uint8_t low = 0; low < 7; ++low) {
    const float tie = (kE2M1[low] + kE2M1[low + 1]) / 2;  // 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5
    const uint8_t even = low % 2 == 0 ? low : uint8_t(low + 1);
    EXPECT_EQ(e2m1_code(tie, tie), even) << tie;
    EXPECT_EQ(e2m1_code(-tie, -tie), even | 8) << -tie;
    EXPECT_EQ(e2m1_code(next_down(tie), 1.0f), low) << tie;
    EXPECT_EQ(e2m1_code(next_up(tie), 1.0f), low + 1) << tie;
  }
}

TEST(E2M1, SweepMatchesTheBruteForceReference) {
  for (float y = 0.0f; y < 8.0f; y += 1.0f / 4096) {
    for (float v : {y, next_up(y), next_down(y)}) {
      if (v < 0.0f) continue;
      ASSERT_EQ(e2m1_code(v, v), reference_e2m1_magnitude(v)) << v;
      ASSERT_EQ(e2m1_code(-v, -v), reference_e2m1_magnitude(v) | 8) << -v;
    }
  }
}

TEST(E2M1, SaturatesAndTakesTheSignOfTheInput) {
  EXPECT_EQ(e2m1_code(6.0f, 6.0f), 7);
  EXPECT_EQ(e2m1_code(next_up(6.0f), 1.0f), 7);
  EXPECT_EQ(e2m1_code(1e30f, 1.0f), 7);
  EXPECT_EQ(e2m1_code(kInf, kInf), 7);
  EXPECT_EQ(e2m1_code(-kInf, -kInf), 15);
  // A NaN y (0 * inf when r overflows) takes the spec's "otherwise" code 7 with the sign of x.
  EXPECT_EQ(e2m1_code(kNaN, 0.0f), 7);
  EXPECT_EQ(e2m1_code(kNaN, -0.0f), 15);
  EXPECT_EQ(e2m1_code(0.0f, -0.0f), 8);  // signed zero
  EXPECT_EQ(e2m1_code(1e-30f, 1e-30f), 0);
}

TEST(E4M3, EveryFiniteByteRoundTrips) {
  for (int b = 0; b <= 0x7E; ++b) {
    const float value = e4m3_to_float(uint8_t(b));
    EXPECT_EQ(double(value), reference_e4m3_value(uint8_t(b))) << b;
    EXPECT_EQ(e4m3_from_nonnegative(value), b) << b;
    EXPECT_EQ(double(e4m3_to_float(uint8_t(b | 0x80))), -reference_e4m3_value(uint8_t(b))) << b;
  }
  EXPECT_TRUE(std::isnan(e4m3_to_float(0x7F)));
  EXPECT_TRUE(std::isnan(e4m3_to_float(0xFF)));
  EXPECT_EQ(e4m3_to_float(0x7E), 448.0f);
  EXPECT_EQ(e4m3_to_float(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(e4m3_to_float(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
}

TEST(E4M3, EveryMidpointRoundsToTheEvenByte) {
  // Normal and subnormal midpoints alike (the subnormal grid k * 2^-9 and the normal grids).
  for (int b = 0; b < 0x7E; ++b) {
    const double low = reference_e4m3_value(uint8_t(b)), high = reference_e4m3_value(uint8_t(b + 1));
    const float mid = float((low + high) / 2);  // exact in fp32
    ASSERT_EQ(double(mid), (low + high) / 2);
    const int even = b % 2 == 0 ? b : b + 1;
    EXPECT_EQ(e4m3_from_nonnegative(mid), even) << "between bytes " << b << " and " << b + 1;
    EXPECT_EQ(e4m3_from_nonnegative(next_down(mid)), b) << b;
    EXPECT_EQ(e4m3_from_nonnegative(next_up(mid)), b + 1) << b;
  }
}

TEST(E4M3, SubnormalsAndUnderflow) {
  EXPECT_EQ(e4m3_from_nonnegative(0.0f), 0);
  EXPECT_EQ(e4m3_from_nonnegative(std::ldexp(1.0f, -11)), 0);  // a quarter of the smallest subnormal
  EXPECT_EQ(e4m3_from_nonnegative(std::ldexp(1.0f, -10)), 0);  // half of it: tie to even 0
  EXPECT_EQ(e4m3_from_nonnegative(next_up(std::ldexp(1.0f, -10))), 1);
  EXPECT_EQ(e4m3_from_nonnegative(std::ldexp(7.5f, -9)), 0x08);  // tie between 0x07 and 0x08 (even)
  EXPECT_EQ(e4m3_from_nonnegative(std::ldexp(1.0f, -149)), 0);   // smallest fp32 subnormal
}

TEST(E4M3, SaturatesAt448) {
  for (float t : {448.0f, next_up(448.0f), 464.0f, 480.0f, 1e10f, std::numeric_limits<float>::max(), kInf}) {
    EXPECT_EQ(e4m3_from_nonnegative(t), 0x7E) << t;
  }
  EXPECT_EQ(e4m3_from_nonnegative(next_down(448.0f)), 0x7E);  // nearest is 448
  EXPECT_EQ(e4m3_from_nonnegative(416.0f), 0x7D);
  EXPECT_EQ(e4m3_from_nonnegative(432.0f), 0x7E);  // tie between 416 (0x7D) and 448 (0x7E, even)
}

TEST(E4M3, SweepMatchesTheBruteForceReference) {
  for (double t = std::ldexp(1.0, -12); t < 600.0; t *= 1.0009765625) {
    const float v = float(t);
    ASSERT_EQ(e4m3_from_nonnegative(v), reference_e4m3(v)) << v;
  }
}

TEST(Widening, EveryFloat16BitPatternIsExact) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const uint16_t h = uint16_t(bits);
    _Float16 half;
    std::memcpy(&half, &h, sizeof half);
    const float expected = float(half), actual = fp16_bits_to_float(h);
    if (std::isnan(expected)) {
      ASSERT_TRUE(std::isnan(actual)) << bits;
    } else {
      ASSERT_EQ(float_bits(actual), float_bits(expected)) << bits;
    }
  }
}

TEST(Widening, Bfloat16IsTheTopHalfOfAFloat) {
  EXPECT_EQ(bf16_bits_to_float(0x3F80), 1.0f);
  EXPECT_EQ(bf16_bits_to_float(0xC040), -3.0f);
  EXPECT_EQ(bf16_bits_to_float(0x7F80), kInf);
  EXPECT_TRUE(std::isnan(bf16_bits_to_float(0x7FC0)));
  EXPECT_EQ(float_bits(bf16_bits_to_float(0x0001)), 0x00010000u);  // bf16 subnormal kept
}

// One block through quantize_block: (scale byte, 16 codes).
std::pair<uint8_t, std::vector<int>> quantize(std::vector<float> values, float global_scale = 1.0f) {
  values.resize(kBlockSize, 0.0f);
  float x[kBlockSize];
  for (int j = 0; j < kBlockSize; ++j) x[j] = values[j];
  uint64_t packed = 0xDEADBEEFDEADBEEFull;
  const uint8_t scale = quantize_block(x, global_scale, packed);
  std::vector<int> codes;
  for (int j = 0; j < kBlockSize; ++j) codes.push_back(int((packed >> (4 * j)) & 0xF));
  return {scale, codes};
}

std::vector<int> padded(std::vector<int> codes) {
  codes.resize(kBlockSize, 0);
  return codes;
}

TEST(Block, NanRule) {
  // Any NaN: scale byte 0x7F (E4M3 NaN) and all-zero data, so the NaN survives dequantization.
  auto [scale, codes] = quantize({1.0f, kNaN, 2.0f, 448.0f});
  EXPECT_EQ(scale, kE4M3NaN);
  EXPECT_EQ(codes, padded({}));
  EXPECT_TRUE(std::isnan(dequantize_value(uint8_t(codes[0]), e4m3_to_float(scale), 1.0f)));
  EXPECT_EQ(quantize({-kNaN}).first, kE4M3NaN);
  // Infinity is not NaN: the scale saturates, inf codes to 6.0 (SPEC step 4 and 6).
  auto [inf_scale, inf_codes] = quantize({kInf, -kInf, 448.0f, 1.0f});
  EXPECT_EQ(inf_scale, 0x7E);
  EXPECT_EQ(inf_codes, padded({7, 15, 2, 0}));
}

TEST(Block, HandComputedCorners) {
  // The cases of tests/test_edge_cases.py, on the codec alone.
  EXPECT_EQ(quantize({}), std::make_pair(uint8_t(0x00), padded({})));
  EXPECT_EQ(quantize({-0.0f, 0.0f}), std::make_pair(uint8_t(0x00), padded({8, 0})));
  EXPECT_EQ(quantize({6.0f, 0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, -6.0f, -0.25f, -0.75f, -1.25f, -1.75f, -2.5f,
                      -3.5f, -5.0f}),
            std::make_pair(uint8_t(0x38), std::vector<int>{7, 0, 2, 2, 4, 4, 6, 6, 15, 8, 10, 10, 12, 12, 14, 14}));
  EXPECT_EQ(quantize({6.375f}).first, 0x38);        // t = 1.0625: tie, to 0x38 (even)
  EXPECT_EQ(quantize({7.125f}).first, 0x3A);        // t = 1.1875: tie, to 0x3A (even)
  EXPECT_EQ(quantize({0.087890625f}).first, 0x08);  // t = 7.5 * 2^-9: tie, to 0x08
  EXPECT_EQ(quantize({0.0859375f}).first, 0x07);
  EXPECT_EQ(quantize({0.01171875f}).first, 0x01);   // t = 2^-9, the smallest subnormal
  EXPECT_EQ(quantize({0.005859375f}).first, 0x00);  // t = 2^-10: tie, to 0
  EXPECT_EQ(quantize({3000.0f, -1000.0f, 100.0f}), std::make_pair(uint8_t(0x7E), padded({7, 12, 0})));
  EXPECT_EQ(quantize({std::ldexp(1.0f, -10), -std::ldexp(1.0f, -11)}), std::make_pair(uint8_t(0x00), padded({0, 8})));
  EXPECT_EQ(quantize({3.0f, 1.0f, 0.4f, 0.1f}, 0.5f), std::make_pair(uint8_t(0x38), padded({7, 4, 2, 0})));
}

TEST(Block, ScaleAndReciprocalFollowTheSpecOrder) {
  // t = a / (6 s) with 6 s rounded first; r = 1 / (float(sf) * s) with the product rounded first.
  for (float s : {1.0f, 0.1f, 3e-5f, 7.0f}) {
    for (float a : {0.3f, 1.0f, 17.0f, 999.0f}) {
      const BlockScale b = block_scale(a, s);
      const float six_s = 6.0f * s;
      EXPECT_EQ(b.byte, reference_e4m3(a / six_s)) << a << " " << s;
      const float sf = e4m3_to_float(b.byte);
      const float sf_s = sf * s;
      EXPECT_EQ(b.reciprocal, sf == 0.0f ? 0.0f : 1.0f / sf_s);
    }
  }
  EXPECT_EQ(block_scale(0.0f, 1.0f).reciprocal, 0.0f);
}

TEST(Block, PackingIsLowNibbleFirst) {
  float x[kBlockSize] = {};
  x[0] = 6.0f;   // code 7, low nibble of byte 0
  x[1] = -1.0f;  // code 10, high nibble of byte 0
  x[15] = 3.0f;  // code 5, high nibble of byte 7
  uint64_t packed = 0;
  EXPECT_EQ(quantize_block(x, 1.0f, packed), 0x38);
  EXPECT_EQ(packed & 0xFF, 0xA7u);
  EXPECT_EQ(packed >> 56, 0x50u);
}

TEST(Dequantize, ValueIsCodeTimesBlockScaleTimesGlobalScale) {
  for (uint8_t code = 0; code < 16; ++code) {
    for (uint8_t sf : {uint8_t(0x38), uint8_t(0x01), uint8_t(0x7E)}) {
      const float expected = (e2m1_to_float(code) * e4m3_to_float(sf)) * 0.25f;
      EXPECT_EQ(dequantize_value(code, e4m3_to_float(sf), 0.25f), expected);
    }
  }
}

}  // namespace

// The fused RoPE append's rounding of a rotated value to 16 bits (nvfp4kv/rope_rotation.h): every finite pattern
// round-trips, every midpoint between neighbours goes to the even pattern, the floats next to a midpoint go to
// the nearer neighbour, overflow gives inf and NaN the canonical quiet NaN.
struct Format16 {
  const char* name;
  float (*decode)(uint16_t);
  uint16_t (*encode)(float);
  uint16_t exponent_mask;  // all-ones exponent: inf and NaN
  uint16_t canonical_nan;
};

float fp16_value(uint16_t h) { return fp16_bits_to_float(h); }
float bf16_value(uint16_t h) { return bf16_bits_to_float(h); }

void check_rounding_to_16_bits(const Format16& f) {
  for (uint32_t h = 0; h < 0x7FFFu; ++h) {  // non-negative finite patterns and their successors
    const uint16_t lo = uint16_t(h), hi = uint16_t(h + 1);
    if ((hi & f.exponent_mask) == f.exponent_mask) continue;  // the largest finite: overflow is checked below
    for (const uint16_t sign : {uint16_t(0), uint16_t(0x8000)}) {
      const float a = f.decode(lo | sign);
      ASSERT_EQ(f.encode(a), lo | sign) << f.name << " round trip of " << std::hex << (lo | sign);
      const double b = f.decode(hi | sign);
      const float mid = float((double(a) + b) / 2);  // exact: one bit more than the 16-bit format has
      ASSERT_EQ(double(mid), (double(a) + b) / 2) << f.name;
      const uint16_t even = (lo & 1) == 0 ? lo : hi;
      ASSERT_EQ(f.encode(mid), even | sign) << f.name << " midpoint above " << std::hex << lo;
      ASSERT_EQ(f.encode(std::nextafter(mid, 0.0f)), lo | sign) << f.name << " below the midpoint above " << lo;
      ASSERT_EQ(f.encode(std::nextafter(mid, float(b) * 2)), hi | sign) << f.name << " above the midpoint " << lo;
    }
  }
  EXPECT_EQ(f.encode(kNaN), f.canonical_nan) << f.name;
  EXPECT_EQ(f.encode(-kNaN), f.canonical_nan) << f.name;
  EXPECT_EQ(f.encode(kInf), f.exponent_mask) << f.name;
  EXPECT_EQ(f.encode(-kInf), uint16_t(0x8000 | f.exponent_mask)) << f.name;
  EXPECT_EQ(f.encode(std::numeric_limits<float>::max()), f.exponent_mask) << f.name;
  const uint16_t largest = uint16_t(f.exponent_mask - 1);  // the largest finite pattern
  const double step = double(f.decode(largest)) - double(f.decode(uint16_t(largest - 1)));
  const float overflow = float(double(f.decode(largest)) + step / 2);  // its midpoint to inf: rounds to inf (even)
  EXPECT_EQ(f.encode(overflow), f.exponent_mask) << f.name;
  EXPECT_EQ(f.encode(std::nextafter(overflow, 0.0f)), largest) << f.name;
}

TEST(RopeRounding, Float16EveryPatternMidpointAndNeighbour) {
  check_rounding_to_16_bits({"float16", fp16_value, nvfp4kv::rope::fp16_bits_from_float, 0x7C00, 0x7E00});
  EXPECT_EQ(nvfp4kv::rope::fp16_bits_from_float(65520.0f), 0x7C00);                        // the midpoint to inf: even
  EXPECT_EQ(nvfp4kv::rope::fp16_bits_from_float(std::nextafter(65520.0f, 0.0f)), 0x7BFF);  // 65504
  EXPECT_EQ(nvfp4kv::rope::fp16_bits_from_float(0x1p-25f), 0x0000);  // half the smallest subnormal
  EXPECT_EQ(nvfp4kv::rope::fp16_bits_from_float(std::nextafter(0x1p-25f, 1.0f)), 0x0001);
}

TEST(RopeRounding, BFloat16EveryPatternMidpointAndNeighbour) {
  check_rounding_to_16_bits({"bfloat16", bf16_value, nvfp4kv::rope::bf16_bits_from_float, 0x7F80, 0x7FC0});
}
