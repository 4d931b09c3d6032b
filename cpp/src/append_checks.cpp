#include "append_checks.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <initializer_list>
#include <utility>

#include "memory_overlap.h"
#include "shared_checks.h"

namespace nvfp4kv {
namespace {

// One 4-D cache tensor as the user named it ("paged_kv_cache[0]", or "paged_kv_cache" when it is a
// half of the stacked tensor): K is element 0 of dim 1, V element 1, with dim 1 dropped.
struct CacheTensor {
  const char* name;
  uint8_t* data;
  std::array<int64_t, 4> sizes;
  std::array<int64_t, 4> strides;
};

std::string sizes_string(const std::array<int64_t, 4>& sizes) {
  std::ostringstream out;
  out << '[' << sizes[0] << ", " << sizes[1] << ", " << sizes[2] << ", " << sizes[3] << ']';
  return out.str();
}

CacheTensor four_d(const TensorInfo& t, const char* name) {
  return CacheTensor{name,
                     static_cast<uint8_t*>(t.data_ptr()),
                     {t.size(0), t.size(1), t.size(2), t.size(3)},
                     {t.stride(0), t.stride(1), t.stride(2), t.stride(3)}};
}

// A cache argument's name as the user gave it: the stacked tensor, or the (K, V) tuple's elements.
struct CacheName {
  const char* whole;
  std::array<const char*, 2> parts;
};
constexpr CacheName kDataCacheName{"paged_kv_cache", {"paged_kv_cache[0]", "paged_kv_cache[1]"}};
constexpr CacheName kScaleCacheName{"kv_cache_sf", {"kv_cache_sf[0]", "kv_cache_sf[1]"}};

// Splits a tuple or stacked cache argument into its K and V 4-D tensors, checking dtype and rank.
std::array<CacheTensor, 2> split_cache(const char* op, const TensorInfo& first, const std::optional<TensorInfo>& second,
                                       const CacheName& name, ScalarType dtype) {
  const bool stacked = !second.has_value();
  const std::array<const TensorInfo*, 2> parts{&first, stacked ? &first : &*second};
  for (int i = 0; i < (stacked ? 1 : 2); ++i) {
    const char* part = stacked ? name.whole : name.parts[i];
    if (parts[i]->scalar_type() != dtype) {
      fail(op, part, " must have dtype ", dtype_name(dtype), ", got ", dtype_name(parts[i]->scalar_type()));
    }
    if (stacked && (first.dim() != 5 || first.size(1) != 2)) {
      fail(op, part, " as one tensor must be 5-D with K/V on dim 1 ([max_num_pages, 2, ...]), got shape ",
           first.shape_string());
    }
    if (!stacked && parts[i]->dim() != 4) {
      fail(op, part, " must be a 4-D tensor, got shape ", parts[i]->shape_string());
    }
  }
  if (!stacked) return {four_d(first, name.parts[0]), four_d(*second, name.parts[1])};
  CacheTensor k{name.whole,
                static_cast<uint8_t*>(first.data_ptr()),
                {first.size(0), first.size(2), first.size(3), first.size(4)},
                {first.stride(0), first.stride(2), first.stride(3), first.stride(4)}};
  CacheTensor v = k;
  v.data += first.stride(1);
  return {k, v};
}

// Checks one 4-D cache tensor against [pages, page_size, heads, width] (NHD) or
// [pages, heads, page_size, width] (HND). `reference` (the K data cache) fixes pages and page_size
// once it has been checked itself.
CacheView check_cache(const char* op, const CacheTensor& t, ScalarType dtype, bool nhd, int64_t num_heads,
                      int64_t width, const CacheTensor* reference) {
  const char* name = t.name;
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
      if (expected[d] < 0) want << '*';
      else want << expected[d];
    }
    want << ']';
    fail(op, name, " must have shape ",
         nhd ? "[max_num_pages, page_size, num_kv_heads, " : "[max_num_pages, num_kv_heads, page_size, ",
         dtype == ScalarType::Byte ? "head_dim/2]" : "head_dim/16]", " = ", want.str(), " for kv_layout ",
         nhd ? "NHD" : "HND", ", got ", sizes_string(t.sizes));
  }
  if (t.sizes[3] != 1 && t.strides[3] != 1) {
    fail(op, name, " must be contiguous in its last dim (stride 1), got stride ", t.strides[3]);
  }
  if (t.sizes[entry_dim] < 1) {
    fail(op, name, " must have page_size >= 1, got shape ", sizes_string(t.sizes));
  }
  return CacheView{t.data, t.strides[0], t.strides[entry_dim], t.strides[head_dim]};
}

// The format strings, in argument order. Returns whether the layout is NHD.
bool check_format(const char* op, const OptionArguments& format, AppendParams& p) {
  if (format.kv_layout != "NHD" && format.kv_layout != "HND") {
    fail(op, "kv_layout must be \"NHD\" or \"HND\", got \"", format.kv_layout, "\"");
  }
  if (format.v_sf_layout != "linear" && format.v_sf_layout != "trtllm") {
    fail(op, "v_sf_layout must be \"linear\" or \"trtllm\", got \"", format.v_sf_layout, "\"");
  }
  if (format.scale_search != "none" && format.scale_search != "4over6") {
    fail(op, "scale_search must be \"none\" or \"4over6\", got \"", format.scale_search, "\"");
  }
  p.v_scales_trtllm = format.v_sf_layout == "trtllm";
  p.four_over_six = format.scale_search == "4over6";
  return format.kv_layout == "NHD";
}

// append_key / append_value: [nnz, num_kv_heads, head_dim], fp16 or bf16.
void check_rows_pair(const char* op, const TensorInfo& append_key, const TensorInfo& append_value, const RowNames& n,
                     AppendParams& p) {
  if (append_key.dim() != 3) {
    fail(op, n.key, " must be a 3-D tensor [nnz, num_kv_heads, head_dim], got shape ", append_key.shape_string());
  }
  const ScalarType dtype = append_key.scalar_type();
  if (dtype != ScalarType::Half && dtype != ScalarType::BFloat16) {
    fail(op, n.key, " must have dtype float16 or bfloat16, got ", dtype_name(dtype));
  }
  const int64_t nnz = append_key.size(0);
  const int64_t num_heads = append_key.size(1);
  const int64_t head_dim = append_key.size(2);
  if (head_dim <= 0 || head_dim % 16 != 0) {
    fail(op, n.key, " head_dim (last dim) must be a positive multiple of 16, got ", head_dim);
  }
  check_last_dim_contiguous(op, append_key, n.key);
  if (append_value.dim() != 3 || append_value.size(0) != nnz || append_value.size(1) != num_heads ||
      append_value.size(2) != head_dim) {
    fail(op, n.value, " must have the same shape as ", n.key, " ", append_key.shape_string(), ", got ",
         append_value.shape_string());
  }
  if (append_value.scalar_type() != dtype) {
    fail(op, n.value, " must have the same dtype as ", n.key, " (", dtype_name(dtype), "), got ",
         dtype_name(append_value.scalar_type()));
  }
  check_last_dim_contiguous(op, append_value, n.value);
  p.key = RowsView{static_cast<const uint16_t*>(append_key.data_ptr()), append_key.stride(0), append_key.stride(1)};
  p.value =
      RowsView{static_cast<const uint16_t*>(append_value.data_ptr()), append_value.stride(0), append_value.stride(1)};
  p.input_is_bf16 = dtype == ScalarType::BFloat16;
  p.nnz = nnz;
  p.num_heads = num_heads;
  p.head_dim = head_dim;
}

// What trtllm-gen attention kernels assume of a cache whose V scales are in the "trtllm" layout:
// 4-token groups (page_size % 4 == 0), 4-block groups (head_dim % 64 == 0), V-scale strides equal to
// the K-scale strides, whole (page, head) tiles contiguous in HND, 16-byte aligned page (and HND head)
// strides.
void check_trtllm_scales(const char* op, const std::array<CacheTensor, 2>& scales, bool nhd, const AppendParams& p) {
  if (p.page_size % 4 != 0) fail(op, "v_sf_layout \"trtllm\" needs page_size % 4 == 0, got page_size ", p.page_size);
  if (p.head_dim % 64 != 0) fail(op, "v_sf_layout \"trtllm\" needs head_dim % 64 == 0, got head_dim ", p.head_dim);
  const CacheTensor& k = scales[0];
  const CacheTensor& v = scales[1];
  if (k.strides != v.strides) {
    fail(op, v.name, " must have the same strides as the K scales for v_sf_layout \"trtllm\", got ",
         sizes_string(v.strides), " and ", sizes_string(k.strides));
  }
  const int64_t blocks = p.head_dim / 16;
  const int64_t entry_stride = v.strides[nhd ? 1 : 2];
  const int64_t head_stride = v.strides[nhd ? 2 : 1];
  if (!nhd && entry_stride != blocks) {
    fail(op, v.name, " must have contiguous [page_size, head_dim/16] tiles (entry stride ", blocks,
         ") for v_sf_layout \"trtllm\" and kv_layout HND, got entry stride ", entry_stride);
  }
  if (v.strides[0] % 16 != 0 || (!nhd && head_stride % 16 != 0)) {
    fail(op, v.name, " must have page", nhd ? "" : " and head", " strides that are multiples of 16 bytes for ",
         "v_sf_layout \"trtllm\", got strides ", sizes_string(v.strides));
  }
}

StridedBytes strided_bytes(const CacheTensor& t) {
  StridedBytes b;
  b.address = reinterpret_cast<uintptr_t>(t.data);
  b.dims = 4;
  for (int d = 0; d < 4; ++d) {
    b.sizes[d] = t.sizes[d];
    b.strides[d] = t.strides[d];
  }
  return b;
}

// The four tensors an append writes (K data, V data, K scales, V scales), with the bytes each can touch,
// worked out once for both overlap checks.
struct WrittenCaches {
  std::array<CacheTensor, 4> tensors;
  std::array<StridedBytes, 4> bytes;
  WrittenRanges ranges;
};

WrittenCaches written_caches(const std::array<CacheTensor, 2>& data, const std::array<CacheTensor, 2>& scales) {
  WrittenCaches w{{data[0], data[1], scales[0], scales[1]}, {}, {}};
  for (size_t i = 0; i < w.tensors.size(); ++i) {
    w.bytes[i] = strided_bytes(w.tensors[i]);
    w.ranges.add(w.tensors[i].name, byte_range(w.bytes[i]));
  }
  return w;
}

// Written tensors must not overlap themselves or each other: overlapping writes lose rows (K == V
// keeps only the V half of every row). K and V of one kind may share a storage when they are two
// disjoint halves of one geometry (a stacked cache's halves, two halves of one pool); any other
// overlapping byte ranges are refused.
void check_written_disjoint(const char* op, const WrittenCaches& w, bool stacked) {
  for (size_t i = 0; i < w.tensors.size(); ++i) {
    if (!touches_each_byte_once(w.bytes[i])) {
      const CacheTensor& t = w.tensors[i];
      fail(op, t.name, " must not overlap itself (no stride-0 or expanded dims), got shape ", sizes_string(t.sizes),
           " and strides ", sizes_string(t.strides));
    }
  }
  for (int k = 0; k < 4; k += 2) {
    const int v = k + 1;
    if (w.ranges.ranges[k].overlaps(w.ranges.ranges[v]) && !disjoint_same_geometry(w.bytes[k], w.bytes[v])) {
      if (stacked) {
        fail(op, w.tensors[k].name, " must hold K and V in separate memory (dim 1 must not be expanded), got a dim-1 ",
             "stride of ", w.bytes[v].address - w.bytes[k].address, " bytes");
      }
      fail(op, w.tensors[v].name, " must not overlap ", w.tensors[k].name, " in memory, got ",
           w.ranges.ranges[k].overlap_bytes(w.ranges.ranges[v]), " overlapping bytes");
    }
  }
  for (int data = 0; data < 2; ++data) {
    for (int scales = 2; scales < 4; ++scales) {
      if (w.ranges.ranges[data].overlaps(w.ranges.ranges[scales])) {
        fail(op, w.tensors[scales].name, " must not overlap ", w.tensors[data].name, " in memory, got ",
             w.ranges.ranges[data].overlap_bytes(w.ranges.ranges[scales]), " overlapping bytes");
      }
    }
  }
}

// Caches: tuple (K, V) or one stacked 5-D tensor; data uint8 [.., head_dim/2], scales e4m3 [.., head_dim/16].
WrittenCaches check_caches(const char* op, const CacheArguments& caches, bool nhd, AppendParams& p) {
  const auto data = split_cache(op, caches.k_cache, caches.v_cache, kDataCacheName, ScalarType::Byte);
  const auto scales = split_cache(op, caches.k_cache_sf, caches.v_cache_sf, kScaleCacheName, ScalarType::Float8_e4m3fn);
  p.k_data = check_cache(op, data[0], ScalarType::Byte, nhd, p.num_heads, p.head_dim / 2, nullptr);
  const CacheTensor& reference = data[0];
  p.v_data = check_cache(op, data[1], ScalarType::Byte, nhd, p.num_heads, p.head_dim / 2, &reference);
  p.k_scales = check_cache(op, scales[0], ScalarType::Float8_e4m3fn, nhd, p.num_heads, p.head_dim / 16, &reference);
  p.v_scales = check_cache(op, scales[1], ScalarType::Float8_e4m3fn, nhd, p.num_heads, p.head_dim / 16, &reference);
  p.page_size = reference.sizes[nhd ? 1 : 2];
  p.num_pages = reference.sizes[0];
  if (p.v_scales_trtllm) check_trtllm_scales(op, scales, nhd, p);
  const WrittenCaches written = written_caches(data, scales);
  check_written_disjoint(op, written, !caches.v_cache.has_value());
  return written;
}

void check_scales(const char* op, const OptionArguments& scales, const TensorInfo& append_key, const char* key_name,
                  AppendParams& p) {
  p.k_scale_device = check_scale(op, "k_scale", scales.k_scale, scales.k_scale_tensor, append_key, key_name, p.k_scale);
  p.v_scale_device = check_scale(op, "v_scale", scales.v_scale, scales.v_scale_tensor, append_key, key_name, p.v_scale);
}

// The arguments both ops share, read in schema order (braced lists evaluate left to right).
CacheArguments read_caches(BoxedArguments& boxed) {
  return {boxed.tensor(), boxed.optional_tensor(), boxed.tensor(), boxed.optional_tensor()};
}

OptionArguments read_options(BoxedArguments& boxed) {
  return {boxed.real(),   boxed.real(),  boxed.string(), boxed.optional_tensor(), boxed.optional_tensor(),
          boxed.string(), boxed.string()};
}

// The rows an op places: the first `index.shape[0]` of its `rows` K/V rows.
int64_t placed_rows(const char* op, const TensorInfo& index, const char* name, int64_t rows, const char* key_name) {
  if (index.size(0) > rows) {
    fail(op, name, " must have at most ", key_name, ".shape[0] = ", rows, " entries, got ", index.size(0));
  }
  return index.size(0);
}

}  // namespace

AppendArguments read_append_fields(BoxedArguments& boxed) {
  return {boxed.tensor(), boxed.tensor(), boxed.tensor(), boxed.tensor(),     read_caches(boxed),
          boxed.tensor(), boxed.tensor(), boxed.tensor(), read_options(boxed)};
}

AppendWithSlotMappingArguments read_append_with_slot_mapping_fields(BoxedArguments& boxed) {
  return {boxed.tensor(), boxed.tensor(), boxed.tensor(), read_caches(boxed), read_options(boxed)};
}

AppendArguments read_append_arguments(BoxedArguments& boxed) {
  AppendArguments args = read_append_fields(boxed);
  boxed.finish("append_paged_kv_cache", 0);
  return args;
}

AppendWithSlotMappingArguments read_append_with_slot_mapping_arguments(BoxedArguments& boxed) {
  AppendWithSlotMappingArguments args = read_append_with_slot_mapping_fields(boxed);
  boxed.finish("append_paged_kv_cache_with_slot_mapping", 0);
  return args;
}

CheckedAppend check_append_arguments(const char* op, const AppendArguments& args, const RowNames& names,
                                     bool fewer_placed_rows) {
  CheckedAppend checked{};
  AppendParams& p = checked.params;
  const bool nhd = check_format(op, args.options, p);
  check_rows_pair(op, args.append_key, args.append_value, names, p);
  check_devices(op, args.append_key, names.key,
                {{&args.append_value, names.value},
                 {&args.batch_indices, "batch_indices"},
                 {&args.positions, "positions"},
                 {&args.caches.k_cache, "paged_kv_cache"},
                 {&args.caches.k_cache_sf, "kv_cache_sf"},
                 {&args.kv_indices, "kv_indices"},
                 {&args.kv_indptr, "kv_indptr"},
                 {&args.kv_last_page_len, "kv_last_page_len"},
                 {args.caches.v_cache ? &*args.caches.v_cache : nullptr, "paged_kv_cache[1]"},
                 {args.caches.v_cache_sf ? &*args.caches.v_cache_sf : nullptr, "kv_cache_sf[1]"}});
  if (fewer_placed_rows) p.nnz = placed_rows(op, args.batch_indices, "batch_indices", p.nnz, names.key);

  // Index tensors: 1-D int32/int64, used as given.
  set_page_table(p, check_page_table(op, args.batch_indices, args.positions, args.kv_indices, args.kv_indptr,
                                     args.kv_last_page_len, p.nnz, fewer_placed_rows ? "batch_indices" : names.key));

  const WrittenCaches written = check_caches(op, args.caches, nhd, p);
  checked.written = written.ranges;
  check_scales(op, args.options, args.append_key, names.key, p);
  check_reads_disjoint(op, written.ranges,
                       {{&args.append_key, names.key},
                        {&args.append_value, names.value},
                        {&args.batch_indices, "batch_indices"},
                        {&args.positions, "positions"},
                        {&args.kv_indices, "kv_indices"},
                        {&args.kv_indptr, "kv_indptr"},
                        {&args.kv_last_page_len, "kv_last_page_len"},
                        {args.options.k_scale_tensor ? &*args.options.k_scale_tensor : nullptr, "k_scale"},
                        {args.options.v_scale_tensor ? &*args.options.v_scale_tensor : nullptr, "v_scale"}});
  return checked;
}

CheckedAppend check_append_with_slot_mapping_arguments(const char* op, const AppendWithSlotMappingArguments& args,
                                                       const RowNames& names) {
  CheckedAppend checked{};
  AppendParams& p = checked.params;
  const bool nhd = check_format(op, args.options, p);
  check_rows_pair(op, args.append_key, args.append_value, names, p);
  check_devices(op, args.append_key, names.key,
                {{&args.append_value, names.value},
                 {&args.slot_mapping, "slot_mapping"},
                 {&args.caches.k_cache, "paged_kv_cache"},
                 {&args.caches.k_cache_sf, "kv_cache_sf"},
                 {args.caches.v_cache ? &*args.caches.v_cache : nullptr, "paged_kv_cache[1]"},
                 {args.caches.v_cache_sf ? &*args.caches.v_cache_sf : nullptr, "kv_cache_sf[1]"}});
  p.slot_mapping = check_index(op, args.slot_mapping, "slot_mapping");
  p.nnz = placed_rows(op, args.slot_mapping, "slot_mapping", p.nnz, names.key);  // only the first rows are appended
  const WrittenCaches written = check_caches(op, args.caches, nhd, p);
  checked.written = written.ranges;
  check_scales(op, args.options, args.append_key, names.key, p);
  check_reads_disjoint(op, written.ranges,
                       {{&args.append_key, names.key},
                        {&args.append_value, names.value},
                        {&args.slot_mapping, "slot_mapping"},
                        {args.options.k_scale_tensor ? &*args.options.k_scale_tensor : nullptr, "k_scale"},
                        {args.options.v_scale_tensor ? &*args.options.v_scale_tensor : nullptr, "v_scale"}});
  return checked;
}

AppendParams check_append_arguments(const AppendArguments& args) {
  return check_append_arguments("append_paged_kv_cache", args, RowNames{}, false).params;
}

AppendParams check_append_with_slot_mapping_arguments(const AppendWithSlotMappingArguments& args) {
  return check_append_with_slot_mapping_arguments("append_paged_kv_cache_with_slot_mapping", args, RowNames{}).params;
}

}  // namespace nvfp4kv
