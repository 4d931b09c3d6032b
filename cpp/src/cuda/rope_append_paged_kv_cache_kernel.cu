// CUDA kernel of the fused RoPE + NVFP4 append (docs/SPEC.md section 5; RopeParams in rope_params.h).
//
// One CTA per row (token). A head of D values is G = next_pow2(D / 16) lanes of one warp, lane u of the group
// holding the head's 16-value unit u (16 values, 8 packed 16-bit words: the NVFP4 block it becomes in the cache),
// so a warp holds 32 / G heads and the CTA's kThreads / G head slots walk the row's heads: Q heads
// [0, Hq), K heads [Hq, Hq + Hkv), V heads [Hq + Hkv, Hq + 2 Hkv). Each thread loads its unit's cos/sin once
// per row and reuses them for every Q and K head it visits.
//
// A rotated value needs its pair partner (rope_rotation.h):
//   GPT-J (2j, 2j + 1): the other half of the same packed word;
//   NeoX (j, j + m), m % 16 == 0: the whole unit u +- m / 16 of the same head, by 8 warp shuffles;
//   NeoX otherwise (partial rotary such as R = 20): the warp's units staged in shared memory, read per value.
// Then Q goes to q_out (16-bit or FP8 E4M3), K to k_out, and for placed rows (row < nnz, position in the table,
// a target that passes the bounds contract of append_params.h) the rotated K and the plain V are quantized
// (block_quantizer.cuh; four_over_six_quantizer.cuh for scale_search "4over6") into the cache.
// Launched with programmatic dependent launch on sm_90+ (programmatic_launch.cuh).
#include <cuda_runtime.h>

#include <cstdint>

#include "../rope_params.h"
#include "block_quantizer.cuh"
#include "four_over_six_quantizer.cuh"
#include "index_chain.cuh"
#include "kernels.h"
#include "programmatic_launch.cuh"

namespace nvfp4kv {
namespace {

constexpr uint32_t kLanes = 32;
constexpr uint32_t kThreads = 256;
constexpr uint32_t kWordsPerUnit = 8;  // 16 values of 16 bits

enum class Pairs { kGptJ, kNeoxAligned, kNeoxStaged };

// Per-call choices made on the host. page_size, quotient_limit and speculate_batch are what index_chain.cuh reads.
struct RopeLaunch {
  append_kernel::Divisor page_size;  // position or slot -> page, for values below quotient_limit
  uint64_t quotient_limit;           // 2^31, or 0 when page_size >= 2^31 (then always a 64-bit division)
  bool speculate_batch;              // nnz == batch_size (decode): kv_indptr[row], [row + 1] loaded early
  int64_t placeable_rows;            // nnz, or 0 when no row can land (the index chain's clamps need non-empty tensors)
  uint32_t group;                    // G: lanes per head (a power of two, >= units per head)
  uint32_t slots;                    // kThreads / G: heads a CTA works on at once
  uint32_t heads;                    // Hq + 2 Hkv
  uint32_t iterations;               // ceil(heads / slots): the same for every thread (shuffles need the whole warp)
  bool query16;                      // 16-byte loads / stores allowed (address and strides)
  bool key16;
  bool value16;
  bool q_out16;
  bool k_out16;
  bool cache_store8;  // 8-byte packed-data stores into both data caches
  bool table_vector;  // 16-byte cos/sin loads (load_unit_table)
};

__device__ __forceinline__ void load_unit(const uint16_t* src, bool vector, uint32_t (&w)[kWordsPerUnit]) {
  if (vector) {
    const uint4 lo = __ldg(reinterpret_cast<const uint4*>(src));
    const uint4 hi = __ldg(reinterpret_cast<const uint4*>(src) + 1);
    w[0] = lo.x, w[1] = lo.y, w[2] = lo.z, w[3] = lo.w, w[4] = hi.x, w[5] = hi.y, w[6] = hi.z, w[7] = hi.w;
    return;
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) w[i] = uint32_t(src[2 * i]) | uint32_t(src[2 * i + 1]) << 16;
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

// cos and sin of the unit's 16 dims (NeoX: pair index j = d or d - m; GPT-J: d / 2), in registers.
struct UnitTable {
  float c[16];
  float s[16];
};

__device__ __forceinline__ void load4(const float* src, float* dst) {
  const float4 v = __ldg(reinterpret_cast<const float4*>(src));
  dst[0] = v.x, dst[1] = v.y, dst[2] = v.z, dst[3] = v.w;
}

// `vector`: a float32 table whose rows and halves allow 16-byte loads, and units that lie wholly inside the
// rotary dims or wholly outside (checked on the host); else one load per value.
__device__ __forceinline__ UnitTable load_unit_table(const RopeParams& p, const void* row, uint32_t unit, bool vector) {
  UnitTable t;
  const int64_t half = p.rotary_dim / 2;
  if (vector) {
    const float* f = static_cast<const float*>(row);
    if (p.neox) {  // j = d or d - m, 16 consecutive columns
      const int64_t first = int64_t(unit) * 16 < half ? int64_t(unit) * 16 : int64_t(unit) * 16 - half;
#pragma unroll
      for (int q = 0; q < 4; ++q) load4(f + first + 4 * q, t.c + 4 * q), load4(f + half + first + 4 * q, t.s + 4 * q);
    } else {  // j = d / 2: 8 consecutive columns, each for a pair of values
      float c[8], s[8];
      const int64_t first = int64_t(unit) * 8;
#pragma unroll
      for (int q = 0; q < 2; ++q) load4(f + first + 4 * q, c + 4 * q), load4(f + half + first + 4 * q, s + 4 * q);
#pragma unroll
      for (int k = 0; k < 16; ++k) t.c[k] = c[k / 2], t.s[k] = s[k / 2];
    }
    return t;
  }
#pragma unroll
  for (int k = 0; k < 16; ++k) {
    const int64_t d = int64_t(unit) * 16 + k;
    const int64_t j = d < p.rotary_dim ? rope::pair_index(d, half, p.neox) : 0;
    t.c[k] = rope::table_value(row, j, p.cos_sin_type);
    t.s[k] = rope::table_value(row, half + j, p.cos_sin_type);
  }
  return t;
}

// The unit's values rotated (dims < rotary_dim) and rounded back to 16 bits; value k's pair partner is value k of
// `partner` (NeoX) or the other half of its own word (GPT-J).
template <bool kBF16, Pairs kPairs>
__device__ __forceinline__ void rotate_unit(const RopeParams& p, uint32_t unit, const UnitTable& t,
                                            const uint32_t (&w)[kWordsPerUnit],
                                            const uint32_t (&partner_words)[kWordsPerUnit],
                                            uint32_t (&out)[kWordsPerUnit]) {
  const int64_t half = p.rotary_dim / 2;
#pragma unroll
  for (int k = 0; k < 16; ++k) {
    const int64_t d = int64_t(unit) * 16 + k;
    uint16_t bits = half_of(w, k);
    if (d < p.rotary_dim) {
      const uint16_t partner = kPairs == Pairs::kGptJ ? half_of(w, k ^ 1) : half_of(partner_words, k);
      const float v = rope::float_from_bits(bits, kBF16), x = rope::float_from_bits(partner, kBF16);
      bits =
          rope::bits_from_float(rope::rotated_value(rope::first_of_pair(d, half, p.neox), v, x, t.c[k], t.s[k]), kBF16);
    }
    if (k % 2 == 0) {
      out[k / 2] = bits;
    } else {
      out[k / 2] |= uint32_t(bits) << 16;
    }
  }
}

// The NVFP4 block of one unit with the call's recipe: its scale byte, its 8 data bytes in `data`.
template <bool kBF16>
__device__ __forceinline__ uint8_t quantize_unit(const RopeParams& p, const uint32_t (&w)[kWordsPerUnit], float s,
                                                 uint2& data) {
  if (p.append.four_over_six) {
    if (block_quantizer::four_over_six_fast_scale(s)) {
      return block_quantizer::quantize_block_four_over_six_fast<kBF16, false>(
          w, s, codec::kE2M1MaxValue * s, codec::kFourOverSixTarget * s, 0.0f, 0.0f, nullptr, nullptr, data);
    }
    return block_quantizer::quantize_block_four_over_six<kBF16>(make_uint4(w[0], w[1], w[2], w[3]),
                                                                make_uint4(w[4], w[5], w[6], w[7]), s, data);
  }
  const float six_s = codec::kE2M1MaxValue * s;  // SPEC step 3: 6 * s rounded first
  const float inverse = 0.0f;                    // an IEEE division per block
  const float* no_table[1] = {nullptr};
  uint8_t sf;
  block_quantizer::quantize_blocks<kBF16, 1, false>(w, &s, &six_s, &inverse, no_table, &data, &sf);
  return sf;
}

__device__ __forceinline__ void store_block(const RopeLaunch& a, const CacheView& data_view, const CacheView& scales,
                                            bool trtllm, int64_t page, int64_t entry, int64_t head, uint32_t unit,
                                            int64_t blocks, uint8_t sf, uint2 data) {
  uint8_t* dst = data_view.at(page, entry, head) + unit * codec::kBlockBytes;
  if (a.cache_store8) {
    *reinterpret_cast<uint2*>(dst) = data;
  } else {
#pragma unroll
    for (int k = 0; k < 4; ++k) dst[k] = uint8_t(data.x >> (8 * k)), dst[4 + k] = uint8_t(data.y >> (8 * k));
  }
  *scale_address(scales, trtllm, page, entry, head, unit, blocks) = sf;
}

// Q to q_out, or K to k_out and the cache, or V to the cache: one head's unit after its partner exchange.
template <bool kBF16, Pairs kPairs>
__device__ __forceinline__ void write_unit(const RopeParams& p, const RopeLaunch& a, const void* table, bool rotates,
                                           const UnitTable& t, int64_t row, uint32_t head, uint32_t unit,
                                           const uint32_t (&w)[kWordsPerUnit], const uint32_t (&partner)[kWordsPerUnit],
                                           bool placed, int64_t page, int64_t entry, float k_scale, float v_scale,
                                           float q_scale) {
  const AppendParams& ap = p.append;
  const bool is_q = head < p.num_q_heads;
  const bool is_k = !is_q && head < p.num_q_heads + ap.num_heads;
  const int64_t kv_head = is_q ? 0 : (is_k ? head - p.num_q_heads : head - p.num_q_heads - ap.num_heads);
  uint32_t out[kWordsPerUnit];
  if (table == nullptr) {
#pragma unroll
    for (int k = 0; k < 8; ++k) out[k] = 0;  // outside the table: zero Q / k_out rows, nothing cached
  } else if ((is_q || is_k) && rotates) {
    rotate_unit<kBF16, kPairs>(p, unit, t, w, partner, out);
  } else {
#pragma unroll
    for (int k = 0; k < 8; ++k) out[k] = w[k];
  }
  if (is_q) {
    if (!p.q_out_fp8) {
      store_unit16(
          static_cast<uint16_t*>(p.q_out.data) + row * p.q_out.row_stride + head * p.q_out.head_stride + unit * 16,
          a.q_out16, out);
      return;
    }
    uint32_t bytes[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      bytes[k] = 0;
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        const uint16_t bits = half_of(out, 4 * k + b);
        bytes[k] |= uint32_t(q_fp8_byte(rope::float_from_bits(bits, kBF16), q_scale)) << (8 * b);
      }
    }
    uint8_t* dst =
        static_cast<uint8_t*>(p.q_out.data) + row * p.q_out.row_stride + head * p.q_out.head_stride + unit * 16;
    if (a.q_out16) {
      *reinterpret_cast<uint4*>(dst) = make_uint4(bytes[0], bytes[1], bytes[2], bytes[3]);
    } else {
#pragma unroll
      for (int k = 0; k < 16; ++k) dst[k] = uint8_t(bytes[k / 4] >> (8 * (k % 4)));
    }
    return;
  }
  if (is_k && p.k_out.data != nullptr) {
    store_unit16(
        static_cast<uint16_t*>(p.k_out.data) + row * p.k_out.row_stride + kv_head * p.k_out.head_stride + unit * 16,
        a.k_out16, out);
  }
  const float s = is_k ? k_scale : v_scale;
  if (!placed || !usable_global_scale(s)) return;  // a bad device scale leaves those rows untouched
  uint2 data;
  const uint8_t sf = quantize_unit<kBF16>(p, out, s, data);
  const int64_t units = ap.head_dim / codec::kBlockSize;
  if (is_k) {
    store_block(a, ap.k_data, ap.k_scales, false, page, entry, kv_head, unit, units, sf, data);
  } else {
    store_block(a, ap.v_data, ap.v_scales, ap.v_scales_trtllm, page, entry, kv_head, unit, units, sf, data);
  }
}

// Each thread takes kHeadsPerPass heads per pass, their loads issued together (bytes in flight per thread).
constexpr uint32_t kHeadsPerPass = 2;

// The inputs of pass i: heads slot + (i + h) * slots, h < kHeadsPerPass (inactive: no head, no unit, or a Q head
// whose FP8 scale is unusable).
__device__ __forceinline__ void load_pass(const RopeParams& p, const RopeLaunch& a, int64_t row, uint32_t slot,
                                          uint32_t unit, bool has_unit, bool write_q, uint32_t i,
                                          uint32_t (&w)[kHeadsPerPass][kWordsPerUnit], bool (&active)[kHeadsPerPass]) {
  const AppendParams& ap = p.append;
#pragma unroll
  for (uint32_t h = 0; h < kHeadsPerPass; ++h) {
    const uint32_t head = slot + (i + h) * a.slots;
    const bool is_q = head < p.num_q_heads;
    active[h] = head < a.heads && has_unit && (!is_q || write_q);
#pragma unroll
    for (int k = 0; k < 8; ++k) w[h][k] = 0;
    if (!active[h]) continue;
    if (is_q) {
      load_unit_plain(p.query.data + row * p.query.row_stride + head * p.query.head_stride + unit * 16, a.query16,
                      w[h]);
    } else if (head < p.num_q_heads + ap.num_heads) {
      const int64_t kv_head = head - p.num_q_heads;
      load_unit(ap.key.data + row * ap.key.row_stride + kv_head * ap.key.head_stride + unit * 16, a.key16, w[h]);
    } else {
      const int64_t kv_head = head - p.num_q_heads - ap.num_heads;
      load_unit(ap.value.data + row * ap.value.row_stride + kv_head * ap.value.head_stride + unit * 16, a.value16,
                w[h]);
    }
  }
}

template <bool kBF16, Pairs kPairs>
__global__ void __launch_bounds__(kThreads, 2)
    rope_append_kernel(const __grid_constant__ RopeParams p, const __grid_constant__ RopeLaunch a) {
  __shared__ uint32_t staged[kPairs == Pairs::kNeoxStaged ? kThreads * kWordsPerUnit : 1];
  const int64_t row = blockIdx.x;
  const uint32_t lane = threadIdx.x % kLanes;
  const uint32_t unit = threadIdx.x % a.group;
  const uint32_t slot = threadIdx.x / a.group;
  const bool has_unit = unit < uint32_t(p.append.head_dim / codec::kBlockSize);
  const int64_t half = p.rotary_dim / 2;
  // NeoX, m % 16 == 0: the partner unit u +- m / 16 of the same head, on this group's lanes.
  const uint32_t group_base = lane - unit;
  const uint32_t unit_shift = uint32_t(half / 16);
  const uint32_t partner_lane = int64_t(unit) * 16 < half ? group_base + unit + unit_shift
                                                          : group_base + unit - (unit >= unit_shift ? unit_shift : 0);
  programmatic_launch::warm_parameter_cache(p, a);
  programmatic_launch::wait_for_previous_kernel();  // before the first global memory access
  programmatic_launch::allow_next_kernel();

  // Every load that depends on no other goes out first: the rope position, the row's level-1 index values and
  // the first pass's inputs; then the table row and the rest of the index chain (index_chain.cuh), whose page
  // id is only waited for by the first K/V store.
  const AppendParams& ap = p.append;
  const void* table = rope_table_row(p, row);
  const bool placeable = row < a.placeable_rows;
  append_kernel::RowIndices indices{0, 0, 0, 0};
  if (placeable) indices = append_kernel::load_row_indices<void>(ap, a, row);
  const float q_scale = p.q_out_fp8 ? rope_q_scale(p) : 1.0f;
  const bool write_q = !p.q_out_fp8 || usable_global_scale(q_scale);  // a bad device scale leaves Q untouched
  uint32_t w[kHeadsPerPass][kWordsPerUnit];
  bool active[kHeadsPerPass];
  load_pass(p, a, row, slot, unit, has_unit, write_q, 0, w, active);
  const bool rotates = table != nullptr && has_unit && int64_t(unit) * 16 < p.rotary_dim;
  UnitTable t{};
  if (rotates) t = load_unit_table(p, table, unit, a.table_vector);
  append_kernel::Target target{0, 0, false};
  if (placeable && table != nullptr) target = append_kernel::start_target<void, true>(ap, a, row, indices);
  const bool placed = placeable && table != nullptr && append_kernel::finish_target(ap, target);
  const float k_scale = placed ? global_scale(ap, false) : 0.0f;
  const float v_scale = placed ? global_scale(ap, true) : 0.0f;

  for (uint32_t i = 0; i < a.iterations; i += kHeadsPerPass) {
    if (i > 0) load_pass(p, a, row, slot, unit, has_unit, write_q, i, w, active);
    // Partner values (whole-warp operations: every lane takes part in every pass).
    uint32_t partner[kHeadsPerPass][kWordsPerUnit] = {};
    if constexpr (kPairs == Pairs::kNeoxAligned) {
#pragma unroll
      for (uint32_t h = 0; h < kHeadsPerPass; ++h) {
#pragma unroll
        for (int k = 0; k < 8; ++k) partner[h][k] = __shfl_sync(0xFFFFFFFFu, w[h][k], partner_lane % kLanes);
      }
    } else if constexpr (kPairs == Pairs::kNeoxStaged) {
#pragma unroll
      for (uint32_t h = 0; h < kHeadsPerPass; ++h) {
        uint32_t* mine = staged + threadIdx.x * kWordsPerUnit;
        __syncwarp();
#pragma unroll
        for (int k = 0; k < 8; ++k) mine[k] = w[h][k];
        __syncwarp();
        const uint16_t* group = reinterpret_cast<const uint16_t*>(staged + (threadIdx.x - unit) * kWordsPerUnit);
#pragma unroll
        for (int k = 0; k < 16; ++k) {
          const int64_t d = int64_t(unit) * 16 + k;
          const uint32_t bits = d < p.rotary_dim ? group[rope::partner_dim(d, half, true)] : 0u;
          partner[h][k / 2] |= bits << (16 * (k % 2));
        }
      }
    }
#pragma unroll
    for (uint32_t h = 0; h < kHeadsPerPass; ++h) {
      if (active[h]) {
        write_unit<kBF16, kPairs>(p, a, table, rotates, t, row, slot + (i + h) * a.slots, unit, w[h], partner[h],
                                  placed, target.page, target.entry, k_scale, v_scale, q_scale);
      }
    }
  }
}

bool aligned16(const void* pointer, int64_t row_stride, int64_t head_stride, int64_t item) {
  return reinterpret_cast<uintptr_t>(pointer) % 16 == 0 && (row_stride * item) % 16 == 0 &&
         (head_stride * item) % 16 == 0;
}

bool aligned8(const CacheView& c) {
  return reinterpret_cast<uintptr_t>(c.data) % 8 == 0 && c.page_stride % 8 == 0 && c.entry_stride % 8 == 0 &&
         c.head_stride % 8 == 0;
}

template <bool kBF16>
cudaError_t launch_pairs(const RopeParams& p, const RopeLaunch& a, Pairs pairs, cudaStream_t stream) {
  const bool programmatic = programmatic_launch::enabled_on_current_device();
  const dim3 grid(uint32_t(p.rows)), block(kThreads);
  switch (pairs) {
    case Pairs::kGptJ:
      return programmatic_launch::launch(rope_append_kernel<kBF16, Pairs::kGptJ>, grid, block, stream, programmatic, p,
                                         a);
    case Pairs::kNeoxAligned:
      return programmatic_launch::launch(rope_append_kernel<kBF16, Pairs::kNeoxAligned>, grid, block, stream,
                                         programmatic, p, a);
    default:
      return programmatic_launch::launch(rope_append_kernel<kBF16, Pairs::kNeoxStaged>, grid, block, stream,
                                         programmatic, p, a);
  }
}

}  // namespace

int launch_rope_append_paged_kv_cache(const RopeParams& p, void* stream, const char** error_string) {
  *error_string = "";
  if (p.rows == 0) return cudaSuccess;
  if (p.rows >= (int64_t(1) << 31)) {
    *error_string = "too many rows for one launch";
    return cudaErrorInvalidValue;
  }
  RopeLaunch a{};
  const bool small_pages = p.append.page_size < (int64_t(1) << 31);
  a.page_size = append_kernel::Divisor::make(small_pages ? uint32_t(p.append.page_size) : 1u);
  a.quotient_limit = small_pages ? uint64_t(1) << 31 : 0;
  const bool slot_mapping = p.append.slot_mapping.data != nullptr;
  a.speculate_batch = !slot_mapping && p.append.nnz == p.append.batch_size;
  const bool no_target =
      p.append.num_pages == 0 || (!slot_mapping && (p.append.batch_size == 0 || p.append.kv_indices.size == 0));
  a.placeable_rows = no_target ? 0 : p.append.nnz;
  const uint32_t units = uint32_t(p.append.head_dim / codec::kBlockSize);  // <= 32 (kRopeMaxHeadDim)
  a.group = 1;
  while (a.group < units) a.group *= 2;
  a.slots = kThreads / a.group;
  a.heads = uint32_t(p.num_q_heads + 2 * p.append.num_heads);
  a.iterations = (a.heads + a.slots - 1) / a.slots;
  const int64_t q_in_item = 2, q_out_item = p.q_out_fp8 ? 1 : 2;
  a.query16 = aligned16(p.query.data, p.query.row_stride, p.query.head_stride, q_in_item);
  a.key16 = aligned16(p.append.key.data, p.append.key.row_stride, p.append.key.head_stride, 2);
  a.value16 = aligned16(p.append.value.data, p.append.value.row_stride, p.append.value.head_stride, 2);
  a.q_out16 = aligned16(p.q_out.data, p.q_out.row_stride, p.q_out.head_stride, q_out_item);
  a.k_out16 = p.k_out.data == nullptr || aligned16(p.k_out.data, p.k_out.row_stride, p.k_out.head_stride, 2);
  a.cache_store8 = aligned8(p.append.k_data) && aligned8(p.append.v_data);
  const int64_t half = p.rotary_dim / 2;
  a.table_vector = p.cos_sin_type == rope::TableType::kFloat32 && reinterpret_cast<uintptr_t>(p.cos_sin) % 16 == 0 &&
                   p.cos_sin_row_stride % 4 == 0 && (p.neox ? half % 16 == 0 : p.rotary_dim % 32 == 0);
  const Pairs pairs = !p.neox ? Pairs::kGptJ : (p.rotary_dim / 2) % 16 == 0 ? Pairs::kNeoxAligned : Pairs::kNeoxStaged;
  const auto s = static_cast<cudaStream_t>(stream);
  const cudaError_t error =
      p.append.input_is_bf16 ? launch_pairs<true>(p, a, pairs, s) : launch_pairs<false>(p, a, pairs, s);
  if (error != cudaSuccess) *error_string = cudaGetErrorString(error);
  return int(error);
}

}  // namespace nvfp4kv
