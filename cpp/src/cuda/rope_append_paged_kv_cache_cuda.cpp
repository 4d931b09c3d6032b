// CUDA registration of the fused RoPE + NVFP4 appends: host checks, device guard, torch's current stream, one
// kernel launch. No synchronisation, allocation or device-to-host copy.
#include <torch/csrc/stable/library.h>

#include "../rope_checks.h"
#include "device_launch.h"
#include "kernels.h"

namespace nvfp4kv {
namespace {

void rope_append_paged_kv_cache_cuda(StableIValue* stack, uint64_t num_args, uint64_t num_outputs) {
  BoxedArguments boxed(stack, num_args, num_outputs);
  const RopeAppendArguments arguments = read_rope_append_arguments(boxed);
  launch_on_device(launch_rope_append_paged_kv_cache, check_rope_append_arguments(arguments),
                   arguments.append.append_key.device_index(), "rope_append_paged_kv_cache");
}

void rope_append_paged_kv_cache_with_slot_mapping_cuda(StableIValue* stack, uint64_t num_args, uint64_t num_outputs) {
  BoxedArguments boxed(stack, num_args, num_outputs);
  const RopeAppendWithSlotMappingArguments arguments = read_rope_append_with_slot_mapping_arguments(boxed);
  launch_on_device(launch_rope_append_paged_kv_cache, check_rope_append_with_slot_mapping_arguments(arguments),
                   arguments.append.append_key.device_index(), "rope_append_paged_kv_cache_with_slot_mapping");
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(nvfp4kv, CUDA, m) {
  m.impl("rope_append_paged_kv_cache", &rope_append_paged_kv_cache_cuda);
  m.impl("rope_append_paged_kv_cache_with_slot_mapping", &rope_append_paged_kv_cache_with_slot_mapping_cuda);
}

}  // namespace nvfp4kv
