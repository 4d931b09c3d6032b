// CUDA kernel of nvfp4kv::dequantize. One thread per 16-value block:
//   packed [rows, head_dim/2] uint8 (contiguous), scales [rows, head_dim/16] e4m3 (contiguous)
//   -> out [rows, head_dim] float32 (freshly allocated, so 16-byte aligned).
// value = e2m1(code) * float(sf) * global_scale, multiplied left to right (codec::dequantize_value).
#include <cuda_runtime.h>

#include "kernels.h"

namespace nvfp4kv {
namespace {

constexpr int kThreads = 256;

template <bool kAligned>  // packed data 8-byte aligned: one 8-byte load per block
__global__ void __launch_bounds__(kThreads) dequantize_kernel(const DequantizeParams p, uint64_t total_blocks) {
  const uint64_t block = uint64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (block >= total_blocks) return;
  const float block_scale = codec::e4m3_to_float(p.scales[block]);
  const uint8_t* src = p.packed + block * codec::kBlockBytes;
  uint64_t codes = 0;
  if constexpr (kAligned) {
    const uint2 packed = *reinterpret_cast<const uint2*>(src);
    codes = uint64_t(packed.x) | (uint64_t(packed.y) << 32);
  } else {
#pragma unroll
    for (int k = 0; k < codec::kBlockBytes; ++k) codes |= uint64_t(src[k]) << (8 * k);
  }
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
  *error_string = "";
  const uint64_t total = uint64_t(p.rows) * uint64_t(p.head_dim / codec::kBlockSize);
  if (total == 0) return 0;
  const uint64_t grid = (total + kThreads - 1) / kThreads;
  if (grid > 0x7FFFFFFFu) {
    *error_string = "too many values for one dequantize launch";
    return int(cudaErrorInvalidValue);
  }
  const auto s = static_cast<cudaStream_t>(stream);
  if (reinterpret_cast<uintptr_t>(p.packed) % 8 == 0) {
    dequantize_kernel<true><<<dim3(uint32_t(grid)), kThreads, 0, s>>>(p, total);
  } else {
    dequantize_kernel<false><<<dim3(uint32_t(grid)), kThreads, 0, s>>>(p, total);
  }
  const cudaError_t error = cudaGetLastError();
  *error_string = cudaGetErrorString(error);
  return int(error);
}

}  // namespace nvfp4kv
