// CUDA kernel of nvfp4kv::append_paged_kv_cache.
//
// Layouts (strides resolved on the host into AppendParams, see append_params.h):
//   append_key / append_value  [nnz, num_heads, head_dim]            fp16 or bf16, last dim contiguous
//   K/V data cache             NHD [pages, page_size, heads, head_dim/2]  or  HND [pages, heads, page_size, head_dim/2]
//   K/V scale cache            same with head_dim/16 float8_e4m3fn bytes
// One thread owns one 16-value block of one (row, head) and does it for K and for V: it loads the
// 2 x 32 input bytes first, then follows the dependent index chain (batch index -> indptr -> page id),
// so the input loads are in flight while the indices arrive; it stores 8 packed bytes + 1 scale byte
// for each of K and V. Consecutive threads walk the blocks of a head row, then heads, then rows, so
// loads and stores of a warp are contiguous.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels.h"

namespace nvfp4kv {
namespace {

constexpr int kThreads = 256;

// Exact widening of 8 packed 16-bit values (one uint4) into fp32.
template <bool kBF16>
__device__ __forceinline__ void widen8(const uint4& packed, float* x) {
  const uint32_t words[4] = {packed.x, packed.y, packed.z, packed.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (kBF16) {
      x[2 * i] = __uint_as_float(words[i] << 16);
      x[2 * i + 1] = __uint_as_float(words[i] & 0xFFFF0000u);
    } else {
      const float2 pair = __half22float2(*reinterpret_cast<const __half2*>(&words[i]));
      x[2 * i] = pair.x;
      x[2 * i + 1] = pair.y;
    }
  }
}

template <bool kBF16, bool kAligned>
__device__ __forceinline__ void load_block(const uint16_t* __restrict__ src, float (&x)[codec::kBlockSize]) {
  if constexpr (kAligned) {
    const uint4* vec = reinterpret_cast<const uint4*>(src);
    widen8<kBF16>(__ldg(vec), x);
    widen8<kBF16>(__ldg(vec + 1), x + 8);
  } else {
#pragma unroll
    for (int j = 0; j < codec::kBlockSize; ++j) {
      const uint16_t bits = __ldg(reinterpret_cast<const unsigned short*>(src) + j);
      x[j] = kBF16 ? codec::bf16_bits_to_float(bits) : codec::fp16_bits_to_float(bits);
    }
  }
}

template <bool kAligned>
__device__ __forceinline__ void store_block(const float (&x)[codec::kBlockSize], float global_scale,
                                            uint8_t* data, uint8_t* scale) {
  uint64_t packed;
  *scale = codec::quantize_block(x, global_scale, packed);
  if constexpr (kAligned) {
    *reinterpret_cast<uint2*>(data) = make_uint2(uint32_t(packed), uint32_t(packed >> 32));
  } else {
#pragma unroll
    for (int k = 0; k < codec::kBlockBytes; ++k) data[k] = uint8_t(packed >> (8 * k));
  }
}

template <bool kBF16, bool kAligned>
__global__ void __launch_bounds__(kThreads)
    append_paged_kv_cache_kernel(const __grid_constant__ AppendParams p, uint32_t blocks_per_row,
                                 uint32_t num_heads, uint32_t total_blocks) {
  const uint32_t item = blockIdx.x * kThreads + threadIdx.x;
  if (item >= total_blocks) return;
  const uint32_t block = item % blocks_per_row;
  const uint32_t row_head = item / blocks_per_row;
  const uint32_t head = row_head % num_heads;
  const uint32_t row = row_head / num_heads;
  const int64_t column = int64_t(block) * codec::kBlockSize;

  float k[codec::kBlockSize], v[codec::kBlockSize];
  load_block<kBF16, kAligned>(p.key.data + row * p.key.row_stride + head * p.key.head_stride + column, k);
  load_block<kBF16, kAligned>(p.value.data + row * p.value.row_stride + head * p.value.head_stride + column, v);

  int64_t page, entry;
  if (!resolve_row_target(p, row, page, entry)) return;
  store_block<kAligned>(k, p.k_scale, p.k_data.at(page, entry, head) + block * codec::kBlockBytes,
                        p.k_scales.at(page, entry, head) + block);
  store_block<kAligned>(v, p.v_scale, p.v_data.at(page, entry, head) + block * codec::kBlockBytes,
                        p.v_scales.at(page, entry, head) + block);
}

bool aligned(const void* ptr, int64_t alignment) { return reinterpret_cast<uintptr_t>(ptr) % alignment == 0; }

// 16-byte input loads and 8-byte packed stores need every base pointer and stride to allow them.
bool vector_access_ok(const AppendParams& p) {
  auto rows_ok = [](const RowsView& r) {
    return aligned(r.data, 16) && (r.row_stride * 2) % 16 == 0 && (r.head_stride * 2) % 16 == 0;
  };
  auto cache_ok = [](const CacheView& c) {
    return aligned(c.data, 8) && c.page_stride % 8 == 0 && c.entry_stride % 8 == 0 && c.head_stride % 8 == 0;
  };
  return rows_ok(p.key) && rows_ok(p.value) && cache_ok(p.k_data) && cache_ok(p.v_data);
}

}  // namespace

int launch_append_paged_kv_cache(const AppendParams& p, void* stream, const char** error_string) {
  const uint64_t blocks_per_row = uint64_t(p.head_dim) / codec::kBlockSize;
  const uint64_t total = uint64_t(p.nnz) * uint64_t(p.num_heads) * blocks_per_row;
  if (total == 0) return 0;
  const dim3 grid(uint32_t((total + kThreads - 1) / kThreads));
  const auto s = static_cast<cudaStream_t>(stream);
  const bool vectorized = vector_access_ok(p);
  const uint32_t args[3] = {uint32_t(blocks_per_row), uint32_t(p.num_heads), uint32_t(total)};
  if (p.input_is_bf16) {
    if (vectorized) append_paged_kv_cache_kernel<true, true><<<grid, kThreads, 0, s>>>(p, args[0], args[1], args[2]);
    else append_paged_kv_cache_kernel<true, false><<<grid, kThreads, 0, s>>>(p, args[0], args[1], args[2]);
  } else {
    if (vectorized) append_paged_kv_cache_kernel<false, true><<<grid, kThreads, 0, s>>>(p, args[0], args[1], args[2]);
    else append_paged_kv_cache_kernel<false, false><<<grid, kThreads, 0, s>>>(p, args[0], args[1], args[2]);
  }
  const cudaError_t error = cudaGetLastError();
  *error_string = cudaGetErrorString(error);
  return int(error);
}

}  // namespace nvfp4kv
