// CUDA kernel of nvfp4kv::dequantize. One thread per 16-value block:
//   packed [rows, head_dim/2] uint8, scales [rows, head_dim/16] e4m3 -> out [rows, head_dim] float32.
#include <cuda_runtime.h>

#include "kernels.h"

namespace nvfp4kv {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) dequantize_kernel(const DequantizeParams p, uint64_t total_blocks) {
  const uint64_t block = uint64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (block >= total_blocks) return;
  const float block_scale = codec::e4m3_to_float(p.scales[block]);
  const uint2 packed = *reinterpret_cast<const uint2*>(p.packed + block * codec::kBlockBytes);
  const uint64_t codes = uint64_t(packed.x) | (uint64_t(packed.y) << 32);
  float4* out = reinterpret_cast<float4*>(p.out + block * codec::kBlockSize);
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    float values[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint8_t code = uint8_t(codes >> (4 * (4 * q + j))) & 0xF;
      values[j] = codec::dequantize_value(code, block_scale, p.global_scale);
    }
    out[q] = make_float4(values[0], values[1], values[2], values[3]);
  }
}

}  // namespace

int launch_dequantize(const DequantizeParams& p, void* stream, const char** error_string) {
  const uint64_t total = uint64_t(p.rows) * uint64_t(p.head_dim / codec::kBlockSize);
  if (total == 0) return 0;
  const dim3 grid(uint32_t((total + kThreads - 1) / kThreads));
  dequantize_kernel<<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(p, total);
  const cudaError_t error = cudaGetLastError();
  *error_string = cudaGetErrorString(error);
  return int(error);
}

}  // namespace nvfp4kv
