// One head row of head_dim 16-bit values quantized into its cache entry (SPEC section 2, the call's
// recipe), shared by the CPU kernels of the plain and the fused RoPE append.
#pragma once

#include "../append_params.h"

namespace nvfp4kv {

// head_dim / 2 data bytes at `data`, head_dim / 16 scale bytes at (page, entry, head) of `scales`.
inline void quantize_head_row(const AppendParams& p, const uint16_t* src, float global_scale, uint8_t* data,
                              const CacheView& scales, bool trtllm_scales, int64_t page, int64_t entry, int64_t head) {
  const int64_t blocks = p.head_dim / codec::kBlockSize;
  for (int64_t block = 0; block < blocks; ++block) {
    float x[codec::kBlockSize];
    for (int j = 0; j < codec::kBlockSize; ++j) {
      const uint16_t bits = src[block * codec::kBlockSize + j];
      x[j] = codec::bits16_to_float(bits, p.input_is_bf16);
    }
    uint64_t packed;
    *scale_address(scales, trtllm_scales, page, entry, head, block, blocks) =
        quantize_block_with_recipe(p, x, global_scale, packed);
    for (int k = 0; k < codec::kBlockBytes; ++k) data[block * codec::kBlockBytes + k] = uint8_t(packed >> (8 * k));
  }
}

}  // namespace nvfp4kv
