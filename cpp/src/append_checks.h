// The append ops' arguments as read from the dispatcher's stack, their metadata checks, and the
// resolved AppendParams the kernels consume.
#pragma once

#include <optional>
#include <string>

#include "append_params.h"
#include "argument_checks.h"
#include "boxed_arguments.h"
#include "shared_checks.h"

namespace nvfp4kv {

// The cache arguments as the ops receive them: tuple caches are four 4-D tensors; a stacked cache
// is the 5-D k_cache / k_cache_sf with K/V on dim 1 and v_cache / v_cache_sf empty.
struct CacheArguments {
  TensorInfo k_cache;
  std::optional<TensorInfo> v_cache;
  TensorInfo k_cache_sf;
  std::optional<TensorInfo> v_cache_sf;
};

// The arguments both ops end with, in schema order. Global decode scales: floats, or [1] float32
// tensors on the inputs' device (then the floats are unused). Formats: kv_layout "NHD" | "HND",
// v_sf_layout "linear" | "trtllm", scale_search "none" | "4over6".
struct OptionArguments {
  double k_scale;
  double v_scale;
  std::string kv_layout;
  std::optional<TensorInfo> k_scale_tensor;
  std::optional<TensorInfo> v_scale_tensor;
  std::string v_sf_layout;
  std::string scale_search;
};

struct AppendArguments {
  TensorInfo append_key;
  TensorInfo append_value;
  TensorInfo batch_indices;
  TensorInfo positions;
  CacheArguments caches;
  TensorInfo kv_indices;
  TensorInfo kv_indptr;
  TensorInfo kv_last_page_len;
  OptionArguments options;
};

struct AppendWithSlotMappingArguments {
  TensorInfo append_key;
  TensorInfo append_value;
  TensorInfo slot_mapping;
  CacheArguments caches;
  OptionArguments options;
};

// The arguments of one call, read from its stack (schemas in registration.cpp); valid while `boxed` lives.
AppendArguments read_append_arguments(BoxedArguments& boxed);
AppendWithSlotMappingArguments read_append_with_slot_mapping_arguments(BoxedArguments& boxed);
// The same fields as the first arguments of an op that has more (the fused RoPE append).
AppendArguments read_append_fields(BoxedArguments& boxed);
AppendWithSlotMappingArguments read_append_with_slot_mapping_fields(BoxedArguments& boxed);

// Check every precondition that needs no device data (SPEC section 3) and resolve the geometry the
// kernels use. They throw before anything is written.
AppendParams check_append_arguments(const AppendArguments& args);
AppendParams check_append_with_slot_mapping_arguments(const AppendWithSlotMappingArguments& args);

// The same checks for an op built on the append (the fused RoPE append, rope_checks.cpp), its errors
// under `op`'s name and the K/V rows' names, with the byte ranges of the caches it writes for the op's own overlap
// checks. With fewer_placed_rows, batch_indices / positions may have fewer entries than append_key has rows (nnz =
// their count: only those rows are placed); the slot mapping always may.
struct RowNames {
  const char* key = "append_key";
  const char* value = "append_value";
};
struct CheckedAppend {
  AppendParams params;
  WrittenRanges written;
};
CheckedAppend check_append_arguments(const char* op, const AppendArguments& args, const RowNames& names,
                                     bool fewer_placed_rows);
CheckedAppend check_append_with_slot_mapping_arguments(const char* op, const AppendWithSlotMappingArguments& args,
                                                       const RowNames& names);

}  // namespace nvfp4kv
