#include "rope_checks.h"

#include <string>

#include "memory_overlap.h"
#include "shared_checks.h"

namespace nvfp4kv {
namespace {

const RowNames kRowNames{"key", "value"};

RotationArguments read_rotation(BoxedArguments& boxed) {
  return {boxed.optional_tensor(), boxed.tensor(), boxed.tensor(),        boxed.tensor(),
          boxed.optional_tensor(), boxed.flag(),   boxed.optional_real(), boxed.optional_tensor()};
}

// A [n, heads, head_dim] tensor; heads < 0: any.
void check_rows_shape(const char* op, const TensorInfo& t, const char* name, int64_t rows, int64_t heads,
                      int64_t head_dim) {
  if (t.dim() != 3 || t.size(0) != rows || (heads >= 0 && t.size(1) != heads) || t.size(2) != head_dim) {
    fail(op, name, " must have shape [n, ", heads >= 0 ? "num_kv_heads" : "num_q_heads", ", head_dim] = [", rows, ", ",
         heads >= 0 ? std::to_string(heads) : std::string("*"), ", ", head_dim, "] (n and head_dim of key), got ",
         t.shape_string());
  }
  check_last_dim_contiguous(op, t, name);
}

rope::TableType table_type(const char* op, const TensorInfo& table) {
  switch (table.scalar_type()) {
    case ScalarType::Float: return rope::TableType::kFloat32;
    case ScalarType::Half: return rope::TableType::kFloat16;
    case ScalarType::BFloat16: return rope::TableType::kBFloat16;
    default:
      fail(op, "cos_sin_cache must have dtype float32, float16 or bfloat16, got ", dtype_name(table.scalar_type()));
  }
}

// [n, H * D] when a [n, H, D] tensor's heads are contiguous, so that two column ranges of one packed
// projection output (query, key and value of a [n, Hq + 2 Hkv, D] qkv tensor) are seen to be disjoint.
StridedBytes head_columns(const TensorInfo& t) {
  StridedBytes bytes = strided_bytes(t);
  if (t.dim() == 3 && (t.size(1) <= 1 || t.stride(1) == t.size(2))) {
    bytes.dims = 2;
    bytes.sizes[1] = t.size(1) * t.size(2);
    bytes.strides[1] = 1;
  }
  return bytes;
}

bool rows_disjoint(const TensorInfo& a, const TensorInfo& b) {
  return !read_range(a).overlaps(read_range(b)) || disjoint_columns(head_columns(a), head_columns(b));
}

// q_out and k_out: each touches its bytes once; neither overlaps the caches, the other, or anything read (a packed
// qkv tensor's column ranges count as disjoint, so q_out may be a column range next to key).
void check_outputs_disjoint(const char* op, const CheckedAppend& checked, const TensorInfo& key,
                            const TensorInfo& value, const RotationArguments& r, NamedTensors rotation_reads,
                            NamedTensors index_reads) {
  const NamedTensors outputs = {{&r.q_out, "q_out"}, {r.k_out ? &*r.k_out : nullptr, "k_out"}};
  WrittenRanges written_outputs;
  for (const auto& [out, name] : outputs) {
    if (out == nullptr) continue;
    if (!touches_each_byte_once(strided_bytes(*out))) {
      fail(op, name, " must not overlap itself (no stride-0 or expanded dims), got shape ", out->shape_string());
    }
    written_outputs.add(name, read_range(*out));
    for (const auto& [read, read_name] : {std::pair<const TensorInfo*, const char*>{&key, "key"},
                                          {&value, "value"},
                                          {r.query ? &*r.query : nullptr, "query"}}) {
      if (read != nullptr && !rows_disjoint(*out, *read)) {
        fail(op, name, " must not overlap ", read_name, " in memory (pass q_out=query to rotate Q in place), got ",
             read_range(*out).overlap_bytes(read_range(*read)), " overlapping bytes");
      }
    }
  }
  check_reads_disjoint(op, checked.written, outputs);
  check_reads_disjoint(op, written_outputs, rotation_reads);
  check_reads_disjoint(op, written_outputs, index_reads);
  if (r.k_out && !rows_disjoint(r.q_out, *r.k_out)) {
    fail(op, "k_out must not overlap q_out in memory, got ", read_range(r.q_out).overlap_bytes(read_range(*r.k_out)),
         " overlapping bytes");
  }
}

// The rotation's arguments, after the append's checks (`checked`) of key, value, caches and placement.
RopeParams check_rotation(const char* op, const TensorInfo& key, const TensorInfo& value, const RotationArguments& r,
                          const CheckedAppend& checked, NamedTensors index_reads) {
  RopeParams p{};
  p.append = checked.params;
  const int64_t n = key.size(0), head_dim = key.size(2);
  const ScalarType dtype = key.scalar_type();
  p.rows = n;
  if (head_dim > kRopeMaxHeadDim) {
    fail(op, "key head_dim (last dim) must be at most ", kRopeMaxHeadDim, " for the fused rotation, got ", head_dim);
  }
  check_devices(op, key, "key",
                {{r.query ? &*r.query : nullptr, "query"},
                 {&r.cos_sin_cache, "cos_sin_cache"},
                 {&r.rope_positions, "rope_positions"},
                 {&r.q_out, "q_out"},
                 {r.k_out ? &*r.k_out : nullptr, "k_out"}});

  // Q in (or in place) and out.
  const TensorInfo& q_in = r.query ? *r.query : r.q_out;
  const char* q_name = r.query ? "query" : "q_out (query rotated in place)";
  if (q_in.scalar_type() != dtype) {
    fail(op, q_name, " must have the same dtype as key (", dtype_name(dtype), "), got ",
         dtype_name(q_in.scalar_type()));
  }
  check_rows_shape(op, q_in, q_name, n, -1, head_dim);
  p.num_q_heads = q_in.size(1);
  p.q_out_fp8 = r.q_out.scalar_type() == ScalarType::Float8_e4m3fn;
  if (r.q_out.scalar_type() != dtype && !p.q_out_fp8) {
    fail(op, "q_out must have dtype ", dtype_name(dtype), " (key's) or float8_e4m3fn, got ",
         dtype_name(r.q_out.scalar_type()));
  }
  check_rows_shape(op, r.q_out, "q_out", n, -1, head_dim);
  if (r.q_out.size(1) != p.num_q_heads) {
    fail(op, "q_out must have query's shape ", q_in.shape_string(), ", got ", r.q_out.shape_string());
  }
  p.query = RowsView{static_cast<const uint16_t*>(q_in.data_ptr()), q_in.stride(0), q_in.stride(1)};
  p.q_out = OutRowsView{r.q_out.data_ptr(), r.q_out.stride(0), r.q_out.stride(1)};
  if (r.k_out) {
    if (r.k_out->scalar_type() != dtype) {
      fail(op, "k_out must have the same dtype as key (", dtype_name(dtype), "), got ",
           dtype_name(r.k_out->scalar_type()));
    }
    check_rows_shape(op, *r.k_out, "k_out", n, key.size(1), head_dim);
    p.k_out = OutRowsView{r.k_out->data_ptr(), r.k_out->stride(0), r.k_out->stride(1)};
  }

  // The table and the positions.
  const TensorInfo& table = r.cos_sin_cache;
  if (table.dim() != 2) {
    fail(op, "cos_sin_cache must be a 2-D tensor [max_pos, rotary_dim], got shape ", table.shape_string());
  }
  p.cos_sin_type = table_type(op, table);
  p.rotary_dim = table.size(1);
  if (p.rotary_dim < 2 || p.rotary_dim % 2 != 0 || p.rotary_dim > head_dim) {
    fail(op, "cos_sin_cache rotary_dim (last dim) must be even and in [2, head_dim = ", head_dim, "], got ",
         p.rotary_dim);
  }
  check_last_dim_contiguous(op, table, "cos_sin_cache");
  p.cos_sin = table.data_ptr();
  p.cos_sin_row_stride = table.stride(0);
  p.max_pos = table.size(0);
  p.rope_positions = check_index(op, r.rope_positions, "rope_positions");
  if (r.rope_positions.size(0) != n) {
    fail(op, "rope_positions must have n = ", n, " entries (key.shape[0]), got ", r.rope_positions.size(0));
  }
  p.neox = r.is_neox;

  // The FP8 Q scale: given exactly when Q goes out in FP8.
  if (p.q_out_fp8) {
    if (!r.q_scale && !r.q_scale_tensor) {
      fail(op, "q_scale must be given with a float8_e4m3fn q_out (a positive finite global decode scale), got None");
    }
    p.q_scale_device = check_scale(op, "q_scale", r.q_scale.value_or(1.0), r.q_scale_tensor, key, "key", p.q_scale);
  } else if (r.q_scale || r.q_scale_tensor) {
    fail(op, "q_scale must be None with a ", dtype_name(dtype), " q_out (it is the decode scale of an FP8 q_out), got ",
         r.q_scale ? std::to_string(*r.q_scale) : std::string("a tensor"));
  }

  // Nothing the op reads overlaps what it writes.
  check_reads_disjoint(op, checked.written,
                       {{r.query ? &*r.query : &r.q_out, q_name},
                        {&r.cos_sin_cache, "cos_sin_cache"},
                        {&r.rope_positions, "rope_positions"},
                        {r.q_scale_tensor ? &*r.q_scale_tensor : nullptr, "q_scale"}});
  check_outputs_disjoint(op, checked, key, value, r,
                         {{&r.cos_sin_cache, "cos_sin_cache"},
                          {&r.rope_positions, "rope_positions"},
                          {r.q_scale_tensor ? &*r.q_scale_tensor : nullptr, "q_scale"}},
                         index_reads);
  return p;
}

const TensorInfo* optional_pointer(const std::optional<TensorInfo>& t) { return t ? &*t : nullptr; }

}  // namespace

RopeAppendArguments read_rope_append_arguments(BoxedArguments& boxed) {
  RopeAppendArguments args{read_append_fields(boxed), read_rotation(boxed)};
  boxed.finish("rope_append_paged_kv_cache", 0);
  return args;
}

RopeAppendWithSlotMappingArguments read_rope_append_with_slot_mapping_arguments(BoxedArguments& boxed) {
  RopeAppendWithSlotMappingArguments args{read_append_with_slot_mapping_fields(boxed), read_rotation(boxed)};
  boxed.finish("rope_append_paged_kv_cache_with_slot_mapping", 0);
  return args;
}

RopeParams check_rope_append_arguments(const RopeAppendArguments& args) {
  const char* op = "rope_append_paged_kv_cache";
  const AppendArguments& a = args.append;
  return check_rotation(op, a.append_key, a.append_value, args.rotation, check_append_arguments(op, a, kRowNames, true),
                        {{&a.batch_indices, "batch_indices"},
                         {&a.positions, "positions"},
                         {&a.kv_indices, "kv_indices"},
                         {&a.kv_indptr, "kv_indptr"},
                         {&a.kv_last_page_len, "kv_last_page_len"},
                         {optional_pointer(a.options.k_scale_tensor), "k_scale"},
                         {optional_pointer(a.options.v_scale_tensor), "v_scale"}});
}

RopeParams check_rope_append_with_slot_mapping_arguments(const RopeAppendWithSlotMappingArguments& args) {
  const char* op = "rope_append_paged_kv_cache_with_slot_mapping";
  const AppendWithSlotMappingArguments& a = args.append;
  return check_rotation(op, a.append_key, a.append_value, args.rotation,
                        check_append_with_slot_mapping_arguments(op, a, kRowNames),
                        {{&a.slot_mapping, "slot_mapping"},
                         {optional_pointer(a.options.k_scale_tensor), "k_scale"},
                         {optional_pointer(a.options.v_scale_tensor), "v_scale"}});
}

}  // namespace nvfp4kv
