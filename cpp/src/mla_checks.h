// The MLA latent append ops' arguments as read from the dispatcher's stack, their metadata checks,
// and the resolved MlaParams the kernels consume (schemas in registration.cpp).
#pragma once

#include <optional>

#include "argument_checks.h"
#include "boxed_arguments.h"
#include "mla_params.h"

namespace nvfp4kv {

// The arguments both MLA ops share, in schema order.
struct MlaCacheArguments {
  TensorInfo ckv_cache;
  TensorInfo ckv_sf_cache;
  TensorInfo kpe_cache;
};

struct MlaScaleArguments {
  double ckv_scale;
  double kpe_scale;
  std::optional<TensorInfo> ckv_scale_tensor;
  std::optional<TensorInfo> kpe_scale_tensor;
};

struct MlaAppendArguments {
  TensorInfo append_ckv;
  TensorInfo append_kpe;
  TensorInfo batch_indices;
  TensorInfo positions;
  MlaCacheArguments caches;
  TensorInfo kv_indices;
  TensorInfo kv_indptr;
  TensorInfo kv_last_page_len;
  MlaScaleArguments scales;
};

struct MlaAppendWithSlotMappingArguments {
  TensorInfo append_ckv;
  TensorInfo append_kpe;
  TensorInfo slot_mapping;
  MlaCacheArguments caches;
  MlaScaleArguments scales;
};

MlaAppendArguments read_mla_append_arguments(BoxedArguments& boxed);
MlaAppendWithSlotMappingArguments read_mla_append_with_slot_mapping_arguments(BoxedArguments& boxed);

// Every precondition that needs no device data (SPEC section 3); they throw before anything is written.
MlaParams check_mla_append_arguments(const MlaAppendArguments& args);
MlaParams check_mla_append_with_slot_mapping_arguments(const MlaAppendWithSlotMappingArguments& args);

}  // namespace nvfp4kv
