// CUDA registration of nvfp4kv::append_paged_kv_cache: host checks, device guard, torch's current
// stream, one kernel launch for K and V. No synchronisation, allocation or device-to-host copy.
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>

#include "../append_checks.h"
#include "current_stream.h"
#include "kernels.h"

namespace nvfp4kv {
namespace {

void append_paged_kv_cache_cuda(Tensor append_key, Tensor append_value, Tensor batch_indices, Tensor positions,
                                Tensor k_cache, std::optional<Tensor> v_cache, Tensor k_cache_sf,
                                std::optional<Tensor> v_cache_sf, Tensor kv_indices, Tensor kv_indptr,
                                Tensor kv_last_page_len, double k_scale, double v_scale, std::string kv_layout) {
  const AppendParams p = check_append_arguments(append_key, append_value, batch_indices, positions, k_cache,
                                                v_cache, k_cache_sf, v_cache_sf, kv_indices, kv_indptr,
                                                kv_last_page_len, k_scale, v_scale, kv_layout);
  const int32_t device = append_key.get_device_index();
  const torch::stable::accelerator::DeviceGuard guard(device);
  const char* error_string = nullptr;
  const int error = launch_append_paged_kv_cache(p, current_cuda_stream(device), &error_string);
  check_cuda_launch(error, error_string, "append_paged_kv_cache");
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(nvfp4kv, CUDA, m) {
  m.impl("append_paged_kv_cache", TORCH_BOX(&append_paged_kv_cache_cuda));
}

}  // namespace nvfp4kv
