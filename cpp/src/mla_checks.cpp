#include "mla_checks.h"

#include <array>

#include "memory_overlap.h"
#include "shared_checks.h"

namespace nvfp4kv {
namespace {

// append_ckv [nnz, C] and append_kpe [nnz, R]: one fp16/bf16 dtype, last dims contiguous.
void check_latent_rows(const char* op, const TensorInfo& ckv, const TensorInfo& kpe, MlaParams& p) {
  if (ckv.dim() != 2) fail(op, "append_ckv must be a 2-D tensor [nnz, ckv_dim], got shape ", ckv.shape_string());
  const ScalarType dtype = ckv.scalar_type();
  if (dtype != ScalarType::Half && dtype != ScalarType::BFloat16) {
    fail(op, "append_ckv must have dtype float16 or bfloat16, got ", dtype_name(dtype));
  }
  p.nnz = ckv.size(0);
  p.ckv_dim = ckv.size(1);
  if (p.ckv_dim <= 0 || p.ckv_dim % 16 != 0) {
    fail(op, "append_ckv ckv_dim (last dim) must be a positive multiple of 16, got ", p.ckv_dim);
  }
  if (ckv.stride(1) != 1) fail(op, "append_ckv must be contiguous in its last dim (stride 1), got ", ckv.stride(1));
  if (kpe.dim() != 2 || kpe.size(0) != p.nnz) {
    fail(op, "append_kpe must be a 2-D tensor [nnz, kpe_dim] with nnz = ", p.nnz,
         " rows (append_ckv.shape[0]), got shape ", kpe.shape_string());
  }
  if (kpe.scalar_type() != dtype) {
    fail(op, "append_kpe must have the same dtype as append_ckv (", dtype_name(dtype), "), got ",
         dtype_name(kpe.scalar_type()));
  }
  p.kpe_dim = kpe.size(1);
  if (p.kpe_dim <= 0) fail(op, "append_kpe kpe_dim (last dim) must be positive, got ", p.kpe_dim);
  if (kpe.stride(1) != 0 && kpe.stride(1) != 1) {
    fail(op, "append_kpe must be contiguous in its last dim (stride 1), got ", kpe.stride(1));
  }
  p.ckv = LatentRowsView{static_cast<const uint16_t*>(ckv.data_ptr()), ckv.stride(0)};
  p.kpe = LatentRowsView{static_cast<const uint16_t*>(kpe.data_ptr()), kpe.stride(0)};
  p.input_is_bf16 = dtype == ScalarType::BFloat16;
}

// One [pages, page_size, width] cache; `reference` (ckv_cache, once checked) fixes pages and page_size.
LatentCacheView check_latent_cache(const char* op, const TensorInfo& t, const char* name, int64_t width,
                                   const char* width_text, const TensorInfo* reference) {
  const bool matches = t.dim() == 3 && t.size(2) == width &&
                       (!reference || (t.size(0) == reference->size(0) && t.size(1) == reference->size(1)));
  if (!matches) {
    std::ostringstream want;
    want << '[' << (reference ? std::to_string(reference->size(0)) : "*") << ", "
         << (reference ? std::to_string(reference->size(1)) : "*") << ", " << width << ']';
    fail(op, name, " must have shape [max_num_pages, page_size, ", width_text, "] = ", want.str(), ", got ",
         t.shape_string());
  }
  if (t.stride(2) != 0 && t.stride(2) != 1) {
    fail(op, name, " must be contiguous in its last dim (stride 1), got stride ", t.stride(2));
  }
  if (t.size(1) < 1) fail(op, name, " must have page_size >= 1, got shape ", t.shape_string());
  const int64_t item = element_size(t.scalar_type());
  return LatentCacheView{static_cast<uint8_t*>(t.data_ptr()), t.stride(0) * item, t.stride(1) * item};
}

void check_caches(const char* op, const MlaCacheArguments& c, MlaParams& p) {
  if (c.ckv_cache.scalar_type() != ScalarType::Byte) {
    fail(op, "ckv_cache must have dtype uint8, got ", dtype_name(c.ckv_cache.scalar_type()));
  }
  if (c.ckv_sf_cache.scalar_type() != ScalarType::Float8_e4m3fn) {
    fail(op, "ckv_sf_cache must have dtype float8_e4m3fn, got ", dtype_name(c.ckv_sf_cache.scalar_type()));
  }
  const ScalarType kpe_dtype = c.kpe_cache.scalar_type();
  const ScalarType input = p.input_is_bf16 ? ScalarType::BFloat16 : ScalarType::Half;
  if (kpe_dtype != ScalarType::Float8_e4m3fn && kpe_dtype != input) {
    fail(op, "kpe_cache must have dtype float8_e4m3fn or the inputs' dtype ", dtype_name(input), ", got ",
         dtype_name(kpe_dtype));
  }
  p.kpe_is_fp8 = kpe_dtype == ScalarType::Float8_e4m3fn;
  p.ckv_data = check_latent_cache(op, c.ckv_cache, "ckv_cache", p.ckv_dim / 2, "ckv_dim/2", nullptr);
  p.ckv_scales = check_latent_cache(op, c.ckv_sf_cache, "ckv_sf_cache", p.ckv_dim / 16, "ckv_dim/16", &c.ckv_cache);
  p.kpe_cache = check_latent_cache(op, c.kpe_cache, "kpe_cache", p.kpe_dim, "kpe_dim", &c.ckv_cache);
  p.num_pages = c.ckv_cache.size(0);
  p.page_size = c.ckv_cache.size(1);
}

// The three caches must not overlap themselves or each other; column slices of one pool are disjoint.
WrittenRanges check_written_disjoint(const char* op, const MlaCacheArguments& c) {
  const std::array<const TensorInfo*, 3> tensors{&c.ckv_cache, &c.ckv_sf_cache, &c.kpe_cache};
  const std::array<const char*, 3> names{"ckv_cache", "ckv_sf_cache", "kpe_cache"};
  std::array<StridedBytes, 3> bytes;
  WrittenRanges written;
  for (size_t i = 0; i < tensors.size(); ++i) {
    bytes[i] = strided_bytes(*tensors[i]);
    if (!touches_each_byte_once(bytes[i])) {
      fail(op, names[i], " must not overlap itself (no stride-0 or expanded dims), got shape ",
           tensors[i]->shape_string());
    }
    written.add(names[i], byte_range(bytes[i]));
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    for (size_t j = i + 1; j < tensors.size(); ++j) {
      if (written.ranges[i].overlaps(written.ranges[j]) && !disjoint_columns(bytes[i], bytes[j])) {
        fail(op, names[j], " must not overlap ", names[i], " in memory, got ",
             written.ranges[i].overlap_bytes(written.ranges[j]), " overlapping bytes");
      }
    }
  }
  return written;
}

void check_scales(const char* op, const MlaScaleArguments& s, const TensorInfo& ckv, MlaParams& p) {
  p.ckv_scale_device = check_scale(op, "ckv_scale", s.ckv_scale, s.ckv_scale_tensor, ckv, "append_ckv", p.ckv_scale);
  p.kpe_scale_device = check_scale(op, "kpe_scale", s.kpe_scale, s.kpe_scale_tensor, ckv, "append_ckv", p.kpe_scale);
}

// The caches, their overlaps and the scales, in that order (what both ops check after their index tensors).
WrittenRanges check_caches_and_scales(const char* op, const MlaCacheArguments& caches, const MlaScaleArguments& scales,
                                      const TensorInfo& ckv, MlaParams& p) {
  check_caches(op, caches, p);
  const WrittenRanges written = check_written_disjoint(op, caches);
  check_scales(op, scales, ckv, p);
  return written;
}

const TensorInfo* optional(const std::optional<TensorInfo>& t) { return t ? &*t : nullptr; }

MlaCacheArguments read_caches(BoxedArguments& boxed) { return {boxed.tensor(), boxed.tensor(), boxed.tensor()}; }

MlaScaleArguments read_scales(BoxedArguments& boxed) {
  return {boxed.real(), boxed.real(), boxed.optional_tensor(), boxed.optional_tensor()};
}

}  // namespace

MlaAppendArguments read_mla_append_arguments(BoxedArguments& boxed) {
  MlaAppendArguments args{boxed.tensor(), boxed.tensor(), boxed.tensor(), boxed.tensor(),    read_caches(boxed),
                          boxed.tensor(), boxed.tensor(), boxed.tensor(), read_scales(boxed)};
  boxed.finish("append_paged_mla_kv_cache", 0);
  return args;
}

MlaAppendWithSlotMappingArguments read_mla_append_with_slot_mapping_arguments(BoxedArguments& boxed) {
  MlaAppendWithSlotMappingArguments args{boxed.tensor(), boxed.tensor(), boxed.tensor(), read_caches(boxed),
                                         read_scales(boxed)};
  boxed.finish("append_paged_mla_kv_cache_with_slot_mapping", 0);
  return args;
}

MlaParams check_mla_append_arguments(const MlaAppendArguments& args) {
  const char* op = "append_paged_mla_kv_cache";
  MlaParams p{};
  check_latent_rows(op, args.append_ckv, args.append_kpe, p);
  check_devices(op, args.append_ckv, "append_ckv",
                {{&args.append_kpe, "append_kpe"},
                 {&args.batch_indices, "batch_indices"},
                 {&args.positions, "positions"},
                 {&args.caches.ckv_cache, "ckv_cache"},
                 {&args.caches.ckv_sf_cache, "ckv_sf_cache"},
                 {&args.caches.kpe_cache, "kpe_cache"},
                 {&args.kv_indices, "kv_indices"},
                 {&args.kv_indptr, "kv_indptr"},
                 {&args.kv_last_page_len, "kv_last_page_len"}});
  set_page_table(p, check_page_table(op, args.batch_indices, args.positions, args.kv_indices, args.kv_indptr,
                                     args.kv_last_page_len, p.nnz, "append_ckv"));
  const WrittenRanges written = check_caches_and_scales(op, args.caches, args.scales, args.append_ckv, p);
  check_reads_disjoint(op, written,
                       {{&args.append_ckv, "append_ckv"},
                        {&args.append_kpe, "append_kpe"},
                        {&args.batch_indices, "batch_indices"},
                        {&args.positions, "positions"},
                        {&args.kv_indices, "kv_indices"},
                        {&args.kv_indptr, "kv_indptr"},
                        {&args.kv_last_page_len, "kv_last_page_len"},
                        {optional(args.scales.ckv_scale_tensor), "ckv_scale"},
                        {optional(args.scales.kpe_scale_tensor), "kpe_scale"}});
  return p;
}

MlaParams check_mla_append_with_slot_mapping_arguments(const MlaAppendWithSlotMappingArguments& args) {
  const char* op = "append_paged_mla_kv_cache_with_slot_mapping";
  MlaParams p{};
  check_latent_rows(op, args.append_ckv, args.append_kpe, p);
  check_devices(op, args.append_ckv, "append_ckv",
                {{&args.append_kpe, "append_kpe"},
                 {&args.slot_mapping, "slot_mapping"},
                 {&args.caches.ckv_cache, "ckv_cache"},
                 {&args.caches.ckv_sf_cache, "ckv_sf_cache"},
                 {&args.caches.kpe_cache, "kpe_cache"}});
  p.slot_mapping = check_index(op, args.slot_mapping, "slot_mapping");
  if (args.slot_mapping.size(0) > p.nnz) {
    fail(op, "slot_mapping must have at most append_ckv.shape[0] = ", p.nnz, " entries, got ",
         args.slot_mapping.size(0));
  }
  p.nnz = args.slot_mapping.size(0);  // only the first slot_mapping.shape[0] rows are appended
  const WrittenRanges written = check_caches_and_scales(op, args.caches, args.scales, args.append_ckv, p);
  check_reads_disjoint(op, written,
                       {{&args.append_ckv, "append_ckv"},
                        {&args.append_kpe, "append_kpe"},
                        {&args.slot_mapping, "slot_mapping"},
                        {optional(args.scales.ckv_scale_tensor), "ckv_scale"},
                        {optional(args.scales.kpe_scale_tensor), "kpe_scale"}});
  return p;
}

}  // namespace nvfp4kv
