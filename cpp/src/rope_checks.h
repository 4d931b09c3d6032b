// The fused RoPE + NVFP4 append ops' arguments as read from the dispatcher's stack, their metadata checks
// (the append's own, append_checks.h, and the rotation's), and the resolved RopeParams.
#pragma once

#include <optional>

#include "append_checks.h"
#include "rope_params.h"

namespace nvfp4kv {

// The arguments after the append's, in schema order (registration.cpp).
struct RotationArguments {
  std::optional<TensorInfo> query;  // [n, Hq, D]; None: q_out holds the query and is rotated in place
  TensorInfo cos_sin_cache;         // [max_pos, R]
  TensorInfo rope_positions;        // [n]
  TensorInfo q_out;                 // [n, Hq, D], the input dtype or float8_e4m3fn
  std::optional<TensorInfo> k_out;  // [n, Hkv, D], the input dtype
  bool is_neox;
  std::optional<double> q_scale;  // FP8 Q only: a float, or
  std::optional<TensorInfo> q_scale_tensor;
};

struct RopeAppendArguments {
  AppendArguments append;  // append_key / append_value are the op's key / value
  RotationArguments rotation;
};

struct RopeAppendWithSlotMappingArguments {
  AppendWithSlotMappingArguments append;
  RotationArguments rotation;
};

RopeAppendArguments read_rope_append_arguments(BoxedArguments& boxed);
RopeAppendWithSlotMappingArguments read_rope_append_with_slot_mapping_arguments(BoxedArguments& boxed);

// Every precondition that needs no device data, before anything is written (SPEC section 3).
RopeParams check_rope_append_arguments(const RopeAppendArguments& args);
RopeParams check_rope_append_with_slot_mapping_arguments(const RopeAppendWithSlotMappingArguments& args);

}  // namespace nvfp4kv
