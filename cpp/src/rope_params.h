// What one fused RoPE + NVFP4 append call reads and writes (docs/SPEC.md section 5): a torch-free description
// shared by the CPU and CUDA kernels. Every row i < rows: Q and K are rotated by the table row
// rope_positions[i], Q goes to q_out (16-bit or FP8 E4M3), the rotated K to k_out when given; rows
// i < append.nnz are also quantized into the cache (rotated K, plain V) exactly as the plain append places them.
// A row whose rope position is outside [0, max_pos) is never rotated: its q_out and k_out rows are zeros and
// its K/V are not written.
#pragma once

#include <cstdint>

#include "append_params.h"
#include "nvfp4kv/rope_rotation.h"

namespace nvfp4kv {

// The largest head_dim of the fused op: a head's 16-value units fit one warp of the CUDA kernel, which
// exchanges pair partners by shuffles (checked on the host).
constexpr int64_t kRopeMaxHeadDim = 512;

// A [rows, heads, head_dim] 16-bit or byte tensor the op writes, last dim contiguous; strides in elements.
struct OutRowsView {
  void* data;  // null: not written
  int64_t row_stride;
  int64_t head_stride;
};

struct RopeParams {
  AppendParams append;         // key / value [rows, num_kv_heads, head_dim], caches, placement of rows < append.nnz
  RowsView query;              // [rows, num_q_heads, head_dim]; data == q_out.data when rotated in place
  OutRowsView q_out;           // [rows, num_q_heads, head_dim]: the input's 16-bit type, or E4M3 bytes (q_out_fp8)
  OutRowsView k_out;           // [rows, num_kv_heads, head_dim] 16-bit, or null data
  const void* cos_sin;         // [max_pos, rotary_dim]: cos in [0, rotary_dim / 2), sin in [rotary_dim / 2, rotary_dim)
  int64_t cos_sin_row_stride;  // in elements
  rope::TableType cos_sin_type;
  int64_t max_pos;
  int64_t rotary_dim;        // even, 2 <= rotary_dim <= head_dim
  IndexView rope_positions;  // [rows]
  int64_t rows;              // >= append.nnz
  int64_t num_q_heads;
  bool neox;  // else GPT-J interleaved pairs
  bool q_out_fp8;
  float q_scale;                // FP8 Q decode scale as a float (checked on the host) ...
  const float* q_scale_device;  // ... or read by the kernel (null when a float was given or Q is 16-bit)
};

// The table row of rope position `position`, or null when it is outside [0, max_pos).
NVFP4KV_HOST_DEVICE const void* rope_table_row(const RopeParams& p, int64_t position) {
  if (position < 0 || position >= p.max_pos) return nullptr;
  const int64_t bytes = p.cos_sin_type == rope::TableType::kFloat32 ? 4 : 2;
  return static_cast<const uint8_t*>(p.cos_sin) + position * p.cos_sin_row_stride * bytes;
}

NVFP4KV_HOST_DEVICE float rope_q_scale(const RopeParams& p) { return p.q_scale_device ? *p.q_scale_device : p.q_scale; }

// One Q value (its 16-bit rotated value as fp32) to its E4M3 byte: one IEEE division, SPEC section 4's rounding.
NVFP4KV_HOST_DEVICE uint8_t q_fp8_byte(float q, float q_scale) { return codec::e4m3_from_float(q / q_scale); }

}  // namespace nvfp4kv
