// CUDA registration of nvfp4kv::append_paged_kv_cache: host checks, device guard, torch's current
// stream, one kernel launch for K and V. No synchronisation, allocation or device-to-host copy.
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>

#include <optional>

#include "../append_checks.h"
#include "current_stream.h"
#include "kernels.h"

namespace nvfp4kv {
namespace {

void launch(const AppendParams& p, const Tensor& append_key, const char* op) {
  const int32_t device = append_key.get_device_index();
  // A device guard only when the tensors live on another device than the current one (the common
  // case needs none, and skipping it keeps the eager host path short).
  std::optional<torch::stable::accelerator::DeviceGuard> guard;
  if (torch::stable::accelerator::getCurrentDeviceIndex() != device) guard.emplace(device);
  const char* error_string = nullptr;
  const int error = launch_append_paged_kv_cache(p, current_cuda_stream(device), &error_string);
  check_cuda_launch(error, error_string, op);
}

void append_paged_kv_cache_cuda(Tensor append_key, Tensor append_value, Tensor batch_indices, Tensor positions,
                                Tensor k_cache, std::optional<Tensor> v_cache, Tensor k_cache_sf,
                                std::optional<Tensor> v_cache_sf, Tensor kv_indices, Tensor kv_indptr,
                                Tensor kv_last_page_len, double k_scale, double v_scale, std::string kv_layout,
                                std::optional<Tensor> k_scale_tensor, std::optional<Tensor> v_scale_tensor,
                                std::string v_sf_layout, std::string scale_search) {
  launch(check_append_arguments(append_key, append_value, batch_indices, positions,
                                {k_cache, v_cache, k_cache_sf, v_cache_sf}, kv_indices, kv_indptr, kv_last_page_len,
                                {k_scale, v_scale, k_scale_tensor, v_scale_tensor},
                                {kv_layout, v_sf_layout, scale_search}),
         append_key, "append_paged_kv_cache");
}

void append_paged_kv_cache_with_slot_mapping_cuda(Tensor append_key, Tensor append_value, Tensor slot_mapping,
                                                  Tensor k_cache, std::optional<Tensor> v_cache, Tensor k_cache_sf,
                                                  std::optional<Tensor> v_cache_sf, double k_scale, double v_scale,
                                                  std::string kv_layout, std::optional<Tensor> k_scale_tensor,
                                                  std::optional<Tensor> v_scale_tensor, std::string v_sf_layout,
                                                  std::string scale_search) {
  launch(check_append_with_slot_mapping_arguments(append_key, append_value, slot_mapping,
                                                  {k_cache, v_cache, k_cache_sf, v_cache_sf},
                                                  {k_scale, v_scale, k_scale_tensor, v_scale_tensor},
                                                  {kv_layout, v_sf_layout, scale_search}),
         append_key, "append_paged_kv_cache_with_slot_mapping");
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(nvfp4kv, CUDA, m) {
  m.impl("append_paged_kv_cache", TORCH_BOX(&append_paged_kv_cache_cuda));
  m.impl("append_paged_kv_cache_with_slot_mapping", TORCH_BOX(&append_paged_kv_cache_with_slot_mapping_cuda));
}

}  // namespace nvfp4kv
