// Checks of nvfp4kv::dequantize, and the output it allocates, shared by the CPU and CUDA kernels.
#pragma once

#include "argument_checks.h"
#include "boxed_arguments.h"
#include "dequantize_params.h"

namespace nvfp4kv {

struct DequantizeCall {
  Tensor out;     // float32 [..., head_dim]
  Tensor packed;  // contiguous (a copy only when the input was not)
  Tensor scales;
  DequantizeParams params;
};

// packed uint8 [..., head_dim/2] + scales float8_e4m3fn [..., head_dim/16] (same leading shape and
// device) + a positive finite global scale, read from the call's stack (schema in registration.cpp).
DequantizeCall prepare_dequantize(BoxedArguments& boxed);

}  // namespace nvfp4kv
