// CUDA kernels of the MLA latent appends (SPEC section 4). A warp quantizes a latent row: lane l owns
// the row's ckv blocks l, l + 32, ... (NVFP4, block_quantizer.cuh; one block per lane for C = 512) and
// its kpe values 2l, 2l + 1, 2l + 64, ... (block_quantizer's quotient bytes: E4M3 of the IEEE quotient
// through a reciprocal computed once; or a bit copy into a 16-bit cache), so that every lane of a warp
// does the same work and a warp's loads and stores are contiguous. The lane's first block and kpe pair
// ("first" below; for C = 512 and R = 64 all its inputs) depend on no index, so they are loaded while the
// row's target is resolved; the rest of a wider row follows once the target is known.
//
//   row kernel (calls of at most kRowKernelMaxRows rows: decode): one row per warp, CTAs of 4 warps so
//     that a small call spreads over many SMs. Before the programmatic wait it computes the addresses of
//     its first loads and the reciprocal of 6 s of a ckv scale passed by value; right after it, the
//     lane's inputs, the row's level-1 index loads and the device scales go out together; the chain
//     (index_chain.cuh) runs up to the page id's load, and the entry's offset terms and the quantizing
//     run while that is in flight: the page id stays as loaded (PendingTarget) until the stores.
//   chain kernel (larger calls: prefill): CTAs of 16 rows and 9 warps. Warp 0 resolves the 16 rows'
//     targets, one per lane (with a kv_indptr of at most 64 entries held in its lanes, two dependent loads
//     instead of three), into byte offsets of each row's parts in the caches, and publishes them
//     through a named barrier; warps 1-8 load the inputs of 2 rows each at once (2 rows' loads in flight
//     per lane), quantize them (the block reciprocals from a table of the ckv scale that the CTA fills),
//     then wait for the offsets and store.
//
// Every index load is clamped into its tensor and a row whose target fails the bounds contract of
// append_params.h is skipped (index_chain.cuh). Launched with programmatic dependent launch on sm_90+.
// docs/PERFORMANCE.md section 9 has the measurements.
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "../mla_params.h"
#include "block_io.cuh"
#include "block_quantizer.cuh"
#include "index_chain.cuh"
#include "kernel_mode.h"
#include "kernels.h"
#include "launch_args.cuh"
#include "named_barrier.cuh"
#include "programmatic_launch.cuh"
#include "schedule_hint.cuh"

namespace nvfp4kv {
namespace {

using append_kernel::Divisor;
using append_kernel::PendingTarget;
using append_kernel::RowIndexAddresses;
using append_kernel::RowIndices;
using append_kernel::Target;

constexpr uint32_t kLanes = 32;
constexpr uint32_t kRowKernelWarps = 4;  // rows per CTA of the row kernel
constexpr uint32_t kChainRows = 16;      // rows per CTA of the chain kernel: one per chain lane
constexpr uint32_t kRowsPerWarp = 2;     // chain kernel: rows per quantizing warp
constexpr uint32_t kQuantizingWarps = kChainRows / kRowsPerWarp;
constexpr uint32_t kChainKernelThreads = (kQuantizingWarps + 1) * kLanes;  // warp 0: the chain

// Calls of at most this many rows run the row kernel (decode), larger ones the chain kernel.
constexpr int64_t kRowKernelMaxRows = 2048;

// Per-call choices made on the host. page_size, quotient_limit and speculate_batch are what
// index_chain.cuh reads (as in LaunchArgs).
struct MlaLaunch {
  Divisor page_size;        // position or slot -> page, for values below quotient_limit
  uint64_t quotient_limit;  // 2^31, or 0 when page_size >= 2^31 (then always a 64-bit division)
  bool speculate_batch;     // nnz == batch_size (decode): kv_indptr[row], [row + 1] loaded with batch_indices[row]
  bool ckv_load16;          // 16-byte ckv loads (row base and stride allow them)
  bool kpe_pairs;           // 4-byte kpe loads of value pairs, 2-byte (fp8) or 4-byte (copy) stores
  bool ckv_store8;          // 8-byte packed-data stores
  bool indptr_in_warp;      // chain kernel: kv_indptr held by the chain warp's lanes (index_chain.cuh)
};

template <bool kBF16>
__device__ __forceinline__ float value_of(uint32_t bits) {
  return codec::bits16_to_float(uint16_t(bits), kBF16);
}

// kpe_scale and division_inverse(kpe_scale): the kpe bytes are block_quantizer's quotient bytes.
struct KpeScale {
  float s;
  float inverse;
};

__device__ __forceinline__ KpeScale kpe_scale_of(float s) { return {s, block_quantizer::division_inverse(s)}; }

// Whether the kpe cache is E4M3 (else a bit copy): always in the common shape (common_shape below).
template <bool kCommon>
__device__ __forceinline__ bool kpe_fp8(const MlaParams& p) {
  return kCommon || p.kpe_is_fp8;
}

// A kpe value pair (low half = even element) as written: two E4M3 bytes, or the pair itself (copy).
template <bool kBF16, bool kCommon>
__device__ __forceinline__ uint32_t kpe_pair_out(const MlaParams& p, uint32_t pair, const KpeScale& k) {
  if (!kpe_fp8<kCommon>(p)) return pair;
  return block_quantizer::quotient_bytes2(value_of<kBF16>(pair & 0xFFFFu), value_of<kBF16>(pair >> 16), k.s, k.inverse);
}

// The 16 values of ckv block `block` of a row as packed words (low half = even element).
__device__ __forceinline__ void load_block(const uint16_t* row, int64_t block, bool vector, uint32_t (&w)[8]) {
  const uint16_t* src = row + block * codec::kBlockSize;
  if (vector) {
    append_kernel::load_values<1, true>(src, w);
  } else {
    append_kernel::load_values<1, false>(src, w);
  }
}

// The ckv global scale's quantities: s, 6 s (SPEC step 3: rounded first) and division_inverse(6 s).
struct CkvScale {
  float s;
  float six_s;
  float inverse;
};

__device__ __forceinline__ CkvScale ckv_scale_of(float s) {
  const float six_s = __fmul_rn(codec::kE2M1MaxValue, s);
  return {s, six_s, block_quantizer::division_inverse(six_s)};
}

struct Block {
  uint2 packed;
  uint8_t sf;
};

// kTable: the reciprocal from the CTA's table of the ckv scale (block_quantizer::reciprocal_entry), else computed.
template <bool kBF16, bool kTable>
__device__ __forceinline__ Block quantize_block(const uint32_t (&w)[8], const CkvScale& g, const float* reciprocal) {
  const float* table[1] = {reciprocal};
  Block b;
  block_quantizer::quantize_blocks<kBF16, 1, kTable>(w, &g.s, &g.six_s, &g.inverse, table, &b.packed, &b.sf);
  return b;
}

template <bool kCommon>
__device__ __forceinline__ void store_block(const MlaLaunch& a, uint8_t* data, uint8_t* scales, int64_t block,
                                            const Block& b) {
  uint8_t* out = data + block * codec::kBlockBytes;
  if (kCommon || a.ckv_store8) {
    *reinterpret_cast<uint2*>(out) = b.packed;
  } else {
#pragma unroll
    for (int k = 0; k < 4; ++k) out[k] = uint8_t(b.packed.x >> (8 * k)), out[4 + k] = uint8_t(b.packed.y >> (8 * k));
  }
  scales[block] = b.sf;
}

template <bool kCommon>
__device__ __forceinline__ void store_kpe_pair(const MlaParams& p, uint8_t* dst, int64_t j, uint32_t out) {
  if (kpe_fp8<kCommon>(p)) {
    *reinterpret_cast<uint16_t*>(dst + j) = uint16_t(out);
  } else {
    *reinterpret_cast<uint32_t*>(dst + 2 * j) = out;
  }
}

// What a row's kpe values may be written with: a bad device scale leaves an E4M3 kpe row untouched
// (as a bad ckv scale leaves the ckv row), a bit copy needs no scale.
__device__ __forceinline__ bool kpe_writable(const MlaParams& p, float kpe_scale) {
  return !p.kpe_is_fp8 || usable_global_scale(kpe_scale);
}

// Byte offsets into the three caches (LatentCacheView::offset). Offsets, not pointers, so that the stores
// stay global-memory stores when these pass through shared memory.
struct CacheOffsets {
  int64_t ckv_data;
  int64_t ckv_scales;
  int64_t kpe;
};

// The entry's terms of a row's offsets (page 0): they wait only for the position, not for the page id.
__device__ __forceinline__ CacheOffsets entry_offsets(const MlaParams& p, int64_t entry) {
  return {p.ckv_data.offset(0, entry), p.ckv_scales.offset(0, entry), p.kpe_cache.offset(0, entry)};
}

// Where a row's parts go and which parts are written (none when the row is skipped by the bounds contract,
// whose offsets are then meaningless; not a part whose device scale is unusable).
struct RowOutputs {
  CacheOffsets at;
  bool write_ckv;
  bool write_kpe;
};

__device__ __forceinline__ RowOutputs row_outputs(const MlaParams& p, const Target& t, const CacheOffsets& entry,
                                                  float ckv_scale, float kpe_scale) {
  // Without a branch: the flags do not wait for the page id, and its offsets are unused when they are false.
  const bool placed = append_kernel::finish_target(p, t);
  RowOutputs o;
  o.at.ckv_data = p.ckv_data.offset(t.page, 0) + entry.ckv_data;
  o.at.ckv_scales = p.ckv_scales.offset(t.page, 0) + entry.ckv_scales;
  o.at.kpe = p.kpe_cache.offset(t.page, 0) + entry.kpe;
  o.write_ckv = placed & usable_global_scale(ckv_scale);
  o.write_kpe = placed & kpe_writable(p, kpe_scale);
  return o;
}

// Which of the lane's first inputs exist (the row kernel and the chain kernel's warps hoist these).
struct LaneShare {
  bool block;  // ckv block `lane`
  bool pair;   // kpe values 2 lane, 2 lane + 1, read as a pair
};

__device__ __forceinline__ LaneShare lane_share(const MlaParams& p, const MlaLaunch& a, uint32_t lane) {
  return {lane < p.ckv_dim / codec::kBlockSize, a.kpe_pairs && 2 * lane < p.kpe_dim};
}

struct LaneInputs {
  uint32_t w[8];  // ckv block `lane`
  uint32_t kpe_pair;
};

// The lane's first inputs of the row whose ckv and kpe values start at `ckv` and `kpe`.
template <bool kCommon>
__device__ __forceinline__ LaneInputs load_first(const MlaLaunch& a, const uint16_t* ckv, const uint16_t* kpe,
                                                 uint32_t lane, const LaneShare& share) {
  LaneInputs in{};
  if (share.block) load_block(ckv, lane, kCommon || a.ckv_load16, in.w);
  if (share.pair) in.kpe_pair = __ldg(reinterpret_cast<const uint32_t*>(kpe + 2 * lane));
  return in;
}

struct LaneOutputs {
  Block block;
  uint32_t kpe;  // kpe_pair_out of the first pair
};

template <bool kBF16, bool kTable, bool kCommon>
__device__ __forceinline__ LaneOutputs quantize_first(const MlaParams& p, const LaneInputs& in, const CkvScale& g,
                                                      const float* reciprocal, const KpeScale& k) {
  return {quantize_block<kBF16, kTable>(in.w, g, reciprocal), kpe_pair_out<kBF16, kCommon>(p, in.kpe_pair, k)};
}

// The lane's part of row `row` written to `o`: the first outputs, then the blocks and kpe values beyond
// them (C > 512, R > 64, or kpe values that are not read as pairs), loaded here. kCommon: the call has the
// common shape (common_shape below), so there are none.
template <bool kBF16, bool kTable, bool kCommon>
__device__ __forceinline__ void store_row(const MlaParams& p, const MlaLaunch& a, int64_t row, uint32_t lane,
                                          const LaneShare& share, const RowOutputs& o, const LaneOutputs& out,
                                          const CkvScale& g, const float* reciprocal, const KpeScale& k) {
  if (o.write_ckv) {
    uint8_t* data = p.ckv_data.data + o.at.ckv_data;
    uint8_t* scales = p.ckv_scales.data + o.at.ckv_scales;
    if (share.block) store_block<kCommon>(a, data, scales, lane, out.block);
    for (int64_t block = lane + kLanes; !kCommon && block < p.ckv_dim / codec::kBlockSize; block += kLanes) {
      uint32_t w[8];
      load_block(p.ckv.data + row * p.ckv.row_stride, block, a.ckv_load16, w);
      store_block<false>(a, data, scales, block, quantize_block<kBF16, kTable>(w, g, reciprocal));
    }
  }
  if (!o.write_kpe) return;
  uint8_t* dst = p.kpe_cache.data + o.at.kpe;
  if (kCommon || a.kpe_pairs) {  // kpe_dim even, pairs aligned for 4-byte loads and the stores
    if (share.pair) store_kpe_pair<kCommon>(p, dst, 2 * lane, out.kpe);
    for (int64_t j = 2 * (lane + kLanes); !kCommon && j < p.kpe_dim; j += 2 * kLanes) {
      const uint32_t pair = __ldg(reinterpret_cast<const uint32_t*>(p.kpe.data + row * p.kpe.row_stride + j));
      store_kpe_pair<false>(p, dst, j, kpe_pair_out<kBF16, false>(p, pair, k));
    }
    return;
  }
  if constexpr (!kCommon) {
    for (int64_t j = lane; j < p.kpe_dim; j += kLanes) {
      const uint16_t bits = __ldg(p.kpe.data + row * p.kpe.row_stride + j);
      if (p.kpe_is_fp8) {
        dst[j] = uint8_t(block_quantizer::quotient_byte(value_of<kBF16>(bits), k.s, k.inverse));
      } else {
        reinterpret_cast<uint16_t*>(dst)[j] = bits;
      }
    }
  }
}

template <bool kBF16, typename Index>
__global__ void __launch_bounds__(kRowKernelWarps* kLanes)
    append_mla_row_kernel(const __grid_constant__ MlaParams p, const __grid_constant__ MlaLaunch a) {
  const int64_t row = int64_t(blockIdx.x) * kRowKernelWarps + threadIdx.x / kLanes;
  const uint32_t lane = threadIdx.x % kLanes;
  // Addresses and the by-value scale's reciprocal before the wait, so that loads follow it at once.
  const uint16_t* ckv = p.ckv.data + row * p.ckv.row_stride;
  const uint16_t* kpe = p.kpe.data + row * p.kpe.row_stride;
  const LaneShare share = lane_share(p, a, lane);
  RowIndexAddresses<Index> indices = append_kernel::row_index_addresses<Index>(p, a, row);
  CkvScale g = ckv_scale_of(p.ckv_scale);
  compute_here(ckv, kpe, indices.b, indices.position, indices.first, indices.last, g.six_s, g.inverse);
  programmatic_launch::warm_parameter_cache(p, a);
  programmatic_launch::wait_for_previous_kernel();  // before the first global memory access
  programmatic_launch::allow_next_kernel();
  if (row >= p.nnz) return;
  const LaneInputs in = load_first<false>(a, ckv, kpe, lane, share);
  const RowIndices r = append_kernel::load_row_indices<Index>(p, a, row, indices);
  const KpeScale k = kpe_scale_of(mla_kpe_scale(p));
  const float device_ckv_scale = p.ckv_scale_device ? *p.ckv_scale_device : 0.0f;
  const PendingTarget<Index> pending = append_kernel::start_pending_target<Index, true>(p, a, row, r);
  if (p.ckv_scale_device) g = ckv_scale_of(device_ckv_scale);  // after the chain's loads: it waits for the scale
  // While the page id is in flight:
  const CacheOffsets e = entry_offsets(p, pending.entry);
  const LaneOutputs out = quantize_first<kBF16, false, false>(p, in, g, nullptr, k);
  const Target t = append_kernel::resolved(pending);  // the first instruction that waits for the page id
  store_row<kBF16, false, false>(p, a, row, lane, share, row_outputs(p, t, e, g.s, k.s), out, g, nullptr, k);
}

// Named barriers of the chain kernel: the targets published, the reciprocal table filled.
constexpr uint32_t kTargetsReady = 1;
constexpr uint32_t kTableReady = 2;

// The common shape at 5 CTAs per SM (40 registers; no spills on sm_80-90, 4-8 bytes on sm_100 / sm_120): more,
// shorter CTAs in flight per SM.
template <bool kBF16, typename Index, bool kCommon>
__global__ void __launch_bounds__(kChainKernelThreads, kCommon ? 5 : 3)  // 40 / 72 registers
    append_mla_chain_kernel(const __grid_constant__ MlaParams p, const __grid_constant__ MlaLaunch a) {
  __shared__ RowOutputs outputs[kChainRows];
  __shared__ float reciprocal[block_quantizer::kReciprocalTableSize];
  const int64_t cta_row = int64_t(blockIdx.x) * kChainRows;
  const uint32_t warp = threadIdx.x / kLanes, lane = threadIdx.x % kLanes;
  programmatic_launch::wait_for_previous_kernel();  // before the first global memory access
  programmatic_launch::allow_next_kernel();
  if (warp == 0) {
    const int64_t row = cta_row + lane;
    const bool chain = lane < kChainRows && row < p.nnz;
    append_kernel::WarpIndptr<Index> indptr{};
    if (a.indptr_in_warp) indptr = append_kernel::load_warp_indptr<Index>(p, lane);
    RowIndices r{0, 0, 0, 0};
    if (chain) r = append_kernel::load_row_indices<Index>(p, a, row);
    if (a.indptr_in_warp) append_kernel::range_from_warp(p, indptr, r);
    RowOutputs o{};
    if (chain) {
      const Target t = append_kernel::start_target<Index, true>(p, a, row, r, a.indptr_in_warp);
      o = row_outputs(p, t, entry_offsets(p, t.entry), mla_ckv_scale(p), mla_kpe_scale(p));
    }
    if (lane < kChainRows) outputs[lane] = o;
    named_barrier_arrive<kTargetsReady, kChainKernelThreads>();
    return;
  }
  const uint32_t first = (warp - 1) * kRowsPerWarp;  // the warp's rows: cta_row + first + k
  const int64_t row0 = cta_row + first;
  const LaneShare share = lane_share(p, a, lane);
  LaneInputs in[kRowsPerWarp] = {};
#pragma unroll
  for (uint32_t k = 0; k < kRowsPerWarp; ++k) {
    // The common shape loads a row past the last one as the last one (no branch; never stored).
    const int64_t row = kCommon ? min(row0 + k, p.nnz - 1) : row0 + k;
    if (kCommon || row < p.nnz) {
      in[k] =
          load_first<kCommon>(a, p.ckv.data + row * p.ckv.row_stride, p.kpe.data + row * p.kpe.row_stride, lane, share);
    }
  }
  const CkvScale g = ckv_scale_of(mla_ckv_scale(p));
  const KpeScale kpe = kpe_scale_of(mla_kpe_scale(p));
  // The ckv scale's reciprocal table, one entry per thread of the first four quantizing warps.
  const uint32_t entry = threadIdx.x - kLanes;
  if (entry < block_quantizer::kReciprocalTableSize) {
    reciprocal[entry] = block_quantizer::reciprocal_entry(uint8_t(entry), g.s);
  }
  named_barrier_sync<kTableReady, kQuantizingWarps * kLanes>();
  LaneOutputs out[kRowsPerWarp];
#pragma unroll
  for (uint32_t k = 0; k < kRowsPerWarp; ++k) {
    out[k] = quantize_first<kBF16, true, kCommon>(p, in[k], g, reciprocal, kpe);
  }
  named_barrier_sync<kTargetsReady, kChainKernelThreads>();
#pragma unroll
  for (uint32_t k = 0; k < kRowsPerWarp; ++k) {
    if (row0 + k < p.nnz) {
      store_row<kBF16, true, kCommon>(p, a, row0 + k, lane, share, outputs[first + k], out[k], g, reciprocal, kpe);
    }
  }
}

bool aligned(const void* pointer, int64_t stride_bytes, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(pointer) % uint64_t(bytes) == 0 && stride_bytes % bytes == 0;
}

bool cache_aligned(const LatentCacheView& c, int64_t bytes) {
  return aligned(c.data, c.page_stride, bytes) && c.entry_stride % bytes == 0;
}

// The common shape (DeepSeek's C = 512 and R = 64, or narrower; 16-byte ckv rows, 8-byte ckv cache
// entries, kpe read in pairs and written as E4M3): a lane owns at most one ckv block and one kpe pair.
bool common_shape(const MlaParams& p, const MlaLaunch& a) {
  return p.ckv_dim <= int64_t(kLanes) * codec::kBlockSize && p.kpe_dim <= 2 * int64_t(kLanes) && a.kpe_pairs &&
         a.ckv_load16 && a.ckv_store8 && p.kpe_is_fp8;
}

template <bool kBF16, typename Index>
cudaError_t launch_kernel(const MlaParams& p, const MlaLaunch& a, bool row_kernel, uint32_t ctas, cudaStream_t stream) {
  const bool programmatic = programmatic_launch::enabled_on_current_device();
  if (row_kernel) {
    return programmatic_launch::launch(append_mla_row_kernel<kBF16, Index>, dim3(ctas), dim3(kRowKernelWarps * kLanes),
                                       stream, programmatic, p, a);
  }
  const auto kernel =
      common_shape(p, a) ? append_mla_chain_kernel<kBF16, Index, true> : append_mla_chain_kernel<kBF16, Index, false>;
  return programmatic_launch::launch(kernel, dim3(ctas), dim3(kChainKernelThreads), stream, programmatic, p, a);
}

template <bool kBF16>
cudaError_t launch_index(const MlaParams& p, const MlaLaunch& a, bool row_kernel, uint32_t ctas, cudaStream_t stream) {
  switch (append_kernel::index_types(p)) {
    case append_kernel::IndexTypes::kInt32: return launch_kernel<kBF16, int32_t>(p, a, row_kernel, ctas, stream);
    case append_kernel::IndexTypes::kInt64: return launch_kernel<kBF16, int64_t>(p, a, row_kernel, ctas, stream);
    default: return launch_kernel<kBF16, void>(p, a, row_kernel, ctas, stream);
  }
}

}  // namespace

int launch_append_paged_mla_kv_cache(const MlaParams& p, void* stream, const char** error_string) {
  *error_string = "";
  // When no row can land anywhere there is nothing to do (and the index clamps need non-empty tensors).
  const bool slot_mapping = p.slot_mapping.data != nullptr;
  if (p.nnz == 0 || p.num_pages == 0) return cudaSuccess;
  if (!slot_mapping && (p.batch_size == 0 || p.kv_indices.size == 0)) return cudaSuccess;
  MlaLaunch a{};
  const bool small_pages = p.page_size < (int64_t(1) << 31);
  a.page_size = Divisor::make(small_pages ? uint32_t(p.page_size) : 1u);
  a.quotient_limit = small_pages ? uint64_t(1) << 31 : 0;
  a.speculate_batch = !slot_mapping && p.nnz == p.batch_size;
  a.indptr_in_warp = append_kernel::indptr_fits_warp(p, a);
  a.ckv_load16 = aligned(p.ckv.data, p.ckv.row_stride * 2, 16);
  const int64_t kpe_item = p.kpe_is_fp8 ? 1 : 2;
  a.kpe_pairs =
      p.kpe_dim % 2 == 0 && aligned(p.kpe.data, p.kpe.row_stride * 2, 4) && cache_aligned(p.kpe_cache, 2 * kpe_item);
  a.ckv_store8 = cache_aligned(p.ckv_data, 8);
  // The tests' kernel-mode hook: "split" forces the row kernel, "pair" the chain kernel.
  const int forced = kernel_mode::forced();
  const bool row_kernel =
      forced == kernel_mode::kForceSplit || (forced != kernel_mode::kForcePair && p.nnz <= kRowKernelMaxRows);
  const uint64_t rows_per_cta = row_kernel ? kRowKernelWarps : kChainRows;
  const uint64_t ctas = (uint64_t(p.nnz) + rows_per_cta - 1) / rows_per_cta;
  if (ctas >= (uint64_t(1) << 31)) {
    *error_string = "too many latent rows for one launch";
    return cudaErrorInvalidValue;
  }
  const auto s = static_cast<cudaStream_t>(stream);
  const cudaError_t error = p.input_is_bf16 ? launch_index<true>(p, a, row_kernel, uint32_t(ctas), s)
                                            : launch_index<false>(p, a, row_kernel, uint32_t(ctas), s);
  if (error != cudaSuccess) *error_string = cudaGetErrorString(error);
  return int(error);
}

}  // namespace nvfp4kv
