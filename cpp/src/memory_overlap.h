// Which bytes a strided tensor can touch, for the host checks that refuse aliasing between what an op
// writes and anything else it reads or writes (torch's own in-place ops refuse such overlap too).
// Sizes and strides are in elements; a dim of size 1 (or any dim of an empty tensor) touches nothing
// beyond its first element, whatever its stride. Fixed-size arrays: the checks run on every call.
#pragma once

#include <array>
#include <cstdint>

namespace nvfp4kv {

struct StridedBytes {
  static constexpr int kMaxDims = 6;
  uintptr_t address = 0;  // of element 0
  int dims = 0;
  std::array<int64_t, kMaxDims> sizes{};    // elements
  std::array<int64_t, kMaxDims> strides{};  // elements, >= 0
  int64_t itemsize = 1;                     // bytes per element
};

// [begin, end) covering every byte the tensor can touch; empty when it has no elements.
struct ByteRange {
  uintptr_t begin;
  uintptr_t end;
  bool overlaps(const ByteRange& other) const {
    return begin < end && other.begin < other.end && begin < other.end && other.begin < end;
  }
  // Bytes in both ranges' hulls, when they overlap.
  uint64_t overlap_bytes(const ByteRange& other) const {
    return (end < other.end ? end : other.end) - (begin > other.begin ? begin : other.begin);
  }
};

ByteRange byte_range(const StridedBytes& t);

// True when no two elements can share a byte (a sufficient test: with the dims of size > 1 sorted by
// stride, each stride reaches past everything the smaller dims span). False for stride-0 (expanded)
// dims of size > 1 and for views whose elements interleave.
bool touches_each_byte_once(const StridedBytes& t);

// Two tensors of equal sizes, strides and element size, element 0 of one `delta` bytes after the
// other's, form one tensor with an extra dim of size 2 and stride delta. True when that tensor
// touches each byte once (e.g. the two halves of a stacked cache, or two halves of one pool).
bool disjoint_same_geometry(const StridedBytes& first, const StridedBytes& second);

// Two tensors with the same outer geometry (rank, and the sizes and byte strides of every dim but the
// last) and contiguous last dims: true when each lies in its own column range of one combined tensor
// (the same outer dims, rows from the lower one's first byte to the higher one's last) that touches
// each byte once, e.g. the data, scale and kpe slices of one [pages, page_size, bytes] pool.
bool disjoint_columns(const StridedBytes& first, const StridedBytes& second);

}  // namespace nvfp4kv
