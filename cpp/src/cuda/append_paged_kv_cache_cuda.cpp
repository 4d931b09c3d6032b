// CUDA registration of nvfp4kv::append_paged_kv_cache: host checks, device guard, torch's current
// stream, one kernel launch for K and V. No synchronisation, allocation or device-to-host copy.
#include <torch/csrc/stable/library.h>

#include "../append_checks.h"
#include "device_launch.h"
#include "kernels.h"

namespace nvfp4kv {
namespace {

// Boxed kernels: the arguments are read from the dispatcher's stack (boxed_arguments.h).
void append_paged_kv_cache_cuda(StableIValue* stack, uint64_t num_args, uint64_t num_outputs) {
  BoxedArguments boxed(stack, num_args, num_outputs);
  const AppendArguments arguments = read_append_arguments(boxed);
  launch_on_device(launch_append_paged_kv_cache, check_append_arguments(arguments), arguments.append_key.device_index(),
                   "append_paged_kv_cache");
}

void append_paged_kv_cache_with_slot_mapping_cuda(StableIValue* stack, uint64_t num_args, uint64_t num_outputs) {
  BoxedArguments boxed(stack, num_args, num_outputs);
  const AppendWithSlotMappingArguments arguments = read_append_with_slot_mapping_arguments(boxed);
  launch_on_device(launch_append_paged_kv_cache, check_append_with_slot_mapping_arguments(arguments),
                   arguments.append_key.device_index(), "append_paged_kv_cache_with_slot_mapping");
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(nvfp4kv, CUDA, m) {
  m.impl("append_paged_kv_cache", &append_paged_kv_cache_cuda);
  m.impl("append_paged_kv_cache_with_slot_mapping", &append_paged_kv_cache_with_slot_mapping_cuda);
}

}  // namespace nvfp4kv
