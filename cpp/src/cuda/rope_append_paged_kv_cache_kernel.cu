// CUDA kernel of the fused RoPE + NVFP4 append (docs/SPEC.md section 5; RopeParams in rope_params.h).
//
// A row (token) is split into work items: a head of D values is G = next_pow2(D / 16) lanes of one warp, lane u of
// the group holding the head's 16-value unit u (8 packed 16-bit words: the NVFP4 block it becomes in the cache);
// item = head * G + unit over the row's heads Q [0, Hq), K [Hq, Hq + Hkv), V [Hq + Hkv, Hq + 2 Hkv). A CTA takes
// the items [chunk * span, (chunk + 1) * span) of its rows, thread t items t, t + threads, ... of them. Four
// shapes (docs/PERFORMANCE.md section 10 has their measurements):
//   the common shape (common_shape below) up to kDecodeKernelMaxRows rows: rope_append_decode_kernel, one row and
//     a 256-thread (16-bit Q) or 128-thread (FP8 Q) chunk per CTA, no shared memory and no barrier: each thread
//     loads its unit, its unit's table columns and (K/V) the row's index chain itself;
//   other shapes up to kRowsPerCtaMinRows rows (rope_append_kernel): one row and a 128-thread chunk per CTA (one
//     item per thread; only chunks holding K or V items follow the index chain);
//   prefill, 16-byte aligned inputs: rope_append_rows_kernel, 2 (common shape) or 4 rows of one chunk per CTA,
//     the inputs staged in shared memory by cp.async so that more bytes are in flight than registers could hold
//     (the common shape's instances: a NeoX unit pair per thread, 64 threads per 128-item chunk); the common shape
//     takes this kernel with one row per CTA (and 256-thread chunks with 16-bit Q) from kDecodeKernelMaxRows rows to
//     kRowsPerCtaMinRows;
//   one CTA per row (span = all items, up to 1024 threads): the test hook's "oneshot", and rows of more than
//     65535 chunks.
// Every CTA but the common decode kernel's stages its rows' cos/sin table rows in shared memory as float32 (one
// load per column, or in the multi-row common instances a 16-byte aligned float32 table copied by cp.async;
// rope_unit.cuh's table_slot places the columns).
// The per-unit work (pair partners, rounding, FP8 Q, quantization) is rope_unit.cuh's.
// Launched with programmatic dependent launch on sm_90+ (programmatic_launch.cuh).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "../rope_params.h"
#include "kernel_mode.h"
#include "kernels.h"
#include "programmatic_launch.cuh"
#include "rope_unit.cuh"

namespace nvfp4kv {
namespace {

constexpr uint32_t kLanes = 32;
constexpr uint32_t kMaxThreads = 1024;
constexpr uint32_t kChunkThreads = 128;
// The common shape's one-row instances with 16-bit Q (both kernels): chunks of 256 threads, a Llama row's Q in one CTA
// and its K and V in another (two CTAs per row instead of three; faster there, slower with FP8 Q: docs/PERFORMANCE.md
// section 10, r14).
constexpr uint32_t kWideChunkThreads = 256;
constexpr uint32_t kMaxChunks = 65535;  // gridDim.y
constexpr int64_t kRowsPerCtaMinRows = 1024;
// The common shape's barrier-free decode kernel up to this many rows, and above them the rows kernel's one-row
// instances, which fit four CTAs of 256 threads per SM to its three (on an H100 the decode kernel is 0.05 us faster
// at 64 rows and 1.3 us slower at 256: docs/PERFORMANCE.md section 10, r15).
constexpr int64_t kDecodeKernelMaxRows = 64;
constexpr int kRowsKernelCtasPerSm = 8;  // 64 registers: 32 warps per SM
// The decode kernel holds its unit's table in registers: 80 registers, 24 warps per SM.
constexpr int kDecodeCtasPerSm = 6;
// The common shape with several rows per CTA (unit pairs, 64 threads): 64 registers, 32 warps per SM (sm_90: no
// spills).
constexpr int kUnitPairCtasPerSm = 16;

using namespace rope_unit;

// The common shape's multi-row instances give each thread a NeoX unit pair (u, u + G / 2) of one head
// (rope_unit.cuh's write_item_pair): a chunk's items on half as many threads.
template <Shape kShape, int kRows>
__host__ __device__ constexpr bool unit_pairs() {
  return common(kShape) && kRows > 1;
}

// Items per CTA of an instance of rope_append_rows_kernel (and with kRows = 1 of rope_append_decode_kernel).
template <Shape kShape, int kRows>
__host__ __device__ constexpr uint32_t rows_kernel_items() {
  return kShape == Shape::kCommonQ16 && kRows == 1 ? kWideChunkThreads : kChunkThreads;
}

// Threads per CTA of such an instance (its __launch_bounds__; a call's CTAs may be smaller: launch_rows).
template <Shape kShape, int kRows>
__host__ __device__ constexpr uint32_t rows_kernel_threads() {
  return rows_kernel_items<kShape, kRows>() / (unit_pairs<kShape, kRows>() ? 2 : 1);
}

template <bool kBF16, Pairs kPairs>
__global__ void __launch_bounds__(kMaxThreads)
    rope_append_kernel(const __grid_constant__ RopeParams p, const __grid_constant__ RopeLaunch a) {
  extern __shared__ uint32_t staged[];  // kNeoxStaged: blockDim.x units
  __shared__ __align__(16) float table[table_floats(kRopeMaxHeadDim)];
  const int64_t row = blockIdx.x;
  const uint32_t lane = threadIdx.x % kLanes;
  const uint32_t group = 1u << a.group_shift;
  const uint32_t unit = threadIdx.x & (group - 1);
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

  // The loads that depend on no other go out first: the rope position, the row's level-1 index values, the
  // first item's inputs; then the rest of the index chain (index_chain.cuh), whose page id only the K/V stores
  // wait for, and the table row, staged in shared memory for the whole CTA.
  const AppendParams& ap = p.append;
  const int64_t position = p.rope_positions[row];
  const uint32_t first_item = blockIdx.y * a.span;
  const bool has_kv_items = first_item + a.span > (p.num_q_heads << a.group_shift);
  const bool placeable = row < a.placeable_rows && has_kv_items;
  append_kernel::RowIndices indices{0, 0, 0, 0};
  if (placeable) indices = append_kernel::load_row_indices<void>(ap, a, row);
  const float q_scale = p.q_out_fp8 ? rope_q_scale(p) : 1.0f;
  const bool write_q = !p.q_out_fp8 || usable_global_scale(q_scale);  // a bad device scale leaves Q untouched
  uint32_t w[kWordsPerUnit] = {};
  Head h = head_of(p, (first_item + threadIdx.x) >> a.group_shift);
  bool active = first_item + threadIdx.x < a.items && has_unit && (!h.is_q || write_q);
  if (active) load_item<Shape::kAny>(p, a, row, h, unit, w);
  const float q_inverse = p.q_out_fp8 ? block_quantizer::division_inverse(q_scale) : 0.0f;
  const bool in_table = position >= 0 && position < p.max_pos;
  append_kernel::Target target{0, 0, false};
  const bool placed = placeable && in_table;
  if (placed) target = append_kernel::start_target<void, true>(ap, a, row, indices);
  const void* source = rope_table_row(p, in_table ? position : 0);
  for (int j = int(threadIdx.x); j < int(p.rotary_dim) + kTablePad; j += int(blockDim.x))
    table[table_slot(j)] = in_table && j < p.rotary_dim ? rope::table_value(source, j, p.cos_sin_type) : 0.0f;
  __syncthreads();

  for (uint32_t i = 0; i < a.iterations; ++i) {
    if (i > 0) {
      const uint32_t item = first_item + threadIdx.x + i * blockDim.x;
      h = head_of(p, item >> a.group_shift);
      active = item < a.items && has_unit && (!h.is_q || write_q);
#pragma unroll
      for (int k = 0; k < 8; ++k) w[k] = 0;
      if (active) load_item<Shape::kAny>(p, a, row, h, unit, w);
    }
    // Partner values (whole-warp operations: every lane takes part in every iteration).
    uint32_t partner[kWordsPerUnit] = {};
    if constexpr (kPairs == Pairs::kNeoxAligned) {
#pragma unroll
      for (int k = 0; k < 8; ++k) partner[k] = __shfl_sync(0xFFFFFFFFu, w[k], partner_lane % kLanes);
    } else if constexpr (kPairs == Pairs::kNeoxStaged) {
      uint32_t* mine = staged + threadIdx.x * kWordsPerUnit;
      __syncwarp();
#pragma unroll
      for (int k = 0; k < 8; ++k) mine[k] = w[k];
      __syncwarp();
      staged_partner(p, half, reinterpret_cast<const uint16_t*>(staged + (threadIdx.x - unit) * kWordsPerUnit), unit,
                     partner);
    }
    if (active)
      write_item<kBF16, kPairs, Shape::kAny>(p, a, table, in_table, row, h, unit, w, partner, target, placed, q_scale,
                                             q_inverse, kv_scale_of(p, h));
  }
}

// 16 bytes from global to shared memory without a register (cp.async, sm_80+), cached in L1 like the plain loads.
__device__ __forceinline__ void copy16_async(void* shared, const void* global) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 16;\n" ::"r"(uint32_t(__cvta_generic_to_shared(shared))),
               "l"(global));
}

__device__ __forceinline__ void wait_async_copies() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

// A unit staged in shared memory (16-byte aligned) with its two 16-byte halves swapped or not.
__device__ __forceinline__ void read_staged_unit(const uint32_t (&staged)[kWordsPerUnit], uint32_t swapped,
                                                 uint32_t (&w)[kWordsPerUnit]) {
  const uint4 lo = reinterpret_cast<const uint4*>(staged)[swapped];
  const uint4 hi = reinterpret_cast<const uint4*>(staged)[swapped ^ 1u];
  w[0] = lo.x, w[1] = lo.y, w[2] = lo.z, w[3] = lo.w, w[4] = hi.x, w[5] = hi.y, w[6] = hi.z, w[7] = hi.w;
}

// Prefill shape: CTA (group of kRows rows, 128-item chunk) with 16-byte aligned inputs. Each thread's unit (unit
// pair in the common instances) of every row of the group goes to shared memory by cp.async (bytes in flight without
// registers held), the rows' positions and table rows are loaded once for all of them, and lane r < kRows of the last
// warp follows row r's index chain for the CTA; one barrier, then each thread works through its item row by row. Pair
// partners are read from the staged units. Index: the type of every index tensor and the RoPE positions (void: a mix).
// Load order, so that a decode row waits two memory round trips before its barrier: level 1 of the chains, the
// positions (kept as loaded) and the input copies go out together; then the chain lanes load their page ids
// while the other warps load the table rows.
template <bool kBF16, Pairs kPairs, Shape kShape, int kRows, typename Index>
__global__ void __launch_bounds__(rows_kernel_threads<kShape, kRows>(),
                                  unit_pairs<kShape, kRows>()
                                      ? kUnitPairCtasPerSm
                                      : kRowsKernelCtasPerSm * kChunkThreads / rows_kernel_threads<kShape, kRows>())
    rope_append_rows_kernel(const __grid_constant__ RopeParams p, const __grid_constant__ RopeLaunch a) {
  constexpr bool kUnitPairs = unit_pairs<kShape, kRows>();
  __shared__ __align__(16) uint32_t units[kRows][rows_kernel_items<kShape, kRows>()][kWordsPerUnit];
  extern __shared__ __align__(16) float tables[];  // kRows rows of table_floats(R)
  __shared__ append_kernel::Target targets[kRows];
  const int64_t row0 = int64_t(blockIdx.x) * kRows;
  const uint32_t group = 1u << a.group_shift;
  const uint32_t slot = threadIdx.x & (group - 1);  // the thread's place in its head's lane group
  // Unit pairs: thread t takes units u = t % (G / 2) and u + G / 2 of the chunk's head t / (G / 2). One-row common
  // instances: the pair partners u and u + G / 2 on lanes 2 i and 2 i + 1, so that the two lanes read the same table
  // addresses (a 16-byte shared load then returns two lanes' registers per wavefront). Elsewhere u = slot.
  const uint32_t half_group = group / 2;
  const uint32_t unit = kUnitPairs       ? threadIdx.x & (half_group - 1)
                        : common(kShape) ? (slot >> 1) | ((slot & 1u) << (a.group_shift - 1))
                                         : slot;
  // One-row common instances: the halves of the units of lanes with bit 2 set staged swapped, so that 8 consecutive
  // lanes' 16-byte reads of units 32 bytes apart fall in different banks.
  const uint32_t swapped = common(kShape) ? (threadIdx.x >> 2) & 1u : 0u;
  // Chunks in reverse: the K/V chunk, whose CTAs follow the index chain and quantize, is dispatched first and
  // gets an SM of its own when a call has more CTAs than SMs.
  const uint32_t chunk = gridDim.y - 1 - blockIdx.y;
  const uint32_t item =
      chunk * a.span + (kUnitPairs ? (threadIdx.x >> (a.group_shift - 1) << a.group_shift) + unit : threadIdx.x);
  const Head h = head_of(p, item >> a.group_shift);
  const bool has_kv_items = (chunk + 1) * a.span > (p.num_q_heads << a.group_shift);
  const AppendParams& ap = p.append;
  // The index chain of row r runs in lane r of the last warp (wraps to >= kRows outside that warp).
  const uint32_t chain_lane = threadIdx.x - (blockDim.x - kLanes);
  const int64_t chain_row = row0 + chain_lane;
  const bool chain = chain_lane < kRows && has_kv_items && chain_row < a.placeable_rows;
  const auto chain_addresses = append_kernel::row_index_addresses<Index>(ap, a, chain ? chain_row : 0);
  // What the thread stages of each row (addresses only: computed before the wait): its own unit's two halves, or in
  // the one-row common instances half e = t % 2 of its lane pair's unit u (the one below G / 2), then of unit
  // u + G / 2, so that each copy instruction moves whole units (complete 32-byte sectors): faster at decode, slower
  // with several rows per CTA (docs/PERFORMANCE.md section 10, r12).
  constexpr bool kPairCopies = common(kShape) && kRows == 1;
  const uint32_t pair_half = kPairCopies ? threadIdx.x & 1u : 0u;
  const uint16_t* inputs[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    inputs[r] =
        kPairCopies ? item_source(p, row0 + r, h, slot >> 1) + 8 * pair_half : item_source(p, row0 + r, h, unit);
  }
  programmatic_launch::warm_parameter_cache(p, a);
  programmatic_launch::wait_for_previous_kernel();  // before the first global memory access
  programmatic_launch::allow_next_kernel();

  append_kernel::RowIndicesOf<append_kernel::LoadedIndex<Index>> indices{0, 0, 0, 0};
  if (chain) indices = append_kernel::load_row_indices_as_loaded<Index>(ap, a, chain_row, chain_addresses);
  const bool q_fp8 = q_out_fp8<kShape>(p);
  const float q_scale = q_fp8 ? rope_q_scale(p) : 1.0f;
  const bool write_q = !q_fp8 || usable_global_scale(q_scale);  // a bad device scale leaves Q untouched
  const bool active = item < a.items && (common(kShape) || unit < uint32_t(ap.head_dim / codec::kBlockSize)) &&
                      (!h.is_q || write_q) && (!kUnitPairs || threadIdx.x < a.span / 2);
  // Unit pairs: the thread's 4 16-byte pieces (u's halves, then u + G / 2's) in units[r][2 t .. 2 t + 1], piece i in
  // slot i ^ twist, so that any 8 consecutive lanes' 16-byte reads of one piece fall in different banks.
  const uint32_t twist = (threadIdx.x >> 1) & 3u;
  append_kernel::LoadedIndex<Index> positions[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int64_t row = row0 + r;
    positions[r] = row < p.rows ? append_kernel::read_loaded_index<Index>(p.rope_positions, row) : -1;
    if (active && row < p.rows) {
      if constexpr (kUnitPairs) {
#pragma unroll
        for (uint32_t piece = 0; piece < 4; ++piece) {
          copy16_async(reinterpret_cast<uint4*>(units[r]) + 4 * threadIdx.x + (piece ^ twist),
                       inputs[r] + (piece >> 1) * half_group * 16 + (piece & 1u) * 8);
        }
      } else if constexpr (kPairCopies) {
        copy16_async(&units[r][threadIdx.x & ~1u][4 * (swapped ^ pair_half)], inputs[r]);
        copy16_async(&units[r][threadIdx.x | 1u][4 * (swapped ^ pair_half)], inputs[r] + (group / 2) * 16);
      } else {
        copy16_async(&units[r][threadIdx.x][4 * swapped], inputs[r]);
        copy16_async(&units[r][threadIdx.x][4 * (swapped ^ 1u)], inputs[r] + 8);
      }
    }
  }
  if (chain_lane < kRows) {  // row r's cache target, for every thread of the CTA (used if in the table)
    append_kernel::Target t{0, 0, false};
    if (chain) {
      t = append_kernel::start_target<Index, true>(ap, a, chain_row, indices);
      t.ok = append_kernel::finish_target(ap, t);
    }
    targets[chain_lane] = t;
  }
  // The rows' tables, staged by the warps that follow no chain (all of them in a CTA that follows none), two
  // columns of every row per step: all of a step's loads go out before its first store waits.
  const uint32_t stagers = has_kv_items && blockDim.x > kLanes ? blockDim.x - kLanes : blockDim.x;
  const int columns = table_columns(p.rotary_dim);
  const int floats = table_floats(p.rotary_dim);
  uint32_t in_table_rows = 0;  // bit r: row r's position lies in the table
  const void* sources[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const bool in_table = positions[r] >= 0 && positions[r] < p.max_pos;
    in_table_rows |= uint32_t(in_table) << r;
    sources[r] = rope_table_row(p, in_table ? int64_t(positions[r]) : 0);
  }
  // Multi-row common instances (prefill) with a float32 table whose rows are 16-byte aligned: the rows copied as
  // they are, 16 bytes per instruction (cos | sin; the common shape's reads stay below R, so the padding is not
  // written), without a register or a conversion. The one-row instances keep the loads: a copy's wait would sit
  // on decode's path before the barrier (docs/PERFORMANCE.md section 10, ta and r13).
  constexpr bool kCopyTable = common(kShape) && kRows > 1;
  const bool copy_table = kCopyTable && a.table16;
  if (copy_table) {
    const uint32_t chunks = uint32_t(p.rotary_dim / 4);  // 16-byte chunks per row
#pragma unroll
    for (int r = 0; r < kRows; ++r) {  // unrolled: sources[] stays in registers
      for (uint32_t k = threadIdx.x; ((in_table_rows >> r) & 1u) && k < chunks && threadIdx.x < stagers; k += stagers) {
        copy16_async(tables + r * floats + table_slot(int(4 * k)), static_cast<const float*>(sources[r]) + 4 * k);
      }
    }
  }
  for (uint32_t j0 = threadIdx.x; !copy_table && j0 < uint32_t(columns) && threadIdx.x < stagers; j0 += 2 * stagers) {
    uint32_t bits[kRows][2];  // zero bits: 0.0f in every table type
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
#pragma unroll
      for (int step = 0; step < 2; ++step) {
        const uint32_t j = j0 + step * stagers;
        const bool load = ((in_table_rows >> r) & 1u) && j < p.rotary_dim;
        bits[r][step] = load ? rope::table_bits(sources[r], j, p.cos_sin_type) : 0u;
      }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
#pragma unroll
      for (int step = 0; step < 2; ++step) {
        const uint32_t j = j0 + step * stagers;
        if (j < uint32_t(columns)) {
          tables[r * floats + table_slot(int(j))] = rope::table_value_of_bits(bits[r][step], p.cos_sin_type);
        }
      }
    }
  }
  const float q_inverse = q_fp8 ? block_quantizer::division_inverse(q_scale) : 0.0f;
  // The K/V scale: read before the barrier in the common instances (a device scale's load then overlaps the
  // table's), with each row's write in the others, whose registers are full before it.
  KvScale kv{0.0f, 0.0f, false};
  if constexpr (common(kShape)) kv = kv_scale_of(p, h);
  wait_async_copies();
  __syncthreads();
  if (!active) return;

  const int64_t half = p.rotary_dim / 2;
  const uint32_t unit_shift = uint32_t(half / 16);
  const uint32_t head_base = threadIdx.x - slot;
  // The partner unit u +- m / 16 of the same head (NeoX aligned), staged by this thread's neighbour in the common
  // instances, whose halves are swapped as this thread's are.
  const uint32_t partner_thread = common(kShape)              ? threadIdx.x ^ 1u
                                  : int64_t(unit) * 16 < half ? head_base + unit + unit_shift
                                                              : head_base + unit - unit_shift;
  for (int r = 0; r < kRows && row0 + r < p.rows; ++r) {
    const bool in_table = (in_table_rows >> r) & 1u;
    const append_kernel::Target t = targets[r];
    if constexpr (kUnitPairs) {
      uint32_t pair[2][kWordsPerUnit];
      const uint4* pieces = reinterpret_cast<const uint4*>(units[r]) + 4 * threadIdx.x;
#pragma unroll
      for (uint32_t piece = 0; piece < 4; ++piece) {
        const uint4 v = pieces[piece ^ twist];
        uint32_t* dst = &pair[piece >> 1][4 * (piece & 1u)];
        dst[0] = v.x, dst[1] = v.y, dst[2] = v.z, dst[3] = v.w;
      }
      write_item_pair<kBF16, kShape>(p, a, tables + r * floats, in_table, row0 + r, h, unit, pair, t, t.ok && in_table,
                                     q_scale, q_inverse, kv);
      continue;
    }
    uint32_t w[kWordsPerUnit], partner[kWordsPerUnit] = {};
    read_staged_unit(units[r][threadIdx.x], swapped, w);
    if constexpr (kPairs == Pairs::kNeoxAligned) {
      read_staged_unit(units[r][partner_thread], swapped, partner);
    } else if constexpr (kPairs == Pairs::kNeoxStaged) {
      staged_partner(p, half, reinterpret_cast<const uint16_t*>(&units[r][head_base][0]), unit, partner);
    }
    write_item<kBF16, kPairs, kShape>(p, a, tables + r * floats, in_table, row0 + r, h, unit, w, partner, t,
                                      t.ok && in_table, q_scale, q_inverse, common(kShape) ? kv : kv_scale_of(p, h));
  }
}

// The common shape up to kDecodeKernelMaxRows rows: CTA (row, chunk of rows_kernel_items<kShape, 1> items), no shared
// memory and no barrier. Each thread loads its unit into registers, its unit's cos/sin columns from the table row
// (load_unit_table) and, in K/V threads, the row's index chain itself (the warp's lanes load the same addresses); the
// NeoX partner, unit u +- G / 2 on the neighbour lane (the rows kernel's lane pairs), comes by shuffle. Load order:
// level 1 of the chain, the RoPE position and the unit's values together; then the table row and the page id, while the
// values are in flight.
template <bool kBF16, Shape kShape, typename Index>
__global__ void __launch_bounds__(rows_kernel_threads<kShape, 1>(),
                                  kDecodeCtasPerSm* kChunkThreads / rows_kernel_threads<kShape, 1>())
    rope_append_decode_kernel(const __grid_constant__ RopeParams p, const __grid_constant__ RopeLaunch a) {
  static_assert(common(kShape), "the decode kernel serves the common shape");
  constexpr Pairs kPairs = Pairs::kNeoxAligned;
  const int64_t row = blockIdx.x;
  const uint32_t slot = threadIdx.x & ((1u << a.group_shift) - 1);
  const uint32_t unit = (slot >> 1) | ((slot & 1u) << (a.group_shift - 1));  // lane pairs (u, u + G / 2)
  const uint32_t chunk = gridDim.y - 1 - blockIdx.y;  // the K/V chunk first, as in the rows kernel
  const uint32_t item = chunk * a.span + threadIdx.x;
  const Head h = head_of(p, item >> a.group_shift);
  const AppendParams& ap = p.append;
  const bool kv_item = item < a.items && !h.is_q;
  const bool chain = kv_item && row < a.placeable_rows;
  const auto chain_addresses = append_kernel::row_index_addresses<Index>(ap, a, chain ? row : 0);
  const uint16_t* input = item_source(p, row, h, unit);
  programmatic_launch::warm_parameter_cache(p, a);
  programmatic_launch::wait_for_previous_kernel();  // before the first global memory access
  programmatic_launch::allow_next_kernel();

  append_kernel::RowIndicesOf<append_kernel::LoadedIndex<Index>> indices{0, 0, 0, 0};
  if (chain) indices = append_kernel::load_row_indices_as_loaded<Index>(ap, a, row, chain_addresses);
  const append_kernel::LoadedIndex<Index> position = append_kernel::read_loaded_index<Index>(p.rope_positions, row);
  const bool loaded = item < a.items;
  uint32_t w[kWordsPerUnit] = {};
  if (loaded) {
    if (h.is_q) {
      load_unit_plain(input, true, w);
    } else {
      load_unit(input, true, w);
    }
  }
  const bool q_fp8 = q_out_fp8<kShape>(p);
  const float q_scale = q_fp8 ? rope_q_scale(p) : 1.0f;
  const bool in_table = position >= 0 && position < p.max_pos;
  UnitTable table{};
  if (loaded && in_table && (h.is_q || h.is_k)) {
    table = load_unit_table(p, a.table16, rope_table_row(p, int64_t(position)), unit);
  }
  append_kernel::PendingTarget<Index> target{0, 0, false};
  if (chain) target = append_kernel::start_pending_target<Index, true>(ap, a, row, indices);
  const KvScale kv = kv_scale_of(p, h);
  const bool write_q = !q_fp8 || usable_global_scale(q_scale);  // a bad device scale leaves Q untouched
  const float q_inverse = q_fp8 ? block_quantizer::division_inverse(q_scale) : 0.0f;
  uint32_t partner[kWordsPerUnit];  // every lane of the warp takes part
#pragma unroll
  for (int k = 0; k < 8; ++k) partner[k] = __shfl_xor_sync(0xFFFFFFFFu, w[k], 1);
  if (!loaded || (h.is_q && !write_q)) return;
  const append_kernel::Target t = append_kernel::resolved(target);
  write_item<kBF16, kPairs, kShape>(p, a, table, in_table, row, h, unit, w, partner, t, t.ok && in_table, q_scale,
                                    q_inverse, kv);
}

bool aligned16(const void* pointer, int64_t row_stride, int64_t head_stride, int64_t item) {
  return reinterpret_cast<uintptr_t>(pointer) % 16 == 0 && (row_stride * item) % 16 == 0 &&
         (head_stride * item) % 16 == 0;
}

bool aligned8(const CacheView& c) {
  return reinterpret_cast<uintptr_t>(c.data) % 8 == 0 && c.page_stride % 8 == 0 && c.entry_stride % 8 == 0 &&
         c.head_stride % 8 == 0;
}

// Threads of a CTA of at most `limit` threads over `items` items: whole warps.
uint32_t cta_threads(uint64_t items, uint32_t limit) {
  return uint32_t(std::min<uint64_t>(limit, (items + kLanes - 1) / kLanes * kLanes));
}

// The launch arguments of chunked calls for an instance of rope_append_rows_kernel or rope_append_decode_kernel: chunks
// of rows_kernel_items<kShape, kRows>() items (wider than the launcher's kChunkThreads in some: fewer of them).
template <Shape kShape, int kRows>
RopeLaunch with_instance_chunks(const RopeLaunch& chunked) {
  RopeLaunch a = chunked;
  a.span = cta_threads(a.items, rows_kernel_items<kShape, kRows>());
  return a;
}

template <bool kBF16, Pairs kPairs, Shape kShape = Shape::kAny, int kRows = 4, typename Index = void>
cudaError_t launch_rows(const RopeParams& p, const RopeLaunch& chunked, cudaStream_t stream, bool programmatic) {
  const RopeLaunch a = with_instance_chunks<kShape, kRows>(chunked);
  const uint32_t threads = unit_pairs<kShape, kRows>() ? cta_threads(a.span / 2, a.span) : a.span;
  const dim3 grid(uint32_t((p.rows + kRows - 1) / kRows), (a.items + a.span - 1) / a.span), block(threads);
  const size_t table_bytes = kRows * table_floats(p.rotary_dim) * sizeof(float);
  return programmatic_launch::launch_with_shared(rope_append_rows_kernel<kBF16, kPairs, kShape, kRows, Index>, grid,
                                                 block, table_bytes, stream, programmatic, p, a);
}

template <bool kBF16, Shape kShape, typename Index>
cudaError_t launch_decode(const RopeParams& p, const RopeLaunch& chunked, cudaStream_t stream, bool programmatic) {
  const RopeLaunch a = with_instance_chunks<kShape, 1>(chunked);
  const dim3 grid(uint32_t(p.rows), (a.items + a.span - 1) / a.span), block(a.span);
  return programmatic_launch::launch_with_shared(rope_append_decode_kernel<kBF16, kShape, Index>, grid, block, 0,
                                                 stream, programmatic, p, a);
}

// The common shape (Llama-like calls), which has its own instances of the decode and rows kernels: NeoX pairs over the
// whole head, a power-of-two number of units per head, no k_out, the plain recipe, 16-byte Q/K/V loads and Q stores,
// 8-byte cache stores.
bool common_shape(const RopeParams& p, const RopeLaunch& a, Pairs pairs) {
  const uint32_t units = uint32_t(p.append.head_dim / codec::kBlockSize);
  return pairs == Pairs::kNeoxAligned && p.rotary_dim == p.append.head_dim && (1u << a.group_shift) == units &&
         p.k_out.data == nullptr && !p.append.four_over_six && a.query16 && a.key16 && a.value16 && a.q_out16 &&
         a.cache_store8;
}

// Kernel and rows per CTA (docs/PERFORMANCE.md section 10): the common shape takes its decode kernel up to
// kDecodeKernelMaxRows rows, the rows kernel with one row per CTA below kRowsPerCtaMinRows rows (faster than
// rope_append_kernel there), and from there on 2 (unit pairs; with FP8 Q 4 rows per CTA were 12-23% slower, their
// shared memory capping the CTAs per SM, docs/PERFORMANCE.md r17); other shapes take 4 from kRowsPerCtaMinRows on.
template <bool kBF16, typename Index>
cudaError_t launch_common(const RopeParams& p, const RopeLaunch& a, bool rows_per_cta, cudaStream_t stream,
                          bool programmatic) {
  constexpr Pairs kNeox = Pairs::kNeoxAligned;
  const bool decode = p.rows <= kDecodeKernelMaxRows;
  if (p.q_out_fp8) {
    if (rows_per_cta) return launch_rows<kBF16, kNeox, Shape::kCommonQFp8, 2, Index>(p, a, stream, programmatic);
    if (decode) return launch_decode<kBF16, Shape::kCommonQFp8, Index>(p, a, stream, programmatic);
    return launch_rows<kBF16, kNeox, Shape::kCommonQFp8, 1, Index>(p, a, stream, programmatic);
  }
  if (rows_per_cta) return launch_rows<kBF16, kNeox, Shape::kCommonQ16, 2, Index>(p, a, stream, programmatic);
  if (decode) return launch_decode<kBF16, Shape::kCommonQ16, Index>(p, a, stream, programmatic);
  return launch_rows<kBF16, kNeox, Shape::kCommonQ16, 1, Index>(p, a, stream, programmatic);
}

// The common instances are built per index dtype (the cache indices and the RoPE positions: one load per value
// when they share one, docs/PERFORMANCE.md r9); the other shapes read through IndexView.
template <bool kBF16>
cudaError_t launch_common_index(const RopeParams& p, const RopeLaunch& a, bool rows_per_cta, cudaStream_t stream,
                                bool programmatic) {
  switch (append_kernel::index_types(p.append, &p.rope_positions)) {
    case append_kernel::IndexTypes::kInt32:
      return launch_common<kBF16, int32_t>(p, a, rows_per_cta, stream, programmatic);
    case append_kernel::IndexTypes::kInt64:
      return launch_common<kBF16, int64_t>(p, a, rows_per_cta, stream, programmatic);
    default: return launch_common<kBF16, void>(p, a, rows_per_cta, stream, programmatic);
  }
}

template <bool kBF16>
cudaError_t launch_pairs(const RopeParams& p, const RopeLaunch& a, Pairs pairs, uint32_t threads, bool aligned_chunks,
                         bool rows_per_cta, cudaStream_t stream) {
  const bool programmatic = programmatic_launch::enabled_on_current_device();
  if (aligned_chunks && common_shape(p, a, pairs)) {
    return launch_common_index<kBF16>(p, a, rows_per_cta, stream, programmatic);
  }
  if (rows_per_cta) {
    switch (pairs) {
      case Pairs::kGptJ: return launch_rows<kBF16, Pairs::kGptJ>(p, a, stream, programmatic);
      case Pairs::kNeoxAligned: return launch_rows<kBF16, Pairs::kNeoxAligned>(p, a, stream, programmatic);
      default: return launch_rows<kBF16, Pairs::kNeoxStaged>(p, a, stream, programmatic);
    }
  }
  const dim3 grid(uint32_t(p.rows), (a.items + a.span - 1) / a.span), block(threads);
  switch (pairs) {
    case Pairs::kGptJ:
      return programmatic_launch::launch_with_shared(rope_append_kernel<kBF16, Pairs::kGptJ>, grid, block, 0, stream,
                                                     programmatic, p, a);
    case Pairs::kNeoxAligned:
      return programmatic_launch::launch_with_shared(rope_append_kernel<kBF16, Pairs::kNeoxAligned>, grid, block, 0,
                                                     stream, programmatic, p, a);
    default:
      return programmatic_launch::launch_with_shared(rope_append_kernel<kBF16, Pairs::kNeoxStaged>, grid, block,
                                                     threads * kWordsPerUnit * sizeof(uint32_t), stream, programmatic,
                                                     p, a);
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
  while ((1u << a.group_shift) < units) ++a.group_shift;
  const uint64_t items = uint64_t(p.num_q_heads + 2 * p.append.num_heads) << a.group_shift;
  if (items >= (uint64_t(1) << 31)) {
    *error_string = "too many heads for one launch";
    return cudaErrorInvalidValue;
  }
  a.items = uint32_t(items);
  const bool chunked =
      kernel_mode::forced() != kernel_mode::kForceOneShot && items <= uint64_t(kMaxChunks) * kChunkThreads;
  const uint32_t threads = cta_threads(items, chunked ? kChunkThreads : kMaxThreads);
  a.span = chunked ? threads : a.items;
  a.iterations = (a.span + threads - 1) / threads;
  const int64_t q_out_item = p.q_out_fp8 ? 1 : 2;
  a.query16 = aligned16(p.query.data, p.query.row_stride, p.query.head_stride, 2);
  a.key16 = aligned16(p.append.key.data, p.append.key.row_stride, p.append.key.head_stride, 2);
  a.value16 = aligned16(p.append.value.data, p.append.value.row_stride, p.append.value.head_stride, 2);
  a.q_out16 = aligned16(p.q_out.data, p.q_out.row_stride, p.q_out.head_stride, q_out_item);
  a.k_out16 = p.k_out.data == nullptr || aligned16(p.k_out.data, p.k_out.row_stride, p.k_out.head_stride, 2);
  a.cache_store8 = aligned8(p.append.k_data) && aligned8(p.append.v_data);
  a.table16 = p.cos_sin_type == rope::TableType::kFloat32 && reinterpret_cast<uintptr_t>(p.cos_sin) % 16 == 0 &&
              (p.cos_sin_row_stride * 4) % 16 == 0 && p.rotary_dim % 4 == 0;
  const int64_t half = p.rotary_dim / 2;
  const Pairs pairs = !p.neox ? Pairs::kGptJ : half % 16 == 0 ? Pairs::kNeoxAligned : Pairs::kNeoxStaged;
  // The rows kernel takes chunks with 16-byte aligned inputs ("split" keeps the decode kernel): several rows per
  // CTA from kRowsPerCtaMinRows rows on ("pair" forces it), one below (common shape only).
  const int forced = kernel_mode::forced();
  const bool aligned_chunks = chunked && a.query16 && a.key16 && a.value16 && forced != kernel_mode::kForceSplit;
  const bool rows_per_cta = aligned_chunks && (forced == kernel_mode::kForcePair || p.rows >= kRowsPerCtaMinRows);
  const auto s = static_cast<cudaStream_t>(stream);
  const cudaError_t error = p.append.input_is_bf16
                                ? launch_pairs<true>(p, a, pairs, threads, aligned_chunks, rows_per_cta, s)
                                : launch_pairs<false>(p, a, pairs, threads, aligned_chunks, rows_per_cta, s);
  if (error != cudaSuccess) *error_string = cudaGetErrorString(error);
  return int(error);
}

}  // namespace nvfp4kv
