// Metadata checks of append_paged_kv_cache and the resolved AppendParams the kernels consume.
#pragma once

#include <optional>
#include <string>

#include "append_params.h"
#include "argument_checks.h"

namespace nvfp4kv {

// Checks every precondition that needs no device data (SPEC section 3) and resolves the cache
// geometry. `v_cache` / `v_cache_sf` are empty when `k_cache` / `k_cache_sf` is the stacked 5-D
// tensor with K/V on dim 1. Throws before anything is written.
AppendParams check_append_arguments(const Tensor& append_key, const Tensor& append_value,
                                    const Tensor& batch_indices, const Tensor& positions,
                                    const Tensor& k_cache, const std::optional<Tensor>& v_cache,
                                    const Tensor& k_cache_sf, const std::optional<Tensor>& v_cache_sf,
                                    const Tensor& kv_indices, const Tensor& kv_indptr,
                                    const Tensor& kv_last_page_len, double k_scale, double v_scale,
                                    const std::string& kv_layout);

}  // namespace nvfp4kv
