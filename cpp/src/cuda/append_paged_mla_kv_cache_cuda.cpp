// CUDA registration of the MLA latent appends: host checks, device guard, torch's current stream, one
// kernel launch. No synchronisation, allocation or device-to-host copy.
#include <torch/csrc/stable/library.h>

#include "../mla_checks.h"
#include "device_launch.h"
#include "kernels.h"

namespace nvfp4kv {
namespace {

void append_paged_mla_kv_cache_cuda(StableIValue* stack, uint64_t num_args, uint64_t num_outputs) {
  BoxedArguments boxed(stack, num_args, num_outputs);
  const MlaAppendArguments arguments = read_mla_append_arguments(boxed);
  launch_on_device(launch_append_paged_mla_kv_cache, check_mla_append_arguments(arguments),
                   arguments.append_ckv.device_index(), "append_paged_mla_kv_cache");
}

void append_paged_mla_kv_cache_with_slot_mapping_cuda(StableIValue* stack, uint64_t num_args, uint64_t num_outputs) {
  BoxedArguments boxed(stack, num_args, num_outputs);
  const MlaAppendWithSlotMappingArguments arguments = read_mla_append_with_slot_mapping_arguments(boxed);
  launch_on_device(launch_append_paged_mla_kv_cache, check_mla_append_with_slot_mapping_arguments(arguments),
                   arguments.append_ckv.device_index(), "append_paged_mla_kv_cache_with_slot_mapping");
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(nvfp4kv, CUDA, m) {
  m.impl("append_paged_mla_kv_cache", &append_paged_mla_kv_cache_cuda);
  m.impl("append_paged_mla_kv_cache_with_slot_mapping", &append_paged_mla_kv_cache_with_slot_mapping_cuda);
}

}  // namespace nvfp4kv
