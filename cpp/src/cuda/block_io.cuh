// Moving 16-value blocks: a thread's input loads (16-byte vectors when aligned) and its stores of packed
// data and scale bytes into the cache (linear or "trtllm" V-scale layout).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "../append_params.h"
#include "index_chain.cuh"
#include "launch_args.cuh"

namespace nvfp4kv {
namespace append_kernel {

template <int kBlocks, bool kVector>
__device__ __forceinline__ void load_values(const uint16_t* src, uint32_t* w) {
  if constexpr (kVector) {
    const uint4* vec = reinterpret_cast<const uint4*>(src);
#pragma unroll
    for (int i = 0; i < 2 * kBlocks; ++i) {
      const uint4 v = __ldg(vec + i);
      w[4 * i] = v.x;
      w[4 * i + 1] = v.y;
      w[4 * i + 2] = v.z;
      w[4 * i + 3] = v.w;
    }
  } else {
    const unsigned short* s = reinterpret_cast<const unsigned short*>(src);
#pragma unroll
    for (int i = 0; i < 8 * kBlocks; ++i) w[i] = uint32_t(__ldg(s + 2 * i)) | (uint32_t(__ldg(s + 2 * i + 1)) << 16);
  }
}

// Where a tensor's blocks go: the address of (entry, head, column) in a page and the page stride still
// to apply (store_tensor writes at data + t.page * data_page_stride). Built before the page id is known
// (kPageKnown false: page 0, so that the arithmetic is done early: the one-item kernel builds it for
// entry 0 before its programmatic wait and adds the entry's term, add_entry, while the page id's load
// is in flight) or after (the id's page, stride 0).
struct TensorDestination {
  uint8_t* data;
  int64_t data_page_stride;
  uint8_t* scales;  // linear layout
  int64_t scales_page_stride;
};

template <bool kPageKnown>
__device__ __forceinline__ TensorDestination tensor_destination(const CacheView& data_view, const CacheView& scale_view,
                                                                const Target& t, uint32_t head, uint32_t column) {
  const int64_t page = kPageKnown ? t.page : 0;
  return {data_view.at(page, t.entry, head) + column / 2, kPageKnown ? 0 : data_view.page_stride,
          scale_view.at(page, t.entry, head) + column / codec::kBlockSize, kPageKnown ? 0 : scale_view.page_stride};
}

// The entry's term of a destination built for entry 0.
__device__ __forceinline__ void add_entry(TensorDestination& d, const CacheView& data_view, const CacheView& scale_view,
                                          int64_t entry) {
  d.data += entry * data_view.entry_stride;
  d.scales += entry * scale_view.entry_stride;
}

// The blocks of one tensor: data at `data_view`, scales at `scale_view` in the linear layout or, for
// V with v_scales_trtllm, in the "trtllm" layout (mirrors scale_address in append_params.h).
template <int kBlocks, bool kVector>
__device__ __forceinline__ void store_tensor(const uint2* data, const uint8_t* sf, const CacheView& data_view,
                                             const CacheView& scale_view, bool trtllm_scales, const Target& t,
                                             const TensorDestination& dst, uint32_t head, uint32_t column,
                                             const LaunchArgs& a) {
  uint8_t* data_dst = dst.data + t.page * dst.data_page_stride;
  if constexpr (kVector) {
    if (kBlocks % 2 == 0 && a.store16) {
#pragma unroll
      for (int i = 0; i + 1 < kBlocks; i += 2) {
        reinterpret_cast<uint4*>(data_dst)[i / 2] = make_uint4(data[i].x, data[i].y, data[i + 1].x, data[i + 1].y);
      }
    } else {
#pragma unroll
      for (int i = 0; i < kBlocks; ++i) reinterpret_cast<uint2*>(data_dst)[i] = data[i];
    }
  } else {
#pragma unroll
    for (int i = 0; i < kBlocks; ++i) {
#pragma unroll
      for (int k = 0; k < 4; ++k) data_dst[8 * i + k] = uint8_t(data[i].x >> (8 * k));
#pragma unroll
      for (int k = 0; k < 4; ++k) data_dst[8 * i + 4 + k] = uint8_t(data[i].y >> (8 * k));
    }
  }
  const uint32_t block = column / codec::kBlockSize;
  if (trtllm_scales) {
    // Tile offset 4 S (entry / 4) + 4 j + entry % 4 = row * S + column within the (page, head) tile.
#pragma unroll
    for (int i = 0; i < kBlocks; ++i) {
      const uint32_t u = 4 * (block + i) + uint32_t(t.entry & 3);
      const uint32_t q = a.blocks_per_row.div(u);
      scale_view.at(t.page, (t.entry & ~int64_t(3)) + q, head)[u - q * a.blocks_per_row.d] = sf[i];
    }
    return;
  }
  uint8_t* scale_dst = dst.scales + t.page * dst.scales_page_stride;
  if (kVector && kBlocks % 2 == 0 && a.scale_store16) {
#pragma unroll
    for (int i = 0; i + 1 < kBlocks; i += 2) {
      reinterpret_cast<uint16_t*>(scale_dst)[i / 2] = uint16_t(sf[i] | (sf[i + 1] << 8));
    }
    return;
  }
#pragma unroll
  for (int i = 0; i < kBlocks; ++i) scale_dst[i] = sf[i];
}

}  // namespace append_kernel
}  // namespace nvfp4kv
