// Exhaustive checks of the GPU quantization path against the codec and the spec (run on a GPU machine
// by tests/gpu/run_device.sh, stage `check`, and by tests/test_cuda.py::test_device_codec_check_passes;
// `--host` runs the host part, 2^32 values on one CPU core, ~40 s).
//
//   1. codec::e2m1_code (the "code float" formulation, device-compiled) equals SPEC step 6 written
//      literally, for every fp32 y; and the kernel's unsaturated path (|y| < 7) equals it too.
//   2. block_quantizer::scale_byte (the sm_89+ hardware conversion) equals
//      codec::e4m3_from_nonnegative for every non-negative fp32 and +inf.
//   3. block_quantizer::scale_value equals codec::e4m3_to_float for every finite scale byte.
//   4. block_quantizer::quantize_blocks equals codec::quantize_block on random blocks with zeros,
//      subnormals, infinities, NaNs and outliers, for bf16 and fp16 and global scales from 1e-38 to 1e38.
//   5. the scale byte of block_quantizer::scale_quotient (a / 6s from a reciprocal hoisted per global
//      scale) equals that of the IEEE division __fdiv_rn for every non-negative fp32 a and +inf, for
//      kQuotientScales values of 6 s inside, at the ends of and beyond the hoisted range.
//   6. block_quantizer::quantize_block_four_over_six_fast (the choice read from error estimates, the
//      exact sums only for close calls) equals codec::quantize_block_four_over_six on random blocks:
//      those of check 4, Gaussian-like blocks over 2^-60 .. 2^60, blocks of one magnitude and blocks on
//      a coarse grid (exact ties), with calibrated and arbitrary global scales, table variant (with the
//      hoisted-reciprocal quotients) and direct variant.
//   7. block_quantizer::nan_free_quotient_bytes2 (FP8 Q bytes of a word of two NaN-free 16-bit values) equals
//      SPEC section 4's E4M3(x / s) of each half through the IEEE division, for every non-NaN 16-bit value in the low
//      half with 256 hashed partners in the high half, bf16 and fp16, and the kQuotientScales values as s (those
//      with a nonzero hoisted inverse: the only ones the kernels give it).
//
// Build: tests/gpu/build_codec_check.sh ARCH OUTPUT (ARCH 90 for sm_90).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "check_cuda.h"
#include "cuda/block_quantizer.cuh"
#include "cuda/four_over_six_quantizer.cuh"

using namespace nvfp4kv;

// SPEC section 2, step 6, as written.
__host__ __device__ uint8_t spec_e2m1_code(float y, float x) {
  const float m = fabsf(y);
  uint8_t c;
  if (m != m) c = 7;
  else if (m <= 0.25f) c = 0;
  else if (m < 0.75f) c = 1;
  else if (m <= 1.25f) c = 2;
  else if (m < 1.75f) c = 3;
  else if (m <= 2.5f) c = 4;
  else if (m < 3.5f) c = 5;
  else if (m <= 5.0f) c = 6;
  else c = 7;
  return uint8_t(c | (signbit(x) ? 8 : 0));
}

__global__ void check_e2m1(uint32_t high, unsigned long long* bad) {
  const uint32_t bits = (high << 24) | (blockIdx.x * blockDim.x + threadIdx.x);
  const float y = __uint_as_float(bits);
  unsigned long long local = 0;
  if (codec::e2m1_code(y, y) != spec_e2m1_code(y, y)) ++local;
  const float u = fabsf(y);
  if (u < 7.0f) {  // the kernel's unsaturated path: e2m1_code_float(|y|) without the clamp
    const uint8_t code = uint8_t(__float_as_uint(codec::e2m1_code_float(u)) - codec::kCodeFloatZeroBits);
    if (code != (spec_e2m1_code(y, y) & 7)) ++local;
  }
  if (local) atomicAdd(bad, local);
}

__global__ void check_e4m3(uint32_t high, unsigned long long* bad) {
  const uint32_t bits = (high << 24) | (blockIdx.x * blockDim.x + threadIdx.x);
  if (bits > 0x7F800000u) return;  // non-negative fp32 up to +inf; NaN is never rounded
  const float t = __uint_as_float(bits);
  if (block_quantizer::scale_byte(t) != codec::e4m3_from_nonnegative(t)) atomicAdd(bad, 1ull);
}

__global__ void check_scale_values(unsigned long long* bad) {
  const uint8_t byte = uint8_t(threadIdx.x);
  if (byte >= 0x7F) return;
  if (__float_as_uint(block_quantizer::scale_value(byte)) != __float_as_uint(codec::e4m3_to_float(byte))) {
    atomicAdd(bad, 1ull);
  }
}

__device__ uint32_t hash(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

// A 16-bit value of a random block: mostly normal numbers of one magnitude, with zeros, subnormals,
// outliers, infinities and (rarely) NaNs.
template <bool kBF16>
__device__ uint16_t random_value(uint32_t h, uint32_t block_h) {
  const uint32_t kind = h % 64;
  const uint16_t sign = uint16_t((h >> 6) & 1) << 15;
  const uint32_t mantissa = h >> 8;
  const int exp_bits = kBF16 ? 8 : 5, man_bits = kBF16 ? 7 : 10;
  const uint32_t max_exp = (1u << exp_bits) - 1;
  uint32_t e = (block_h % (max_exp - 1)) + 1;  // the block's typical exponent
  const uint32_t spread = (h >> 20) % 4;
  e = e > spread ? e - spread : 1;
  uint32_t m = mantissa & ((1u << man_bits) - 1);
  if (kind == 0) return sign;                                                          // +-0
  if (kind == 1) return uint16_t(sign | m);                                            // subnormal
  if (kind == 2 && (block_h & 7) == 0) return uint16_t(sign | (max_exp << man_bits));  // +-inf
  if (kind == 3 && (block_h & 31) == 0) return uint16_t(0x7FFF);                       // NaN
  if (kind == 4) e = e + 6 < max_exp ? e + 6 : max_exp - 1;                            // outlier
  if (kind == 5) e = max_exp - 1;                                                      // largest binade
  return uint16_t(sign | (e << man_bits) | m);
}

template <bool kBF16>
__global__ void check_blocks(uint32_t seed, unsigned long long* bad, unsigned long long* nan_blocks) {
  const uint32_t id = blockIdx.x * blockDim.x + threadIdx.x;
  const uint32_t block_h = hash(id * 2654435761u + seed);
  uint16_t values[16];
  uint32_t w[8];
  float x[16];
  for (int j = 0; j < 16; ++j) {
    values[j] = random_value<kBF16>(hash(block_h + 0x9e3779b9u * (j + 1)), block_h);
    x[j] = codec::bits16_to_float(values[j], kBF16);
  }
  for (int i = 0; i < 8; ++i) w[i] = uint32_t(values[2 * i]) | (uint32_t(values[2 * i + 1]) << 16);
  // Global scales over the whole positive fp32 range, biased toward ones that fit the data.
  const uint32_t sh = hash(block_h ^ 0xabcdef01u);
  float s;
  if (sh % 4 == 0) {
    s = __uint_as_float((sh >> 2) % 0x7F7FFFFFu + 1);  // any positive finite fp32, subnormals included
  } else {
    float amax = 0.0f;
    for (int j = 0; j < 16; ++j) amax = fmaxf(amax, fabsf(x[j]));
    s = (amax > 0.0f && amax < 1e38f ? amax : 1.0f) / (6.0f * 448.0f) * (0.25f + float(sh % 1024) / 256.0f);
    if (!(s > 0.0f)) s = 1.0f;
  }
  // Every thread of the check has its own s, so it builds its own table.
  float my_table[block_quantizer::kReciprocalTableSize];
  for (int b = 0; b < block_quantizer::kReciprocalTableSize; ++b) {
    my_table[b] = block_quantizer::reciprocal_entry(uint8_t(b), s);
  }
  const float six_s = 6.0f * s;
  const float inverse = block_quantizer::division_inverse(six_s);
  const float* tables[1] = {my_table};
  uint2 data[1];
  uint8_t sf[1];
  if (id & 1) {  // the table path and the direct path
    block_quantizer::quantize_blocks<kBF16, 1, true>(w, &s, &six_s, &inverse, tables, data, sf);
  } else {
    block_quantizer::quantize_blocks<kBF16, 1, false>(w, &s, &six_s, &inverse, tables, data, sf);
  }
  uint64_t expected_packed;
  const uint8_t expected_sf = codec::quantize_block(x, s, expected_packed);
  const uint64_t packed = uint64_t(data[0].x) | (uint64_t(data[0].y) << 32);
  if (packed != expected_packed || sf[0] != expected_sf) {
    const unsigned long long n = atomicAdd(bad, 1ull);
    if (n < 4) {
      printf("block mismatch (%s): s=%a sf %02x vs %02x data %016llx vs %016llx\n", kBF16 ? "bf16" : "fp16", s, sf[0],
             expected_sf, (unsigned long long)packed, (unsigned long long)expected_packed);
    }
  }
  if (expected_sf == codec::kE4M3NaN) atomicAdd(nan_blocks, 1ull);
}

// The scale quotient from a hoisted reciprocal gives the scale byte of the IEEE division for every
// non-negative fp32 absmax (and +inf), for 6 s given by bits (one scale per launch).
__global__ void check_scale_quotient(uint32_t high, uint32_t six_s_bits, unsigned long long* bad) {
  const uint32_t bits = (high << 24) | (blockIdx.x * blockDim.x + threadIdx.x);
  if (bits > 0x7F800000u) return;  // NaN absmax: the block is discarded
  const float a = __uint_as_float(bits);
  const float six_s = __uint_as_float(six_s_bits);
  const float inverse = block_quantizer::division_inverse(six_s);
  const uint8_t fast = block_quantizer::scale_byte(block_quantizer::scale_quotient(a, six_s, inverse));
  const uint8_t exact = block_quantizer::scale_byte(__fdiv_rn(a, six_s));
  if (fast != exact) {
    const unsigned long long n = atomicAdd(bad, 1ull);
    if (n < 4) printf("scale quotient mismatch: a=%a 6s=%a: %02x vs %02x\n", a, six_s, fast, exact);
  }
}

// 6 s values for check_scale_quotient: the ends of the hoisted range, powers of two, all-ones
// mantissas, 6 x calibrated scales, and pseudo-random values over the whole range.
uint32_t six_s_sample(uint32_t i) {
  const float fixed[] = {0x1p-60f,      0x1p60f,        0x1.fffffep-61f, 0x1.000002p60f, 1.0f,           6.0f,
                         0x1.fffffep0f, 0x1.fffffep-1f, 0x1.800002p3f,   1.0f / 448.0f,  6.0f / 2688.0f, 3.0f / 7.0f};
  constexpr uint32_t kFixed = sizeof(fixed) / sizeof(fixed[0]);
  float v;
  if (i < kFixed) {
    v = fixed[i];
  } else {
    uint32_t h = (i + 0x9e3779b9u) * 2654435761u;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    const uint32_t exponent = 127 - 62 + (h % 125);  // 2^-62 .. 2^62: both ends of the range and beyond
    uint32_t b = (exponent << 23) | ((h * 3266489917u) >> 9);
    std::memcpy(&v, &b, 4);
  }
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  return bits;
}

// A 16-bit value of a 4-over-6 test block (kind = block_h % 4): check 4's values, Gaussian-like values
// of one block-wide magnitude 2^e (e in [-60, 60] for bf16, [-20, 12] for fp16), one magnitude with random signs, or
// multiples -12..12 of a power of two (blocks that both candidates can represent exactly: tied errors).
template <bool kBF16>
__device__ uint16_t four_over_six_value(uint32_t h, uint32_t block_h) {
  const uint32_t kind = block_h % 4;
  if (kind == 0) return random_value<kBF16>(h, block_h);
  const int e = kBF16 ? int((block_h >> 2) % 121) - 60 : int((block_h >> 2) % 33) - 20;
  float v;
  if (kind == 1) {
    const float gauss = float(h & 0xFFF) + float((h >> 12) & 0xFFF) + float((h >> 20) & 0xFFF) - 6142.5f;
    v = ldexpf(gauss / 2048.0f, e);
  } else if (kind == 2) {
    v = ldexpf((h & 1) ? -1.0f : 1.0f, e) * (1.0f + float((block_h >> 9) & 7) / 8.0f);
  } else {
    v = ldexpf(float(int(h % 25) - 12), e);
  }
  if constexpr (kBF16) {
    const __nv_bfloat16 b = __float2bfloat16_rn(v);
    return *reinterpret_cast<const uint16_t*>(&b);
  } else {
    const __half b = __float2half_rn(v);
    return *reinterpret_cast<const uint16_t*>(&b);
  }
}

template <bool kBF16>
__global__ void check_four_over_six_blocks(uint32_t seed, unsigned long long* bad, unsigned long long* close_calls) {
  const uint32_t id = blockIdx.x * blockDim.x + threadIdx.x;
  const uint32_t block_h = hash(id * 2654435761u + seed);
  uint16_t values[16];
  uint32_t w[8];
  float x[16];
  float amax = 0.0f;
  for (int j = 0; j < 16; ++j) {
    values[j] = four_over_six_value<kBF16>(hash(block_h + 0x9e3779b9u * (j + 1)), block_h);
    x[j] = codec::bits16_to_float(values[j], kBF16);
    amax = fmaxf(amax, fabsf(x[j]));
  }
  for (int i = 0; i < 8; ++i) w[i] = uint32_t(values[2 * i]) | (uint32_t(values[2 * i + 1]) << 16);
  const uint32_t sh = hash(block_h ^ 0x5bd1e995u);
  float s;
  if (sh % 8 == 0) {
    s = __uint_as_float((sh >> 3) % 0x7F7FFFFFu + 1);  // any positive finite fp32
  } else {
    s = (amax > 0.0f && amax < 1e38f ? amax : 1.0f) / (6.0f * 448.0f) * (0.25f + float(sh % 1024) / 256.0f);
    if (!(s > 0.0f)) s = 1.0f;
  }
  if (!block_quantizer::four_over_six_fast_scale(s)) s = 1.0f;  // the kernels use the codec there
  uint2 data;
  uint8_t sf;
  if (id & 1) {
    float reciprocal[block_quantizer::kReciprocalTableSize], scaled[block_quantizer::kReciprocalTableSize];
    for (int b = 0; b < block_quantizer::kReciprocalTableSize; ++b) {
      reciprocal[b] = block_quantizer::reciprocal_entry(uint8_t(b), s);
      scaled[b] = block_quantizer::scaled_scale_entry(uint8_t(b));
    }
    const float inverse6 = block_quantizer::division_inverse(6.0f * s);
    const float inverse4 = block_quantizer::division_inverse(4.0f * s);
    if (inverse6 != 0.0f && inverse4 != 0.0f) {  // the pair kernel's loop: no division fallback
      sf = block_quantizer::quantize_block_four_over_six_fast<kBF16, true, true>(w, s, 6.0f * s, 4.0f * s, inverse6,
                                                                                 inverse4, reciprocal, scaled, data);
    } else {
      sf = block_quantizer::quantize_block_four_over_six_fast<kBF16, true>(w, s, 6.0f * s, 4.0f * s, inverse6, inverse4,
                                                                           reciprocal, scaled, data);
    }
  } else {
    sf = block_quantizer::quantize_block_four_over_six_fast<kBF16, false>(w, s, 6.0f * s, 4.0f * s, 0.0f, 0.0f, nullptr,
                                                                          nullptr, data);
  }
  uint64_t expected_packed;
  const uint8_t expected_sf = codec::quantize_block_four_over_six(x, s, expected_packed);
  const uint64_t packed = uint64_t(data.x) | (uint64_t(data.y) << 32);
  if (packed != expected_packed || sf != expected_sf) {
    const unsigned long long n = atomicAdd(bad, 1ull);
    if (n < 4) {
      printf("4-over-6 mismatch (%s): s=%a amax=%a sf %02x vs %02x data %016llx vs %016llx\n", kBF16 ? "bf16" : "fp16",
             s, amax, sf, expected_sf, (unsigned long long)packed, (unsigned long long)expected_packed);
    }
  }
  // Close calls: distinct candidates whose exact errors agree to 2^-16 (ties included).
  float absmax;
  if (codec::block_has_nan(x, absmax) || absmax == 0.0f) return;
  const codec::BlockScale six = codec::block_scale(absmax, s), four = codec::block_scale(absmax, s, 4.0f);
  if (six.byte == four.byte) return;
  const float e6 = codec::block_squared_error(x, codec::encode_block(x, six.reciprocal), six.byte, s);
  const float e4 = codec::block_squared_error(x, codec::encode_block(x, four.reciprocal), four.byte, s);
  if (fabsf(e6 - e4) <= 0x1p-16f * (e6 + e4)) atomicAdd(close_calls, 1ull);
}

constexpr uint32_t kQuotientScales = 160;

// SPEC section 4: E4M3(x / s), the quotient by IEEE division, saturating at 448 (inf too), the sign of x kept.
__device__ uint32_t spec_quotient_byte(float x, float s) {
  return (signbit(x) ? 0x80u : 0u) | block_quantizer::scale_byte(__fdiv_rn(fabsf(x), s));
}

// Check 7 for one s (bits): the low half is i % 2^16, the high half a hash of i (2^24 threads).
template <bool kBF16>
__global__ void check_nan_free_quotient_bytes(uint32_t s_bits, unsigned long long* bad) {
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  const uint32_t word = (i & 0xFFFFu) | (hash(i) & 0xFFFF0000u);
  const float x0 = codec::bits16_to_float(uint16_t(word), kBF16);
  const float x1 = codec::bits16_to_float(uint16_t(word >> 16), kBF16), s = __uint_as_float(s_bits);
  const float inverse = block_quantizer::division_inverse(s);
  if (x0 != x0 || x1 != x1 || inverse == 0.0f) return;
  const uint32_t fast = block_quantizer::nan_free_quotient_bytes2<kBF16>(word, s, inverse);
  const uint32_t exact = spec_quotient_byte(x0, s) | spec_quotient_byte(x1, s) << 8;
  if (fast != exact) {
    const unsigned long long n = atomicAdd(bad, 1ull);
    if (n < 4) printf("nan-free quotient bytes mismatch: word=%08x s=%a: %04x vs %04x\n", word, s, fast, exact);
  }
}

uint64_t host_e2m1_mismatches() {
  uint64_t bad = 0;
  for (uint64_t i = 0; i < (uint64_t(1) << 32); ++i) {
    float y;
    const uint32_t bits = uint32_t(i);
    std::memcpy(&y, &bits, 4);
    if (codec::e2m1_code(y, y) != spec_e2m1_code(y, y)) ++bad;
  }
  return bad;
}

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--host") == 0) {
    const uint64_t bad = host_e2m1_mismatches();
    std::printf("host e2m1_code vs spec, all 2^32 fp32: %llu mismatches\n", (unsigned long long)bad);
    return bad ? 1 : 0;
  }
  unsigned long long* counters;
  CHECK_CUDA(cudaMalloc(&counters, 8 * sizeof(unsigned long long)));
  CHECK_CUDA(cudaMemset(counters, 0, 8 * sizeof(unsigned long long)));
  // bad: [0] e2m1, [1] e4m3, [2] scale values, [3] blocks; aux: [0], [1] NaN blocks, [2] quotient
  // mismatches, [3] 4-over-6 mismatches; close calls of check 6 in a counter of their own.
  unsigned long long* close_calls;
  CHECK_CUDA(cudaMalloc(&close_calls, sizeof(unsigned long long)));
  CHECK_CUDA(cudaMemset(close_calls, 0, sizeof(unsigned long long)));
  unsigned long long *bad = counters, *aux = counters + 4;
  unsigned long long* word_quotients;  // check 7's mismatches
  CHECK_CUDA(cudaMalloc(&word_quotients, sizeof(unsigned long long)));
  CHECK_CUDA(cudaMemset(word_quotients, 0, sizeof(unsigned long long)));
  for (uint32_t high = 0; high < 256; ++high) {
    check_e2m1<<<1 << 16, 256>>>(high, bad + 0);
    check_e4m3<<<1 << 16, 256>>>(high, bad + 1);
  }
  check_scale_values<<<1, 256>>>(bad + 2);
  for (uint32_t i = 0; i < kQuotientScales; ++i) {
    for (uint32_t high = 0; high < 128; ++high) check_scale_quotient<<<1 << 16, 256>>>(high, six_s_sample(i), aux + 2);
  }
  for (uint32_t i = 0; i < kQuotientScales; ++i) {
    check_nan_free_quotient_bytes<true><<<1 << 16, 256>>>(six_s_sample(i), word_quotients);
    check_nan_free_quotient_bytes<false><<<1 << 16, 256>>>(six_s_sample(i), word_quotients);
  }
  for (uint32_t round = 0; round < 16; ++round) {
    check_blocks<true><<<4096, 256>>>(round * 7919u + 1, bad + 3, aux);
    check_blocks<false><<<4096, 256>>>(round * 104729u + 2, bad + 3, aux + 1);
    check_four_over_six_blocks<true><<<4096, 256>>>(round * 15485863u + 3, aux + 3, close_calls);
    check_four_over_six_blocks<false><<<4096, 256>>>(round * 32452843u + 4, aux + 3, close_calls);
  }
  CHECK_CUDA(cudaGetLastError());
  CHECK_CUDA(cudaDeviceSynchronize());
  unsigned long long host[8], close_host, word_host;
  CHECK_CUDA(cudaMemcpy(host, counters, sizeof host, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(&close_host, close_calls, sizeof close_host, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(&word_host, word_quotients, sizeof word_host, cudaMemcpyDeviceToHost));
  bad = host;
  aux = host + 4;
  int device;
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDevice(&device));
  CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
  std::printf("device %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);
  std::printf("e2m1_code vs spec, all 2^32 fp32 (and the unsaturated path for |y| < 7): %llu mismatches\n", bad[0]);
  std::printf("scale_byte vs codec::e4m3_from_nonnegative, all fp32 in [0, +inf]: %llu mismatches\n", bad[1]);
  std::printf("scale_value vs codec::e4m3_to_float, bytes 0..0x7E: %llu mismatches\n", bad[2]);
  std::printf("quantize_blocks vs codec::quantize_block, %d random blocks (%llu + %llu with NaN): %llu mismatches\n",
              16 * 2 * 4096 * 256, aux[0], aux[1], bad[3]);
  std::printf(
      "scale byte of the hoisted-reciprocal quotient vs __fdiv_rn, all fp32 in [0, +inf], %u scales: "
      "%llu mismatches\n",
      kQuotientScales, aux[2]);
  std::printf(
      "quantize_block_four_over_six_fast vs codec::quantize_block_four_over_six, %d random blocks "
      "(%llu close calls): %llu mismatches\n",
      16 * 2 * 4096 * 256, close_host, aux[3]);
  std::printf(
      "nan_free_quotient_bytes2 vs E4M3(x / s) by IEEE division, 2^24 words of NaN-free bf16 and fp16, %u scales: "
      "%llu mismatches\n",
      kQuotientScales, word_host);
  const bool ok = bad[0] == 0 && bad[1] == 0 && bad[2] == 0 && bad[3] == 0 && aux[2] == 0 && aux[3] == 0 &&
                  close_host > 0 && word_host == 0;
  std::printf(ok ? "codec_check: PASS\n" : "codec_check: FAIL\n");
  return ok ? 0 : 1;
}
