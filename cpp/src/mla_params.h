// What one MLA latent append writes where (SPEC section 4): a torch-free description shared by the
// CPU and CUDA kernels. Each token has one latent row: ckv (C values, NVFP4: C/2 data bytes and C/16
// block scales) and kpe (R values, float8_e4m3fn bytes, or a bit copy when the kpe cache has the
// inputs' 16-bit dtype). The placement and bounds contract are the paged K/V append's
// (resolve_row_target in append_params.h), with one head.
#pragma once

#include <cstdint>

#include "append_params.h"

namespace nvfp4kv {

// One [pages, page_size, width] cache tensor, last dim contiguous; strides in bytes.
struct LatentCacheView {
  uint8_t* data;
  int64_t page_stride;
  int64_t entry_stride;

  NVFP4KV_HOST_DEVICE int64_t offset(int64_t page, int64_t entry) const {
    return page * page_stride + entry * entry_stride;
  }
  NVFP4KV_HOST_DEVICE uint8_t* at(int64_t page, int64_t entry) const { return data + offset(page, entry); }
};

// Latent rows to append: [nnz, width] fp16 or bf16, last dim contiguous.
struct LatentRowsView {
  const uint16_t* data;  // raw 16-bit elements
  int64_t row_stride;    // in elements
};

struct MlaParams {
  LatentRowsView ckv;  // [nnz, ckv_dim]
  LatentRowsView kpe;  // [nnz, kpe_dim]
  bool input_is_bf16;  // else float16
  IndexView batch_indices;
  IndexView positions;
  IndexView kv_indices;
  IndexView kv_indptr;
  IndexView slot_mapping;      // slot-mapping variant (null data for the page-table variant)
  LatentCacheView ckv_data;    // ckv_dim / 2 bytes per (page, entry)
  LatentCacheView ckv_scales;  // ckv_dim / 16 bytes per (page, entry)
  LatentCacheView kpe_cache;   // kpe_dim bytes (e4m3) or 2 kpe_dim bytes (copy) per (page, entry)
  bool kpe_is_fp8;             // else the kpe rows are copied bit for bit
  int64_t nnz;
  int64_t ckv_dim;  // C, a positive multiple of 16
  int64_t kpe_dim;  // R >= 1
  int64_t page_size;
  int64_t num_pages;
  int64_t batch_size;
  float ckv_scale;  // global decode scales given as floats, checked on the host
  float kpe_scale;
  const float* ckv_scale_device;  // or [1] float32 tensors read by the kernel (null when a float was given)
  const float* kpe_scale_device;
};

NVFP4KV_HOST_DEVICE float mla_ckv_scale(const MlaParams& p) {
  return p.ckv_scale_device ? *p.ckv_scale_device : p.ckv_scale;
}
NVFP4KV_HOST_DEVICE float mla_kpe_scale(const MlaParams& p) {
  return p.kpe_scale_device ? *p.kpe_scale_device : p.kpe_scale;
}

// One kpe value to its float8_e4m3fn byte: y = x / kpe_scale, one IEEE division, then e4m3_from_float.
NVFP4KV_HOST_DEVICE uint8_t kpe_byte(float x, float kpe_scale) { return codec::e4m3_from_float(x / kpe_scale); }

}  // namespace nvfp4kv
