// Torch-free launchers of the CUDA kernels (compiled by nvcc); the host wrappers call these after
// the argument checks, on torch's current stream. They return the cudaError_t of the launch.
#pragma once

#include "../append_params.h"
#include "../dequantize_params.h"
#include "../mla_params.h"
#include "../rope_params.h"

namespace nvfp4kv {

int launch_append_paged_kv_cache(const AppendParams& params, void* stream, const char** error_string);
int launch_append_paged_mla_kv_cache(const MlaParams& params, void* stream, const char** error_string);
int launch_rope_append_paged_kv_cache(const RopeParams& params, void* stream, const char** error_string);
int launch_dequantize(const DequantizeParams& params, void* stream, const char** error_string);

}  // namespace nvfp4kv
