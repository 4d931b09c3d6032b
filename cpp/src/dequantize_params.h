// What one dequantize call reads and writes: torch-free, shared by the CPU and CUDA kernels.
#pragma once

#include <cstdint>

namespace nvfp4kv {

struct DequantizeParams {
  const uint8_t* packed;  // [rows, head_dim / 2] contiguous
  const uint8_t* scales;  // [rows, head_dim / 16] contiguous float8_e4m3fn bytes
  float* out;             // [rows, head_dim] contiguous float32
  int64_t rows;
  int64_t head_dim;
  float global_scale;
};

}  // namespace nvfp4kv
