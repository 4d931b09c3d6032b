// The index chain of one row: where its K/V land in the paged cache (batch index -> kv_indptr ->
// kv_indices, or the slot mapping), read directly as int32 or int64 device data.
#pragma once

#include <cstdint>
#include <type_traits>

#include "../append_params.h"
#include "launch_args.cuh"

namespace nvfp4kv {
namespace append_kernel {

// Mirrors resolve_row_target (append_params.h) and its bounds contract exactly,
// with every load index clamped into its tensor instead of early returns.

// Index element i: `Index` is int32_t or int64_t when the host saw that dtype on every index tensor
// (one load), void for a mix (IndexView picks per tensor).
template <typename Index>
__device__ __forceinline__ int64_t read_index(const IndexView& v, int64_t i) {
  if constexpr (std::is_void_v<Index>) {
    return v[i];
  } else {
    return int64_t(__ldg(static_cast<const Index*>(v.data) + i * v.stride));
  }
}

// v / page_size for v >= 0; 0 for v < 0 (padding slots, bad positions: their rows are skipped anyway).
__device__ __forceinline__ uint64_t page_quotient(int64_t v, const AppendParams& p, const LaunchArgs& a) {
  if (v < 0) return 0;
  if (uint64_t(v) < a.quotient_limit) return a.page_size.div(uint32_t(v));
  return uint64_t(v) / uint64_t(p.page_size);  // only for positions or slots of 2^31 and more
}

// Level 1 of the chain: the row's own index values (loads only; nothing waits for them here).
struct RowIndices {
  int64_t b;         // batch_indices[row], or slot_mapping[row] in the slot-mapping variant
  int64_t position;  // positions[row]
  int64_t first;     // kv_indptr[row], kv_indptr[row + 1]: the early guess that b == row (decode)
  int64_t last;
};

template <typename Index>
__device__ __forceinline__ RowIndices load_row_indices(const AppendParams& p, const LaunchArgs& a, int64_t row) {
  RowIndices r{0, 0, 0, 0};
  if (p.slot_mapping.data != nullptr) {
    r.b = read_index<Index>(p.slot_mapping, row);
    return r;
  }
  r.b = read_index<Index>(p.batch_indices, row);
  r.position = read_index<Index>(p.positions, row);
  if (a.speculate_batch) {  // row < nnz == batch_size, so row + 1 is a valid kv_indptr index
    r.first = read_index<Index>(p.kv_indptr, row);
    r.last = read_index<Index>(p.kv_indptr, row + 1);
  }
  return r;
}

// Levels 2-3: everything up to the page id, whose load is left in flight.
struct Target {
  int64_t page;   // page id (loaded, not yet range-checked)
  int64_t entry;  // entry in the page
  bool ok;        // every check but the page id's range passed
};

template <typename Index>
__device__ __forceinline__ Target start_target(const AppendParams& p, const LaunchArgs& a, int64_t row,
                                               const RowIndices& r) {
  Target t;
  if (p.slot_mapping.data != nullptr) {
    const int64_t slot = r.b;
    const uint64_t page = page_quotient(slot, p, a);
    t.ok = slot >= 0;  // and page < num_pages, checked with the page-table case in finish_target
    t.page = int64_t(page);
    t.entry = slot - int64_t(page) * p.page_size;
    return t;
  }
  const int64_t b = r.b, position = r.position;
  int64_t first = r.first, last = r.last;
  const bool b_ok = uint64_t(b) < uint64_t(p.batch_size);
  if (!a.speculate_batch || b != row) {
    const int64_t bc = b_ok ? b : 0;  // batch_size >= 1 (the host launches nothing otherwise)
    first = read_index<Index>(p.kv_indptr, bc);
    last = read_index<Index>(p.kv_indptr, bc + 1);
  }
  const uint64_t page_offset = page_quotient(position, p, a);
  // last - first fits in uint64 when last > first; the slot then lies below last: no overflow.
  const int64_t slot = int64_t(uint64_t(first) + page_offset);
  t.ok = b_ok && position >= 0 && first < last && page_offset < uint64_t(last) - uint64_t(first) && slot >= 0 &&
         slot < p.kv_indices.size;
  t.page = read_index<Index>(p.kv_indices, t.ok ? slot : 0);  // kv_indices.size >= 1 (the host checks)
  t.entry = position - int64_t(page_offset) * p.page_size;
  return t;
}

__device__ __forceinline__ bool finish_target(const AppendParams& p, const Target& t) {
  return t.ok && t.page >= 0 && t.page < p.num_pages;
}

}  // namespace append_kernel
}  // namespace nvfp4kv
