// CPU implementation of nvfp4kv::dequantize: value = e2m1(code) * float(scale) * global_scale.
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>

#include "../dequantize_arguments.h"
#include "nvfp4kv/nvfp4_codec.h"

namespace nvfp4kv {
namespace {

void dequantize_rows(const DequantizeParams& p, int64_t begin, int64_t end) {
  for (int64_t row = begin; row < end; ++row) {
    const uint8_t* packed = p.packed + row * (p.head_dim / 2);
    const uint8_t* scales = p.scales + row * (p.head_dim / codec::kBlockSize);
    float* out = p.out + row * p.head_dim;
    for (int64_t j = 0; j < p.head_dim; ++j) {
      const uint8_t code = (packed[j / 2] >> (4 * (j % 2))) & 0xF;
      out[j] = codec::dequantize_value(code, codec::e4m3_to_float(scales[j / codec::kBlockSize]), p.global_scale);
    }
  }
}

// Boxed kernel: the arguments are read from the dispatcher's stack (boxed_arguments.h).
void dequantize_cpu(StableIValue* stack, uint64_t num_args, uint64_t num_outputs) {
  BoxedArguments boxed(stack, num_args, num_outputs);
  const DequantizeCall call = prepare_dequantize(boxed);
  const DequantizeParams& p = call.params;
  torch::stable::parallel_for(0, p.rows, std::max<int64_t>(1, 65536 / std::max<int64_t>(1, p.head_dim)),
                              [&](int64_t begin, int64_t end) { dequantize_rows(p, begin, end); });
  boxed.return_tensor(call.out);
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(nvfp4kv, CPU, m) { m.impl("dequantize", &dequantize_cpu); }

}  // namespace nvfp4kv
