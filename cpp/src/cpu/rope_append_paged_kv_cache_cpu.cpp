// CPU implementation of nvfp4kv::rope_append_paged_kv_cache and its slot-mapping variant (docs/SPEC.md
// section 5): per row, each Q and K head is rotated into a 16-bit buffer (rope_rotation.h), Q written out
// (16-bit or FP8), K to k_out, and for placed rows the rotated K and the plain V quantized into the cache
// exactly as the plain append does (head_row_quantizer.h).
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>

#include <algorithm>
#include <cstring>

#include "../rope_checks.h"
#include "head_row_quantizer.h"

namespace nvfp4kv {
namespace {

// One head row rotated into `out` (head_dim 16-bit values); `table` is the row's cos/sin row, or null for a
// position outside the table (zeros). `src` may be the row `out` is written back to: it is read first.
void rotate_head(const RopeParams& p, const uint16_t* src, const void* table, uint16_t* out) {
  const int64_t head_dim = p.append.head_dim;
  if (table == nullptr) {
    std::fill(out, out + head_dim, uint16_t(0));
    return;
  }
  const bool bf16 = p.append.input_is_bf16;
  const int64_t half = p.rotary_dim / 2;
  for (int64_t d = 0; d < head_dim; ++d) {
    if (d >= p.rotary_dim) {
      out[d] = src[d];  // beyond the rotary dims: a bit copy
      continue;
    }
    const int64_t j = rope::pair_index(d, half, p.neox);
    const float c = rope::table_value(table, j, p.cos_sin_type);
    const float s = rope::table_value(table, half + j, p.cos_sin_type);
    const float v = codec::bits16_to_float(src[d], bf16);
    const float w = codec::bits16_to_float(src[rope::partner_dim(d, half, p.neox)], bf16);
    out[d] = rope::bits_from_float(rope::rotated_value(rope::first_of_pair(d, half, p.neox), v, w, c, s), bf16);
  }
}

void write_q_head(const RopeParams& p, const uint16_t* rotated, void* out, float q_scale) {
  const int64_t head_dim = p.append.head_dim;
  if (!p.q_out_fp8) {
    std::memcpy(out, rotated, size_t(head_dim) * sizeof(uint16_t));
    return;
  }
  uint8_t* bytes = static_cast<uint8_t*>(out);
  for (int64_t d = 0; d < head_dim; ++d) {
    bytes[d] = q_fp8_byte(codec::bits16_to_float(rotated[d], p.append.input_is_bf16), q_scale);
  }
}

void rope_append_rows(const RopeParams& p, int64_t begin, int64_t end) {
  const AppendParams& a = p.append;
  const float k_scale = global_scale(a, false);
  const float v_scale = global_scale(a, true);
  const float q_scale = p.q_out_fp8 ? rope_q_scale(p) : 1.0f;
  const bool write_q = !p.q_out_fp8 || usable_global_scale(q_scale);  // a bad device scale leaves Q untouched
  const bool write_k = usable_global_scale(k_scale);
  const bool write_v = usable_global_scale(v_scale);
  const int64_t q_item = p.q_out_fp8 ? 1 : 2;
  uint16_t rotated[kRopeMaxHeadDim];
  for (int64_t row = begin; row < end; ++row) {
    const void* table = rope_table_row(p, p.rope_positions[row]);
    if (write_q) {
      for (int64_t head = 0; head < p.num_q_heads; ++head) {
        rotate_head(p, p.query.data + row * p.query.row_stride + head * p.query.head_stride, table, rotated);
        write_q_head(
            p, rotated,
            static_cast<uint8_t*>(p.q_out.data) + (row * p.q_out.row_stride + head * p.q_out.head_stride) * q_item,
            q_scale);
      }
    }
    int64_t page = 0, entry = 0;
    const bool placed = table != nullptr && row < a.nnz && resolve_row_target(a, row, page, entry);
    for (int64_t head = 0; head < a.num_heads; ++head) {
      rotate_head(p, a.key.data + row * a.key.row_stride + head * a.key.head_stride, table, rotated);
      if (p.k_out.data != nullptr) {
        std::memcpy(static_cast<uint16_t*>(p.k_out.data) + row * p.k_out.row_stride + head * p.k_out.head_stride,
                    rotated, size_t(a.head_dim) * sizeof(uint16_t));
      }
      if (!placed) continue;
      if (write_k)
        quantize_head_row(a, rotated, k_scale, a.k_data.at(page, entry, head), a.k_scales, false, page, entry, head);
      if (write_v) {
        quantize_head_row(a, a.value.data + row * a.value.row_stride + head * a.value.head_stride, v_scale,
                          a.v_data.at(page, entry, head), a.v_scales, a.v_scales_trtllm, page, entry, head);
      }
    }
  }
}

void rope_append(const RopeParams& p) {
  // About 32 KiB of input per task keeps small decode calls on the calling thread.
  const int64_t values_per_row = (p.num_q_heads + 2 * p.append.num_heads) * p.append.head_dim;
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, values_per_row));
  if (p.rows <= grain) {
    rope_append_rows(p, 0, p.rows);
  } else {
    torch::stable::parallel_for(0, p.rows, grain, [&](int64_t begin, int64_t end) { rope_append_rows(p, begin, end); });
  }
}

// Boxed kernels: the arguments are read from the dispatcher's stack (boxed_arguments.h).
void rope_append_paged_kv_cache_cpu(StableIValue* stack, uint64_t num_args, uint64_t num_outputs) {
  BoxedArguments boxed(stack, num_args, num_outputs);
  rope_append(check_rope_append_arguments(read_rope_append_arguments(boxed)));
}

void rope_append_paged_kv_cache_with_slot_mapping_cpu(StableIValue* stack, uint64_t num_args, uint64_t num_outputs) {
  BoxedArguments boxed(stack, num_args, num_outputs);
  rope_append(check_rope_append_with_slot_mapping_arguments(read_rope_append_with_slot_mapping_arguments(boxed)));
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(nvfp4kv, CPU, m) {
  m.impl("rope_append_paged_kv_cache", &rope_append_paged_kv_cache_cpu);
  m.impl("rope_append_paged_kv_cache_with_slot_mapping", &rope_append_paged_kv_cache_with_slot_mapping_cpu);
}

}  // namespace nvfp4kv
