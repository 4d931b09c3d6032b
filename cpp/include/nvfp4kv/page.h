// The C++ API of the paged-KV op, mirroring python/nvfp4kv/append.py (dequantize: fp4_quantization.h).
//
// Header-only over the c10 dispatcher: every function calls the op registered by libnvfp4kv.so
// (schemas in cpp/src/registration.cpp), so C++ and Python run the same CPU and CUDA kernels and
// raise the same errors: a bad argument throws std::invalid_argument (ValueError in Python) with the
// same message, e.g. "nvfp4kv.append_paged_kv_cache: kv_cache_sf[1] must have dtype float8_e4m3fn,
// got uint8", before anything is written. Link the CMake target nvfp4kv::nvfp4kv: it keeps libnvfp4kv.so on the link
// line even with --as-needed, so the ops are registered when the program starts.
//
//   #include <nvfp4kv/page.h>
//   nvfp4kv::nvfp4_quantize_append_paged_kv_cache(key, value, batch_indices, positions,
//       {k_cache, v_cache}, {k_cache_sf, v_cache_sf},    // (K, V) caches, or one stacked 5-D tensor each
//       kv_indices, kv_indptr, kv_last_page_len, k_scale, v_scale, "NHD");
#pragma once

#include <ATen/ATen.h>

#include "nvfp4kv/operator.h"

#include <optional>
#include <string_view>
#include <tuple>
#include <utility>

namespace nvfp4kv {

// A paged cache as the Python API takes it: a (K, V) pair of 4-D tensors, or one 5-D tensor with
// K/V on dim 1 ([max_num_pages, 2, ...]). Converts implicitly from a tensor, a std::tuple or
// std::pair of two tensors, or a braced pair {k, v}.
struct PagedCache {
  PagedCache(at::Tensor stacked) : first(std::move(stacked)) {}  // NOLINT: implicit by design
  PagedCache(at::Tensor k, at::Tensor v) : first(std::move(k)), second(std::move(v)) {}
  PagedCache(const std::tuple<at::Tensor, at::Tensor>& kv)  // NOLINT
      : first(std::get<0>(kv)), second(std::get<1>(kv)) {}
  PagedCache(const std::pair<at::Tensor, at::Tensor>& kv) : first(kv.first), second(kv.second) {}  // NOLINT

  bool stacked() const { return !second.has_value(); }

  at::Tensor first;                  // K of a pair, or the whole stacked tensor
  std::optional<at::Tensor> second;  // V of a pair; empty for a stacked tensor
};

// A global decode scale as the Python API takes it: a float (validated on the host) or a one-element
// float32 tensor on the inputs' device, read by the kernel (no synchronisation, so a captured CUDA
// graph sees values written into it later). A CPU tensor with CUDA inputs is read on the host and
// validated as a float (refused during CUDA graph capture).
struct GlobalScale {
  GlobalScale(double value) : value(value) {}                                // NOLINT: implicit by design
  GlobalScale(at::Tensor tensor) : value(1.0), tensor(std::move(tensor)) {}  // NOLINT

  double value;                      // the op's float argument (1.0, unused, for a tensor scale)
  std::optional<at::Tensor> tensor;  // the op's *_scale_tensor argument
};

// Quantizes K/V rows to NVFP4 and writes them into the paged cache in place (SPEC sections 1, 2).
//   append_key, append_value: [nnz, num_kv_heads, head_dim] float16/bfloat16, last dim contiguous
//   batch_indices, positions: [nnz] int32/int64 (request and token position of each row)
//   paged_kv_cache: uint8 (K, V) [max_num_pages, page_size, num_kv_heads, head_dim/2] (NHD) or
//                   [max_num_pages, num_kv_heads, page_size, head_dim/2] (HND), or one 5-D tensor
//   kv_cache_sf:    the same structure, float8_e4m3fn, last dim head_dim/16
//   kv_indices, kv_indptr, kv_last_page_len: the page table, already covering the new rows
//   k_scale, v_scale: global decode scales (value = e2m1 * block_scale * global_scale)
//   v_sf_layout: "linear" or "trtllm" (V scales 4-token interleaved); scale_search: "none" or "4over6"
inline void nvfp4_quantize_append_paged_kv_cache(const at::Tensor& append_key, const at::Tensor& append_value,
                                                 const at::Tensor& batch_indices, const at::Tensor& positions,
                                                 const PagedCache& paged_kv_cache, const PagedCache& kv_cache_sf,
                                                 const at::Tensor& kv_indices, const at::Tensor& kv_indptr,
                                                 const at::Tensor& kv_last_page_len, const GlobalScale& k_scale,
                                                 const GlobalScale& v_scale, std::string_view kv_layout = "NHD",
                                                 std::string_view v_sf_layout = "linear",
                                                 std::string_view scale_search = "none") {
  static const c10::OperatorHandle op = detail::find_op("nvfp4kv::append_paged_kv_cache");
  detail::call(op, {{"append_key", append_key},
                    {"append_value", append_value},
                    {"batch_indices", batch_indices},
                    {"positions", positions},
                    {"k_cache", paged_kv_cache.first},
                    {"v_cache", paged_kv_cache.second},
                    {"k_cache_sf", kv_cache_sf.first},
                    {"v_cache_sf", kv_cache_sf.second},
                    {"kv_indices", kv_indices},
                    {"kv_indptr", kv_indptr},
                    {"kv_last_page_len", kv_last_page_len},
                    {"k_scale", k_scale.value},
                    {"v_scale", v_scale.value},
                    {"kv_layout", std::string(kv_layout)},
                    {"k_scale_tensor", k_scale.tensor},
                    {"v_scale_tensor", v_scale.tensor},
                    {"v_sf_layout", std::string(v_sf_layout)},
                    {"scale_search", std::string(scale_search)}});
}

// The same append addressed by flat slots, as vLLM-style engines do: row i goes to page
// slot_mapping[i] / page_size, entry slot_mapping[i] % page_size.
//   slot_mapping: [n] int32/int64, n <= append_key.size(0); negative slots are padding (skipped), and
//                 so are slots at or beyond max_num_pages * page_size; rows past n are ignored.
inline void nvfp4_quantize_append_paged_kv_cache_with_slot_mapping(
    const at::Tensor& append_key, const at::Tensor& append_value, const at::Tensor& slot_mapping,
    const PagedCache& paged_kv_cache, const PagedCache& kv_cache_sf, const GlobalScale& k_scale,
    const GlobalScale& v_scale, std::string_view kv_layout = "NHD", std::string_view v_sf_layout = "linear",
    std::string_view scale_search = "none") {
  static const c10::OperatorHandle op = detail::find_op("nvfp4kv::append_paged_kv_cache_with_slot_mapping");
  detail::call(op, {{"append_key", append_key},
                    {"append_value", append_value},
                    {"slot_mapping", slot_mapping},
                    {"k_cache", paged_kv_cache.first},
                    {"v_cache", paged_kv_cache.second},
                    {"k_cache_sf", kv_cache_sf.first},
                    {"v_cache_sf", kv_cache_sf.second},
                    {"k_scale", k_scale.value},
                    {"v_scale", v_scale.value},
                    {"kv_layout", std::string(kv_layout)},
                    {"k_scale_tensor", k_scale.tensor},
                    {"v_scale_tensor", v_scale.tensor},
                    {"v_sf_layout", std::string(v_sf_layout)},
                    {"scale_search", std::string(scale_search)}});
}

// Quantizes MLA latent rows and writes them into the paged latent caches in place (SPEC section 4).
//   append_ckv [nnz, C], append_kpe [nnz, R]: float16/bfloat16, last dim contiguous, C % 16 == 0
//   ckv_cache uint8 [max_num_pages, page_size, C/2], ckv_sf_cache float8_e4m3fn [.., C/16]: NVFP4 ckv
//   kpe_cache float8_e4m3fn [.., R] (kpe / kpe_scale rounded to E4M3), or the inputs' dtype (a bit copy)
//   batch_indices, positions, kv_indices, kv_indptr, kv_last_page_len: placed as the paged K/V append
inline void nvfp4_quantize_append_paged_mla_kv_cache(const at::Tensor& append_ckv, const at::Tensor& append_kpe,
                                                     const at::Tensor& batch_indices, const at::Tensor& positions,
                                                     const at::Tensor& ckv_cache, const at::Tensor& ckv_sf_cache,
                                                     const at::Tensor& kpe_cache, const at::Tensor& kv_indices,
                                                     const at::Tensor& kv_indptr, const at::Tensor& kv_last_page_len,
                                                     const GlobalScale& ckv_scale, const GlobalScale& kpe_scale) {
  static const c10::OperatorHandle op = detail::find_op("nvfp4kv::append_paged_mla_kv_cache");
  detail::call(op, {{"append_ckv", append_ckv},
                    {"append_kpe", append_kpe},
                    {"batch_indices", batch_indices},
                    {"positions", positions},
                    {"ckv_cache", ckv_cache},
                    {"ckv_sf_cache", ckv_sf_cache},
                    {"kpe_cache", kpe_cache},
                    {"kv_indices", kv_indices},
                    {"kv_indptr", kv_indptr},
                    {"kv_last_page_len", kv_last_page_len},
                    {"ckv_scale", ckv_scale.value},
                    {"kpe_scale", kpe_scale.value},
                    {"ckv_scale_tensor", ckv_scale.tensor},
                    {"kpe_scale_tensor", kpe_scale.tensor}});
}

// The MLA append addressed by flat slots (see nvfp4_quantize_append_paged_kv_cache_with_slot_mapping).
inline void nvfp4_quantize_append_paged_mla_kv_cache_with_slot_mapping(
    const at::Tensor& append_ckv, const at::Tensor& append_kpe, const at::Tensor& slot_mapping,
    const at::Tensor& ckv_cache, const at::Tensor& ckv_sf_cache, const at::Tensor& kpe_cache,
    const GlobalScale& ckv_scale, const GlobalScale& kpe_scale) {
  static const c10::OperatorHandle op = detail::find_op("nvfp4kv::append_paged_mla_kv_cache_with_slot_mapping");
  detail::call(op, {{"append_ckv", append_ckv},
                    {"append_kpe", append_kpe},
                    {"slot_mapping", slot_mapping},
                    {"ckv_cache", ckv_cache},
                    {"ckv_sf_cache", ckv_sf_cache},
                    {"kpe_cache", kpe_cache},
                    {"ckv_scale", ckv_scale.value},
                    {"kpe_scale", kpe_scale.value},
                    {"ckv_scale_tensor", ckv_scale.tensor},
                    {"kpe_scale_tensor", kpe_scale.tensor}});
}

// Sequence length of each request: full pages times page_size plus the last page's entries.
inline at::Tensor get_seq_lens(const at::Tensor& kv_indptr, const at::Tensor& kv_last_page_len, int64_t page_size) {
  const at::Tensor pages = kv_indptr.slice(0, 1) - kv_indptr.slice(0, 0, -1);
  return at::clamp_min(pages - 1, 0) * page_size + kv_last_page_len;
}

// int32 (batch_indices, positions) of the nnz appended rows: row j of request b
// (append_indptr[b] <= j < append_indptr[b+1]) gets b and
// seq_lens[b] - (append_indptr[b+1] - append_indptr[b]) + (j - append_indptr[b]).
// Runs on the inputs' device without synchronising (nnz is given).
inline std::tuple<at::Tensor, at::Tensor> get_batch_indices_positions(const at::Tensor& append_indptr,
                                                                      const at::Tensor& seq_lens, int64_t nnz) {
  const auto options = append_indptr.options();
  const at::Tensor counts = append_indptr.slice(0, 1) - append_indptr.slice(0, 0, -1);
  const at::Tensor batch = at::arange(counts.numel(), options.dtype(at::kLong));
  const at::Tensor batch_indices = at::repeat_interleave(batch, counts, /*dim=*/0, /*output_size=*/nnz);
  const at::Tensor rows = at::arange(nnz, options.dtype(at::kLong));
  const at::Tensor first_position = seq_lens.to(counts.scalar_type()) - counts;
  const at::Tensor positions = first_position.index_select(0, batch_indices) + rows -
                               append_indptr.slice(0, 0, -1).index_select(0, batch_indices);
  return {batch_indices.to(at::kInt), positions.to(at::kInt)};
}

}  // namespace nvfp4kv
