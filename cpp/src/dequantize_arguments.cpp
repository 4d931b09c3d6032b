#include "dequantize_arguments.h"

#include <torch/csrc/stable/ops.h>

#include <vector>

namespace nvfp4kv {

namespace {
constexpr const char* kOp = "dequantize";
}

DequantizeCall prepare_dequantize(BoxedArguments& boxed) {
  const Tensor packed_tensor = boxed.owned_tensor();
  const Tensor scales_tensor = boxed.owned_tensor();
  const double global_scale = boxed.real();
  boxed.finish(kOp, 1);
  const TensorInfo packed(packed_tensor);
  const TensorInfo scales(scales_tensor);
  if (packed.scalar_type() != ScalarType::Byte) {
    fail(kOp, "packed must have dtype uint8, got ", dtype_name(packed.scalar_type()));
  }
  if (scales.scalar_type() != ScalarType::Float8_e4m3fn) {
    fail(kOp, "scales must have dtype float8_e4m3fn, got ", dtype_name(scales.scalar_type()));
  }
  if (packed.dim() < 1 || packed.size(packed.dim() - 1) % 8 != 0) {
    fail(kOp, "packed must have a last dim head_dim/2 that is a multiple of 8, got shape ", packed.shape_string());
  }
  bool same_leading =
      scales.dim() == packed.dim() && scales.size(scales.dim() - 1) * 8 == packed.size(packed.dim() - 1);
  for (int64_t d = 0; same_leading && d + 1 < packed.dim(); ++d) same_leading = scales.size(d) == packed.size(d);
  if (!same_leading) {
    fail(kOp, "scales must have shape [..., head_dim/16] matching packed ", packed.shape_string(), ", got ",
         scales.shape_string());
  }
  if (!scales.same_device(packed)) {
    fail(kOp, "scales must be on the same device as packed (", packed.device_string(), "), got ",
         scales.device_string());
  }
  const float scale = checked_global_scale(kOp, "global_scale", global_scale);

  std::vector<int64_t> out_shape(packed_tensor.sizes().begin(), packed_tensor.sizes().end());
  out_shape.back() *= 2;
  DequantizeCall call{torch::stable::new_empty(packed_tensor, out_shape, ScalarType::Float),
                      torch::stable::contiguous(packed_tensor),
                      torch::stable::contiguous(scales_tensor),
                      {}};
  const int64_t head_dim = out_shape.back();
  call.params = DequantizeParams{static_cast<const uint8_t*>(call.packed.data_ptr()),
                                 static_cast<const uint8_t*>(call.scales.data_ptr()),
                                 static_cast<float*>(call.out.data_ptr()),
                                 head_dim ? call.out.numel() / head_dim : 0,
                                 head_dim,
                                 scale};
  return call;
}

}  // namespace nvfp4kv
