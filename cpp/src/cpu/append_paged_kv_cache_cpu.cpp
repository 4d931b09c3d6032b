// CPU implementation of nvfp4kv::append_paged_kv_cache (SPEC sections 1 and 2).
// Work is split over (row, head) pairs; each pair quantizes its K and V head rows block by block.
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>

#include <algorithm>

#include "../append_checks.h"
#include "head_row_quantizer.h"

namespace nvfp4kv {
namespace {

void append_rows(const AppendParams& p, int64_t begin, int64_t end) {
  const float k_scale = global_scale(p, false);
  const float v_scale = global_scale(p, true);
  const bool write_k = usable_global_scale(k_scale);  // a bad device scale leaves those rows untouched
  const bool write_v = usable_global_scale(v_scale);
  for (int64_t item = begin; item < end; ++item) {
    const int64_t row = item / p.num_heads;
    const int64_t head = item % p.num_heads;
    int64_t page, entry;
    if (!resolve_row_target(p, row, page, entry)) continue;
    if (write_k) {
      quantize_head_row(p, p.key.data + row * p.key.row_stride + head * p.key.head_stride, k_scale,
                        p.k_data.at(page, entry, head), p.k_scales, false, page, entry, head);
    }
    if (write_v) {
      quantize_head_row(p, p.value.data + row * p.value.row_stride + head * p.value.head_stride, v_scale,
                        p.v_data.at(page, entry, head), p.v_scales, p.v_scales_trtllm, page, entry, head);
    }
  }
}

void append(const AppendParams& p) {
  const int64_t items = p.nnz * p.num_heads;
  // About 32 KiB of input per task keeps small decode calls on the calling thread.
  const int64_t grain = std::max<int64_t>(1, 16384 / p.head_dim);
  if (items <= grain) {
    append_rows(p, 0, items);
  } else {
    torch::stable::parallel_for(0, items, grain, [&](int64_t begin, int64_t end) { append_rows(p, begin, end); });
  }
}

// Boxed kernels: the arguments are read from the dispatcher's stack (boxed_arguments.h).
void append_paged_kv_cache_cpu(StableIValue* stack, uint64_t num_args, uint64_t num_outputs) {
  BoxedArguments boxed(stack, num_args, num_outputs);
  append(check_append_arguments(read_append_arguments(boxed)));
}

void append_paged_kv_cache_with_slot_mapping_cpu(StableIValue* stack, uint64_t num_args, uint64_t num_outputs) {
  BoxedArguments boxed(stack, num_args, num_outputs);
  append(check_append_with_slot_mapping_arguments(read_append_with_slot_mapping_arguments(boxed)));
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(nvfp4kv, CPU, m) {
  m.impl("append_paged_kv_cache", &append_paged_kv_cache_cpu);
  m.impl("append_paged_kv_cache_with_slot_mapping", &append_paged_kv_cache_with_slot_mapping_cpu);
}

}  // namespace nvfp4kv
