// What the host computes once per append launch and every thread of the kernels reads: the work
// split's divisors (no integer division instruction in the kernels) and the per-call choices.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace nvfp4kv {
namespace append_kernel {

constexpr int kThreads = 256;

// Division by a run-time constant d in [1, 2^31) for dividends n < 2^31 (Granlund-Montgomery,
// "Division by invariant integers using multiplication", Thm 4.2 with N = 31): with
// l = ceil(log2 d) and m = ceil(2^(31+l) / d) < 2^32, floor(n / d) = (n * m) >> (31 + l).
// Keeps 32- and 64-bit divisions (dozens of instructions each) out of the kernel.
struct Divisor {
  uint32_t d;
  uint32_t multiplier;
  uint32_t shift;

  static Divisor make(uint32_t divisor) {
    uint32_t l = 0;
    while ((uint64_t(1) << l) < divisor) ++l;
    const uint64_t power = uint64_t(1) << (31 + l);
    return Divisor{divisor, uint32_t((power + divisor - 1) / divisor), 31 + l};
  }
  __device__ __forceinline__ uint32_t div(uint32_t n) const { return uint32_t((uint64_t(n) * multiplier) >> shift); }
};

struct LaunchArgs {
  Divisor items_per_row;     // threads per row: item -> row
  Divisor items_per_tensor;  // split mode: threads per row and tensor: -> K or V
  Divisor groups_per_head;   // head_dim / (16 * kBlocks): -> head, group
  Divisor blocks_per_row;    // head_dim / 16: "trtllm" V scale addresses
  Divisor page_size;         // position or slot -> page, for values below quotient_limit
  uint64_t quotient_limit;   // 2^31, or 0 when page_size >= 2^31 (then always a 64-bit division)
  int64_t row_begin;         // first row of this launch
  uint32_t items;            // threads with work in this launch
  bool speculate_batch;      // nnz == batch_size: load kv_indptr[row] early, betting b == row
  bool store16;              // 16-byte packed stores (even kBlocks and every data view 16-byte aligned)
  bool scale_store16;        // 2-byte scale stores (even kBlocks and every scale view 2-byte aligned)
  bool hoisted_division;     // a / (6 s) (and 4-over-6's a / (4 s) in table modes) from reciprocals per global scale
  uint32_t item_offset;      // pair kernel: threads below this one quantize nothing (0, or 32: a chain-only warp)
  uint32_t split_threads;    // split mode: threads per CTA (a multiple of 32, at most kThreads)

  // Pair kernel: items per CTA.
  __host__ __device__ uint32_t cta_items() const { return kThreads - item_offset; }
};

}  // namespace append_kernel
}  // namespace nvfp4kv
