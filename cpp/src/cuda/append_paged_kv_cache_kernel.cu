// CUDA kernel of nvfp4kv::append_paged_kv_cache and of its slot-mapping variant.
//
// Layouts (strides resolved on the host into AppendParams, see append_params.h):
//   append_key / append_value  [nnz, num_heads, head_dim]                 fp16 or bf16, last dim contiguous
//   K/V data cache             NHD [pages, page_size, heads, head_dim/2]  or  HND [pages, heads, page_size, head_dim/2]
//   K/V scale cache            the same with head_dim/16 float8_e4m3fn bytes
//   index tensors              batch_indices, positions [nnz]; kv_indptr [batch_size + 1]; kv_indices [*];
//                              or slot_mapping [nnz]; int32 or int64, any stride, read as given
//
// Work split. A thread owns kBlocks (1 or 2) consecutive 16-value blocks of one (row, head):
//   pair mode (prefill): for K and for V, 2 blocks each when head_dim / 16 is even, so K and V are one
//     launch and every thread has 128 bytes of loads in flight; 64 registers, 32 warps per SM;
//   split mode (calls of at most 2^16 blocks per tensor, i.e. decode): 1 block of K or of V per thread,
//     so a small call has many short threads and its latency is shorter.
// Consecutive threads walk the blocks of a head row, then heads, (then K/V,) then rows: the 16-byte
// input loads of a warp are contiguous, and so are its packed stores in the NHD layout.
//
// Order inside a thread, chosen so that loads overlap:
//   0. wait for the previous kernel of the stream (programmatic launch, programmatic_launch.cuh); the
//      one-item-per-thread kernel first warms the constant cache with its parameters and computes the
//      addresses of step 1's loads and, in split mode (decode), the store addresses but for the entry's
//      and page's terms and the reciprocal of 6 s of a scale passed by value, so that little but loads
//      is left after the wait (decode's latency; split mode runs CTAs of kSplitModeThreads = 128 threads,
//      so that a small call spreads over more SMs: one warp per scheduler);
//   1. issue the input loads (they depend on no index), the row's level-1 index loads and (split mode)
//      the loads of device scales;
//   2. fill the CTA's reciprocal tables (pair mode) while they are in flight;
//   3. resolve the index chain up to issuing the load of the page id (batch index -> kv_indptr ->
//      kv_indices). When nnz == batch_size kv_indptr[row] is loaded with batch_indices[row] on the
//      bet b == row (decode), which removes one dependent load. Every index used for a load is
//      clamped into its tensor and a flag says whether the row is written (the one-item kernel loads
//      the page id before checking, and computes the page-independent store addresses while it is in
//      flight). In pair mode with at least
//      9 threads per row, warp 0 resolves the chains of all the CTA's rows (one per lane) for the
//      whole CTA, and in the page-table variant does nothing else (append_paged_kv_cache_pair_kernel);
//   4. quantize (block_quantizer.cuh; the optional 4-over-6 recipe four_over_six_quantizer.cuh, which
//      the pair kernel runs one block at a time from shared memory, quantize_item_staged) while the
//      page id is in flight;
//   5. store 8 or 16 packed bytes and 1 or 2 scale bytes per tensor (V scales byte by byte in the
//      optional "trtllm" layout).
// Building blocks beside this file: launch_args.cuh (the work split's divisors and per-call choices),
// index_chain.cuh (step 3), block_quantizer.cuh and four_over_six_quantizer.cuh (step 4),
// block_io.cuh (steps 1 and 5), kernel_mode.h (the tests' kernel-mode hook), programmatic_launch.cuh
// (step 0).
// docs/PERFORMANCE.md has the measured numbers and what each design choice bought.
#include <cuda_runtime.h>

#include <cstdint>

#include "block_io.cuh"
#include "block_quantizer.cuh"
#include "four_over_six_quantizer.cuh"
#include "index_chain.cuh"
#include "kernel_mode.h"
#include "kernels.h"
#include "launch_args.cuh"
#include "named_barrier.cuh"
#include "programmatic_launch.cuh"
#include "schedule_hint.cuh"

namespace nvfp4kv {
namespace {

using namespace append_kernel;  // NOLINT(build/namespaces): the kernels' building blocks

// ---------------------------------------------------------------------------------------------
// One thread's work item: kBlocks blocks of one (row, head) for K and V (pair mode) or for one of them.

struct Item {
  int64_t row;
  uint32_t head;
  uint32_t column;  // first value of the item's blocks in the head row
  bool is_value;    // split mode: the item is V (else K)
};

template <bool kSplit, int kBlocks>
__device__ __forceinline__ Item locate(uint32_t item, const LaunchArgs& a) {
  Item it;
  const uint32_t row_in_launch = a.items_per_row.div(item);
  uint32_t in_row = item - row_in_launch * a.items_per_row.d;
  it.is_value = false;
  if constexpr (kSplit) {
    it.is_value = a.items_per_tensor.div(in_row) != 0;
    in_row -= it.is_value ? a.items_per_tensor.d : 0;
  }
  it.head = a.groups_per_head.div(in_row);
  const uint32_t group = in_row - it.head * a.groups_per_head.d;
  it.row = a.row_begin + row_in_launch;
  it.column = group * kBlocks * codec::kBlockSize;
  return it;
}

// Where the item's input words are: blocks [0, kBlocks) are K (or the split item's tensor), the rest V.
struct ItemSources {
  const uint16_t* first;
  const uint16_t* second;  // pair mode
};

template <bool kSplit>
__device__ __forceinline__ ItemSources item_sources(const AppendParams& p, const Item& it) {
  const RowsView& first = it.is_value ? p.value : p.key;
  ItemSources s{first.data + it.row * first.row_stride + it.head * first.head_stride + it.column, nullptr};
  if constexpr (!kSplit) {
    s.second = p.value.data + it.row * p.value.row_stride + it.head * p.value.head_stride + it.column;
  }
  return s;
}

template <int kBlocks, bool kVector, bool kSplit>
__device__ __forceinline__ void load_item(const ItemSources& s, uint32_t* w) {
  load_values<kBlocks, kVector>(s.first, w);
  if constexpr (!kSplit) load_values<kBlocks, kVector>(s.second, w + 8 * kBlocks);
}

// The global scales of an item: its first tensor's (K, or the split item's tensor) and V's (pair mode).
// A device scale is a load: the one-item kernel issues it beside the input loads, so that the
// quantization does not wait for it after the index chain.
struct ItemScales {
  float first;
  float value;
};

template <bool kSplit>
__device__ __forceinline__ ItemScales item_scales(const AppendParams& p, const Item& it) {
  return {global_scale(p, it.is_value), kSplit ? 0.0f : global_scale(p, true)};
}

// The quantized blocks of one item: kN = kBlocks (split mode) or 2 kBlocks (K then V).
template <int kN>
struct Quantized {
  uint2 data[kN];
  uint8_t sf[kN];
  float k_scale;  // the item's first tensor's global scale (K, or the split item's tensor)
  float v_scale;
};

// Quantize an item with global scales g. `reciprocal` and `inverses` (fill_reciprocal_tables) are the
// CTA's shared tables when kTables; split mode computes 1 / (sf s) (one block per thread gains nothing
// from a table) and takes division_inverse(6 s) as split_inverse (0: the IEEE division), which the
// kernel computes while the inputs are in flight.
template <bool kBF16, int kBlocks, bool kSplit, bool kFourOverSix, bool kTables>
__device__ __forceinline__ Quantized<kSplit ? kBlocks : 2 * kBlocks> quantize_item(
    const ItemScales& g, const Item& it, const uint32_t* w,
    const float (*reciprocal)[block_quantizer::kReciprocalTableSize], const float* inverses, const float* scaled,
    float split_inverse = 0.0f) {
  constexpr int kN = kSplit ? kBlocks : 2 * kBlocks;
  Quantized<kN> q;
  q.k_scale = g.first;  // split mode: the item's tensor
  q.v_scale = g.value;
  if constexpr (kFourOverSix) {  // the optional 4-over-6 recipe, block by block
    if (!block_quantizer::four_over_six_fast_scale(q.k_scale) ||
        !block_quantizer::four_over_six_fast_scale(q.v_scale)) {
#pragma unroll
      for (int i = 0; i < kN; ++i) {
        q.sf[i] = block_quantizer::quantize_block_four_over_six<kBF16>(
            make_uint4(w[8 * i], w[8 * i + 1], w[8 * i + 2], w[8 * i + 3]),
            make_uint4(w[8 * i + 4], w[8 * i + 5], w[8 * i + 6], w[8 * i + 7]), i < kBlocks ? q.k_scale : q.v_scale,
            q.data[i]);
      }
      return q;
    }
#pragma unroll
    for (int i = 0; i < kN; ++i) {
      const float s = i < kBlocks ? q.k_scale : q.v_scale;
      const bool value = i < kBlocks ? it.is_value : true;
      q.sf[i] = block_quantizer::quantize_block_four_over_six_fast<kBF16, kTables>(
          w + 8 * i, s, codec::kE2M1MaxValue * s, codec::kFourOverSixTarget * s, kTables ? inverses[value] : 0.0f,
          kTables ? inverses[2 + value] : 0.0f, kTables ? reciprocal[value] : nullptr, scaled, q.data[i]);
    }
  } else {
    float s[kN], six_s[kN], inverse[kN];
    const float* tables[kN];
#pragma unroll
    for (int i = 0; i < kN; ++i) {
      const bool value = i < kBlocks ? it.is_value : true;
      s[i] = i < kBlocks ? q.k_scale : q.v_scale;
      six_s[i] = codec::kE2M1MaxValue * s[i];  // SPEC step 3: 6 * s rounded first
      inverse[i] = kTables ? inverses[value] : split_inverse;
      tables[i] = kTables ? reciprocal[value] : nullptr;
    }
    block_quantizer::quantize_blocks<kBF16, kN, kTables>(w, s, six_s, inverse, tables, q.data, q.sf);
  }
  return q;
}

// 4-over-6 in the pair kernel: the item's blocks one at a time in a loop that is not unrolled, read
// back from the thread's own shared-memory slots (no barrier needed), so that a warp fetches the
// block's code once instead of once per block (the unrolled body of four blocks overflowed the
// instruction cache: ncu "no instruction" stalls) and the input words leave registers. Slots are
// [index][kThreads] so that consecutive threads touch consecutive 16 bytes.
template <bool kBF16, int kBlocks>
__device__ __forceinline__ Quantized<2 * kBlocks> quantize_item_staged(
    const AppendParams& p, const Item& it, const uint32_t* w,
    const float (*reciprocal)[block_quantizer::kReciprocalTableSize], const float* inverses, const float* scaled,
    uint4* staged, uint2* staged_data, uint8_t* staged_sf) {
  constexpr int kN = 2 * kBlocks;
  Quantized<kN> q;
  q.k_scale = global_scale(p, false);
  q.v_scale = global_scale(p, true);
  // Global scales the loop does not handle (s >= 2^120, or a quotient that divides: 6 s or 4 s outside
  // [2^-60, 2^60]) take the unrolled code, which handles every case.
  if (!block_quantizer::four_over_six_fast_scale(q.k_scale) || !block_quantizer::four_over_six_fast_scale(q.v_scale) ||
      inverses[0] == 0.0f || inverses[1] == 0.0f || inverses[2] == 0.0f || inverses[3] == 0.0f) {
    return quantize_item<kBF16, kBlocks, false, true, true>({q.k_scale, q.v_scale}, it, w, reciprocal, inverses,
                                                            scaled);
  }
  const uint32_t t = threadIdx.x;
#pragma unroll
  for (int i = 0; i < 2 * kN; ++i) {
    staged[i * kThreads + t] = make_uint4(w[4 * i], w[4 * i + 1], w[4 * i + 2], w[4 * i + 3]);
  }
#pragma unroll 1
  for (int i = 0; i < kN; ++i) {
    const uint4 low = staged[2 * i * kThreads + t], high = staged[(2 * i + 1) * kThreads + t];
    const uint32_t block[8] = {low.x, low.y, low.z, low.w, high.x, high.y, high.z, high.w};
    const bool value = i >= kBlocks;
    const float s = value ? q.v_scale : q.k_scale;
    uint2 data;
    staged_sf[i * kThreads + t] = block_quantizer::quantize_block_four_over_six_fast<kBF16, true, true>(
        block, s, codec::kE2M1MaxValue * s, codec::kFourOverSixTarget * s, inverses[value], inverses[2 + value],
        reciprocal[value], scaled, data);
    staged_data[i * kThreads + t] = data;
  }
#pragma unroll
  for (int i = 0; i < kN; ++i) {
    q.data[i] = staged_data[i * kThreads + t];
    q.sf[i] = staged_sf[i * kThreads + t];
  }
  return q;
}

// Where an item's blocks go, but for the page id: its first tensor's, then (pair mode) V's.
struct ItemDestination {
  TensorDestination first;
  TensorDestination value;
};

template <bool kSplit, bool kPageKnown>
__device__ __forceinline__ ItemDestination item_destination(const AppendParams& p, const Item& it,
                                                            const Target& target) {
  ItemDestination d{};
  d.first = tensor_destination<kPageKnown>(it.is_value ? p.v_data : p.k_data, it.is_value ? p.v_scales : p.k_scales,
                                           target, it.head, it.column);
  if constexpr (!kSplit) d.value = tensor_destination<kPageKnown>(p.v_data, p.v_scales, target, it.head, it.column);
  return d;
}

// The entry's part of an item destination built for entry 0 (item_destination with a Target{}).
template <bool kSplit>
__device__ __forceinline__ void add_entry(ItemDestination& d, const AppendParams& p, const Item& it, int64_t entry) {
  add_entry(d.first, it.is_value ? p.v_data : p.k_data, it.is_value ? p.v_scales : p.k_scales, entry);
  if constexpr (!kSplit) add_entry(d.value, p.v_data, p.v_scales, entry);
}

// Store an item once its target is known. A device scale that is not positive and finite leaves its
// K or V rows untouched.
template <bool kVector, int kBlocks, bool kSplit, int kN>
__device__ __forceinline__ void store_item(const AppendParams& p, const LaunchArgs& a, const Item& it,
                                           const Quantized<kN>& q, const Target& target, const ItemDestination& dst) {
  if (!finish_target(p, target)) return;
  if (usable_global_scale(q.k_scale)) {
    store_tensor<kBlocks, kVector>(q.data, q.sf, it.is_value ? p.v_data : p.k_data,
                                   it.is_value ? p.v_scales : p.k_scales, it.is_value && p.v_scales_trtllm, target,
                                   dst.first, it.head, it.column, a);
  }
  if constexpr (!kSplit) {
    if (usable_global_scale(q.v_scale)) {
      store_tensor<kBlocks, kVector>(q.data + kBlocks, q.sf + kBlocks, p.v_data, p.v_scales, p.v_scales_trtllm, target,
                                     dst.value, it.head, it.column, a);
    }
  }
}

// SPEC step 5 as tables, one per global scale: reciprocal[t][byte] = 1 / (float(byte) * s_t) or 0.
// Every thread of the CTA writes one entry; the caller syncs before use.
// inverses[t] = division_inverse(6 s_t) comes with them, and for 4-over-6 inverses[2 + t] =
// division_inverse(4 s_t) (0, i.e. IEEE division, without a.hoisted_division).
template <bool kFourOverSix>
__device__ __forceinline__ void fill_reciprocal_tables(const AppendParams& p, const LaunchArgs& a,
                                                       float (*reciprocal)[block_quantizer::kReciprocalTableSize],
                                                       float* inverses) {
  static_assert(kThreads == 2 * block_quantizer::kReciprocalTableSize, "one table entry per thread");
  const bool value = threadIdx.x >= block_quantizer::kReciprocalTableSize;
  const uint32_t byte = threadIdx.x % block_quantizer::kReciprocalTableSize;
  const float s = global_scale(p, value);
  reciprocal[value][byte] = block_quantizer::reciprocal_entry(uint8_t(byte), s);
  if (byte == 0) {
    inverses[value] = a.hoisted_division ? block_quantizer::division_inverse(codec::kE2M1MaxValue * s) : 0.0f;
    if constexpr (kFourOverSix) {
      inverses[2 + value] =
          a.hoisted_division ? block_quantizer::division_inverse(codec::kFourOverSixTarget * s) : 0.0f;
    }
  }
}

// The 4-over-6 recipe's m by scale byte (block_quantizer::scaled_scale_entry), one global table.
__device__ __forceinline__ void fill_scaled_table(float* scaled) {
  if (threadIdx.x < block_quantizer::kReciprocalTableSize) {
    scaled[threadIdx.x] = block_quantizer::scaled_scale_entry(uint8_t(threadIdx.x));
  }
}

// One item per thread. The loads that start the two chains (inputs; the row's index values) go out
// first, then the tables are filled while they are in flight.
template <bool kBF16, bool kVector, int kBlocks, bool kSplit, typename Index, bool kFourOverSix>
// 64 registers (4 CTAs of kThreads per SM) but for 4-over-6 (split mode: 128) and the scalar kernel: a
// large decode call (split mode) must fit one wave (docs/PERFORMANCE.md v10: 72 registers cost nnz 1024 a
// second wave, +1.2 us).
__global__ void __launch_bounds__(kThreads, !kVector       ? 1
                                            : kFourOverSix ? (kSplit ? 2 : 1)
                                                           : 4)
    append_paged_kv_cache_kernel(const __grid_constant__ AppendParams p, const __grid_constant__ LaunchArgs a) {
  constexpr bool kTables = !kSplit;
  __shared__ float reciprocal[kTables ? 2 : 1][block_quantizer::kReciprocalTableSize];
  __shared__ float inverses[kFourOverSix ? 4 : 2];
  __shared__ float scaled[kTables && kFourOverSix ? block_quantizer::kReciprocalTableSize : 1];
  const uint32_t index = blockIdx.x * (kSplit ? blockDim.x : kThreads) + threadIdx.x;  // split: a.split_threads
  const bool active = index < a.items;
  const Item it = locate<kSplit, kBlocks>(index, a);
  uint32_t w[8 * (kSplit ? kBlocks : 2 * kBlocks)];
  RowIndices r{};
  ItemScales g{};
  // The first loads' addresses are computed before the wait (they need no global memory), so that the
  // loads go out right after it.
  ItemSources sources = item_sources<kSplit>(p, it);
  RowIndexAddresses<Index> indices = row_index_addresses<Index>(p, a, it.row);
  compute_here(sources.first, sources.second, indices.b, indices.position, indices.first, indices.last);
  // Split mode: so are the store addresses but for the entry's and the page's terms, and the reciprocal
  // of 6 s for a scale passed by value (docs/PERFORMANCE.md v10b; the other modes keep their v9
  // code of 7fbc0e8: there the addresses live across the loads and the compiler delays the input loads then).
  ItemDestination dst{};
  float split_inverse = 0.0f;
  if constexpr (kSplit) {
    dst = item_destination<kSplit, false>(p, it, Target{});
    compute_here(dst.first.data, dst.first.scales);
  }
  if constexpr (kSplit && !kFourOverSix) {
    if (a.hoisted_division) {
      split_inverse = block_quantizer::division_inverse(codec::kE2M1MaxValue * (it.is_value ? p.v_scale : p.k_scale));
    }
    compute_here(split_inverse);
  }
  programmatic_launch::warm_parameter_cache(p, a);
  programmatic_launch::wait_for_previous_kernel();  // before the first global memory access
  programmatic_launch::allow_next_kernel();
  if (active) {
    load_item<kBlocks, kVector, kSplit>(sources, w);
    r = load_row_indices<Index>(p, a, it.row, indices);
    if constexpr (kSplit) g = item_scales<kSplit>(p, it);
  }
  if constexpr (kTables) {
    fill_reciprocal_tables<kFourOverSix>(p, a, reciprocal, inverses);
    if constexpr (kFourOverSix) fill_scaled_table(scaled);
    __syncthreads();
  }
  if (!active) return;
  const Target target = start_target<Index, true>(p, a, it.row, r);
  if constexpr (kSplit) {
    add_entry<kSplit>(dst, p, it, target.entry);  // while the page id is in flight
  } else {
    dst = item_destination<kSplit, false>(p, it, target);  // while the page id is in flight
    compute_here(dst.first.data, dst.first.data_page_stride, dst.first.scales, dst.first.scales_page_stride);
    g = item_scales<kSplit>(p, it);
  }
  if (kSplit && !kFourOverSix && a.hoisted_division && (it.is_value ? p.v_scale_device : p.k_scale_device)) {
    split_inverse = block_quantizer::division_inverse(codec::kE2M1MaxValue * g.first);  // a device scale
  }
  const auto q = quantize_item<kBF16, kBlocks, kSplit, kFourOverSix, kTables>(g, it, w, reciprocal, inverses, scaled,
                                                                              split_inverse);
  store_item<kVector, kBlocks, kSplit>(p, a, it, q, target, dst);
}

// Pair mode for calls with at least kMinItemsPerRowForSharedChain threads per row, so that a CTA
// spans at most 32 rows: warp 0 resolves the index chain of every row of the CTA, one row per lane,
// and publishes the targets through a named barrier (`bar.arrive` / `bar.sync` before the stores).
// The chain then costs one warp's instructions per CTA instead of one per warp. With a chain-only
// warp (a.item_offset == 32: the page-table variant, whose chain is three dependent loads) warp 0
// quantizes nothing and the CTA takes 224 items, so the CTA no longer waits for a warp 0 that
// started quantizing late; otherwise warp 0 quantizes its own items after publishing the targets.
constexpr uint32_t kMinItemsPerRowForSharedChain = 9;  // rows per CTA <= 255 / 9 + 2 = 30
constexpr uint32_t kTargetsReady = 1;                  // the named barrier of the published targets

template <bool kBF16, int kBlocks, typename Index, bool kFourOverSix>
__global__ void __launch_bounds__(kThreads, 4)  // 64 registers
    append_paged_kv_cache_pair_kernel(const __grid_constant__ AppendParams p, const __grid_constant__ LaunchArgs a) {
  __shared__ float reciprocal[2][block_quantizer::kReciprocalTableSize];
  __shared__ float inverses[kFourOverSix ? 4 : 2];
  __shared__ float scaled[kFourOverSix ? block_quantizer::kReciprocalTableSize : 1];
  __shared__ Target targets[32];
  // 4-over-6 (quantize_item_staged): the thread's input words, packed blocks and scale bytes; 44 KB at
  // kBlocks = 2, so 4 CTAs per SM still fit.
  __shared__ uint4 staged[kFourOverSix ? 4 * kBlocks * kThreads : 1];
  __shared__ uint2 staged_data[kFourOverSix ? 2 * kBlocks * kThreads : 1];
  __shared__ uint8_t staged_sf[kFourOverSix ? 2 * kBlocks * kThreads : 1];
  const uint32_t first_item = blockIdx.x * a.cta_items();
  const uint32_t first_row = a.items_per_row.div(first_item);
  const uint32_t index = first_item + threadIdx.x - a.item_offset;
  const bool active = threadIdx.x >= a.item_offset && index < a.items;
  const Item it = locate<false, kBlocks>(index, a);
  uint32_t w[16 * kBlocks];
  programmatic_launch::wait_for_previous_kernel();  // before the first global memory access
  programmatic_launch::allow_next_kernel();
  if (active) load_item<kBlocks, true, false>(item_sources<false>(p, it), w);

  const bool chain_warp = threadIdx.x < 32;
  const uint32_t last_item = (a.items - first_item < a.cta_items() ? a.items : first_item + a.cta_items()) - 1;
  const uint32_t rows = a.items_per_row.div(last_item) - first_row + 1;
  const int64_t chain_row = a.row_begin + first_row + threadIdx.x;
  RowIndices r{};
  if (chain_warp && threadIdx.x < rows) r = load_row_indices<Index>(p, a, chain_row);
  fill_reciprocal_tables<kFourOverSix>(p, a, reciprocal, inverses);
  if constexpr (kFourOverSix) fill_scaled_table(scaled);
  __syncthreads();  // the tables are complete

  if (chain_warp) {
    if (threadIdx.x < rows) targets[threadIdx.x] = start_target<Index, false>(p, a, chain_row, r);
    __syncwarp();
    named_barrier_arrive<kTargetsReady, kThreads>();
  }
  Quantized<2 * kBlocks> q;
  if constexpr (kFourOverSix) {
    if (active) {
      q = quantize_item_staged<kBF16, kBlocks>(p, it, w, reciprocal, inverses, scaled, staged, staged_data, staged_sf);
    }
  } else if (active) {
    q = quantize_item<kBF16, kBlocks, false, false, true>(item_scales<false>(p, it), it, w, reciprocal, inverses,
                                                          scaled);
  }
  if (!chain_warp) named_barrier_sync<kTargetsReady, kThreads>();
  if (active) {
    const Target& target = targets[it.row - a.row_begin - first_row];
    store_item<true, kBlocks, false>(p, a, it, q, target, item_destination<false, true>(p, it, target));
  }
}

// ---------------------------------------------------------------------------------------------
// Host side.

bool aligned(const void* ptr, int64_t alignment) { return reinterpret_cast<uintptr_t>(ptr) % alignment == 0; }

bool rows_aligned(const RowsView& r, int64_t bytes) {
  return aligned(r.data, bytes) && (r.row_stride * 2) % bytes == 0 && (r.head_stride * 2) % bytes == 0;
}

bool cache_aligned(const CacheView& c, int64_t bytes) {
  return aligned(c.data, bytes) && c.page_stride % bytes == 0 && c.entry_stride % bytes == 0 &&
         c.head_stride % bytes == 0;
}

// Threads per CTA in split mode (decode; docs/PERFORMANCE.md v10b).
constexpr uint32_t kSplitModeThreads = 128;

// Calls with at most this many blocks per tensor (nnz * heads * head_dim / 16) run in split mode:
// up to about one wave of 1-block threads on a large GPU, where latency, not bandwidth, decides.
constexpr int64_t kSplitModeMaxBlocks = int64_t(1) << 16;

enum class Mode { kScalar, kSplit, kPair };

struct Plan {
  Mode mode;
  int blocks;  // per thread and tensor
};

template <bool kBF16, bool kVector, int kBlocks, bool kSplit, typename Index, bool kFourOverSix = false>
void launch_rows(const AppendParams& p, LaunchArgs a, cudaStream_t stream) {
  const bool programmatic = programmatic_launch::enabled_on_current_device();
  const uint32_t per_row = a.items_per_row.d;
  const int64_t rows_per_launch = ((int64_t(1) << 31) - kThreads) / per_row;
  for (int64_t row = 0; row < p.nnz; row += rows_per_launch) {
    const int64_t rows = p.nnz - row < rows_per_launch ? p.nnz - row : rows_per_launch;
    a.row_begin = row;
    a.items = uint32_t(rows * per_row);
    const uint32_t threads = kSplit ? a.split_threads : kThreads;
    const dim3 grid((a.items + threads - 1) / threads);
    if constexpr (kVector && !kSplit) {
      if (per_row >= kMinItemsPerRowForSharedChain && kernel_mode::forced() != kernel_mode::kForceOneShot) {
        // The page table's chain (three dependent loads) gets a warp of its own; the slot mapping's
        // (one load) and the compute-bound 4-over-6 recipe keep warp 0 quantizing too.
        const bool chain_only = p.slot_mapping.data == nullptr && !kFourOverSix;
        a.item_offset = chain_only ? 32 : 0;
        const dim3 grid((a.items + a.cta_items() - 1) / a.cta_items());
        programmatic_launch::launch(append_paged_kv_cache_pair_kernel<kBF16, kBlocks, Index, kFourOverSix>, grid,
                                    dim3(kThreads), stream, programmatic, p, a);
        continue;
      }
    }
    programmatic_launch::launch(append_paged_kv_cache_kernel<kBF16, kVector, kBlocks, kSplit, Index, kFourOverSix>,
                                grid, dim3(threads), stream, programmatic, p, a);
  }
}

template <bool kBF16, typename Index>
void launch_plan(const AppendParams& p, const LaunchArgs& a, const Plan& plan, cudaStream_t stream) {
  if (p.four_over_six) {  // the optional recipe: the same modes
    switch (plan.mode) {
      case Mode::kScalar: launch_rows<kBF16, false, 1, false, void, true>(p, a, stream); break;
      case Mode::kSplit: launch_rows<kBF16, true, 1, true, Index, true>(p, a, stream); break;
      case Mode::kPair:
        if (plan.blocks == 2) launch_rows<kBF16, true, 2, false, Index, true>(p, a, stream);
        else launch_rows<kBF16, true, 1, false, Index, true>(p, a, stream);
        break;
    }
    return;
  }
  switch (plan.mode) {
    case Mode::kScalar: launch_rows<kBF16, false, 1, false, void>(p, a, stream); break;
    case Mode::kSplit: launch_rows<kBF16, true, 1, true, Index>(p, a, stream); break;
    case Mode::kPair:
      if (plan.blocks == 2) launch_rows<kBF16, true, 2, false, Index>(p, a, stream);
      else launch_rows<kBF16, true, 1, false, Index>(p, a, stream);
      break;
  }
}

template <bool kBF16>
void launch_index(const AppendParams& p, const LaunchArgs& a, const Plan& plan, cudaStream_t stream) {
  switch (index_types(p)) {
    case IndexTypes::kInt32: launch_plan<kBF16, int32_t>(p, a, plan, stream); break;
    case IndexTypes::kInt64: launch_plan<kBF16, int64_t>(p, a, plan, stream); break;
    default: launch_plan<kBF16, void>(p, a, plan, stream);
  }
}

}  // namespace

int launch_append_paged_kv_cache(const AppendParams& p, void* stream, const char** error_string) {
  *error_string = "";
  // When no row can land anywhere there is nothing to do (and the index clamps need non-empty tensors).
  const bool slot_mapping = p.slot_mapping.data != nullptr;
  if (p.nnz == 0 || p.num_pages == 0) return 0;
  if (!slot_mapping && (p.batch_size == 0 || p.kv_indices.size == 0)) return 0;

  const int64_t blocks_per_row = p.head_dim / codec::kBlockSize;
  const int64_t total_blocks = p.nnz * p.num_heads * blocks_per_row;
  // 16-byte input loads and 8-byte packed stores need every base pointer and stride to allow them.
  const bool vector =
      rows_aligned(p.key, 16) && rows_aligned(p.value, 16) && cache_aligned(p.k_data, 8) && cache_aligned(p.v_data, 8);
  Plan plan{Mode::kScalar, 1};
  if (vector) {
    const int forced = kernel_mode::forced();
    const bool split =
        forced == kernel_mode::kForceSplit || (forced == kernel_mode::kAuto && total_blocks <= kSplitModeMaxBlocks);
    plan = split ? Plan{Mode::kSplit, 1} : Plan{Mode::kPair, blocks_per_row % 2 == 0 ? 2 : 1};
  }
  const int64_t groups = blocks_per_row / plan.blocks;
  const int64_t items_per_tensor = groups * p.num_heads;
  const int64_t items_per_row = plan.mode == Mode::kSplit ? 2 * items_per_tensor : items_per_tensor;
  if (items_per_row >= (int64_t(1) << 31) - kThreads) {
    *error_string = "num_kv_heads * head_dim is too large for the CUDA kernel";
    return int(cudaErrorInvalidValue);
  }
  LaunchArgs a{};
  a.items_per_row = Divisor::make(uint32_t(items_per_row));
  a.items_per_tensor = Divisor::make(uint32_t(items_per_tensor));
  a.groups_per_head = Divisor::make(uint32_t(groups));
  a.blocks_per_row = Divisor::make(uint32_t(blocks_per_row));
  const bool small_pages = p.page_size < (int64_t(1) << 31);
  a.page_size = Divisor::make(small_pages ? uint32_t(p.page_size) : 1u);
  a.quotient_limit = small_pages ? uint64_t(1) << 31 : 0;
  a.speculate_batch = !slot_mapping && p.nnz == p.batch_size;
  a.hoisted_division = true;  // the kernels still fall back per CTA when the scales need a division
  a.split_threads = kSplitModeThreads;
  a.store16 = plan.blocks >= 2 && cache_aligned(p.k_data, 16) && cache_aligned(p.v_data, 16);
  a.scale_store16 =
      plan.blocks >= 2 && cache_aligned(p.k_scales, 2) && cache_aligned(p.v_scales, 2) && !p.v_scales_trtllm;

  const auto s = static_cast<cudaStream_t>(stream);
  if (p.input_is_bf16) launch_index<true>(p, a, plan, s);
  else launch_index<false>(p, a, plan, s);
  const cudaError_t error = cudaGetLastError();
  *error_string = cudaGetErrorString(error);
  return int(error);
}

}  // namespace nvfp4kv
