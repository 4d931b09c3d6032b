// CUDA registration of nvfp4kv::dequantize.
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>

#include "../dequantize_arguments.h"
#include "current_stream.h"
#include "kernels.h"

namespace nvfp4kv {
namespace {

Tensor dequantize_cuda(Tensor packed, Tensor scales, double global_scale) {
  const int32_t device = packed.get_device_index();
  const torch::stable::accelerator::DeviceGuard guard(device);
  const DequantizeCall call = prepare_dequantize(packed, scales, global_scale);
  const char* error_string = nullptr;
  const int error = launch_dequantize(call.params, current_cuda_stream(device), &error_string);
  check_cuda_launch(error, error_string, "dequantize");
  return call.out;
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(nvfp4kv, CUDA, m) { m.impl("dequantize", TORCH_BOX(&dequantize_cuda)); }

}  // namespace nvfp4kv
