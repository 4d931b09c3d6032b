// Metadata checks of append_paged_kv_cache and the resolved AppendParams the kernels consume.
#pragma once

#include <optional>
#include <string>

#include "append_params.h"
#include "argument_checks.h"

namespace nvfp4kv {

// The cache arguments as the op receives them: tuple caches are four 4-D tensors; a stacked cache
// is the 5-D k_cache / k_cache_sf with K/V on dim 1 and v_cache / v_cache_sf empty.
struct CacheArguments {
  const Tensor& k_cache;
  const std::optional<Tensor>& v_cache;
  const Tensor& k_cache_sf;
  const std::optional<Tensor>& v_cache_sf;
};

// Global decode scales: floats, or [1] float32 tensors on the inputs' device (then the floats are unused).
struct ScaleArguments {
  double k_scale;
  double v_scale;
  const std::optional<Tensor>& k_scale_tensor;
  const std::optional<Tensor>& v_scale_tensor;
};

// The format choices: kv_layout "NHD" | "HND", v_sf_layout "linear" | "trtllm", scale_search "none" | "4over6".
struct FormatArguments {
  const std::string& kv_layout;
  const std::string& v_sf_layout;
  const std::string& scale_search;
};

// Check every precondition that needs no device data (SPEC section 3) and resolve the geometry the
// kernels use. They throw before anything is written.
AppendParams check_append_arguments(const Tensor& append_key, const Tensor& append_value,
                                    const Tensor& batch_indices, const Tensor& positions,
                                    const CacheArguments& caches, const Tensor& kv_indices, const Tensor& kv_indptr,
                                    const Tensor& kv_last_page_len, const ScaleArguments& scales,
                                    const FormatArguments& format);

AppendParams check_append_with_slot_mapping_arguments(const Tensor& append_key, const Tensor& append_value,
                                                      const Tensor& slot_mapping, const CacheArguments& caches,
                                                      const ScaleArguments& scales, const FormatArguments& format);

}  // namespace nvfp4kv
