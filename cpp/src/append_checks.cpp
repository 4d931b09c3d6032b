#include "append_checks.h"

#include <array>
#include <vector>

namespace nvfp4kv {
namespace {

constexpr const char* kOp = "append_paged_kv_cache";

void check_rows(const Tensor& t, const char* name) {
  if (t.stride(2) != 1) {
    fail(kOp, name, " must be contiguous in its last dim (stride 1), got stride ", t.stride(2));
  }
}

IndexView check_index(const Tensor& t, const char* name) {
  if (!is_index_dtype(t.scalar_type())) {
    fail(kOp, name, " must have dtype int32 or int64, got ", dtype_name(t.scalar_type()));
  }
  if (t.dim() != 1) fail(kOp, name, " must be a 1-D tensor, got shape ", shape_string(t));
  return IndexView{t.data_ptr(), t.stride(0), t.size(0), t.scalar_type() == ScalarType::Long};
}

// One 4-D cache tensor as the user named it ("paged_kv_cache[0]", or "paged_kv_cache" when it is a
// half of the stacked tensor): K is element 0 of dim 1, V element 1, with dim 1 dropped.
struct CacheTensor {
  std::string name;
  uint8_t* data;
  std::array<int64_t, 4> sizes;
  std::array<int64_t, 4> strides;
};

std::string sizes_string(const std::array<int64_t, 4>& sizes) {
  std::ostringstream out;
  out << '[' << sizes[0] << ", " << sizes[1] << ", " << sizes[2] << ", " << sizes[3] << ']';
  return out.str();
}

CacheTensor four_d(const Tensor& t, const std::string& name) {
  return CacheTensor{name, static_cast<uint8_t*>(t.data_ptr()), {t.size(0), t.size(1), t.size(2), t.size(3)},
                     {t.stride(0), t.stride(1), t.stride(2), t.stride(3)}};
}

// Splits a tuple or stacked cache argument into its K and V 4-D tensors, checking dtype and rank.
std::array<CacheTensor, 2> split_cache(const Tensor& first, const std::optional<Tensor>& second,
                                       const char* name, ScalarType dtype) {
  const std::string base = name;
  const bool stacked = !second.has_value();
  const std::array<const Tensor*, 2> parts{&first, stacked ? &first : &*second};
  for (int i = 0; i < (stacked ? 1 : 2); ++i) {
    const std::string part = stacked ? base : base + "[" + std::to_string(i) + "]";
    if (parts[i]->scalar_type() != dtype) {
      fail(kOp, part, " must have dtype ", dtype_name(dtype), ", got ", dtype_name(parts[i]->scalar_type()));
    }
    if (stacked && (first.dim() != 5 || first.size(1) != 2)) {
      fail(kOp, part, " as one tensor must be 5-D with K/V on dim 1 ([max_num_pages, 2, ...]), got shape ",
           shape_string(first));
    }
    if (!stacked && parts[i]->dim() != 4) {
      fail(kOp, part, " must be a 4-D tensor, got shape ", shape_string(*parts[i]));
    }
  }
  if (!stacked) return {four_d(first, base + "[0]"), four_d(*second, base + "[1]")};
  CacheTensor k{base, static_cast<uint8_t*>(first.data_ptr()),
                {first.size(0), first.size(2), first.size(3), first.size(4)},
                {first.stride(0), first.stride(2), first.stride(3), first.stride(4)}};
  CacheTensor v = k;
  v.data += first.stride(1);
  return {k, v};
}

// Checks one 4-D cache tensor against [pages, page_size, heads, width] (NHD) or
// [pages, heads, page_size, width] (HND). `reference` (the K data cache) fixes pages and page_size
// once it has been checked itself.
CacheView check_cache(const CacheTensor& t, ScalarType dtype, bool nhd, int64_t num_heads, int64_t width,
                      const CacheTensor* reference) {
  const char* name = t.name.c_str();
  const int entry_dim = nhd ? 1 : 2;
  const int head_dim = nhd ? 2 : 1;
  std::array<int64_t, 4> expected{-1, -1, -1, width};
  if (reference) {
    expected[0] = reference->sizes[0];
    expected[entry_dim] = reference->sizes[entry_dim];
  }
  expected[head_dim] = num_heads;
  bool matches = true;
  for (int d = 0; d < 4; ++d) matches = matches && (expected[d] < 0 || t.sizes[d] == expected[d]);
  if (!matches) {
    std::ostringstream want;
    want << '[';
    for (int d = 0; d < 4; ++d) {
      want << (d ? ", " : "");
      if (expected[d] < 0) want << '*'; else want << expected[d];
    }
    want << ']';
    fail(kOp, name, " must have shape ",
         nhd ? "[max_num_pages, page_size, num_kv_heads, " : "[max_num_pages, num_kv_heads, page_size, ",
         dtype == ScalarType::Byte ? "head_dim/2]" : "head_dim/16]", " = ", want.str(), " for kv_layout ",
         nhd ? "NHD" : "HND", ", got ", sizes_string(t.sizes));
  }
  if (t.strides[3] != 1) {
    fail(kOp, name, " must be contiguous in its last dim (stride 1), got stride ", t.strides[3]);
  }
  if (t.sizes[entry_dim] < 1) {
    fail(kOp, name, " must have page_size >= 1, got shape ", sizes_string(t.sizes));
  }
  return CacheView{t.data, t.strides[0], t.strides[entry_dim], t.strides[head_dim]};
}

}  // namespace

AppendParams check_append_arguments(const Tensor& append_key, const Tensor& append_value,
                                    const Tensor& batch_indices, const Tensor& positions,
                                    const Tensor& k_cache, const std::optional<Tensor>& v_cache,
                                    const Tensor& k_cache_sf, const std::optional<Tensor>& v_cache_sf,
                                    const Tensor& kv_indices, const Tensor& kv_indptr,
                                    const Tensor& kv_last_page_len, double k_scale, double v_scale,
                                    const std::string& kv_layout) {
  if (kv_layout != "NHD" && kv_layout != "HND") {
    fail(kOp, "kv_layout must be \"NHD\" or \"HND\", got \"", kv_layout, "\"");
  }
  const bool nhd = kv_layout == "NHD";

  // append_key / append_value: [nnz, num_kv_heads, head_dim], fp16 or bf16.
  if (append_key.dim() != 3) {
    fail(kOp, "append_key must be a 3-D tensor [nnz, num_kv_heads, head_dim], got shape ", shape_string(append_key));
  }
  const ScalarType dtype = append_key.scalar_type();
  if (dtype != ScalarType::Half && dtype != ScalarType::BFloat16) {
    fail(kOp, "append_key must have dtype float16 or bfloat16, got ", dtype_name(dtype));
  }
  const int64_t nnz = append_key.size(0);
  const int64_t num_heads = append_key.size(1);
  const int64_t head_dim = append_key.size(2);
  if (head_dim <= 0 || head_dim % 16 != 0) {
    fail(kOp, "append_key head_dim (last dim) must be a positive multiple of 16, got ", head_dim);
  }
  check_rows(append_key, "append_key");
  if (append_value.dim() != 3 || append_value.size(0) != nnz || append_value.size(1) != num_heads ||
      append_value.size(2) != head_dim) {
    fail(kOp, "append_value must have the same shape as append_key ", shape_string(append_key), ", got ",
         shape_string(append_value));
  }
  if (append_value.scalar_type() != dtype) {
    fail(kOp, "append_value must have the same dtype as append_key (", dtype_name(dtype), "), got ",
         dtype_name(append_value.scalar_type()));
  }
  check_rows(append_value, "append_value");

  // Every tensor on append_key's device.
  const std::vector<std::pair<const Tensor*, const char*>> others{
      {&append_value, "append_value"}, {&batch_indices, "batch_indices"}, {&positions, "positions"},
      {&k_cache, "paged_kv_cache"},    {&k_cache_sf, "kv_cache_sf"},      {&kv_indices, "kv_indices"},
      {&kv_indptr, "kv_indptr"},       {&kv_last_page_len, "kv_last_page_len"}};
  for (const auto& [tensor, name] : others) {
    if (!same_device(*tensor, append_key)) {
      fail(kOp, name, " must be on the same device as append_key (", device_string(append_key), "), got ",
           device_string(*tensor));
    }
  }
  if (v_cache && !same_device(*v_cache, append_key)) {
    fail(kOp, "paged_kv_cache[1] must be on the same device as append_key (", device_string(append_key),
         "), got ", device_string(*v_cache));
  }
  if (v_cache_sf && !same_device(*v_cache_sf, append_key)) {
    fail(kOp, "kv_cache_sf[1] must be on the same device as append_key (", device_string(append_key),
         "), got ", device_string(*v_cache_sf));
  }

  // Index tensors: 1-D int32/int64, used as given.
  AppendParams p{};
  p.batch_indices = check_index(batch_indices, "batch_indices");
  p.positions = check_index(positions, "positions");
  p.kv_indices = check_index(kv_indices, "kv_indices");
  p.kv_indptr = check_index(kv_indptr, "kv_indptr");
  check_index(kv_last_page_len, "kv_last_page_len");
  if (batch_indices.size(0) != nnz) {
    fail(kOp, "batch_indices must have nnz = ", nnz, " entries (append_key.shape[0]), got ", batch_indices.size(0));
  }
  if (positions.size(0) != nnz) {
    fail(kOp, "positions must have nnz = ", nnz, " entries (append_key.shape[0]), got ", positions.size(0));
  }
  const int64_t batch_size = kv_last_page_len.size(0);
  if (kv_indptr.size(0) != batch_size + 1) {
    fail(kOp, "kv_indptr must have batch_size + 1 = ", batch_size + 1,
         " entries (batch_size = kv_last_page_len.shape[0]), got ", kv_indptr.size(0));
  }

  // Caches: tuple (K, V) or one stacked 5-D tensor; data uint8 [.., head_dim/2], scales e4m3 [.., head_dim/16].
  const auto data = split_cache(k_cache, v_cache, "paged_kv_cache", ScalarType::Byte);
  const auto scales = split_cache(k_cache_sf, v_cache_sf, "kv_cache_sf", ScalarType::Float8_e4m3fn);
  p.k_data = check_cache(data[0], ScalarType::Byte, nhd, num_heads, head_dim / 2, nullptr);
  const CacheTensor& reference = data[0];
  p.v_data = check_cache(data[1], ScalarType::Byte, nhd, num_heads, head_dim / 2, &reference);
  p.k_scales = check_cache(scales[0], ScalarType::Float8_e4m3fn, nhd, num_heads, head_dim / 16, &reference);
  p.v_scales = check_cache(scales[1], ScalarType::Float8_e4m3fn, nhd, num_heads, head_dim / 16, &reference);

  p.k_scale = checked_global_scale(kOp, "k_scale", k_scale);
  p.v_scale = checked_global_scale(kOp, "v_scale", v_scale);

  p.key = RowsView{static_cast<const uint16_t*>(append_key.data_ptr()), append_key.stride(0), append_key.stride(1)};
  p.value = RowsView{static_cast<const uint16_t*>(append_value.data_ptr()), append_value.stride(0),
                     append_value.stride(1)};
  p.input_is_bf16 = dtype == ScalarType::BFloat16;
  p.nnz = nnz;
  p.num_heads = num_heads;
  p.head_dim = head_dim;
  p.page_size = reference.sizes[nhd ? 1 : 2];
  p.num_pages = reference.sizes[0];
  p.batch_size = batch_size;
  return p;
}

}  // namespace nvfp4kv
