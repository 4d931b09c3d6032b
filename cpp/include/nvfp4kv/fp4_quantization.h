// The C++ API of dequantization, mirroring python/nvfp4kv/fp4_quantization.py: header-only over the
// c10 dispatcher, like page.h (link the CMake target nvfp4kv::nvfp4kv).
#pragma once

#include <ATen/ATen.h>

#include "nvfp4kv/operator.h"

namespace nvfp4kv {

// float32 [..., D] = e2m1(code) * float(block_scale) * global_scale.
//   packed: uint8 [..., D/2] (low nibble = even element); scales: float8_e4m3fn [..., D/16].
inline at::Tensor dequantize(const at::Tensor& packed, const at::Tensor& scales, double global_scale) {
  static const c10::OperatorHandle op = detail::find_op("nvfp4kv::dequantize");
  return detail::call(op, {{"packed", packed}, {"scales", scales}, {"global_scale", global_scale}})[0].toTensor();
}

}  // namespace nvfp4kv
