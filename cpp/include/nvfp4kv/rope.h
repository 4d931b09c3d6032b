// The C++ API of the fused RoPE + NVFP4 append, mirroring python/nvfp4kv/rope.py (docs/SPEC.md section 5).
// Header-only over the c10 dispatcher, like page.h (whose PagedCache and GlobalScale it takes).
//
//   #include <nvfp4kv/rope.h>
//   at::Tensor q = nvfp4kv::rope_quantize_nvfp4_append_paged_kv_cache(query, key, value, cos_sin_cache,
//       rope_positions, batch_indices, positions, {k_cache, v_cache}, {k_cache_sf, v_cache_sf},
//       kv_indices, kv_indptr, kv_last_page_len, k_scale, v_scale, "NHD", options);  // RopeOptions
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "nvfp4kv/operator.h"
#include "nvfp4kv/page.h"

namespace nvfp4kv {

// The keyword arguments of the Python API.
struct RopeOptions {
  bool is_neox = true;                        // pairs (j, j + R/2); false: GPT-J pairs (2j, 2j + 1)
  std::optional<at::Tensor> q_out;            // [n, Hq, D] output, or the query itself (rotated in place)
  std::optional<at::ScalarType> q_out_dtype;  // a new q_out's dtype: the query's (default) or Float8_e4m3fn
  std::optional<GlobalScale> q_scale;         // the FP8 Q decode scale, exactly when Q goes out in FP8
  std::optional<at::Tensor> k_out;            // [n, Hkv, D]: receives the rotated K
  std::string_view v_sf_layout = "linear";
  std::string_view scale_search = "none";
};

namespace detail {

// (the op's query argument, q_out): a new q_out when none is given; no query when q_out is the query.
inline std::pair<std::optional<at::Tensor>, at::Tensor> rope_q_arguments(const at::Tensor& query,
                                                                         const RopeOptions& options) {
  if (options.q_out.has_value()) {
    const bool in_place = options.q_out->is_same(query);
    return {in_place ? std::nullopt : std::optional<at::Tensor>(query), *options.q_out};
  }
  return {query, at::empty(query.sizes(), query.options().dtype(options.q_out_dtype.value_or(query.scalar_type())))};
}

// Calls the fused op: `placement` (the variant's own index arguments), then the arguments both variants share.
inline at::Tensor call_rope(const c10::OperatorHandle& op, std::vector<NamedArgument> placement,
                            const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                            const at::Tensor& cos_sin_cache, const at::Tensor& rope_positions,
                            const PagedCache& paged_kv_cache, const PagedCache& kv_cache_sf, const GlobalScale& k_scale,
                            const GlobalScale& v_scale, std::string_view kv_layout, const RopeOptions& options) {
  auto [op_query, q_out] = rope_q_arguments(query, options);
  const bool q_scale_value = options.q_scale.has_value() && !options.q_scale->tensor.has_value();
  std::vector<NamedArgument> arguments{
      {"append_key", key},
      {"append_value", value},
      {"k_cache", paged_kv_cache.first},
      {"v_cache", paged_kv_cache.second},
      {"k_cache_sf", kv_cache_sf.first},
      {"v_cache_sf", kv_cache_sf.second},
      {"k_scale", k_scale.value},
      {"v_scale", v_scale.value},
      {"kv_layout", std::string(kv_layout)},
      {"k_scale_tensor", k_scale.tensor},
      {"v_scale_tensor", v_scale.tensor},
      {"v_sf_layout", std::string(options.v_sf_layout)},
      {"scale_search", std::string(options.scale_search)},
      {"query", op_query},
      {"cos_sin_cache", cos_sin_cache},
      {"rope_positions", rope_positions},
      {"q_out", q_out},
      {"k_out", options.k_out},
      {"is_neox", options.is_neox},
      {"q_scale", q_scale_value ? c10::IValue(options.q_scale->value) : c10::IValue()},
      {"q_scale_tensor", options.q_scale.has_value() ? c10::IValue(options.q_scale->tensor) : c10::IValue()}};
  arguments.insert(arguments.end(), placement.begin(), placement.end());
  call(op, arguments);
  return q_out;
}

}  // namespace detail

// Rotates Q and K (RoPE) and quantize-appends the rotated K and the V into the NVFP4 paged cache; returns q_out.
//   query [n, Hq, D], key / value [n, Hkv, D]: float16/bfloat16, last dim contiguous
//   cos_sin_cache [max_pos, R] float32/float16/bfloat16 (cos | sin), rope_positions [n] int32/int64
//   batch_indices, positions [nnz <= n] and the rest: as nvfp4_quantize_append_paged_kv_cache (rows >= nnz are only
//   rotated; a row whose rope position is outside the table is not rotated, its Q row zeros, its K/V not cached)
inline at::Tensor rope_quantize_nvfp4_append_paged_kv_cache(
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, const at::Tensor& cos_sin_cache,
    const at::Tensor& rope_positions, const at::Tensor& batch_indices, const at::Tensor& positions,
    const PagedCache& paged_kv_cache, const PagedCache& kv_cache_sf, const at::Tensor& kv_indices,
    const at::Tensor& kv_indptr, const at::Tensor& kv_last_page_len, const GlobalScale& k_scale,
    const GlobalScale& v_scale, std::string_view kv_layout = "NHD", const RopeOptions& options = {}) {
  static const c10::OperatorHandle op = detail::find_op("nvfp4kv::rope_append_paged_kv_cache");
  return detail::call_rope(op,
                           {{"batch_indices", batch_indices},
                            {"positions", positions},
                            {"kv_indices", kv_indices},
                            {"kv_indptr", kv_indptr},
                            {"kv_last_page_len", kv_last_page_len}},
                           query, key, value, cos_sin_cache, rope_positions, paged_kv_cache, kv_cache_sf, k_scale,
                           v_scale, kv_layout, options);
}

// The same, addressed by flat slots (see nvfp4_quantize_append_paged_kv_cache_with_slot_mapping).
inline at::Tensor rope_quantize_nvfp4_append_paged_kv_cache_with_slot_mapping(
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, const at::Tensor& cos_sin_cache,
    const at::Tensor& rope_positions, const at::Tensor& slot_mapping, const PagedCache& paged_kv_cache,
    const PagedCache& kv_cache_sf, const GlobalScale& k_scale, const GlobalScale& v_scale,
    std::string_view kv_layout = "NHD", const RopeOptions& options = {}) {
  static const c10::OperatorHandle op = detail::find_op("nvfp4kv::rope_append_paged_kv_cache_with_slot_mapping");
  return detail::call_rope(op, {{"slot_mapping", slot_mapping}}, query, key, value, cos_sin_cache, rope_positions,
                           paged_kv_cache, kv_cache_sf, k_scale, v_scale, kv_layout, options);
}

}  // namespace nvfp4kv
