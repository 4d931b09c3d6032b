// Builds a paged NVFP4 KV cache, appends a prefill and a few decode steps through the nvfp4kv C++
// API, dequantizes the appended rows back out of the pages and prints the quantization error.
// Runs on the CPU, and on the GPU too when libtorch sees one. Exits non-zero if the error is not
// what NVFP4 gives (a relative RMS error of about 0.1 on Gaussian data).
#include <nvfp4kv/nvfp4kv.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <vector>

namespace {

constexpr int64_t kPageSize = 16;
constexpr int64_t kNumHeads = 8;
constexpr int64_t kHeadDim = 128;
constexpr double kMaxRelativeRmsError = 0.15;

struct Requests {
  at::Tensor kv_indices, kv_indptr, kv_last_page_len;  // the page table of the requests
};

// Page table of requests with the given lengths; request b owns pages [kv_indptr[b], kv_indptr[b+1])
// taken in reverse order from the pool, so pages are scattered.
Requests page_table(const std::vector<int64_t>& lengths, int64_t num_pages, const at::TensorOptions& index) {
  std::vector<int32_t> indptr{0}, last_page_len;
  for (int64_t length : lengths) {
    indptr.push_back(indptr.back() + int32_t((length + kPageSize - 1) / kPageSize));
    last_page_len.push_back(int32_t((length - 1) % kPageSize + 1));
  }
  const auto to_tensor = [&](const std::vector<int32_t>& v) {
    return torch::tensor(v, torch::kInt32).to(index.device());
  };
  return {torch::arange(num_pages - 1, num_pages - 1 - indptr.back(), -1, index), to_tensor(indptr),
          to_tensor(last_page_len)};
}

// K rows [nnz, heads, head_dim] read back out of the cache at (batch_indices, positions).
at::Tensor read_rows(const at::Tensor& k_cache, const at::Tensor& k_cache_sf, const Requests& r,
                     const at::Tensor& batch_indices, const at::Tensor& positions, double k_scale) {
  const at::Tensor slots = r.kv_indptr.index_select(0, batch_indices) + positions.div(kPageSize, "floor");
  const at::Tensor pages = r.kv_indices.index_select(0, slots.to(torch::kLong)).to(torch::kLong);
  const at::Tensor entries = positions.remainder(kPageSize).to(torch::kLong);
  using torch::indexing::TensorIndex;
  const at::Tensor packed = k_cache.index({TensorIndex(pages), TensorIndex(entries)});  // NHD
  const at::Tensor scales = k_cache_sf.index({TensorIndex(pages), TensorIndex(entries)});
  return nvfp4kv::dequantize(packed, scales, k_scale);
}

double relative_rms_error(const at::Tensor& expected, const at::Tensor& actual) {
  const at::Tensor reference = expected.to(torch::kFloat32);
  return ((actual - reference).pow(2).mean() / reference.pow(2).mean()).sqrt().item<double>();
}

bool run(const torch::Device& device) {
  torch::manual_seed(0);
  const auto index = torch::TensorOptions().dtype(torch::kInt32).device(device);
  const auto half = torch::TensorOptions().dtype(torch::kBFloat16).device(device);
  const std::vector<int64_t> prompt_lengths{37, 5, 64};
  const int64_t decode_steps = 4, num_pages = 64;

  // One stacked cache per tensor kind: [pages, 2 (K/V), page_size, heads, head_dim/2] and the scales.
  at::Tensor cache = torch::zeros({num_pages, 2, kPageSize, kNumHeads, kHeadDim / 2},
                                  torch::TensorOptions().dtype(torch::kUInt8).device(device));
  at::Tensor cache_sf = torch::zeros({num_pages, 2, kPageSize, kNumHeads, kHeadDim / 16},
                                     torch::TensorOptions().dtype(torch::kFloat8_e4m3fn).device(device));
  const double k_scale = 4.0 / (448.0 * 6.0), v_scale = 4.0 / (448.0 * 6.0);  // |x| up to about 4

  std::vector<int64_t> final_lengths = prompt_lengths;
  for (auto& length : final_lengths) length += decode_steps;
  const Requests table = page_table(final_lengths, num_pages, index);
  std::vector<at::Tensor> keys, batches, positions_all;

  // Prefill: every prompt token of every request in one call (ragged rows, append_indptr).
  std::vector<int32_t> append_indptr{0};
  for (int64_t length : prompt_lengths) append_indptr.push_back(append_indptr.back() + int32_t(length));
  const int64_t prefill_rows = append_indptr.back();
  at::Tensor prompt_lens = torch::tensor(std::vector<int64_t>(prompt_lengths), torch::kInt32).to(device);
  auto [batch_indices, positions] = nvfp4kv::get_batch_indices_positions(
      torch::tensor(append_indptr, torch::kInt32).to(device), prompt_lens, prefill_rows);
  at::Tensor kv = torch::randn({prefill_rows, 2, kNumHeads, kHeadDim}, half);
  nvfp4kv::nvfp4_quantize_append_paged_kv_cache(kv.select(1, 0), kv.select(1, 1), batch_indices, positions, cache,
                                                cache_sf, table.kv_indices, table.kv_indptr, table.kv_last_page_len,
                                                k_scale, v_scale, "NHD");
  keys.push_back(kv.select(1, 0));
  batches.push_back(batch_indices);
  positions_all.push_back(positions);

  // Decode: one token per request and step, K and V as separate tensors, the cache as (K, V) halves.
  const int64_t batch_size = int64_t(prompt_lengths.size());
  for (int64_t step = 0; step < decode_steps; ++step) {
    at::Tensor key = torch::randn({batch_size, kNumHeads, kHeadDim}, half);
    at::Tensor value = torch::randn({batch_size, kNumHeads, kHeadDim}, half);
    at::Tensor decode_batch = torch::arange(batch_size, index);
    at::Tensor decode_positions = prompt_lens + step;
    nvfp4kv::nvfp4_quantize_append_paged_kv_cache(key, value, decode_batch, decode_positions,
                                                  {cache.select(1, 0), cache.select(1, 1)},
                                                  {cache_sf.select(1, 0), cache_sf.select(1, 1)}, table.kv_indices,
                                                  table.kv_indptr, table.kv_last_page_len, k_scale, v_scale, "NHD");
    keys.push_back(key);
    batches.push_back(decode_batch);
    positions_all.push_back(decode_positions);
  }

  const at::Tensor expected = torch::cat(keys);
  const at::Tensor actual = read_rows(cache.select(1, 0), cache_sf.select(1, 0), table, torch::cat(batches),
                                      torch::cat(positions_all), k_scale);
  const double error = relative_rms_error(expected, actual);
  const double max_error = (actual - expected.to(torch::kFloat32)).abs().max().item<double>();
  std::printf(
      "%-4s appended %lld K/V rows (%lld heads x %lld) into %lld pages: relative RMS error %.4f, "
      "max abs error %.4f\n",
      device.is_cuda() ? "cuda" : "cpu", static_cast<long long>(expected.size(0)), static_cast<long long>(kNumHeads),
      static_cast<long long>(kHeadDim), static_cast<long long>(table.kv_indptr[-1].item<int64_t>()), error, max_error);
  return std::isfinite(error) && error < kMaxRelativeRmsError;
}

}  // namespace

int main() {
  try {
    bool ok = run(torch::kCPU);
    if (torch::cuda::is_available()) ok = run(torch::Device(torch::kCUDA, 0)) && ok;
    else std::printf("cuda not available: ran on the CPU only\n");
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}
