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
// Params is AppendParams or MlaParams (mla_params.h): the index views, batch_size, page_size and
// num_pages; Args is LaunchArgs or the MLA kernels' launch arguments: page_size (a Divisor),
// quotient_limit and speculate_batch.

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

// The dtype shared by every index tensor a call reads (its index views and `extra`, e.g. RoPE positions):
// kernels instantiated for int32_t / int64_t take one load per element; a mix takes void (IndexView picks).
enum class IndexTypes { kInt32, kInt64, kMixed };

template <typename Params>
inline IndexTypes index_types(const Params& p, const IndexView* extra = nullptr) {
  bool all32 = true, all64 = true;
  const auto see = [&](const IndexView& v) { all32 &= !v.is_int64, all64 &= v.is_int64; };
  if (p.slot_mapping.data != nullptr) {
    see(p.slot_mapping);
  } else {
    see(p.batch_indices), see(p.positions), see(p.kv_indptr), see(p.kv_indices);
  }
  if (extra != nullptr) see(*extra);
  return all32 ? IndexTypes::kInt32 : all64 ? IndexTypes::kInt64 : IndexTypes::kMixed;
}

// v / page_size for v >= 0; 0 for v < 0 (padding slots, bad positions: their rows are skipped anyway).
// Index values read as int32 are below 2^31, so they need no 64-bit path and no branch (a decode
// row's latency): below quotient_limit when it is set, and below page_size (quotient 0) when not.
template <typename Index, typename Params, typename Args>
__device__ __forceinline__ uint64_t page_quotient(int64_t v, const Params& p, const Args& a) {
  if constexpr (std::is_same_v<Index, int32_t>) {
    const uint32_t q = a.page_size.div(uint32_t(v < 0 ? 0 : v));
    return a.quotient_limit != 0 ? q : 0;
  }
  if (v < 0) return 0;
  if (uint64_t(v) < a.quotient_limit) return a.page_size.div(uint32_t(v));
  return uint64_t(v) / uint64_t(p.page_size);  // only for positions or slots of 2^31 and more
}

// An index value as loaded, in its index type (int64 for a mix of types). A kernel that works while such a
// load is in flight (the page id, a RoPE position) keeps the value so until it needs it: widening an int32
// right after the load would make the thread wait for the load there.
template <typename Index>
using LoadedIndex = std::conditional_t<std::is_same_v<Index, int32_t>, int32_t, int64_t>;

// Level 1 of the chain: the row's own index values (loads only; nothing waits for them here), widened to
// int64 (RowIndices), or as loaded (load_row_indices_as_loaded, below).
template <typename Value>
struct RowIndicesOf {
  Value b;         // batch_indices[row], or slot_mapping[row] in the slot-mapping variant
  Value position;  // positions[row]
  Value first;     // kv_indptr[row], kv_indptr[row + 1]: the early guess that b == row (decode)
  Value last;
};
using RowIndices = RowIndicesOf<int64_t>;

// Where level 1's values are (typed Index; parameters and the row only, so a kernel can compute this
// before its programmatic wait and issue the loads right after it). Null: not read.
template <typename Index>
struct RowIndexAddresses {
  const Index* b = nullptr;  // batch_indices + row, or slot_mapping + row
  const Index* position = nullptr;
  const Index* first = nullptr;  // kv_indptr + row and + row + 1 (speculate_batch)
  const Index* last = nullptr;
};

template <typename Index, typename Params, typename Args>
__device__ __forceinline__ RowIndexAddresses<Index> row_index_addresses(const Params& p, const Args& a, int64_t row) {
  RowIndexAddresses<Index> s;
  if constexpr (!std::is_void_v<Index>) {
    const auto at = [](const IndexView& v, int64_t i) { return static_cast<const Index*>(v.data) + i * v.stride; };
    if (p.slot_mapping.data != nullptr) {
      s.b = at(p.slot_mapping, row);
      return s;
    }
    s.b = at(p.batch_indices, row);
    s.position = at(p.positions, row);
    if (a.speculate_batch) {  // row < nnz == batch_size, so row + 1 is a valid kv_indptr index
      s.first = at(p.kv_indptr, row);
      s.last = at(p.kv_indptr, row + 1);
    }
  }
  return s;
}

// Level 1's loads through the views: the pair kernel's chain warp, right after its wait. It keeps the
// form measured in v9 (7fbc0e8): giving it the other kernels' forms (row_index_addresses, and kLoadFirst
// below) cost page-table prefill 4-9% at nnz 4096 and at D=64 (docs/PERFORMANCE.md v12d, 2026-12-02).
template <typename Index, typename Params, typename Args>
__device__ __forceinline__ RowIndices load_row_indices(const Params& p, const Args& a, int64_t row) {
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

// The same loads from addresses computed before the wait (row_index_addresses; void: through the views).
template <typename Index, typename Params, typename Args>
__device__ __forceinline__ RowIndices load_row_indices(const Params& p, const Args& a, int64_t row,
                                                       const RowIndexAddresses<Index>& s) {
  if constexpr (std::is_void_v<Index>) {
    return load_row_indices<Index>(p, a, row);
  } else {
    RowIndices r{0, 0, 0, 0};
    r.b = int64_t(__ldg(s.b));
    if (p.slot_mapping.data != nullptr) return r;
    r.position = int64_t(__ldg(s.position));
    if (a.speculate_batch) {
      r.first = int64_t(__ldg(s.first));
      r.last = int64_t(__ldg(s.last));
    }
    return r;
  }
}

// The same loads with the values kept as loaded (LoadedIndex): nothing waits for them before the chain goes on,
// not even at the end of a branch that only some lanes take. (The widened form above is not written through this
// one: that changes the append and MLA kernels' SASS, which their measurements are of.)
template <typename Index, typename Params, typename Args>
__device__ __forceinline__ RowIndicesOf<LoadedIndex<Index>> load_row_indices_as_loaded(
    const Params& p, const Args& a, int64_t row, const RowIndexAddresses<Index>& s) {
  if constexpr (std::is_void_v<Index>) {
    return load_row_indices<Index>(p, a, row);
  } else {
    RowIndicesOf<Index> r{0, 0, 0, 0};
    r.b = __ldg(s.b);
    if (p.slot_mapping.data != nullptr) return r;
    r.position = __ldg(s.position);
    if (a.speculate_batch) {
      r.first = __ldg(s.first);
      r.last = __ldg(s.last);
    }
    return r;
  }
}

// Levels 2-3: everything up to the page id, whose load is left in flight.
struct Target {
  int64_t page;   // page id (loaded, not yet range-checked)
  int64_t entry;  // entry in the page
  bool ok;        // every check but the page id's range passed
};

template <typename Index>
struct PendingTarget {
  LoadedIndex<Index> page;  // the page id
  int64_t entry;
  bool ok;
};

template <typename Index>
__device__ __forceinline__ Target resolved(const PendingTarget<Index>& t) {
  return {int64_t(t.page), t.entry, t.ok};
}

template <typename Index>
__device__ __forceinline__ LoadedIndex<Index> read_loaded_index(const IndexView& v, int64_t i) {
  if constexpr (std::is_same_v<Index, int32_t>) {
    return __ldg(static_cast<const int32_t*>(v.data) + i * v.stride);
  } else {
    return read_index<Index>(v, i);
  }
}

// Whether batch index b lies in [0, batch_size) (the bounds contract's first check; a row that fails it reads
// kv_indptr at batch 0 and is skipped).
template <typename Params>
__device__ __forceinline__ bool batch_in_range(const Params& p, int64_t b) {
  return uint64_t(b) < uint64_t(p.batch_size);
}

// Level 2 from a warp's registers (the MLA chain kernel), for calls of few requests that are not decode: every
// lane of the chain warp loads kv_indptr entries lane and lane + 32 (clamped) with level 1, and a row's
// kv_indptr[b], [b + 1] are then shuffles instead of a memory round trip (docs/PERFORMANCE.md section 9, m14).
constexpr int64_t kWarpIndptrEntries = 64;

template <typename Params, typename Args>
inline bool indptr_fits_warp(const Params& p, const Args& a) {
  return p.slot_mapping.data == nullptr && !a.speculate_batch && p.batch_size + 1 <= kWarpIndptrEntries;
}

template <typename Index>
struct WarpIndptr {
  LoadedIndex<Index> low;   // kv_indptr[min(lane, batch_size)]
  LoadedIndex<Index> high;  // kv_indptr[min(lane + 32, batch_size)]
};

template <typename Index, typename Params>
__device__ __forceinline__ WarpIndptr<Index> load_warp_indptr(const Params& p, uint32_t lane) {
  return {read_loaded_index<Index>(p.kv_indptr, lane < p.batch_size ? lane : p.batch_size),
          read_loaded_index<Index>(p.kv_indptr, lane + 32 < p.batch_size ? lane + 32 : p.batch_size)};
}

// kv_indptr[i], i in [0, kWarpIndptrEntries), from the lanes' entries; every lane of the warp takes part.
template <typename Value>
__device__ __forceinline__ Value warp_indptr_entry(Value low, Value high, int64_t i) {
  const Value from_low = __shfl_sync(0xFFFFFFFFu, low, int(i) & 31);
  const Value from_high = __shfl_sync(0xFFFFFFFFu, high, int(i) & 31);
  return i < 32 ? from_low : from_high;
}

// Level 2 of the row whose level 1 is r, from the warp (b clamped as target_of_row clamps it); the chain then
// starts with range_given.
template <typename Index, typename Params, typename Value>
__device__ __forceinline__ void range_from_warp(const Params& p, const WarpIndptr<Index>& w, RowIndicesOf<Value>& r) {
  const int64_t b = int64_t(r.b);
  const int64_t bc = batch_in_range(p, b) ? b : 0;
  r.first = Value(warp_indptr_entry(w.low, w.high, bc));
  r.last = Value(warp_indptr_entry(w.low, w.high, bc + 1));
}

// kLoadFirst: the page id's load goes out before the checks (which then overlap it), its index clamped
// into kv_indices (size >= 1: the host checks); a row whose checks fail is skipped and its id unused.
// Otherwise the checks come first and a failed row loads element 0 (the pair kernel's chain warp,
// whose latency is hidden by the quantizing warps: its code is kept as measured, see load_row_indices).
// Result: Target, or PendingTarget<Index> (the page id as loaded).
// range_given: r.first / r.last already hold kv_indptr[b], [b + 1] (range_from_warp).
template <typename Index, bool kLoadFirst, typename Result, typename Params, typename Args, typename Value>
__device__ __forceinline__ Result target_of_row(const Params& p, const Args& a, int64_t row,
                                                const RowIndicesOf<Value>& r, bool range_given) {
  using QuotientIndex = std::conditional_t<kLoadFirst, Index, void>;  // the chain warp keeps its measured code
  using PageId = decltype(Result::page);
  Result t;
  if (p.slot_mapping.data != nullptr) {
    const int64_t slot = r.b;
    const uint64_t page = page_quotient<QuotientIndex>(slot, p, a);
    t.ok = slot >= 0;       // and page < num_pages, checked with the page-table case in finish_target
    t.page = PageId(page);  // an int32 when the slot was read as int32, so below 2^31
    t.entry = slot - int64_t(page) * p.page_size;
    return t;
  }
  const int64_t b = r.b, position = r.position;
  Value first = r.first, last = r.last;  // as loaded: widened where used (an int32 stays one across the branch)
  const bool b_ok = batch_in_range(p, b);
  if (!range_given && (!a.speculate_batch || b != row)) {
    const int64_t bc = b_ok ? b : 0;  // batch_size >= 1 (the host launches nothing otherwise)
    first = Value(read_index<Index>(p.kv_indptr, bc));
    last = Value(read_index<Index>(p.kv_indptr, bc + 1));
  }
  const uint64_t page_offset = page_quotient<QuotientIndex>(position, p, a);
  // last - first fits in uint64 when last > first; the slot then lies below last: no overflow.
  const int64_t slot = int64_t(uint64_t(first) + page_offset);
  t.ok = b_ok && position >= 0 && first < last && page_offset < uint64_t(last) - uint64_t(first) && slot >= 0 &&
         slot < p.kv_indices.size;
  // kLoadFirst: a slot outside [0, size) (negative ones compare as huge) reads the last element.
  const uint64_t last_slot = uint64_t(p.kv_indices.size - 1);
  const int64_t page_slot = kLoadFirst ? int64_t(uint64_t(slot) > last_slot ? last_slot : slot) : (t.ok ? slot : 0);
  t.page = read_loaded_index<Index>(p.kv_indices, page_slot);
  t.entry = position - int64_t(page_offset) * p.page_size;
  return t;
}

template <typename Index, bool kLoadFirst, typename Params, typename Args, typename Value>
__device__ __forceinline__ Target start_target(const Params& p, const Args& a, int64_t row,
                                               const RowIndicesOf<Value>& r, bool range_given = false) {
  return target_of_row<Index, kLoadFirst, Target>(p, a, row, r, range_given);
}

template <typename Index, bool kLoadFirst, typename Params, typename Args, typename Value>
__device__ __forceinline__ PendingTarget<Index> start_pending_target(const Params& p, const Args& a, int64_t row,
                                                                     const RowIndicesOf<Value>& r) {
  return target_of_row<Index, kLoadFirst, PendingTarget<Index>>(p, a, row, r, false);
}

template <typename Params>
__device__ __forceinline__ bool finish_target(const Params& p, const Target& t) {
  return t.ok && t.page >= 0 && t.page < p.num_pages;
}

}  // namespace append_kernel
}  // namespace nvfp4kv
