// Everything public of nvfp4kv in one include: the C++ API over the dispatcher (page.h, rope.h,
// fp4_quantization.h) and the torch-free NVFP4 codec (nvfp4_codec.h).
#pragma once

#include "nvfp4kv/fp4_quantization.h"
#include "nvfp4kv/nvfp4_codec.h"
#include "nvfp4kv/page.h"
#include "nvfp4kv/rope.h"
