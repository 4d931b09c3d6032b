// CUDA kernel of the MLA latent appends (SPEC section 4). One thread per 16-value unit of a latent row:
// the row's C/16 ckv blocks (NVFP4, block_quantizer.cuh) and then ceil(R/16) kpe chunks (E4M3 by one IEEE
// division per value, or a bit copy into a 16-bit cache). Each thread loads its inputs (they depend on no
// index), resolves the row's target through the bounds contract of append_params.h (the index loads of
// a row's threads meet in L1), and stores its bytes. Launched with programmatic dependent launch on
// sm_90+ (programmatic_launch.cuh).
#include <cuda_runtime.h>

#include <cstdint>

#include "../mla_params.h"
#include "block_quantizer.cuh"
#include "kernels.h"
#include "programmatic_launch.cuh"

namespace nvfp4kv {
namespace {

constexpr uint32_t kThreads = 256;
constexpr int kUnit = 16;  // values per thread

// Per-call choices made on the host.
struct MlaLaunch {
  uint32_t units_per_row;  // ckv_units + kpe units
  uint32_t ckv_units;      // C / 16
  uint64_t items;          // nnz * units_per_row
  bool ckv_load16;         // 16-byte input loads (row base and stride allow them)
  bool kpe_load16;
  bool ckv_store8;   // 8-byte packed-data stores
  bool kpe_store16;  // 16-byte kpe stores (fp8: one chunk, copy: half a chunk)
};

// `count` (<= 16) 16-bit values at src as packed words (low half = even element), zeros past count.
__device__ __forceinline__ void load_unit(const uint16_t* src, int count, bool vector, uint32_t (&w)[8]) {
  if (vector && count == kUnit) {
    const uint4 a = __ldg(reinterpret_cast<const uint4*>(src));
    const uint4 b = __ldg(reinterpret_cast<const uint4*>(src) + 1);
    w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w, w[4] = b.x, w[5] = b.y, w[6] = b.z, w[7] = b.w;
    return;
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint32_t lo = 2 * i < count ? __ldg(src + 2 * i) : 0u;
    const uint32_t hi = 2 * i + 1 < count ? __ldg(src + 2 * i + 1) : 0u;
    w[i] = lo | (hi << 16);
  }
}

template <bool kBF16>
__device__ __forceinline__ float unit_value(const uint32_t (&w)[8], int j) {
  const uint16_t bits = uint16_t(w[j / 2] >> (16 * (j % 2)));
  return kBF16 ? codec::bf16_bits_to_float(bits) : codec::fp16_bits_to_float(bits);
}

template <bool kBF16>
__device__ __forceinline__ void store_ckv_block(const MlaLaunch& a, const uint32_t (&w)[8], float s, uint8_t* data,
                                                uint8_t* scale) {
  const float six_s = __fmul_rn(codec::kE2M1MaxValue, s);
  const float inverse = block_quantizer::division_inverse(six_s);
  const float* no_table[1] = {nullptr};
  uint2 packed;
  uint8_t sf;
  block_quantizer::quantize_blocks<kBF16, 1, false>(w, &s, &six_s, &inverse, no_table, &packed, &sf);
  if (a.ckv_store8) {
    *reinterpret_cast<uint2*>(data) = packed;
  } else {
#pragma unroll
    for (int k = 0; k < 4; ++k) data[k] = uint8_t(packed.x >> (8 * k)), data[4 + k] = uint8_t(packed.y >> (8 * k));
  }
  *scale = sf;
}

template <bool kBF16>
__device__ __forceinline__ void store_kpe_chunk(const MlaParams& p, const MlaLaunch& a, const uint32_t (&w)[8],
                                                int count, float s, uint8_t* dst) {
  if (!p.kpe_is_fp8) {  // the cache has the inputs' dtype: the 16-bit values as they are
    if (a.kpe_store16 && count == kUnit) {
      reinterpret_cast<uint4*>(dst)[0] = make_uint4(w[0], w[1], w[2], w[3]);
      reinterpret_cast<uint4*>(dst)[1] = make_uint4(w[4], w[5], w[6], w[7]);
    } else {
#pragma unroll
      for (int j = 0; j < kUnit; ++j) {
        if (j < count) reinterpret_cast<uint16_t*>(dst)[j] = uint16_t(w[j / 2] >> (16 * (j % 2)));
      }
    }
    return;
  }
  if (!usable_global_scale(s)) return;  // a bad device scale leaves the row's kpe untouched
  uint32_t bytes[4] = {0, 0, 0, 0};
#pragma unroll
  for (int j = 0; j < kUnit; ++j) bytes[j / 4] |= uint32_t(kpe_byte(unit_value<kBF16>(w, j), s)) << (8 * (j % 4));
  if (a.kpe_store16 && count == kUnit) {
    *reinterpret_cast<uint4*>(dst) = make_uint4(bytes[0], bytes[1], bytes[2], bytes[3]);
  } else {
#pragma unroll
    for (int j = 0; j < kUnit; ++j) {
      if (j < count) dst[j] = uint8_t(bytes[j / 4] >> (8 * (j % 4)));
    }
  }
}

template <bool kBF16>
__global__ void __launch_bounds__(kThreads)
    append_paged_mla_kv_cache_kernel(const __grid_constant__ MlaParams p, const __grid_constant__ MlaLaunch a) {
  const uint64_t item = uint64_t(blockIdx.x) * kThreads + threadIdx.x;
  programmatic_launch::wait_for_previous_kernel();  // before the first global memory access
  programmatic_launch::allow_next_kernel();
  if (item >= a.items) return;
  const int64_t row = int64_t(item / a.units_per_row);
  const uint32_t unit = uint32_t(item % a.units_per_row);
  const bool ckv = unit < a.ckv_units;
  const int64_t first = ckv ? int64_t(unit) * kUnit : int64_t(unit - a.ckv_units) * kUnit;
  const int count = ckv ? kUnit : int(p.kpe_dim - first < kUnit ? p.kpe_dim - first : kUnit);
  const uint16_t* src = ckv ? p.ckv.data + row * p.ckv.row_stride + first : p.kpe.data + row * p.kpe.row_stride + first;
  uint32_t w[8];
  load_unit(src, count, ckv ? a.ckv_load16 : a.kpe_load16, w);
  const float s = ckv ? mla_ckv_scale(p) : mla_kpe_scale(p);
  int64_t page, entry;
  if (!resolve_row_target(p, row, page, entry)) return;
  if (ckv) {
    if (!usable_global_scale(s)) return;  // a bad device scale leaves the row's ckv untouched
    store_ckv_block<kBF16>(a, w, s, p.ckv_data.at(page, entry) + unit * codec::kBlockBytes,
                           p.ckv_scales.at(page, entry) + unit);
  } else {
    const int64_t item_bytes = p.kpe_is_fp8 ? 1 : 2;
    store_kpe_chunk<kBF16>(p, a, w, count, s, p.kpe_cache.at(page, entry) + first * item_bytes);
  }
}

bool aligned(const void* pointer, int64_t stride_bytes, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(pointer) % uint64_t(bytes) == 0 && stride_bytes % bytes == 0;
}

bool cache_aligned(const LatentCacheView& c, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(c.data) % uint64_t(bytes) == 0 && c.page_stride % bytes == 0 &&
         c.entry_stride % bytes == 0;
}

}  // namespace

int launch_append_paged_mla_kv_cache(const MlaParams& p, void* stream, const char** error_string) {
  *error_string = "";
  MlaLaunch a{};
  a.ckv_units = uint32_t(p.ckv_dim / kUnit);
  a.units_per_row = a.ckv_units + uint32_t((p.kpe_dim + kUnit - 1) / kUnit);
  a.items = uint64_t(p.nnz) * a.units_per_row;
  if (a.items == 0) return cudaSuccess;
  if (a.items > (uint64_t(1) << 40)) {
    *error_string = "too many latent rows for one launch";
    return cudaErrorInvalidValue;
  }
  a.ckv_load16 = aligned(p.ckv.data, p.ckv.row_stride * 2, 16);
  a.kpe_load16 = aligned(p.kpe.data, p.kpe.row_stride * 2, 16);
  a.ckv_store8 = cache_aligned(p.ckv_data, 8);
  a.kpe_store16 = cache_aligned(p.kpe_cache, 16);
  const dim3 grid(uint32_t((a.items + kThreads - 1) / kThreads));
  const auto s = static_cast<cudaStream_t>(stream);
  const bool programmatic = programmatic_launch::enabled_on_current_device();
  const cudaError_t error =
      p.input_is_bf16
          ? programmatic_launch::launch(append_paged_mla_kv_cache_kernel<true>, grid, kThreads, s, programmatic, p, a)
          : programmatic_launch::launch(append_paged_mla_kv_cache_kernel<false>, grid, kThreads, s, programmatic, p, a);
  if (error != cudaSuccess) *error_string = cudaGetErrorString(error);
  return int(error);
}

}  // namespace nvfp4kv
