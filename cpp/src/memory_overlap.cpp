#include "memory_overlap.h"

#include <algorithm>
#include <utility>

namespace nvfp4kv {

ByteRange byte_range(const StridedBytes& t) {
  uint64_t last = 0;  // offset of the last element, in elements
  for (int d = 0; d < t.dims; ++d) {
    if (t.sizes[d] == 0) return {t.address, t.address};
    last += uint64_t(t.sizes[d] - 1) * uint64_t(t.strides[d]);
  }
  return {t.address, t.address + uintptr_t((last + 1) * uint64_t(t.itemsize))};
}

bool touches_each_byte_once(const StridedBytes& t) {
  std::array<std::pair<int64_t, int64_t>, StridedBytes::kMaxDims> dims;  // (stride, size), size > 1
  int n = 0;
  for (int d = t.dims - 1; d >= 0; --d) {  // innermost first: a row-major tensor is already sorted
    if (t.sizes[d] == 0) return true;
    if (t.sizes[d] > 1) dims[n++] = {t.strides[d], t.sizes[d]};
  }
  for (int i = 1; i < n; ++i) {  // insertion sort of at most kMaxDims dims
    for (int j = i; j > 0 && dims[j] < dims[j - 1]; --j) std::swap(dims[j], dims[j - 1]);
  }
  uint64_t span = 1;  // elements spanned by the smaller dims
  for (int i = 0; i < n; ++i) {
    const auto [stride, size] = dims[i];
    if (uint64_t(stride) < span) return false;
    span += uint64_t(stride) * uint64_t(size - 1);
  }
  return true;
}

bool disjoint_same_geometry(const StridedBytes& first, const StridedBytes& second) {
  if (first.dims != second.dims || first.dims >= StridedBytes::kMaxDims || first.itemsize != second.itemsize) {
    return false;
  }
  for (int d = 0; d < first.dims; ++d) {
    if (first.sizes[d] != second.sizes[d]) return false;
    if (first.sizes[d] > 1 && first.strides[d] != second.strides[d]) return false;
  }
  const uintptr_t low = std::min(first.address, second.address);
  const uintptr_t delta = std::max(first.address, second.address) - low;
  if (delta == 0 || delta % uintptr_t(first.itemsize) != 0) return false;
  StridedBytes pair = first;
  pair.address = low;
  pair.sizes[pair.dims] = 2;
  pair.strides[pair.dims] = int64_t(delta / uintptr_t(first.itemsize));
  ++pair.dims;
  return touches_each_byte_once(pair);
}

bool disjoint_columns(const StridedBytes& first, const StridedBytes& second) {
  const int dims = first.dims;
  if (dims < 1 || second.dims != dims) return false;
  const StridedBytes& low = first.address <= second.address ? first : second;
  const StridedBytes& high = first.address <= second.address ? second : first;
  StridedBytes rows;  // in bytes
  rows.address = low.address;
  rows.dims = dims;
  for (int d = 0; d + 1 < dims; ++d) {
    if (low.sizes[d] != high.sizes[d]) return false;
    const int64_t stride = low.strides[d] * low.itemsize;
    if (low.sizes[d] > 1 && stride != high.strides[d] * high.itemsize) return false;
    rows.sizes[d] = low.sizes[d];
    rows.strides[d] = stride;
  }
  const int last = dims - 1;
  for (const StridedBytes* t : {&low, &high}) {
    if (t->sizes[last] > 1 && t->strides[last] != 1) return false;
  }
  const uint64_t delta = high.address - low.address;
  if (delta < uint64_t(low.sizes[last] * low.itemsize)) return false;
  rows.sizes[last] = int64_t(delta) + high.sizes[last] * high.itemsize;
  rows.strides[last] = 1;
  return touches_each_byte_once(rows);
}

}  // namespace nvfp4kv
