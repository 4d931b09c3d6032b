// The host checks every op family shares (the paged K/V appends and the MLA latent appends): index
// tensors and the page table, devices, global scales, and tensors the op reads that must not overlap
// what it writes. Every failure throws like fail() (argument_checks.h).
#pragma once

#include <cstddef>
#include <initializer_list>
#include <optional>
#include <utility>

#include "append_params.h"
#include "argument_checks.h"
#include "memory_overlap.h"

namespace nvfp4kv {

using NamedTensors = std::initializer_list<std::pair<const TensorInfo*, const char*>>;  // null: not given

// A 1-D int32 or int64 index tensor, as the kernels read it.
IndexView check_index(const char* op, const TensorInfo& t, const char* name);

// The page-table arguments: nnz batch indices and positions (nnz = `rows`.shape[0]), kv_indptr with
// batch_size + 1 entries (batch_size = kv_last_page_len.shape[0]).
struct PageTable {
  IndexView batch_indices;
  IndexView positions;
  IndexView kv_indices;
  IndexView kv_indptr;
  int64_t batch_size;
};
PageTable check_page_table(const char* op, const TensorInfo& batch_indices, const TensorInfo& positions,
                           const TensorInfo& kv_indices, const TensorInfo& kv_indptr,
                           const TensorInfo& kv_last_page_len, int64_t nnz, const char* rows);

// Into AppendParams or MlaParams, which name the page-table fields alike (see resolve_row_target).
template <typename Params>
void set_page_table(Params& p, const PageTable& t) {
  p.batch_indices = t.batch_indices;
  p.positions = t.positions;
  p.kv_indices = t.kv_indices;
  p.kv_indptr = t.kv_indptr;
  p.batch_size = t.batch_size;
}

// The tensor's last dim has stride 1 (a size-1 last dim has any).
void check_last_dim_contiguous(const char* op, const TensorInfo& t, const char* name);

// Every given tensor on the device of `reference`, the argument named `reference_name`.
void check_devices(const char* op, const TensorInfo& reference, const char* reference_name, NamedTensors tensors);

// A global decode scale: a float, checked here (value set, null returned), or a one-element float32
// tensor on `reference`'s device, read by the kernel (its data returned). A CPU tensor with CUDA inputs
// is read here and checked as its float would be (refused during CUDA graph capture).
const float* check_scale(const char* op, const char* name, double scale, const std::optional<TensorInfo>& tensor,
                         const TensorInfo& reference, const char* reference_name, float& value);

StridedBytes strided_bytes(const TensorInfo& t);

// The bytes a tensor can touch (byte_range of its StridedBytes, without building them).
ByteRange read_range(const TensorInfo& t);

// What an op writes, for the overlap checks: `count` tensors' names and byte ranges, and their hull.
struct WrittenRanges {
  static constexpr size_t kMax = 6;
  std::array<const char*, kMax> names{};
  std::array<ByteRange, kMax> ranges{};
  size_t count = 0;
  ByteRange hull{UINTPTR_MAX, 0};  // from the lowest begin to the highest end

  void add(const char* name, const ByteRange& range);
};

// A tensor the op reads must not overlap what it writes.
void check_reads_disjoint(const char* op, const WrittenRanges& written, NamedTensors reads);

}  // namespace nvfp4kv
