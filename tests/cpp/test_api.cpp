// The nvfp4kv C++ API (cpp/include/nvfp4kv/page.h, fp4_quantization.h) on CPU tensors, against bytes
// computed here with the codec: an independent scatter loop over rows, heads and blocks. Caches start
// as random bytes, so comparing whole caches proves that exactly the intended bytes were written.
#include <gtest/gtest.h>
#include <nvfp4kv/nvfp4kv.h>
#include <torch/cuda.h>

#include <cstring>
#include <string>
#include <tuple>
#include <vector>

namespace {

namespace codec = nvfp4kv::codec;

struct Case {
  at::Tensor key, value;                // [nnz, heads, head_dim]
  at::Tensor batch_indices, positions;  // [nnz]
  at::Tensor kv_indices, kv_indptr, kv_last_page_len;
  at::Tensor cache, cache_sf;  // stacked [pages, 2, ...] (uint8, float8_e4m3fn), random bytes
  double k_scale, v_scale;
  std::string layout;
  int64_t page_size;
};

// Requests of random lengths over scattered pages; the appended rows are the last tokens of each.
Case make_case(uint64_t seed, const std::string& layout, at::ScalarType dtype, at::ScalarType index_dtype,
               bool strided_input, int64_t heads = 4, int64_t head_dim = 64, int64_t page_size = 16) {
  at::manual_seed(seed);
  const int64_t batch = 3;
  const at::Tensor seq_lens = at::randint(1, 41, {batch}, at::kLong);
  const at::Tensor appended = at::minimum(seq_lens, at::randint(1, 41, {batch}, at::kLong));
  const at::Tensor pages_per_request = (seq_lens + page_size - 1).div(page_size, "floor");
  const int64_t used_pages = pages_per_request.sum().item<int64_t>(), num_pages = used_pages + 5;
  Case c;
  c.layout = layout;
  c.page_size = page_size;
  c.kv_indices = at::randperm(num_pages, at::kLong).slice(0, 0, used_pages).to(index_dtype);
  c.kv_indptr = at::cat({at::zeros({1}, at::kLong), at::cumsum(pages_per_request, 0)}).to(index_dtype);
  c.kv_last_page_len = (seq_lens - (pages_per_request - 1) * page_size).to(index_dtype);
  const at::Tensor batch_indices = at::repeat_interleave(at::arange(batch, at::kLong), appended);
  const at::Tensor first = at::cumsum(appended, 0) - appended;
  const at::Tensor offsets = at::arange(batch_indices.numel(), at::kLong) - first.index_select(0, batch_indices);
  c.positions = ((seq_lens - appended).index_select(0, batch_indices) + offsets).to(index_dtype);
  c.batch_indices = batch_indices.to(index_dtype);
  const int64_t nnz = batch_indices.numel();
  const at::Tensor kv = (at::randn({nnz, 2, heads, head_dim}) * 3).to(dtype);
  if (strided_input) {
    c.key = kv.select(1, 0);
    c.value = kv.select(1, 1);
  } else {
    c.key = kv.select(1, 0).contiguous();
    c.value = kv.select(1, 1).contiguous();
  }
  const std::vector<int64_t> inner =
      layout == "NHD" ? std::vector<int64_t>{page_size, heads} : std::vector<int64_t>{heads, page_size};
  c.cache = at::randint(0, 256, {num_pages, 2, inner[0], inner[1], head_dim / 2}, at::kByte);
  c.cache_sf =
      at::randint(0, 256, {num_pages, 2, inner[0], inner[1], head_dim / 16}, at::kByte).view(at::kFloat8_e4m3fn);
  c.k_scale = c.key.abs().max().item<double>() / (6 * 448) * 1.7;
  c.v_scale = c.value.abs().max().item<double>() / (6 * 448) * 0.6;
  return c;
}

// The expected stacked caches (as bytes) after the append, computed row by row with the codec.
std::pair<at::Tensor, at::Tensor> expected_caches(const Case& c) {
  at::Tensor data = c.cache.view(at::kByte).clone(), scales = c.cache_sf.view(at::kByte).clone();
  const at::Tensor batch = c.batch_indices.to(at::kLong), positions = c.positions.to(at::kLong);
  const at::Tensor indices = c.kv_indices.to(at::kLong), indptr = c.kv_indptr.to(at::kLong);
  const int64_t heads = c.key.size(1), head_dim = c.key.size(2);
  for (int64_t i = 0; i < c.key.size(0); ++i) {
    const int64_t b = batch[i].item<int64_t>(), p = positions[i].item<int64_t>();
    const int64_t page = indices[indptr[b].item<int64_t>() + p / c.page_size].item<int64_t>();
    const int64_t entry = p % c.page_size;
    for (int kv = 0; kv < 2; ++kv) {
      const at::Tensor rows = (kv == 0 ? c.key : c.value).to(at::kFloat);  // exact widening
      const float scale = float(kv == 0 ? c.k_scale : c.v_scale);
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t d1 = c.layout == "NHD" ? entry : h, d2 = c.layout == "NHD" ? h : entry;
        at::Tensor out_data = data[page][kv][d1][d2], out_scales = scales[page][kv][d1][d2];
        const at::Tensor row = rows[i][h].contiguous();
        for (int64_t block = 0; block < head_dim / codec::kBlockSize; ++block) {
          float x[codec::kBlockSize];
          std::memcpy(x, row.data_ptr<float>() + block * codec::kBlockSize, sizeof x);
          uint64_t packed;
          out_scales[block] = int64_t(codec::quantize_block(x, scale, packed));
          for (int k = 0; k < codec::kBlockBytes; ++k) {
            out_data[block * codec::kBlockBytes + k] = int64_t((packed >> (8 * k)) & 0xFF);
          }
        }
      }
    }
  }
  return {data, scales};
}

void expect_caches(const Case& c, const std::pair<at::Tensor, at::Tensor>& expected) {
  EXPECT_TRUE(at::equal(c.cache.view(at::kByte), expected.first)) << "data cache";
  EXPECT_TRUE(at::equal(c.cache_sf.view(at::kByte), expected.second)) << "scale cache";
}

using Params = std::tuple<std::string, bool, at::ScalarType, at::ScalarType, bool>;

class AppendMatchesCodec : public ::testing::TestWithParam<Params> {};

TEST_P(AppendMatchesCodec, EveryByte) {
  const auto& [layout, stacked, dtype, index_dtype, strided_input] = GetParam();
  Case c = make_case(7, layout, dtype, index_dtype, strided_input);
  const auto expected = expected_caches(c);
  if (stacked) {
    nvfp4kv::nvfp4_quantize_append_paged_kv_cache(c.key, c.value, c.batch_indices, c.positions, c.cache, c.cache_sf,
                                                  c.kv_indices, c.kv_indptr, c.kv_last_page_len, c.k_scale, c.v_scale,
                                                  layout);
  } else {
    // (K, V) as halves of the stacked storage: strided views, as a std::tuple and a braced pair.
    nvfp4kv::nvfp4_quantize_append_paged_kv_cache(c.key, c.value, c.batch_indices, c.positions,
                                                  std::make_tuple(c.cache.select(1, 0), c.cache.select(1, 1)),
                                                  {c.cache_sf.select(1, 0), c.cache_sf.select(1, 1)}, c.kv_indices,
                                                  c.kv_indptr, c.kv_last_page_len, c.k_scale, c.v_scale, layout);
  }
  expect_caches(c, expected);
}

INSTANTIATE_TEST_SUITE_P(Layouts, AppendMatchesCodec,
                         ::testing::Values(Params{"NHD", false, at::kBFloat16, at::kInt, false},
                                           Params{"NHD", true, at::kHalf, at::kLong, true},
                                           Params{"HND", false, at::kHalf, at::kInt, true},
                                           Params{"HND", true, at::kBFloat16, at::kLong, false}));

TEST(Append, DefaultLayoutIsNHD) {
  Case c = make_case(8, "NHD", at::kBFloat16, at::kInt, false);
  const auto expected = expected_caches(c);
  nvfp4kv::nvfp4_quantize_append_paged_kv_cache(c.key, c.value, c.batch_indices, c.positions, c.cache, c.cache_sf,
                                                c.kv_indices, c.kv_indptr, c.kv_last_page_len, c.k_scale, c.v_scale);
  expect_caches(c, expected);
}

TEST(Append, HandComputedTies) {
  // a = 6, s = 1: sf = 0x38 (1.0), r = 1, ties round half to even (tests/test_edge_cases.py).
  const at::Tensor row =
      at::tensor({6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -6.0, -0.25, -0.75, -1.25, -1.75, -2.5, -3.5, -5.0})
          .to(at::kBFloat16)
          .reshape({1, 1, 16});
  at::Tensor cache = at::full({1, 2, 1, 1, 8}, 0xA5, at::kByte);
  at::Tensor cache_sf = at::full({1, 2, 1, 1, 1}, 0x5A, at::kByte);
  const at::Tensor zero = at::zeros({1}, at::kInt);
  nvfp4kv::nvfp4_quantize_append_paged_kv_cache(row, row, zero, zero, cache, cache_sf.view(at::kFloat8_e4m3fn), zero,
                                                at::tensor({0, 1}, at::kInt), at::ones({1}, at::kInt), 1.0, 1.0);
  const std::vector<int> codes{7, 0, 2, 2, 4, 4, 6, 6, 15, 8, 10, 10, 12, 12, 14, 14};
  for (int kv = 0; kv < 2; ++kv) {
    EXPECT_EQ(cache_sf[0][kv][0][0][0].item<int64_t>(), 0x38);
    for (int k = 0; k < 8; ++k) {
      EXPECT_EQ(cache[0][kv][0][0][k].item<int64_t>(), codes[2 * k] | codes[2 * k + 1] << 4) << k;
    }
  }
}

TEST(Mla, HandComputedLatentRow) {
  // One row to page 1, entry 1 of two 2-entry pages: ckv as in HandComputedTies (a = 6, s = 1), kpe by hand.
  const at::Tensor ckv =
      at::tensor({6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -6.0, -0.25, -0.75, -1.25, -1.75, -2.5, -3.5, -5.0})
          .to(at::kBFloat16)
          .reshape({1, 16});
  const at::Tensor kpe = at::tensor({1.0, -1.1875, 464.0, -0.0}).to(at::kBFloat16).reshape({1, 4});
  at::Tensor ckv_cache = at::randint(0, 256, {2, 2, 8}, at::kByte);
  at::Tensor sf_cache = at::randint(0, 256, {2, 2, 1}, at::kByte);
  at::Tensor kpe_cache = at::randint(0, 256, {2, 2, 4}, at::kByte);
  at::Tensor expected_ckv = ckv_cache.clone(), expected_sf = sf_cache.clone(), expected_kpe = kpe_cache.clone();
  const std::vector<int> codes{7, 0, 2, 2, 4, 4, 6, 6, 15, 8, 10, 10, 12, 12, 14, 14};
  for (int k = 0; k < 8; ++k) expected_ckv[1][1][k] = codes[2 * k] | codes[2 * k + 1] << 4;
  expected_sf[1][1][0] = 0x38;
  const std::vector<int> kpe_bytes{0x38, 0xBA, 0x7E, 0x80};
  for (int j = 0; j < 4; ++j) expected_kpe[1][1][j] = kpe_bytes[j];
  nvfp4kv::nvfp4_quantize_append_paged_mla_kv_cache(ckv, kpe, at::zeros({1}, at::kInt), at::ones({1}, at::kInt),
                                                    ckv_cache, sf_cache.view(at::kFloat8_e4m3fn),
                                                    kpe_cache.view(at::kFloat8_e4m3fn), at::tensor({1}, at::kInt),
                                                    at::tensor({0, 1}, at::kInt), at::tensor({2}, at::kInt), 1.0, 1.0);
  EXPECT_TRUE(at::equal(ckv_cache, expected_ckv));
  EXPECT_TRUE(at::equal(sf_cache, expected_sf));
  EXPECT_TRUE(at::equal(kpe_cache, expected_kpe));
  try {
    nvfp4kv::nvfp4_quantize_append_paged_mla_kv_cache_with_slot_mapping(ckv, kpe, at::zeros({1}, at::kInt), ckv_cache,
                                                                        sf_cache, kpe_cache, 1.0, 1.0);
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()),
              "nvfp4kv.append_paged_mla_kv_cache_with_slot_mapping: ckv_sf_cache must have dtype float8_e4m3fn, got "
              "uint8");
  }
  EXPECT_TRUE(at::equal(ckv_cache, expected_ckv));
}

TEST(Rope, HandComputedQuarterTurn) {
  // GPT-J pairs turned by a quarter (cos 0, sin 1): (x, y) -> (-y, x), exactly. The key is chosen so that its
  // rotation is HandComputedTies' row, whose codes are known; V is that row itself. Q goes out in FP8 with
  // q_scale 0.5: byte = E4M3(2 q). Row 1 is padding (nnz 1): rotated, not cached.
  const std::vector<double> rotated{6.0,  0.25,  0.75,  1.25,  1.75,  2.5,  3.5,  5.0,
                                    -6.0, -0.25, -0.75, -1.25, -1.75, -2.5, -3.5, -5.0};
  std::vector<double> key_values(16);
  for (int j = 0; j < 8; ++j) key_values[2 * j] = rotated[2 * j + 1], key_values[2 * j + 1] = -rotated[2 * j];
  const at::Tensor row = at::tensor(rotated).to(at::kBFloat16).reshape({1, 1, 16});
  const at::Tensor key = at::tensor(key_values).to(at::kBFloat16).reshape({1, 1, 16}).repeat({2, 1, 1});
  const at::Tensor value = row.repeat({2, 1, 1});
  at::Tensor table = at::zeros({4, 16}, at::kFloat);
  table.slice(1, 8).fill_(1.0);  // cos 0, sin 1
  at::Tensor cache = at::full({1, 2, 1, 1, 8}, 0xA5, at::kByte);
  at::Tensor cache_sf = at::full({1, 2, 1, 1, 1}, 0x5A, at::kByte);
  const at::Tensor zero = at::zeros({1}, at::kInt);
  nvfp4kv::RopeOptions options;
  options.is_neox = false;
  options.q_out_dtype = at::kFloat8_e4m3fn;
  options.q_scale = nvfp4kv::GlobalScale(0.5);
  const at::Tensor q = nvfp4kv::rope_quantize_nvfp4_append_paged_kv_cache(
      key, key, value, table, at::tensor({3, 0}, at::kInt), zero, zero, cache, cache_sf.view(at::kFloat8_e4m3fn), zero,
      at::tensor({0, 1}, at::kInt), at::ones({1}, at::kInt), 1.0, 1.0, "NHD", options);
  ASSERT_EQ(q.scalar_type(), at::kFloat8_e4m3fn);
  EXPECT_TRUE(
      at::equal(q.view(at::kByte), (row.repeat({2, 1, 1}).to(at::kFloat) * 2).to(at::kFloat8_e4m3fn).view(at::kByte)));
  const std::vector<int> codes{7, 0, 2, 2, 4, 4, 6, 6, 15, 8, 10, 10, 12, 12, 14, 14};
  const auto expect_codes = [&] {
    for (int kv = 0; kv < 2; ++kv) {
      EXPECT_EQ(cache_sf[0][kv][0][0][0].item<int64_t>(), 0x38);
      for (int k = 0; k < 8; ++k)
        EXPECT_EQ(cache[0][kv][0][0][k].item<int64_t>(), codes[2 * k] | codes[2 * k + 1] << 4);
    }
  };
  expect_codes();
  // The slot-mapping variant, Q rotated in place in a bf16 query (slot 0: page 0, entry 0; -1: padding).
  cache.fill_(0xA5);
  cache_sf.fill_(0x5A);
  at::Tensor query = key.clone();
  nvfp4kv::RopeOptions in_place;
  in_place.is_neox = false;
  in_place.q_out = query;
  const at::Tensor q16 = nvfp4kv::rope_quantize_nvfp4_append_paged_kv_cache_with_slot_mapping(
      query, key, value, table, at::tensor({3, 0}, at::kInt), at::tensor({0, -1}, at::kInt), cache,
      cache_sf.view(at::kFloat8_e4m3fn), 1.0, 1.0, "NHD", in_place);
  EXPECT_TRUE(q16.is_same(query));
  EXPECT_TRUE(at::equal(query, row.repeat({2, 1, 1})));
  expect_codes();
}

TEST(Append, TensorScaleWritesTheSameBytesAsAFloatScale) {
  Case c = make_case(9, "NHD", at::kBFloat16, at::kInt, false);
  const auto expected = expected_caches(c);
  const at::Tensor k_scale = at::tensor({float(c.k_scale)}), v_scale = at::tensor({float(c.v_scale)});
  nvfp4kv::nvfp4_quantize_append_paged_kv_cache(c.key, c.value, c.batch_indices, c.positions, c.cache, c.cache_sf,
                                                c.kv_indices, c.kv_indptr, c.kv_last_page_len, k_scale, v_scale);
  expect_caches(c, expected);
}

TEST(AppendWithSlotMapping, WritesTheSameBytesAsThePageTable) {
  Case c = make_case(10, "HND", at::kHalf, at::kLong, true);
  const auto expected = expected_caches(c);
  const at::Tensor indptr = c.kv_indptr.to(at::kLong);
  const at::Tensor slots = c.batch_indices.to(at::kLong);  // slot = page * page_size + entry
  const at::Tensor page_iter = indptr.index_select(0, slots) + c.positions.to(at::kLong).div(c.page_size, "floor");
  const at::Tensor slot_mapping =
      c.kv_indices.to(at::kLong).index_select(0, page_iter) * c.page_size + c.positions.to(at::kLong) % c.page_size;
  // Two padding rows past the mapping are ignored.
  const at::Tensor key = at::cat({c.key, at::randn({2, c.key.size(1), c.key.size(2)}).to(at::kHalf)});
  const at::Tensor value = at::cat({c.value, at::randn({2, c.key.size(1), c.key.size(2)}).to(at::kHalf)});
  nvfp4kv::nvfp4_quantize_append_paged_kv_cache_with_slot_mapping(key, value, slot_mapping, c.cache, c.cache_sf,
                                                                  c.k_scale, c.v_scale, "HND");
  expect_caches(c, expected);
}

// A bad argument throws std::invalid_argument with the Python message, before anything is written.
template <typename Call>
void expect_error(Case& c, Call call, const std::string& message) {
  const at::Tensor data = c.cache.view(at::kByte).clone(), scales = c.cache_sf.view(at::kByte).clone();
  try {
    call();
    ADD_FAILURE() << "no error, expected: " << message;
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), message);
  }
  EXPECT_TRUE(at::equal(c.cache.view(at::kByte), data));
  EXPECT_TRUE(at::equal(c.cache_sf.view(at::kByte), scales));
}

TEST(Errors, SameMessagesAsPython) {
  Case c = make_case(11, "NHD", at::kBFloat16, at::kInt, false);
  const auto append = [&](const nvfp4kv::PagedCache& cache, const nvfp4kv::PagedCache& cache_sf, double k_scale,
                          const std::string& layout) {
    nvfp4kv::nvfp4_quantize_append_paged_kv_cache(c.key, c.value, c.batch_indices, c.positions, cache, cache_sf,
                                                  c.kv_indices, c.kv_indptr, c.kv_last_page_len, k_scale, c.v_scale,
                                                  layout);
  };
  const std::string op = "nvfp4kv.append_paged_kv_cache: ";
  expect_error(
      c,
      [&] {
        append({c.cache.select(1, 0), c.cache.select(1, 1)}, {c.cache_sf.select(1, 0), c.cache.select(1, 1)}, c.k_scale,
               "NHD");
      },
      op + "kv_cache_sf[1] must have dtype float8_e4m3fn, got uint8");
  expect_error(
      c, [&] { append(c.cache, c.cache_sf, c.k_scale, "NDH"); },
      op + "kv_layout must be \"NHD\" or \"HND\", got \"NDH\"");
  expect_error(
      c, [&] { append(c.cache, c.cache_sf, 0.0, "NHD"); },
      op + "k_scale must be a positive finite global decode scale in float32, got 0");
  expect_error(
      c, [&] { append(c.cache, c.cache_sf, c.k_scale, "HND"); },
      op +
          "paged_kv_cache must have shape [max_num_pages, num_kv_heads, page_size, head_dim/2] = [*, 4, *, "
          "32] for kv_layout HND, got [" +
          std::to_string(c.cache.size(0)) + ", 16, 4, 32]");
}

// The recipe options reach the op: a bad name or an unusable geometry fails with the Python message,
// and "4over6" / "trtllm" change the bytes relative to the defaults.
TEST(Options, LayoutAndScaleSearchAreForwarded) {
  Case c = make_case(12, "HND", at::kBFloat16, at::kInt, false, 4, 64, 16);
  const auto append = [&](Case& target, const std::string& v_sf_layout, const std::string& scale_search) {
    nvfp4kv::nvfp4_quantize_append_paged_kv_cache(target.key, target.value, target.batch_indices, target.positions,
                                                  target.cache, target.cache_sf, target.kv_indices, target.kv_indptr,
                                                  target.kv_last_page_len, target.k_scale, target.v_scale, "HND",
                                                  v_sf_layout, scale_search);
  };
  const std::string op = "nvfp4kv.append_paged_kv_cache: ";
  expect_error(
      c, [&] { append(c, "interleaved", "none"); },
      op + "v_sf_layout must be \"linear\" or \"trtllm\", got \"interleaved\"");
  expect_error(
      c, [&] { append(c, "linear", "4over5"); }, op + "scale_search must be \"none\" or \"4over6\", got \"4over5\"");
  Case plain = c, searched = c, interleaved = c;
  for (Case* copy : {&plain, &searched, &interleaved}) {
    copy->cache = c.cache.clone();
    copy->cache_sf = c.cache_sf.clone();
  }
  append(plain, "linear", "none");
  append(searched, "linear", "4over6");
  append(interleaved, "trtllm", "none");
  EXPECT_FALSE(at::equal(plain.cache_sf.view(at::kByte), searched.cache_sf.view(at::kByte)));
  EXPECT_TRUE(at::equal(plain.cache.view(at::kByte), interleaved.cache.view(at::kByte)));  // data unchanged
  EXPECT_TRUE(at::equal(plain.cache_sf.select(1, 0).view(at::kByte),                       // K scales too
                        interleaved.cache_sf.select(1, 0).view(at::kByte)));
  EXPECT_FALSE(at::equal(plain.cache_sf.select(1, 1).view(at::kByte),  // V scales move
                         interleaved.cache_sf.select(1, 1).view(at::kByte)));
}

TEST(Dequantize, CodesTimesScales) {
  // Byte 0x21: codes 1 (0.5) and 2 (1.0); 0x8F: codes 15 (-6) and 8 (-0); the rest 0. Scale 0x40 = 2.0.
  at::Tensor packed = at::zeros({2, 8}, at::kByte);
  packed[0][0] = 0x21;
  packed[1][7] = 0x8F;
  const at::Tensor scales = at::tensor({0x40, 0x7F}, at::kByte).reshape({2, 1}).view(at::kFloat8_e4m3fn);
  const at::Tensor out = nvfp4kv::dequantize(packed, scales, 0.5);
  ASSERT_EQ(out.sizes(), (std::vector<int64_t>{2, 16}));
  EXPECT_EQ(out.scalar_type(), at::kFloat);
  EXPECT_EQ(out[0][0].item<float>(), 0.5f);  // 0.5 * 2 * 0.5
  EXPECT_EQ(out[0][1].item<float>(), 1.0f);
  EXPECT_EQ(out[0][2].item<float>(), 0.0f);
  EXPECT_TRUE(at::isnan(out[1]).all().item<bool>());  // scale byte 0x7F: the NaN block
  try {
    nvfp4kv::dequantize(packed.to(at::kFloat), scales, 1.0);
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), "nvfp4kv.dequantize: packed must have dtype uint8, got float32");
  }
}

TEST(Dequantize, ReadsBackWhatAppendWrote) {
  Case c = make_case(12, "NHD", at::kBFloat16, at::kInt, false);
  nvfp4kv::nvfp4_quantize_append_paged_kv_cache(c.key, c.value, c.batch_indices, c.positions, c.cache, c.cache_sf,
                                                c.kv_indices, c.kv_indptr, c.kv_last_page_len, c.k_scale, c.v_scale);
  const int64_t b = c.batch_indices[0].item<int64_t>(), p = c.positions[0].item<int64_t>();
  const int64_t page = c.kv_indices[c.kv_indptr[b].item<int64_t>() + p / c.page_size].item<int64_t>();
  const at::Tensor row =
      nvfp4kv::dequantize(c.cache[page][0][p % c.page_size], c.cache_sf[page][0][p % c.page_size], c.k_scale);
  const at::Tensor reference = c.key[0].to(at::kFloat);
  const double relative = ((row - reference).pow(2).mean() / reference.pow(2).mean()).sqrt().item<double>();
  EXPECT_LT(relative, 0.15);
}

TEST(Helpers, SeqLens) {
  const at::Tensor seq_lens =
      nvfp4kv::get_seq_lens(at::tensor({0, 2, 2, 5, 6}, at::kInt), at::tensor({3, 0, 16, 1}, at::kInt), 16);
  EXPECT_TRUE(at::equal(seq_lens.to(at::kLong), at::tensor({19, 0, 48, 1}, at::kLong)));
}

TEST(Helpers, BatchIndicesPositions) {
  const auto [batch_indices, positions] = nvfp4kv::get_batch_indices_positions(at::tensor({0, 3, 3, 4, 6}, at::kInt),
                                                                               at::tensor({10, 7, 1, 2}, at::kInt), 6);
  EXPECT_EQ(batch_indices.scalar_type(), at::kInt);
  EXPECT_EQ(positions.scalar_type(), at::kInt);
  EXPECT_TRUE(at::equal(batch_indices, at::tensor({0, 0, 0, 2, 3, 3}, at::kInt)));
  EXPECT_TRUE(at::equal(positions, at::tensor({7, 8, 9, 0, 0, 1}, at::kInt)));
}

TEST(Registration, OpsAreRegisteredAtProgramStart) {
  // No dlopen anywhere in this program: linking nvfp4kv::nvfp4kv loaded the library.
  for (const char* name : {"nvfp4kv::append_paged_kv_cache", "nvfp4kv::dequantize"}) {
    const auto op = c10::Dispatcher::singleton().findSchema({name, ""});
    ASSERT_TRUE(op.has_value()) << name;
    EXPECT_TRUE(op->hasKernelForDispatchKey(c10::DispatchKey::CPU)) << name;
  }
}

// The same calls on CUDA tensors (run by tests/gpu/run_cpp_device.sh on a GPU machine): the CUDA
// kernels write the very bytes the codec computes on the host.
at::Tensor on_cuda(const at::Tensor& t) { return t.to(at::Device(at::kCUDA, 0)); }

TEST(Cuda, AppendWritesTheCodecBytes) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  for (const auto& [layout, stacked, dtype, index_dtype, strided_input] :
       {Params{"NHD", false, at::kBFloat16, at::kInt, true}, Params{"HND", true, at::kHalf, at::kLong, false}}) {
    Case c = make_case(13, layout, dtype, index_dtype, strided_input);
    const auto expected = expected_caches(c);
    at::Tensor cache = on_cuda(c.cache), cache_sf = on_cuda(c.cache_sf);
    const at::Tensor kv = on_cuda(at::stack({c.key, c.value}, 1));  // strided rows, as on the CPU
    const nvfp4kv::PagedCache data =
        stacked ? nvfp4kv::PagedCache(cache) : nvfp4kv::PagedCache(cache.select(1, 0), cache.select(1, 1));
    const nvfp4kv::PagedCache scales =
        stacked ? nvfp4kv::PagedCache(cache_sf) : nvfp4kv::PagedCache(cache_sf.select(1, 0), cache_sf.select(1, 1));
    nvfp4kv::nvfp4_quantize_append_paged_kv_cache(
        kv.select(1, 0), kv.select(1, 1), on_cuda(c.batch_indices), on_cuda(c.positions), data, scales,
        on_cuda(c.kv_indices), on_cuda(c.kv_indptr), on_cuda(c.kv_last_page_len), c.k_scale, c.v_scale, layout);
    EXPECT_TRUE(at::equal(cache.cpu(), expected.first)) << layout;
    EXPECT_TRUE(at::equal(cache_sf.view(at::kByte).cpu(), expected.second)) << layout;
  }
}

TEST(Cuda, TensorScaleSlotMappingAndDequantize) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  Case c = make_case(14, "NHD", at::kBFloat16, at::kInt, false);
  const auto expected = expected_caches(c);
  const at::Tensor page_iter = c.kv_indptr.to(at::kLong).index_select(0, c.batch_indices.to(at::kLong)) +
                               c.positions.to(at::kLong).div(c.page_size, "floor");
  const at::Tensor slot_mapping =
      c.kv_indices.to(at::kLong).index_select(0, page_iter) * c.page_size + c.positions.to(at::kLong) % c.page_size;
  at::Tensor cache = on_cuda(c.cache), cache_sf = on_cuda(c.cache_sf);
  nvfp4kv::nvfp4_quantize_append_paged_kv_cache_with_slot_mapping(
      on_cuda(c.key), on_cuda(c.value), on_cuda(slot_mapping), cache, cache_sf, on_cuda(at::tensor({float(c.k_scale)})),
      on_cuda(at::tensor({float(c.v_scale)})));
  EXPECT_TRUE(at::equal(cache.cpu(), expected.first));
  EXPECT_TRUE(at::equal(cache_sf.view(at::kByte).cpu(), expected.second));
  nvfp4kv::nvfp4_quantize_append_paged_kv_cache_with_slot_mapping(c.key, c.value, slot_mapping, c.cache, c.cache_sf,
                                                                  c.k_scale, c.v_scale);
  const at::Tensor host = nvfp4kv::dequantize(c.cache.select(1, 0), c.cache_sf.select(1, 0), c.k_scale);
  const at::Tensor device = nvfp4kv::dequantize(cache.select(1, 0), cache_sf.select(1, 0), c.k_scale).cpu();
  EXPECT_TRUE(at::equal(at::isnan(host), at::isnan(device)));
  EXPECT_TRUE(at::equal(at::nan_to_num(host, 0.0), at::nan_to_num(device, 0.0)));
}

TEST(Cuda, ErrorsAreTheSameOnTheDevice) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  Case c = make_case(15, "NHD", at::kBFloat16, at::kInt, false);
  try {
    nvfp4kv::nvfp4_quantize_append_paged_kv_cache(
        on_cuda(c.key), on_cuda(c.value), on_cuda(c.batch_indices), c.positions, on_cuda(c.cache), on_cuda(c.cache_sf),
        on_cuda(c.kv_indices), on_cuda(c.kv_indptr), on_cuda(c.kv_last_page_len), c.k_scale, c.v_scale);
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()),
              "nvfp4kv.append_paged_kv_cache: positions must be on the same device as append_key (cuda:0), got cpu");
  }
}

}  // namespace
