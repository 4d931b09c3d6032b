// What one append call writes where: a torch-free description shared by the CPU and CUDA kernels,
// and the bounds contract that keeps device-side index data from ever addressing outside the cache.
#pragma once

#include <cstdint>

#include "nvfp4kv/nvfp4_codec.h"
#include "nvfp4kv/nvfp4_four_over_six.h"

namespace nvfp4kv {

// A 1-D int32 or int64 index tensor read as given (no conversion), any stride.
struct IndexView {
  const void* data;
  int64_t stride;  // in elements
  int64_t size;
  bool is_int64;

  NVFP4KV_HOST_DEVICE int64_t operator[](int64_t i) const {
    return is_int64 ? static_cast<const int64_t*>(data)[i * stride]
                    : int64_t(static_cast<const int32_t*>(data)[i * stride]);
  }
};

// Rows to quantize: [nnz, num_kv_heads, head_dim] fp16 or bf16, last dim contiguous.
struct RowsView {
  const uint16_t* data;  // raw 16-bit elements
  int64_t row_stride;    // in elements
  int64_t head_stride;   // in elements
};

// One 4-D cache tensor of 1-byte elements (uint8 data or float8_e4m3fn scales), last dim contiguous.
// Strides are in bytes and already resolved for the layout:
//   NHD [pages, page_size, heads, width]: entry_stride = stride(1), head_stride = stride(2)
//   HND [pages, heads, page_size, width]: entry_stride = stride(2), head_stride = stride(1)
struct CacheView {
  uint8_t* data;
  int64_t page_stride;
  int64_t entry_stride;
  int64_t head_stride;

  NVFP4KV_HOST_DEVICE uint8_t* at(int64_t page, int64_t entry, int64_t head) const {
    return data + page * page_stride + entry * entry_stride + head * head_stride;
  }
};

struct AppendParams {
  RowsView key;             // [nnz, num_heads, head_dim]
  RowsView value;           // [nnz, num_heads, head_dim]
  bool input_is_bf16;       // else float16
  IndexView batch_indices;  // [nnz]
  IndexView positions;      // [nnz]
  IndexView kv_indices;     // [kv_indptr[-1]] page ids
  IndexView kv_indptr;      // [batch_size + 1]
  CacheView k_data;         // head_dim / 2 bytes per (page, entry, head)
  CacheView v_data;
  CacheView k_scales;  // head_dim / 16 bytes per (page, entry, head)
  CacheView v_scales;
  int64_t nnz;
  int64_t num_heads;
  int64_t head_dim;
  int64_t page_size;
  int64_t num_pages;  // max_num_pages of the cache
  int64_t batch_size;
  float k_scale;  // global decode scales given as floats, validated on the host
  float v_scale;
  const float* k_scale_device;  // or [1] float32 tensors read by the kernel (null when a float was given)
  const float* v_scale_device;
  // Slot-mapping variant (null data for the page-table variant): slot_mapping[row] = page * page_size
  // + entry; negative slots are padding. The page-table fields above are unused then.
  IndexView slot_mapping;  // [nnz]
  bool v_scales_trtllm;    // V scales in the 4-token interleaved "trtllm" layout (see scale_address)
  bool four_over_six;      // 4-over-6 block-scale search (nvfp4_four_over_six.h)
};

// Quantizes one block with the call's recipe. Returns the scale byte, writes the 8 data bytes.
NVFP4KV_HOST_DEVICE uint8_t quantize_block_with_recipe(const AppendParams& p, const float (&x)[codec::kBlockSize],
                                                       float global_scale, uint64_t& packed) {
  return p.four_over_six ? codec::quantize_block_four_over_six(x, global_scale, packed)
                         : codec::quantize_block(x, global_scale, packed);
}

// Address of the scale byte of (page, entry, head, block j).
// Linear: the row's S = head_dim / 16 scales at [.., entry, .., j].
// "trtllm" (V only): each (page, head) tile of page_size x S scale bytes is a C-order [T/4][S][4]
// array indexed [entry / 4][j][entry % 4]: flat tile offset 4 S (entry / 4) + 4 j + entry % 4 =
// row * S + column, stored at (row, column) of the tile in the cache's own layout (NHD
// [page, row, head, column], HND [page, head, row, column]). Needs page_size % 4 == 0, S % 4 == 0.
NVFP4KV_HOST_DEVICE uint8_t* scale_address(const CacheView& scales, bool trtllm, int64_t page, int64_t entry,
                                           int64_t head, int64_t block, int64_t blocks_per_row) {
  if (!trtllm) return scales.at(page, entry, head) + block;
  const int64_t u = 4 * block + (entry & 3);
  return scales.at(page, (entry & ~int64_t(3)) + u / blocks_per_row, head) + u % blocks_per_row;
}

// The global scale of K (value = false) or V (value = true). A scale read from a device tensor is
// not validated on the host: when it is not positive and finite the kernels skip those rows.
NVFP4KV_HOST_DEVICE float global_scale(const AppendParams& p, bool value) {
  const float* device = value ? p.v_scale_device : p.k_scale_device;
  return device ? *device : (value ? p.v_scale : p.k_scale);
}

NVFP4KV_HOST_DEVICE bool usable_global_scale(float s) {
  return s > 0.0f && s <= 3.4028234663852886e38f;  // positive and finite (NaN fails both)
}

// Where row `row` lands, or false when it must be skipped (nothing written).
// Bounds contract (index values are device data; none of them may cause an out-of-bounds access):
//   b = batch_indices[row] must lie in [0, batch_size);
//   p = positions[row] must be >= 0;
//   the page slot s = kv_indptr[b] + p / page_size must lie in [kv_indptr[b], kv_indptr[b+1]) (so a
//   decreasing kv_indptr skips the request) and in [0, kv_indices.size);
//   page = kv_indices[s] must lie in [0, num_pages).
// The comparisons are arranged so that no intermediate overflows, whatever values the tensors hold.
//
// Slot-mapping variant: slot = slot_mapping[row]; rows with slot < 0 (padding) or
// slot >= num_pages * page_size are skipped; page = slot / page_size, entry = slot % page_size.
// Params: AppendParams or MlaParams (mla_params.h), which name their index fields alike.
// v / page_size for v >= 0, in 32 bits when both fit (a GPU's 64-bit division is a long subroutine).
NVFP4KV_HOST_DEVICE int64_t divide_by_page_size(int64_t v, int64_t page_size) {
  if (((v | page_size) >> 31) == 0) return int64_t(uint32_t(v) / uint32_t(page_size));
  return v / page_size;
}

template <typename Params>
NVFP4KV_HOST_DEVICE bool resolve_row_target(const Params& p, int64_t row, int64_t& page, int64_t& entry) {
  if (p.slot_mapping.data != nullptr) {
    const int64_t slot = p.slot_mapping[row];
    if (slot < 0) return false;
    page = divide_by_page_size(slot, p.page_size);
    if (page >= p.num_pages) return false;
    entry = slot - page * p.page_size;
    return true;
  }
  const int64_t b = p.batch_indices[row];
  if (b < 0 || b >= p.batch_size) return false;
  const int64_t position = p.positions[row];
  if (position < 0) return false;
  const int64_t first = p.kv_indptr[b];
  const int64_t last = p.kv_indptr[b + 1];
  if (first >= last) return false;
  const int64_t page_offset = divide_by_page_size(position, p.page_size);
  // last - first fits in uint64 because last > first; slot < last then cannot overflow.
  if (uint64_t(page_offset) >= uint64_t(last) - uint64_t(first)) return false;
  const int64_t slot = first + page_offset;
  if (slot < 0 || slot >= p.kv_indices.size) return false;
  page = p.kv_indices[slot];
  if (page < 0 || page >= p.num_pages) return false;
  entry = position - page_offset * p.page_size;
  return true;
}

}  // namespace nvfp4kv
