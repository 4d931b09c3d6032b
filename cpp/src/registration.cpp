// Every nvfp4kv operator schema. Backend files (cpu/, cuda/) only register implementations;
// python/nvfp4kv/fake.py registers the fake (meta) implementations used for tracing.
#include <torch/csrc/stable/library.h>

STABLE_TORCH_LIBRARY(nvfp4kv, m) {
  // Quantizes K/V rows to NVFP4 and scatters them into a paged cache (SPEC section 1).
  // Tuple caches: k_cache/v_cache and k_cache_sf/v_cache_sf are the four 4-D tensors.
  // Stacked caches: k_cache and k_cache_sf are the 5-D tensors (K/V on dim 1) and v_cache /
  // v_cache_sf are None, so a stacked cache reaches the op, and torch.compile, as ONE mutable tensor.
  // k_scale / v_scale are the global decode scales as floats; when k_scale_tensor / v_scale_tensor
  // ([1] float32 on the inputs' device) are given they are read on the device instead (capturable);
  // a CPU one with CUDA inputs is read on the host like a float (SPEC Extension B).
  m.def(
      "append_paged_kv_cache(Tensor append_key, Tensor append_value, Tensor batch_indices, "
      "Tensor positions, Tensor(a!) k_cache, Tensor(b!)? v_cache, Tensor(c!) k_cache_sf, "
      "Tensor(d!)? v_cache_sf, Tensor kv_indices, Tensor kv_indptr, Tensor kv_last_page_len, "
      "float k_scale, float v_scale, str kv_layout, Tensor? k_scale_tensor=None, "
      "Tensor? v_scale_tensor=None, str v_sf_layout=\"linear\", str scale_search=\"none\") -> ()");
  // v_sf_layout: "linear" (SPEC) or "trtllm" (V scales 4-token interleaved, for trtllm-gen kernels);
  // scale_search: "none" (SPEC) or "4over6" (per-block choice between the 6- and 4-targeted scale).
  // The same quantize-and-scatter addressed by flat slots (vLLM style): slot_mapping[i] =
  // page * page_size + entry; negative slots are padding; only the first slot_mapping.shape[0] rows
  // of append_key / append_value are used.
  m.def(
      "append_paged_kv_cache_with_slot_mapping(Tensor append_key, Tensor append_value, "
      "Tensor slot_mapping, Tensor(a!) k_cache, Tensor(b!)? v_cache, Tensor(c!) k_cache_sf, "
      "Tensor(d!)? v_cache_sf, float k_scale, float v_scale, str kv_layout, "
      "Tensor? k_scale_tensor=None, Tensor? v_scale_tensor=None, str v_sf_layout=\"linear\", "
      "str scale_search=\"none\") -> ()");
  // MLA latent rows (SPEC section 4): ckv [nnz, C] to NVFP4 (ckv_cache uint8 [pages, page_size, C/2],
  // ckv_sf_cache float8_e4m3fn [pages, page_size, C/16]), kpe [nnz, R] to float8_e4m3fn (kpe_cache
  // [pages, page_size, R]; a kpe_cache of the inputs' 16-bit dtype gets a bit copy). Scales as above.
  m.def(
      "append_paged_mla_kv_cache(Tensor append_ckv, Tensor append_kpe, Tensor batch_indices, "
      "Tensor positions, Tensor(a!) ckv_cache, Tensor(b!) ckv_sf_cache, Tensor(c!) kpe_cache, "
      "Tensor kv_indices, Tensor kv_indptr, Tensor kv_last_page_len, float ckv_scale, float kpe_scale, "
      "Tensor? ckv_scale_tensor=None, Tensor? kpe_scale_tensor=None) -> ()");
  m.def(
      "append_paged_mla_kv_cache_with_slot_mapping(Tensor append_ckv, Tensor append_kpe, Tensor slot_mapping, "
      "Tensor(a!) ckv_cache, Tensor(b!) ckv_sf_cache, Tensor(c!) kpe_cache, float ckv_scale, float kpe_scale, "
      "Tensor? ckv_scale_tensor=None, Tensor? kpe_scale_tensor=None) -> ()");
  // The fused rotary embedding + append (docs/SPEC.md section 5): the append's arguments (key / value as
  // append_key / append_value, [n, Hkv, D]; batch_indices / positions or slot_mapping place the first nnz <= n
  // rows), then query [n, Hq, D] (None: q_out holds it and is rotated in place), cos_sin_cache [max_pos, R],
  // rope_positions [n], q_out [n, Hq, D] (the input dtype or float8_e4m3fn), k_out (the rotated K, optional),
  // the pair convention, and the FP8 Q decode scale (a float or a [1] float32 tensor; FP8 q_out only).
  m.def(
      "rope_append_paged_kv_cache(Tensor append_key, Tensor append_value, Tensor batch_indices, "
      "Tensor positions, Tensor(a!) k_cache, Tensor(b!)? v_cache, Tensor(c!) k_cache_sf, "
      "Tensor(d!)? v_cache_sf, Tensor kv_indices, Tensor kv_indptr, Tensor kv_last_page_len, "
      "float k_scale, float v_scale, str kv_layout, Tensor? k_scale_tensor, Tensor? v_scale_tensor, "
      "str v_sf_layout, str scale_search, Tensor? query, Tensor cos_sin_cache, Tensor rope_positions, "
      "Tensor(e!) q_out, Tensor(f!)? k_out, bool is_neox, float? q_scale, Tensor? q_scale_tensor) -> ()");
  m.def(
      "rope_append_paged_kv_cache_with_slot_mapping(Tensor append_key, Tensor append_value, "
      "Tensor slot_mapping, Tensor(a!) k_cache, Tensor(b!)? v_cache, Tensor(c!) k_cache_sf, "
      "Tensor(d!)? v_cache_sf, float k_scale, float v_scale, str kv_layout, Tensor? k_scale_tensor, "
      "Tensor? v_scale_tensor, str v_sf_layout, str scale_search, Tensor? query, Tensor cos_sin_cache, "
      "Tensor rope_positions, Tensor(e!) q_out, Tensor(f!)? k_out, bool is_neox, float? q_scale, "
      "Tensor? q_scale_tensor) -> ()");
  // packed uint8 [..., D/2] + float8_e4m3fn scales [..., D/16] -> float32 [..., D].
  m.def("dequantize(Tensor packed, Tensor scales, float global_scale) -> Tensor");
}
