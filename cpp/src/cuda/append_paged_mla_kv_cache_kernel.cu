// CUDA kernel of the MLA latent appends (SPEC section 4). One warp per latent row: lane l quantizes the
// row's ckv blocks l, l + 32, ... (NVFP4, block_quantizer.cuh; one block per lane for C = 512) and its kpe
// values 2l, 2l + 1, 2l + 64, ... (E4M3 of one IEEE division each, or a bit copy into a 16-bit cache), so
// that every lane of a warp does the same work and a warp's loads and stores are contiguous. The lanes
// resolve the row's target together (their index loads are one broadcast each), through the bounds
// contract of append_params.h. Launched with programmatic dependent launch on sm_90+.
#include <cuda_runtime.h>

#include <cstdint>

#include "../mla_params.h"
#include "block_quantizer.cuh"
#include "kernels.h"
#include "programmatic_launch.cuh"

namespace nvfp4kv {
namespace {

constexpr uint32_t kWarps = 8;  // rows per CTA
constexpr uint32_t kLanes = 32;

// Per-call choices made on the host.
struct MlaLaunch {
  bool ckv_load16;       // 16-byte ckv loads (row base and stride allow them)
  bool kpe_pairs;        // 4-byte kpe loads of value pairs, 2-byte (fp8) or 4-byte (copy) stores
  bool ckv_store8;       // 8-byte packed-data stores
  bool speculate_batch;  // nnz == batch_size (decode): kv_indptr[row], [row + 1] prefetched early
};

template <bool kBF16>
__device__ __forceinline__ float value_of(uint32_t bits) {
  return kBF16 ? codec::bf16_bits_to_float(uint16_t(bits)) : codec::fp16_bits_to_float(uint16_t(bits));
}

// The E4M3 byte of one kpe value: y = x / s (IEEE), the magnitude rounded as a scale byte (the hardware
// conversion on sm_89+, checked against the codec for every non-negative fp32), the sign of y, NaN 0x7F.
__device__ __forceinline__ uint32_t kpe_code(float x, float s) {
  const float y = __fdiv_rn(x, s);
  if (codec::is_nan(y)) return codec::kE4M3NaN;
  return ((__float_as_uint(y) >> 24) & 0x80u) | block_quantizer::scale_byte(fabsf(y));
}

// The 16 values of ckv block `block` of a row as packed words (low half = even element).
__device__ __forceinline__ void load_block(const uint16_t* row, int64_t block, bool vector, uint32_t (&w)[8]) {
  const uint16_t* src = row + block * codec::kBlockSize;
  if (vector) {
    const uint4 lo = __ldg(reinterpret_cast<const uint4*>(src));
    const uint4 hi = __ldg(reinterpret_cast<const uint4*>(src) + 1);
    w[0] = lo.x, w[1] = lo.y, w[2] = lo.z, w[3] = lo.w, w[4] = hi.x, w[5] = hi.y, w[6] = hi.z, w[7] = hi.w;
    return;
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) w[i] = uint32_t(__ldg(src + 2 * i)) | uint32_t(__ldg(src + 2 * i + 1)) << 16;
}

// The lane's first ckv block and first kpe pair, loaded before the row's target is known (they depend on
// no index): for C = 512 and R = 64 they are all the lane's inputs.
struct LaneInputs {
  uint32_t w[8];
  uint32_t kpe_pair;
};

template <bool kBF16>
__device__ __forceinline__ void append_ckv(const MlaParams& p, const MlaLaunch& a, int64_t row, uint8_t* data,
                                           uint8_t* scales, float s, LaneInputs& first) {
  const float six_s = __fmul_rn(codec::kE2M1MaxValue, s);
  const float inverse = block_quantizer::division_inverse(six_s);
  const float* no_table[1] = {nullptr};
  const uint16_t* src = p.ckv.data + row * p.ckv.row_stride;
  const int64_t lane = threadIdx.x % kLanes;
  for (int64_t block = lane; block < p.ckv_dim / codec::kBlockSize; block += kLanes) {
    if (block != lane) load_block(src, block, a.ckv_load16, first.w);
    const uint32_t (&w)[8] = first.w;
    uint2 packed;
    uint8_t sf;
    block_quantizer::quantize_blocks<kBF16, 1, false>(w, &s, &six_s, &inverse, no_table, &packed, &sf);
    uint8_t* out = data + block * codec::kBlockBytes;
    if (a.ckv_store8) {
      *reinterpret_cast<uint2*>(out) = packed;
    } else {
#pragma unroll
      for (int k = 0; k < 4; ++k) out[k] = uint8_t(packed.x >> (8 * k)), out[4 + k] = uint8_t(packed.y >> (8 * k));
    }
    scales[block] = sf;
  }
}

template <bool kBF16>
__device__ __forceinline__ void append_kpe(const MlaParams& p, const MlaLaunch& a, int64_t row, uint8_t* dst, float s,
                                           const LaneInputs& first) {
  const uint16_t* src = p.kpe.data + row * p.kpe.row_stride;
  const bool fp8 = p.kpe_is_fp8;
  if (fp8 && !usable_global_scale(s)) return;  // a bad device scale leaves the row's kpe untouched
  const int64_t lane = threadIdx.x % kLanes;
  if (a.kpe_pairs) {  // kpe_dim even, pairs aligned for 4-byte loads and the stores
    for (int64_t j = 2 * lane; j < p.kpe_dim; j += 2 * kLanes) {
      const uint32_t pair = j == 2 * lane ? first.kpe_pair : __ldg(reinterpret_cast<const uint32_t*>(src + j));
      if (fp8) {
        const uint32_t lo = kpe_code(value_of<kBF16>(pair & 0xFFFFu), s), hi = kpe_code(value_of<kBF16>(pair >> 16), s);
        *reinterpret_cast<uint16_t*>(dst + j) = uint16_t(lo | hi << 8);
      } else {
        *reinterpret_cast<uint32_t*>(dst + 2 * j) = pair;
      }
    }
    return;
  }
  for (int64_t j = lane; j < p.kpe_dim; j += kLanes) {
    const uint16_t bits = __ldg(src + j);
    if (fp8) {
      dst[j] = uint8_t(kpe_code(value_of<kBF16>(bits), s));
    } else {
      reinterpret_cast<uint16_t*>(dst)[j] = bits;
    }
  }
}

template <bool kBF16>
__global__ void __launch_bounds__(kWarps* kLanes)
    append_paged_mla_kv_cache_kernel(const __grid_constant__ MlaParams p, const __grid_constant__ MlaLaunch a) {
  programmatic_launch::warm_parameter_cache(p, a);
  const int64_t row = int64_t(blockIdx.x) * kWarps + threadIdx.x / kLanes;
  programmatic_launch::wait_for_previous_kernel();  // before the first global memory access
  programmatic_launch::allow_next_kernel();
  if (row >= p.nnz) return;
  const int64_t lane = threadIdx.x % kLanes;
  LaneInputs first{};
  if (lane < p.ckv_dim / codec::kBlockSize)
    load_block(p.ckv.data + row * p.ckv.row_stride, lane, a.ckv_load16, first.w);
  if (a.kpe_pairs && 2 * lane < p.kpe_dim) {
    first.kpe_pair = __ldg(reinterpret_cast<const uint32_t*>(p.kpe.data + row * p.kpe.row_stride + 2 * lane));
  }
  if (a.speculate_batch) {  // decode: request row's page range, in flight while batch_indices[row] loads
    const int64_t stride = p.kv_indptr.stride * (p.kv_indptr.is_int64 ? 8 : 4);
    const char* indptr = static_cast<const char*>(p.kv_indptr.data) + row * stride;
    asm volatile("prefetch.global.L1 [%0];" ::"l"(indptr));
    asm volatile("prefetch.global.L1 [%0];" ::"l"(indptr + stride));
  }
  int64_t page, entry;
  if (!resolve_row_target(p, row, page, entry)) return;
  const float ckv_scale = mla_ckv_scale(p);
  if (usable_global_scale(ckv_scale)) {  // a bad device scale leaves the row's ckv untouched
    append_ckv<kBF16>(p, a, row, p.ckv_data.at(page, entry), p.ckv_scales.at(page, entry), ckv_scale, first);
  }
  append_kpe<kBF16>(p, a, row, p.kpe_cache.at(page, entry), mla_kpe_scale(p), first);
}

bool aligned(const void* pointer, int64_t stride_bytes, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(pointer) % uint64_t(bytes) == 0 && stride_bytes % bytes == 0;
}

bool cache_aligned(const LatentCacheView& c, int64_t bytes) {
  return aligned(c.data, c.page_stride, bytes) && c.entry_stride % bytes == 0;
}

}  // namespace

int launch_append_paged_mla_kv_cache(const MlaParams& p, void* stream, const char** error_string) {
  *error_string = "";
  if (p.nnz == 0) return cudaSuccess;
  const uint64_t ctas = (uint64_t(p.nnz) + kWarps - 1) / kWarps;
  if (ctas >= (uint64_t(1) << 31)) {
    *error_string = "too many latent rows for one launch";
    return cudaErrorInvalidValue;
  }
  MlaLaunch a{};
  a.ckv_load16 = aligned(p.ckv.data, p.ckv.row_stride * 2, 16);
  const int64_t kpe_item = p.kpe_is_fp8 ? 1 : 2;
  a.kpe_pairs =
      p.kpe_dim % 2 == 0 && aligned(p.kpe.data, p.kpe.row_stride * 2, 4) && cache_aligned(p.kpe_cache, 2 * kpe_item);
  a.ckv_store8 = cache_aligned(p.ckv_data, 8);
  a.speculate_batch = p.slot_mapping.data == nullptr && p.nnz == p.batch_size;
  const auto s = static_cast<cudaStream_t>(stream);
  const bool programmatic = programmatic_launch::enabled_on_current_device();
  const dim3 grid{uint32_t(ctas)}, threads{kWarps * kLanes};
  const cudaError_t error =
      p.input_is_bf16
          ? programmatic_launch::launch(append_paged_mla_kv_cache_kernel<true>, grid, threads, s, programmatic, p, a)
          : programmatic_launch::launch(append_paged_mla_kv_cache_kernel<false>, grid, threads, s, programmatic, p, a);
  if (error != cudaSuccess) *error_string = cudaGetErrorString(error);
  return int(error);
}

}  // namespace nvfp4kv
