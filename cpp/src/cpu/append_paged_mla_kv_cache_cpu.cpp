// CPU implementation of the MLA latent appends (SPEC section 4): one latent row per task item.
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>

#include <algorithm>
#include <cstring>

#include "../mla_checks.h"

namespace nvfp4kv {
namespace {

float input_value(const MlaParams& p, uint16_t bits) { return codec::bits16_to_float(bits, p.input_is_bf16); }

void append_row(const MlaParams& p, int64_t row, float ckv_scale, float kpe_scale) {
  int64_t page, entry;
  if (!resolve_row_target(p, row, page, entry)) return;
  if (usable_global_scale(ckv_scale)) {  // a bad device scale leaves the row's ckv untouched
    const uint16_t* src = p.ckv.data + row * p.ckv.row_stride;
    uint8_t* data = p.ckv_data.at(page, entry);
    uint8_t* scales = p.ckv_scales.at(page, entry);
    for (int64_t block = 0; block < p.ckv_dim / codec::kBlockSize; ++block) {
      float x[codec::kBlockSize];
      for (int j = 0; j < codec::kBlockSize; ++j) x[j] = input_value(p, src[block * codec::kBlockSize + j]);
      uint64_t packed;
      scales[block] = codec::quantize_block(x, ckv_scale, packed);
      for (int k = 0; k < codec::kBlockBytes; ++k) data[block * codec::kBlockBytes + k] = uint8_t(packed >> (8 * k));
    }
  }
  const uint16_t* src = p.kpe.data + row * p.kpe.row_stride;
  uint8_t* kpe = p.kpe_cache.at(page, entry);
  if (!p.kpe_is_fp8) {
    std::memcpy(kpe, src, size_t(p.kpe_dim) * sizeof(uint16_t));  // the cache has the inputs' dtype
  } else if (usable_global_scale(kpe_scale)) {
    for (int64_t j = 0; j < p.kpe_dim; ++j) kpe[j] = kpe_byte(input_value(p, src[j]), kpe_scale);
  }
}

void append(const MlaParams& p) {
  const float ckv_scale = mla_ckv_scale(p);
  const float kpe_scale = mla_kpe_scale(p);
  // About 32 KiB of input per task keeps small decode calls on the calling thread.
  const int64_t grain = std::max<int64_t>(1, 16384 / (p.ckv_dim + p.kpe_dim));
  const auto rows = [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) append_row(p, row, ckv_scale, kpe_scale);
  };
  if (p.nnz <= grain) {
    rows(0, p.nnz);
  } else {
    torch::stable::parallel_for(0, p.nnz, grain, rows);
  }
}

void append_paged_mla_kv_cache_cpu(StableIValue* stack, uint64_t num_args, uint64_t num_outputs) {
  BoxedArguments boxed(stack, num_args, num_outputs);
  append(check_mla_append_arguments(read_mla_append_arguments(boxed)));
}

void append_paged_mla_kv_cache_with_slot_mapping_cpu(StableIValue* stack, uint64_t num_args, uint64_t num_outputs) {
  BoxedArguments boxed(stack, num_args, num_outputs);
  append(check_mla_append_with_slot_mapping_arguments(read_mla_append_with_slot_mapping_arguments(boxed)));
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(nvfp4kv, CPU, m) {
  m.impl("append_paged_mla_kv_cache", &append_paged_mla_kv_cache_cpu);
  m.impl("append_paged_mla_kv_cache_with_slot_mapping", &append_paged_mla_kv_cache_with_slot_mapping_cpu);
}

}  // namespace nvfp4kv
