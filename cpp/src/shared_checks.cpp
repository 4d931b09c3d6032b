#include "shared_checks.h"

#include <algorithm>

#ifdef NVFP4KV_WITH_CUDA
#include "cuda/current_stream.h"
#endif

namespace nvfp4kv {

IndexView check_index(const char* op, const TensorInfo& t, const char* name) {
  if (!is_index_dtype(t.scalar_type())) {
    fail(op, name, " must have dtype int32 or int64, got ", dtype_name(t.scalar_type()));
  }
  if (t.dim() != 1) fail(op, name, " must be a 1-D tensor, got shape ", t.shape_string());
  return IndexView{t.data_ptr(), t.stride(0), t.size(0), t.scalar_type() == ScalarType::Long};
}

PageTable check_page_table(const char* op, const TensorInfo& batch_indices, const TensorInfo& positions,
                           const TensorInfo& kv_indices, const TensorInfo& kv_indptr,
                           const TensorInfo& kv_last_page_len, int64_t nnz, const char* rows) {
  PageTable t{check_index(op, batch_indices, "batch_indices"), check_index(op, positions, "positions"),
              check_index(op, kv_indices, "kv_indices"), check_index(op, kv_indptr, "kv_indptr"), 0};
  check_index(op, kv_last_page_len, "kv_last_page_len");
  if (batch_indices.size(0) != nnz) {
    fail(op, "batch_indices must have nnz = ", nnz, " entries (", rows, ".shape[0]), got ", batch_indices.size(0));
  }
  if (positions.size(0) != nnz) {
    fail(op, "positions must have nnz = ", nnz, " entries (", rows, ".shape[0]), got ", positions.size(0));
  }
  t.batch_size = kv_last_page_len.size(0);
  if (kv_indptr.size(0) != t.batch_size + 1) {
    fail(op, "kv_indptr must have batch_size + 1 = ", t.batch_size + 1,
         " entries (batch_size = kv_last_page_len.shape[0]), got ", kv_indptr.size(0));
  }
  return t;
}

void check_last_dim_contiguous(const char* op, const TensorInfo& t, const char* name) {
  if (t.stride(t.dim() - 1) > 1) {
    fail(op, name, " must be contiguous in its last dim (stride 1), got stride ", t.stride(t.dim() - 1));
  }
}

void check_devices(const char* op, const TensorInfo& reference, const char* reference_name, NamedTensors tensors) {
  for (const auto& [tensor, name] : tensors) {
    if (tensor != nullptr && !tensor->same_device(reference)) {
      fail(op, name, " must be on the same device as ", reference_name, " (", reference.device_string(), "), got ",
           tensor->device_string());
    }
  }
}

namespace {

// Whether the CUDA stream `reference` would be appended on is capturing a graph: a scale read on the host
// then would stay fixed in the graph. A build without CUDA kernels never runs an op on a CUDA tensor.
bool capturing(const TensorInfo& reference) {
#ifdef NVFP4KV_WITH_CUDA
  return current_cuda_stream_is_capturing(reference.device_index());
#else
  (void)reference;
  return false;
#endif
}

}  // namespace

const float* check_scale(const char* op, const char* name, double scale, const std::optional<TensorInfo>& tensor,
                         const TensorInfo& reference, const char* reference_name, float& value) {
  value = 1.0f;
  if (!tensor) {
    value = checked_global_scale(op, name, scale);
    return nullptr;
  }
  const bool host_read = tensor->is_cpu() && !reference.is_cpu();
  if (tensor->scalar_type() != ScalarType::Float || tensor->numel() != 1 ||
      !(host_read || tensor->same_device(reference))) {
    fail(op, name, " as a tensor must be a one-element float32 tensor on ", reference_name, "'s device (",
         reference.device_string(), reference.is_cpu() ? ")" : ") or the CPU", ", got dtype ",
         dtype_name(tensor->scalar_type()), ", shape ", tensor->shape_string(), ", device ", tensor->device_string());
  }
  if (!host_read) return static_cast<const float*>(tensor->data_ptr());
  if (capturing(reference)) {
    fail(op, name, " as a CPU tensor cannot be read during CUDA graph capture (the graph would keep the value read ",
         "now): pass a float or a one-element float32 tensor on ", reference_name, "'s device (",
         reference.device_string(), "), got a CPU tensor");
  }
  value = checked_global_scale(op, name, *static_cast<const float*>(tensor->data_ptr()));
  return nullptr;
}

StridedBytes strided_bytes(const TensorInfo& t) {
  StridedBytes b;
  b.address = reinterpret_cast<uintptr_t>(t.data_ptr());
  b.dims = int(t.dim());
  for (int d = 0; d < b.dims; ++d) {
    b.sizes[d] = t.size(d);
    b.strides[d] = t.stride(d);
  }
  b.itemsize = element_size(t.scalar_type());
  return b;
}

ByteRange read_range(const TensorInfo& t) {
  const uintptr_t begin = reinterpret_cast<uintptr_t>(t.data_ptr());
  uint64_t last = 0;  // offset of the last element, in elements
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) == 0) return {begin, begin};
    last += uint64_t(t.size(d) - 1) * uint64_t(t.stride(d));
  }
  return {begin, begin + uintptr_t((last + 1) * uint64_t(element_size(t.scalar_type())))};
}

void WrittenRanges::add(const char* name, const ByteRange& range) {
  names[count] = name;
  ranges[count] = range;
  ++count;
  if (range.begin < range.end) hull = {std::min(hull.begin, range.begin), std::max(hull.end, range.end)};
}

void check_reads_disjoint(const char* op, const WrittenRanges& written, NamedTensors reads) {
  for (const auto& [tensor, name] : reads) {
    if (tensor == nullptr) continue;
    const ByteRange read = read_range(*tensor);
    if (!read.overlaps(written.hull)) continue;  // the usual case, decided in one comparison
    for (size_t i = 0; i < written.count; ++i) {
      if (read.overlaps(written.ranges[i])) {
        fail(op, name, " must not overlap ", written.names[i], " in memory (the op writes there), got ",
             read.overlap_bytes(written.ranges[i]), " overlapping bytes");
      }
    }
  }
}

}  // namespace nvfp4kv
