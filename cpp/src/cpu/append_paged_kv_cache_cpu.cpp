// CPU implementation of nvfp4kv::append_paged_kv_cache (SPEC sections 1 and 2).
// Work is split over (row, head) pairs; each pair quantizes its K and V head rows block by block.
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>

#include "../append_checks.h"
#include <algorithm>

namespace nvfp4kv {
namespace {

// Quantizes one head row of head_dim values into head_dim/2 data bytes and head_dim/16 scale bytes.
void quantize_head_row(const AppendParams& p, const uint16_t* src, float global_scale, uint8_t* data,
                       const CacheView& scales, bool trtllm_scales, int64_t page, int64_t entry, int64_t head) {
  const int64_t blocks = p.head_dim / codec::kBlockSize;
  for (int64_t block = 0; block < blocks; ++block) {
    float x[codec::kBlockSize];
    for (int j = 0; j < codec::kBlockSize; ++j) {
      const uint16_t bits = src[block * codec::kBlockSize + j];
      x[j] = p.input_is_bf16 ? codec::bf16_bits_to_float(bits) : codec::fp16_bits_to_float(bits);
    }
    uint64_t packed;
    *scale_address(scales, trtllm_scales, page, entry, head, block, blocks) = quantize_block_with_recipe(p, x, global_scale, packed);
    for (int k = 0; k < codec::kBlockBytes; ++k) data[block * codec::kBlockBytes + k] = uint8_t(packed >> (8 * k));
  }
}

void append_rows(const AppendParams& p, int64_t begin, int64_t end) {
  const float k_scale = global_scale(p, false);
  const float v_scale = global_scale(p, true);
  const bool write_k = usable_global_scale(k_scale);  // a bad device scale leaves those rows untouched
  const bool write_v = usable_global_scale(v_scale);
  for (int64_t item = begin; item < end; ++item) {
    const int64_t row = item / p.num_heads;
    const int64_t head = item % p.num_heads;
    int64_t page, entry;
    if (!resolve_row_target(p, row, page, entry)) continue;
    if (write_k) {
      quantize_head_row(p, p.key.data + row * p.key.row_stride + head * p.key.head_stride, k_scale,
                        p.k_data.at(page, entry, head), p.k_scales, false, page, entry, head);
    }
    if (write_v) {
      quantize_head_row(p, p.value.data + row * p.value.row_stride + head * p.value.head_stride, v_scale,
                        p.v_data.at(page, entry, head), p.v_scales, p.v_scales_trtllm, page, entry, head);
    }
  }
}

void append(const AppendParams& p) {
  const int64_t items = p.nnz * p.num_heads;
  // About 32 KiB of input per task keeps small decode calls on the calling thread.
  const int64_t grain = std::max<int64_t>(1, 16384 / p.head_dim);
  if (items <= grain) {
    append_rows(p, 0, items);
  } else {
    torch::stable::parallel_for(0, items, grain, [&](int64_t begin, int64_t end) { append_rows(p, begin, end); });
  }
}

void append_paged_kv_cache_cpu(Tensor append_key, Tensor append_value, Tensor batch_indices, Tensor positions,
                               Tensor k_cache, std::optional<Tensor> v_cache, Tensor k_cache_sf,
                               std::optional<Tensor> v_cache_sf, Tensor kv_indices, Tensor kv_indptr,
                               Tensor kv_last_page_len, double k_scale, double v_scale, std::string kv_layout,
                               std::optional<Tensor> k_scale_tensor, std::optional<Tensor> v_scale_tensor,
                               std::string v_sf_layout, std::string scale_search) {
  append(check_append_arguments(append_key, append_value, batch_indices, positions,
                                {k_cache, v_cache, k_cache_sf, v_cache_sf}, kv_indices, kv_indptr, kv_last_page_len,
                                {k_scale, v_scale, k_scale_tensor, v_scale_tensor},
                                {kv_layout, v_sf_layout, scale_search}));
}

void append_paged_kv_cache_with_slot_mapping_cpu(Tensor append_key, Tensor append_value, Tensor slot_mapping,
                                                 Tensor k_cache, std::optional<Tensor> v_cache, Tensor k_cache_sf,
                                                 std::optional<Tensor> v_cache_sf, double k_scale, double v_scale,
                                                 std::string kv_layout, std::optional<Tensor> k_scale_tensor,
                                                 std::optional<Tensor> v_scale_tensor, std::string v_sf_layout,
                                                 std::string scale_search) {
  append(check_append_with_slot_mapping_arguments(append_key, append_value, slot_mapping,
                                                  {k_cache, v_cache, k_cache_sf, v_cache_sf},
                                                  {k_scale, v_scale, k_scale_tensor, v_scale_tensor},
                                                  {kv_layout, v_sf_layout, scale_search}));
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(nvfp4kv, CPU, m) {
  m.impl("append_paged_kv_cache", TORCH_BOX(&append_paged_kv_cache_cpu));
  m.impl("append_paged_kv_cache_with_slot_mapping", TORCH_BOX(&append_paged_kv_cache_with_slot_mapping_cpu));
}

}  // namespace nvfp4kv
