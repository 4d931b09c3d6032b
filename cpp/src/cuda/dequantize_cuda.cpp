// CUDA registration of nvfp4kv::dequantize.
#include <torch/csrc/stable/library.h>

#include "../dequantize_arguments.h"
#include "device_launch.h"
#include "kernels.h"

namespace nvfp4kv {
namespace {

// Boxed kernel: the arguments are read from the dispatcher's stack (boxed_arguments.h).
void dequantize_cuda(StableIValue* stack, uint64_t num_args, uint64_t num_outputs) {
  BoxedArguments boxed(stack, num_args, num_outputs);
  const DequantizeCall call = prepare_dequantize(boxed);  // allocates on the inputs' device
  launch_on_device(launch_dequantize, call.params, call.packed.get_device_index(), "dequantize");
  boxed.return_tensor(call.out);
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(nvfp4kv, CUDA, m) { m.impl("dequantize", &dequantize_cuda); }

}  // namespace nvfp4kv
