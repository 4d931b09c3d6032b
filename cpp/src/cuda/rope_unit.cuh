// Per-unit device work of the fused RoPE + NVFP4 append kernels (rope_append_paged_kv_cache_kernel.cu): a
// 16-value unit of one head of one row loaded, rotated, and written as Q out, k_out and NVFP4 cache blocks.
//
// A rotated value needs its pair partner (rope_rotation.h):
//   GPT-J (2j, 2j + 1): the other half of the same packed word;
//   NeoX (j, j + m), m % 16 == 0: the whole unit u +- m / 16 of the same head (shuffled, or read from the units
//     a kernel staged in shared memory);
//   NeoX otherwise (partial rotary such as R = 20): the head's units staged in shared memory, read per value.
// Each rotated value is v c + w s' with s' = -s for the pair's first member (x c - y s == x c + y (-s) exactly),
// rounded to 16 bits by the hardware conversion, two values per conversion where the whole unit is rotated (NaN
// replaced by rope::kBF16NaN / kFP16NaN). FP8 Q bytes are block_quantizer.cuh's quotient bytes (the IEEE quotient
// by q_scale through a reciprocal computed once and one correction, rounded as the scale bytes are, two values
// per conversion). For placed rows (row < nnz, position in the table, a target that passes the bounds contract
// of append_params.h) the rotated K and the plain V are quantized (block_quantizer.cuh; four_over_six_quantizer.cuh
// for scale_search "4over6") into the cache.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>

#include "../rope_params.h"
#include "block_io.cuh"
#include "block_quantizer.cuh"
#include "four_over_six_quantizer.cuh"
#include "index_chain.cuh"

namespace nvfp4kv {
namespace rope_unit {
namespace {  // one includer (the kernel file): internal linkage, the code generation of a single file

constexpr uint32_t kWordsPerUnit = 8;  // 16 values of 16 bits
constexpr int kTablePad = 4;           // zeros past R: a GPT-J quad ending past R reads up to sin column R / 2 + 1

// Columns per staged table row: R, then zeros (kTablePad), rounded up to 16 bytes for the float4 reads.
__host__ __device__ constexpr int table_columns(int64_t rotary_dim) { return int(rotary_dim + kTablePad + 3) / 4 * 4; }

// Where column j of a staged table row lies: a 16-byte gap after every 32 floats, so that float4 reads of columns
// 32 apart fall in different banks (a NeoX-aligned warp reads columns 16 u + k0 of its units u at once). A float4
// read starts at a multiple of 4 and never spans a gap.
__host__ __device__ constexpr int table_slot(int column) { return column + (column >> 5) * 4; }

// Floats per staged table row (a multiple of 4, so every row starts 16-byte aligned).
__host__ __device__ constexpr int table_floats(int64_t rotary_dim) { return table_slot(table_columns(rotary_dim)); }

enum class Pairs { kGptJ, kNeoxAligned, kNeoxStaged };

// The calls an instance serves: any, or the common shape with 16-bit or FP8 Q out (NeoX pairs over the whole
// head, no k_out, the plain recipe, vector loads and stores: the launcher's common_shape), whose instances carry
// none of the other shapes' branches.
enum class Shape { kAny, kCommonQ16, kCommonQFp8 };

__host__ __device__ constexpr bool common(Shape s) { return s != Shape::kAny; }

template <Shape kShape>
__device__ __forceinline__ bool q_out_fp8(const RopeParams& p) {
  return kShape == Shape::kCommonQFp8 || (kShape == Shape::kAny && p.q_out_fp8);
}

// Per-call choices made on the host. page_size, quotient_limit and speculate_batch are what index_chain.cuh reads.
struct RopeLaunch {
  append_kernel::Divisor page_size;  // position or slot -> page, for values below quotient_limit
  uint64_t quotient_limit;           // 2^31, or 0 when page_size >= 2^31 (then always a 64-bit division)
  bool speculate_batch;              // nnz == batch_size (decode): kv_indptr[row], [row + 1] loaded early
  int64_t placeable_rows;            // nnz, or 0 when no row can land (the index chain's clamps need non-empty tensors)
  uint32_t group_shift;              // log2(G): lanes per head
  uint32_t items;                    // heads * G
  uint32_t span;                     // items per CTA: items, or kChunkThreads
  uint32_t iterations;               // ceil(span / threads): the same for every thread (shuffles need the warp)
  bool query16;                      // 16-byte loads / stores allowed (address and strides)
  bool key16;
  bool value16;
  bool q_out16;
  bool k_out16;
  bool cache_store8;  // 8-byte packed-data stores into both data caches
  bool table16;       // a float32 table whose rows start 16-byte aligned (copied as they are)
};

__device__ __forceinline__ void load_unit(const uint16_t* src, bool vector, uint32_t (&w)[kWordsPerUnit]) {
  if (vector) {
    append_kernel::load_values<1, true>(src, w);
  } else {
    append_kernel::load_values<1, false>(src, w);
  }
}

// Not __ldg: q_out may be the query itself (rotated in place), so its lines must not be read as read-only.
__device__ __forceinline__ void load_unit_plain(const uint16_t* src, bool vector, uint32_t (&w)[kWordsPerUnit]) {
  if (vector) {
    const uint4 lo = reinterpret_cast<const uint4*>(src)[0];
    const uint4 hi = reinterpret_cast<const uint4*>(src)[1];
    w[0] = lo.x, w[1] = lo.y, w[2] = lo.z, w[3] = lo.w, w[4] = hi.x, w[5] = hi.y, w[6] = hi.z, w[7] = hi.w;
    return;
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) w[i] = uint32_t(src[2 * i]) | uint32_t(src[2 * i + 1]) << 16;
}

__device__ __forceinline__ void store_unit16(uint16_t* dst, bool vector, const uint32_t (&w)[kWordsPerUnit]) {
  if (vector) {
    reinterpret_cast<uint4*>(dst)[0] = make_uint4(w[0], w[1], w[2], w[3]);
    reinterpret_cast<uint4*>(dst)[1] = make_uint4(w[4], w[5], w[6], w[7]);
    return;
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) dst[2 * i] = uint16_t(w[i]), dst[2 * i + 1] = uint16_t(w[i] >> 16);
}

__device__ __forceinline__ uint16_t half_of(const uint32_t (&w)[kWordsPerUnit], int k) {
  return uint16_t(w[k / 2] >> (16 * (k % 2)));
}

// fp32 -> the input's 16-bit type, nearest even (overflow -> inf), a NaN as rope_rotation.h's quiet NaN: the
// hardware conversion, which rope::bits_from_float mirrors on the host.
template <bool kBF16>
__device__ __forceinline__ uint32_t round16(float f) {
  if constexpr (kBF16) {
    const uint16_t bits = __bfloat16_as_ushort(__float2bfloat16_rn(f));
    return codec::is_nan(f) ? rope::kBF16NaN : bits;
  } else {
    const uint16_t bits = __half_as_ushort(__float2half_rn(f));
    return codec::is_nan(f) ? rope::kFP16NaN : bits;
  }
}

template <bool kBF16>
__device__ __forceinline__ float widen(uint32_t bits) {
  return codec::bits16_to_float(uint16_t(bits), kBF16);
}

// cos and sin' (sin negated for a pair's first member; NeoX aligned: sin, the sign being the whole unit's and
// put on its partner values by rotate_unit) of values k0 .. k0 + 3 of the unit, from the row's table
// staged in shared memory as float32 (cos [0, R / 2), sin [R / 2, R), zeros up to R + kTablePad).
struct Quad {
  float c[4];
  float s[4];
};

template <Pairs kPairs>
__device__ __forceinline__ Quad table_quad(const RopeParams& p, const float* row, uint32_t unit, int k0) {
  Quad q;
  const int half = int(p.rotary_dim / 2);
  const int d0 = int(unit) * 16 + k0;
  if constexpr (kPairs == Pairs::kNeoxAligned) {  // 4 consecutive columns; the unit's sign goes on the partner
    // 16 u and half are multiples of 16: a unit's 16 columns lie within one 32-float block (+ k0 past its slot).
    const int base = int(unit) * 16 < half ? int(unit) * 16 : int(unit) * 16 - half;
    const float4 c = *reinterpret_cast<const float4*>(row + table_slot(base) + k0);
    const float4 s = *reinterpret_cast<const float4*>(row + table_slot(base + half) + k0);
    q.c[0] = c.x, q.c[1] = c.y, q.c[2] = c.z, q.c[3] = c.w;
    q.s[0] = s.x, q.s[1] = s.y, q.s[2] = s.z, q.s[3] = s.w;
  } else if constexpr (kPairs == Pairs::kGptJ) {  // columns d / 2: two, each for an (even, odd) pair
    const float2 c = *reinterpret_cast<const float2*>(row + table_slot(d0 / 2));  // d0 / 2 even
    const float2 s =
        make_float2(row[table_slot(half + d0 / 2)], row[table_slot(half + d0 / 2 + 1)]);  // half may be odd
    q.c[0] = q.c[1] = c.x, q.c[2] = q.c[3] = c.y;
    q.s[0] = -s.x, q.s[1] = s.x, q.s[2] = -s.y, q.s[3] = s.y;
  } else {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int d = d0 + k;
      const int j = d < p.rotary_dim ? int(rope::pair_index(d, half, true)) : 0;
      q.c[k] = row[table_slot(j)];
      q.s[k] = rope::first_of_pair(d, half, true) ? -row[table_slot(half + j)] : row[table_slot(half + j)];
    }
  }
  return q;
}

// The unit's four quads read from the table row in global memory into registers (the common shape's decode kernel,
// which stages nothing: NeoX aligned, R = D), so that their loads go out before the unit's values arrive.
struct UnitTable {
  Quad quads[4];
};

// `row`: the position's table row; fp32 with 16-byte aligned rows (RopeLaunch::table16) in float4 loads, else one
// load per column (fp16 / bf16 widened exactly).
__device__ __forceinline__ UnitTable load_unit_table(const RopeParams& p, bool table16, const void* row,
                                                     uint32_t unit) {
  UnitTable t;
  const int half = int(p.rotary_dim / 2);
  const int base = int(unit) * 16 < half ? int(unit) * 16 : int(unit) * 16 - half;
  if (table16) {
    const float4* c = reinterpret_cast<const float4*>(static_cast<const float*>(row) + base);
    const float4* s = reinterpret_cast<const float4*>(static_cast<const float*>(row) + half + base);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float4 cv = __ldg(c + k), sv = __ldg(s + k);
      t.quads[k] = Quad{{cv.x, cv.y, cv.z, cv.w}, {sv.x, sv.y, sv.z, sv.w}};
    }
    return t;
  }
#pragma unroll
  for (int k = 0; k < 16; ++k) {
    t.quads[k / 4].c[k % 4] = rope::table_value(row, base + k, p.cos_sin_type);
    t.quads[k / 4].s[k % 4] = rope::table_value(row, half + base + k, p.cos_sin_type);
  }
  return t;
}

// Quad k0 / 4 of the unit: from the row staged in shared memory, or from the registers of load_unit_table.
template <Pairs kPairs>
__device__ __forceinline__ Quad quad_of(const RopeParams& p, const float* row, uint32_t unit, int k0) {
  return table_quad<kPairs>(p, row, unit, k0);
}

template <Pairs kPairs>
__device__ __forceinline__ Quad quad_of(const RopeParams&, const UnitTable& t, uint32_t, int k0) {
  return t.quads[k0 / 4];
}

// Two fp32 values rounded like round16 (NaN aside) and packed, lo in the low half: one hardware conversion.
template <bool kBF16>
__device__ __forceinline__ uint32_t round16x2(float lo, float hi) {
  uint32_t bits;
  if constexpr (kBF16) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    memcpy(&bits, &v, sizeof(bits));
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    memcpy(&bits, &v, sizeof(bits));
  }
  return bits;
}

// Bit 15 / 31 set where the low / high half of a packed pair is a NaN: its magnitude lies above infinity (bf16
// 0x7F80, fp16 0x7C00), so adding 0x7F / 0x3FF carries into the sign bit (and never across halves).
template <bool kBF16>
__device__ __forceinline__ uint32_t nan_halves(uint32_t w) {
  constexpr uint32_t below_infinity = kBF16 ? 0x007F007Fu : 0x03FF03FFu;
  return ((w & 0x7FFF7FFFu) + below_infinity) & 0x80008000u;
}

// NeoX partial rotary (R / 2 not a multiple of 16): the partner of each of the unit's values, read from the head's
// values staged contiguously in shared memory (`head`: its first value; half = R / 2); 0 past R.
__device__ __forceinline__ void staged_partner(const RopeParams& p, int64_t half, const uint16_t* head, uint32_t unit,
                                               uint32_t (&partner)[kWordsPerUnit]) {
#pragma unroll
  for (int k = 0; k < 16; ++k) {
    const int64_t d = int64_t(unit) * 16 + k;
    const uint32_t bits = d < p.rotary_dim ? head[rope::partner_dim(d, half, true)] : 0u;
    partner[k / 2] |= bits << (16 * (k % 2));
  }
}

// The NaNs among a unit's rounded values replaced by rope_rotation.h's canonical one (the hardware conversion's NaN
// may differ); whether there was one.
template <bool kBF16>
__device__ __forceinline__ bool canonicalise_nans(uint32_t (&out)[kWordsPerUnit]) {
  uint32_t nans = 0;
#pragma unroll
  for (int k = 0; k < 8; ++k) nans |= nan_halves<kBF16>(out[k]);
  if (nans != 0) {
    constexpr uint32_t canonical = kBF16 ? rope::kBF16NaN : rope::kFP16NaN;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const uint32_t halves = (nan_halves<kBF16>(out[k]) >> 15) * 0xFFFFu;  // 0xFFFF per NaN half
      out[k] = (out[k] & ~halves) | ((canonical | canonical << 16) & halves);
    }
  }
  return nans != 0;
}

// The unit's values rotated (dims < rotary_dim) and rounded back to 16 bits; value k's pair partner is value k of
// `partner` (NeoX) or the other half of its own word (GPT-J). A unit wholly below R (the common case) rounds two
// values per conversion and, with canonical_nans, canonicalises NaNs (rope_rotation.h) when one of the 16 is one.
// Returns, with canonical_nans, whether one of the 16 results is a NaN (false without).
template <bool kBF16, Pairs kPairs, Shape kShape, typename Table>
__device__ __forceinline__ bool rotate_unit(const RopeParams& p, const Table& row, uint32_t unit,
                                            const uint32_t (&w)[kWordsPerUnit],
                                            const uint32_t (&partner)[kWordsPerUnit], bool canonical_nans,
                                            uint32_t (&out)[kWordsPerUnit]) {
  const int rotated = int(p.rotary_dim) - int(unit) * 16;  // values of the unit below R (may exceed 16)
  uint32_t other[kWordsPerUnit];  // NeoX aligned: the partner values, negated for a first member (x (-s) == (-x) s)
  if constexpr (kPairs == Pairs::kNeoxAligned) {
    const uint32_t flip = int(unit) * 16 < int(p.rotary_dim / 2) ? 0x80008000u : 0u;
#pragma unroll
    for (int k = 0; k < 8; ++k) other[k] = partner[k] ^ flip;
  } else {
#pragma unroll
    for (int k = 0; k < 8; ++k) other[k] = partner[k];
  }
  if (common(kShape) || rotated >= 16) {
#pragma unroll
    for (int k0 = 0; k0 < 16; k0 += 4) {
      const Quad q = quad_of<kPairs>(p, row, unit, k0);
#pragma unroll
      for (int k = k0; k < k0 + 4; k += 2) {
        float turned[2];
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int kk = k + j;
          const uint32_t x_bits = kPairs == Pairs::kGptJ ? half_of(w, kk ^ 1) : half_of(other, kk);
          const float v = widen<kBF16>(half_of(w, kk)), x = widen<kBF16>(x_bits);
          turned[j] = __fadd_rn(__fmul_rn(v, q.c[kk - k0]), __fmul_rn(x, q.s[kk - k0]));
        }
        out[k / 2] = round16x2<kBF16>(turned[0], turned[1]);
      }
    }
    return canonical_nans && canonicalise_nans<kBF16>(out);
  }
  if constexpr (!common(kShape)) {  // a unit that R ends in or lies beyond (never in the common shape)
#pragma unroll
    for (int k0 = 0; k0 < 16; k0 += 4) {  // fully unrolled, no early exit: w and out stay in registers
      Quad q{};
      if (k0 < rotated) q = quad_of<kPairs>(p, row, unit, k0);
#pragma unroll
      for (int k = k0; k < k0 + 4; ++k) {
        const uint32_t bits = half_of(w, k);
        const uint32_t x_bits = kPairs == Pairs::kGptJ ? half_of(w, k ^ 1) : half_of(other, k);
        const float v = widen<kBF16>(bits), x = widen<kBF16>(x_bits);
        const uint32_t turned = round16<kBF16>(__fadd_rn(__fmul_rn(v, q.c[k - k0]), __fmul_rn(x, q.s[k - k0])));
        const uint32_t result = k < rotated ? turned : bits;  // beyond R: a bit copy
        if (k % 2 == 0) {
          out[k / 2] = result;
        } else {
          out[k / 2] |= result << 16;
        }
      }
    }
  }
  uint32_t nans = 0;  // (round16 has canonicalised them)
#pragma unroll
  for (int k = 0; canonical_nans && k < 8; ++k) nans |= nan_halves<kBF16>(out[k]);
  return nans != 0;
}

// The common shape's NeoX unit pair (u, u + G / 2) of one head, rotated by one thread: each unit's values are the
// other's partners and both read the same table columns (16 u .. 16 u + 15 of cos and sin), so each value and
// each column is widened or read once. x c - y s is rotate_unit's x c + y (-s) exactly (a product's sign is
// exact). Returns, with canonical_nans, bit 0 / 1: a NaN among the first / second unit's results.
template <bool kBF16>
__device__ __forceinline__ uint32_t rotate_unit_pair(const RopeParams& p, const float* row, uint32_t unit,
                                                     const uint32_t (&first)[kWordsPerUnit],
                                                     const uint32_t (&second)[kWordsPerUnit], bool canonical_nans,
                                                     uint32_t (&out_first)[kWordsPerUnit],
                                                     uint32_t (&out_second)[kWordsPerUnit]) {
  const int half = int(p.rotary_dim / 2);
#pragma unroll
  for (int k0 = 0; k0 < 16; k0 += 4) {
    const float4 c4 = *reinterpret_cast<const float4*>(row + table_slot(int(unit) * 16) + k0);
    const float4 s4 = *reinterpret_cast<const float4*>(row + table_slot(int(unit) * 16 + half) + k0);
    const float c[4] = {c4.x, c4.y, c4.z, c4.w}, s[4] = {s4.x, s4.y, s4.z, s4.w};
#pragma unroll
    for (int k = k0; k < k0 + 4; k += 2) {
      float x[2], y[2];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const float a = widen<kBF16>(half_of(first, k + j)), b = widen<kBF16>(half_of(second, k + j));
        x[j] = __fsub_rn(__fmul_rn(a, c[k + j - k0]), __fmul_rn(b, s[k + j - k0]));
        y[j] = __fadd_rn(__fmul_rn(b, c[k + j - k0]), __fmul_rn(a, s[k + j - k0]));
      }
      out_first[k / 2] = round16x2<kBF16>(x[0], x[1]);
      out_second[k / 2] = round16x2<kBF16>(y[0], y[1]);
    }
  }
  if (!canonical_nans) return 0;
  return uint32_t(canonicalise_nans<kBF16>(out_first)) | uint32_t(canonicalise_nans<kBF16>(out_second)) << 1;
}

struct Block {
  uint2 data;
  uint32_t sf;
};

// The optional 4-over-6 recipe, out of line: its registers do not weigh on the plain recipe's path.
template <bool kBF16>
__device__ __noinline__ Block quantize_unit_four_over_six(uint4 lo, uint4 hi, float s) {
  Block b;
  if (!block_quantizer::four_over_six_fast_scale(s)) {
    b.sf = block_quantizer::quantize_block_four_over_six<kBF16>(lo, hi, s, b.data);
    return b;
  }
  const uint32_t w[kWordsPerUnit] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
  b.sf = block_quantizer::quantize_block_four_over_six_fast<kBF16, false>(
      w, s, codec::kE2M1MaxValue * s, codec::kFourOverSixTarget * s, 0.0f, 0.0f, nullptr, nullptr, b.data);
  return b;
}

// The NVFP4 block of one unit with the call's recipe.
template <bool kBF16, Shape kShape>
__device__ __forceinline__ Block quantize_unit(const RopeParams& p, const uint32_t (&w)[kWordsPerUnit], float s,
                                               float inverse) {
  if (!common(kShape) && p.append.four_over_six) {
    return quantize_unit_four_over_six<kBF16>(make_uint4(w[0], w[1], w[2], w[3]), make_uint4(w[4], w[5], w[6], w[7]),
                                              s);
  }
  const float six_s = codec::kE2M1MaxValue * s;  // SPEC step 3: 6 * s rounded first
  const float* no_table[1] = {nullptr};
  Block b;
  uint8_t sf;
  block_quantizer::quantize_blocks<kBF16, 1, false>(w, &s, &six_s, &inverse, no_table, &b.data, &sf);
  b.sf = sf;
  return b;
}

template <Shape kShape>
__device__ __forceinline__ void store_block(const RopeLaunch& a, const CacheView& data_view, const CacheView& scales,
                                            bool trtllm, int64_t page, int64_t entry, int64_t head, uint32_t unit,
                                            int64_t blocks, uint8_t sf, uint2 data) {
  uint8_t* dst = data_view.at(page, entry, head) + unit * codec::kBlockBytes;
  if (common(kShape) || a.cache_store8) {
    *reinterpret_cast<uint2*>(dst) = data;
  } else {
#pragma unroll
    for (int k = 0; k < 4; ++k) dst[k] = uint8_t(data.x >> (8 * k)), dst[4 + k] = uint8_t(data.y >> (8 * k));
  }
  *scale_address(scales, trtllm, page, entry, head, unit, blocks) = sf;
}

// Where a work item's head lies.
struct Head {
  uint32_t index;   // in [0, Hq + 2 Hkv)
  int64_t kv_head;  // K / V: the head in key / value and the cache
  bool is_q;
  bool is_k;
};

__device__ __forceinline__ Head head_of(const RopeParams& p, uint32_t index) {
  Head h;
  h.index = index;
  h.is_q = index < p.num_q_heads;
  h.is_k = !h.is_q && index < p.num_q_heads + p.append.num_heads;
  h.kv_head = h.is_q ? 0 : (h.is_k ? index - p.num_q_heads : index - p.num_q_heads - p.append.num_heads);
  return h;
}

// The first of the unit's 16 input values.
__device__ __forceinline__ const uint16_t* item_source(const RopeParams& p, int64_t row, const Head& h, uint32_t unit) {
  const AppendParams& ap = p.append;
  if (h.is_q) return p.query.data + row * p.query.row_stride + h.index * p.query.head_stride + unit * 16;
  if (h.is_k) return ap.key.data + row * ap.key.row_stride + h.kv_head * ap.key.head_stride + unit * 16;
  return ap.value.data + row * ap.value.row_stride + h.kv_head * ap.value.head_stride + unit * 16;
}

template <Shape kShape>
__device__ __forceinline__ void load_item(const RopeParams& p, const RopeLaunch& a, int64_t row, const Head& h,
                                          uint32_t unit, uint32_t (&w)[kWordsPerUnit]) {
  if (h.is_q) {
    load_unit_plain(item_source(p, row, h, unit), common(kShape) || a.query16, w);
  } else if (h.is_k) {
    load_unit(item_source(p, row, h, unit), common(kShape) || a.key16, w);
  } else {
    load_unit(item_source(p, row, h, unit), common(kShape) || a.value16, w);
  }
}

// The global scale a K or V item is quantized with (a device scale is read here: kernels call this before they
// wait for their tables), whether it is usable, and the inverse of 6 s.
struct KvScale {
  float s;
  float six_s_inverse;
  bool usable;  // positive and finite: a bad device scale leaves those rows untouched
};

__device__ __forceinline__ KvScale kv_scale_of(const RopeParams& p, const Head& h) {
  KvScale k{0.0f, 0.0f, false};
  if (h.is_q) return k;
  k.s = global_scale(p.append, !h.is_k);
  k.usable = usable_global_scale(k.s);
  k.six_s_inverse = k.usable ? block_quantizer::division_inverse(codec::kE2M1MaxValue * k.s) : 0.0f;
  return k;
}

// Q to q_out, or K to k_out and the cache, or V to the cache: one head's unit as written (rotated, or V's values, or
// zeros outside the table); `nans`: a NaN among Q's values.
template <bool kBF16, Shape kShape>
__device__ __forceinline__ void emit_item(const RopeParams& p, const RopeLaunch& a, int64_t row, const Head& h,
                                          uint32_t unit, const uint32_t (&out)[kWordsPerUnit], bool nans,
                                          const append_kernel::Target& t, bool placed, float q_scale, float q_inverse,
                                          const KvScale& kv) {
  const AppendParams& ap = p.append;
  if (h.is_q) {
    if (!q_out_fp8<kShape>(p)) {
      store_unit16(
          static_cast<uint16_t*>(p.q_out.data) + row * p.q_out.row_stride + h.index * p.q_out.head_stride + unit * 16,
          common(kShape) || a.q_out16, out);
      return;
    }
    uint32_t bytes[4];  // values 4k .. 4k + 3 in bytes[k], two per conversion
    if (!nans && q_inverse != 0.0f) {
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        bytes[k] =
            block_quantizer::prmt(block_quantizer::nan_free_quotient_bytes2<kBF16>(out[2 * k], q_scale, q_inverse),
                                  block_quantizer::nan_free_quotient_bytes2<kBF16>(out[2 * k + 1], q_scale, q_inverse),
                                  0x5410u);  // the low 16 bits of both
      }
    } else {
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        uint32_t pairs[2];
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          pairs[j] =
              block_quantizer::quotient_bytes2(widen<kBF16>(half_of(out, 4 * k + 2 * j)),
                                               widen<kBF16>(half_of(out, 4 * k + 2 * j + 1)), q_scale, q_inverse);
        }
        bytes[k] = pairs[0] | pairs[1] << 16;
      }
    }
    uint8_t* dst =
        static_cast<uint8_t*>(p.q_out.data) + row * p.q_out.row_stride + h.index * p.q_out.head_stride + unit * 16;
    if (a.q_out16) {
      *reinterpret_cast<uint4*>(dst) = make_uint4(bytes[0], bytes[1], bytes[2], bytes[3]);
    } else {
#pragma unroll
      for (int k = 0; k < 16; ++k) dst[k] = uint8_t(bytes[k / 4] >> (8 * (k % 4)));
    }
    return;
  }
  if (!common(kShape) && h.is_k && p.k_out.data != nullptr) {
    store_unit16(
        static_cast<uint16_t*>(p.k_out.data) + row * p.k_out.row_stride + h.kv_head * p.k_out.head_stride + unit * 16,
        a.k_out16, out);
  }
  if (!placed || !append_kernel::finish_target(ap, t) || !kv.usable) return;
  const Block b = quantize_unit<kBF16, kShape>(p, out, kv.s, kv.six_s_inverse);
  const int64_t units = ap.head_dim / codec::kBlockSize;
  if (h.is_k) {
    store_block<kShape>(a, ap.k_data, ap.k_scales, false, t.page, t.entry, h.kv_head, unit, units, uint8_t(b.sf),
                        b.data);
  } else {
    store_block<kShape>(a, ap.v_data, ap.v_scales, ap.v_scales_trtllm, t.page, t.entry, h.kv_head, unit, units,
                        uint8_t(b.sf), b.data);
  }
}

// NaN bits matter in Q and k_out; the cache keeps only that a block holds a NaN (SPEC step 1).
template <Shape kShape>
__device__ __forceinline__ bool canonical_nans(const Head& h) {
  return h.is_q || !common(kShape);
}

// One head's unit after its partner exchange, rotated (Q, K) and emitted.
template <bool kBF16, Pairs kPairs, Shape kShape, typename Table>
__device__ __forceinline__ void write_item(const RopeParams& p, const RopeLaunch& a, const Table& table, bool in_table,
                                           int64_t row, const Head& h, uint32_t unit,
                                           const uint32_t (&w)[kWordsPerUnit], const uint32_t (&partner)[kWordsPerUnit],
                                           const append_kernel::Target& t, bool placed, float q_scale, float q_inverse,
                                           const KvScale& kv) {
  uint32_t out[kWordsPerUnit];
  bool nans = false;
  if (!in_table) {
#pragma unroll
    for (int k = 0; k < 8; ++k) out[k] = 0;  // outside the table: zero Q / k_out rows, nothing cached
  } else if (!h.is_q && !h.is_k) {
#pragma unroll
    for (int k = 0; k < 8; ++k) out[k] = w[k];
  } else {
    nans = rotate_unit<kBF16, kPairs, kShape>(p, table, unit, w, partner, canonical_nans<kShape>(h), out);
  }
  emit_item<kBF16, kShape>(p, a, row, h, unit, out, nans, t, placed, q_scale, q_inverse, kv);
}

// The common shape's unit pair (u, u + G / 2) of one head (rotate_unit_pair), rotated (Q, K) and emitted.
template <bool kBF16, Shape kShape>
__device__ __forceinline__ void write_item_pair(const RopeParams& p, const RopeLaunch& a, const float* table,
                                                bool in_table, int64_t row, const Head& h, uint32_t unit,
                                                const uint32_t (&w)[2][kWordsPerUnit], const append_kernel::Target& t,
                                                bool placed, float q_scale, float q_inverse, const KvScale& kv) {
  static_assert(common(kShape), "unit pairs are the common shape's");
  uint32_t out[2][kWordsPerUnit];
  uint32_t nans = 0;
  if (!in_table) {
#pragma unroll
    for (int k = 0; k < 8; ++k) out[0][k] = out[1][k] = 0;
  } else if (!h.is_q && !h.is_k) {
#pragma unroll
    for (int k = 0; k < 8; ++k) out[0][k] = w[0][k], out[1][k] = w[1][k];
  } else {
    nans = rotate_unit_pair<kBF16>(p, table, unit, w[0], w[1], canonical_nans<kShape>(h), out[0], out[1]);
  }
  const uint32_t partner_unit = unit + (1u << a.group_shift) / 2;
  emit_item<kBF16, kShape>(p, a, row, h, unit, out[0], nans & 1u, t, placed, q_scale, q_inverse, kv);
  emit_item<kBF16, kShape>(p, a, row, h, partner_unit, out[1], nans & 2u, t, placed, q_scale, q_inverse, kv);
}

}  // namespace
}  // namespace rope_unit
}  // namespace nvfp4kv
