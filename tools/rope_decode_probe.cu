// What no fused RoPE + append kernel can beat at decode on this GPU: the memory dependencies of the bench's
// "rope bf16 q decode" cases (a Llama-3-8B layer: Hq 32, Hkv 8, D = R = 128, NeoX, pages of 16, bf16 Q out; q, k
// and v views of one packed qkv row) without the arithmetic, beside the op on the same input sets (run by
// tests/gpu/run_device.sh, stage "probe"; prints a table).
//
// Skeleton kernels in the op's decode shape (two CTAs of 256 threads per row, the K/V CTA dispatched first; a
// thread per 16-value unit): each thread reads its unit's 32 bytes and writes them folded - Q as 32 bytes to
// q_out, K and V as 8 + 1 bytes to the cache - after
//   bytes:      no index load (the cache slot is the row);
//   + table:    the row's RoPE position, then 16 bytes of its float32 table row folded in (one dependent load);
//   + chain:    and in the K/V CTA the page table's chain: position, kv_indptr read at the row (the op's guess
//               b == row), then the page id (two dependent loads), the cache slot on that page;
//   + staged:   and the table row staged in shared memory with one barrier per CTA, as the op stages it.
// Beside them the op on the same sets, whole and in two parts: its K/V CTAs alone, and without placing a row.
// Per launch inside a CUDA graph of up to 1024 launches over rotated input sets, programmatic launch on (as the
// op launches), L2 flushed before each sample when the sets do not fill 4.5x L2. The rope positions are the cache
// positions (one tensor, as in the bench), so the table's rows stay in L2 as they do there.
// Build and run from the repository root: tests/gpu/run_device.sh probe (its nvcc command).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "cuda/kernels.h"
#include "cuda/programmatic_launch.cuh"
#include "probe_timing.cuh"
#include "rope_params.h"

namespace {

constexpr int kQHeads = 32;
constexpr int kKvHeads = 8;
constexpr int kHeadDim = 128;
constexpr int kUnits = kHeadDim / 16;                         // 16-value units per head
constexpr int kQItems = kQHeads * kUnits;                     // 256: the Q CTA's threads
constexpr int kKvItems = 2 * kKvHeads * kUnits;               // 128: K then V
constexpr int kRowUnits = (kQHeads + 2 * kKvHeads) * kUnits;  // 32-byte units of a packed qkv row
constexpr int kPageSize = 16;
constexpr int64_t kPageData = kPageSize * kKvHeads * kHeadDim / 2;  // bytes of one cache page (K or V)
constexpr int64_t kPageScales = kPageSize * kKvHeads * kUnits;
constexpr int kThreads = 256;

enum Levels { kBytes = 0, kTable = 1, kChain = 2, kStaged = 3 };

// Volatile loads: issued in the order written (the data first, then the indices, as the op issues them); a plain
// load may be scheduled behind a load that waits for an index, and hold its bytes back one round trip.
__device__ __forceinline__ uint4 load16(const uint4* p) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}

__device__ __forceinline__ int load4(const int* p) {
  int v;
  asm volatile("ld.volatile.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ uint2 fold(uint4 lo, uint4 hi) {
  return make_uint2(lo.x ^ lo.z ^ hi.x ^ hi.z, lo.y ^ lo.w ^ hi.y ^ hi.w);
}

// Grid (rows, 2): blockIdx.y 0 is the row's K/V CTA, 1 its Q CTA. Caches as the op's NHD: [pages, 16, 8, 64]
// data bytes, [pages, 16, 8, 8] scale bytes, K then V.
template <int kLevels>
__global__ void __launch_bounds__(kThreads)
    rope_skeleton(const uint4* __restrict__ qkv, const int* __restrict__ positions, const int* __restrict__ indptr,
                  const int* __restrict__ indices, const uint4* __restrict__ table, uint4* __restrict__ q_out,
                  uint8_t* __restrict__ k_data, uint8_t* __restrict__ v_data, uint8_t* __restrict__ k_sf,
                  uint8_t* __restrict__ v_sf) {
  nvfp4kv::programmatic_launch::wait_for_previous_kernel();
  nvfp4kv::programmatic_launch::allow_next_kernel();
  const uint32_t row = blockIdx.x, t = threadIdx.x;
  const bool kv = blockIdx.y == 0;
  const bool idle = kv && t >= kKvItems;
  if (kLevels < kStaged && idle) return;
  const uint32_t item = kv ? kQItems + t : t;
  uint4 lo{}, hi{};
  if (!idle) {
    lo = load16(qkv + (size_t(row) * kRowUnits + item) * 2);
    hi = load16(qkv + (size_t(row) * kRowUnits + item) * 2 + 1);
  }
  int position = 0, start = 0;
  if constexpr (kLevels >= kTable) position = load4(positions + row);
  if constexpr (kLevels >= kChain) start = kv ? load4(indptr + row) : 0;
  size_t slot = row;  // the page id's load goes out before the staging barrier, as in the op
  if (kLevels >= kChain && kv) {
    slot = size_t(uint32_t(load4(indices + start + position / kPageSize))) * kPageSize + position % kPageSize;
  }
  const uint4* row_table = table + size_t(position) * (kHeadDim / 4);
  if constexpr (kLevels == kStaged) {  // the table row through shared memory and one barrier, as the op stages it
    __shared__ uint4 staged[kHeadDim / 4];
    if (t < kHeadDim / 4) staged[t] = load16(row_table + t);
    __syncthreads();
    if (idle) return;
    row_table = staged;
  }
  if constexpr (kLevels >= kTable) {
    const uint4 c = kLevels == kStaged ? row_table[t % (kHeadDim / 4)] : load16(row_table + t % (kHeadDim / 4));
    lo.x ^= c.x, lo.y ^= c.y, hi.z ^= c.z, hi.w ^= c.w;
  }
  if (!kv) {
    q_out[(size_t(row) * kQItems + t) * 2] = lo;
    q_out[(size_t(row) * kQItems + t) * 2 + 1] = hi;
    return;
  }
  const uint32_t head = (t / kUnits) % kKvHeads, unit = t % kUnits;
  const bool value = t >= kKvItems / 2;
  const uint2 d = fold(lo, hi);
  const size_t block = (slot * kKvHeads + head) * kUnits + unit;
  reinterpret_cast<uint2*>(value ? v_data : k_data)[block] = d;
  (value ? v_sf : k_sf)[block] = uint8_t(d.x ^ (d.y >> 8));
}

// One input set: `rows` decode rows, request r = row r with one page of its own at a random place in the set's
// pages, the row at a random entry of it.
struct RopeSet {
  uint16_t* qkv;  // [rows, Hq + 2 Hkv, D] bf16
  uint16_t* q_out;
  int* positions;  // the cache positions and the RoPE positions
  int* batch;
  int* indptr;
  int* indices;
  uint8_t* k_data;  // [rows pages, 16, Hkv, D / 2]
  uint8_t* v_data;
  uint8_t* k_sf;
  uint8_t* v_sf;
};

nvfp4kv::RopeParams op_params(const RopeSet& set, int rows, const float* table) {
  nvfp4kv::RopeParams p{};
  nvfp4kv::AppendParams& a = p.append;
  constexpr int64_t kRowStride = int64_t(kQHeads + 2 * kKvHeads) * kHeadDim;
  p.query = {set.qkv, kRowStride, kHeadDim};
  a.key = {set.qkv + kQHeads * kHeadDim, kRowStride, kHeadDim};
  a.value = {set.qkv + (kQHeads + kKvHeads) * kHeadDim, kRowStride, kHeadDim};
  a.input_is_bf16 = true;
  a.batch_indices = {set.batch, 1, rows, false};
  a.positions = {set.positions, 1, rows, false};
  a.kv_indices = {set.indices, 1, rows, false};
  a.kv_indptr = {set.indptr, 1, rows + 1, false};
  a.k_data = {set.k_data, kPageData, kKvHeads * kHeadDim / 2, kHeadDim / 2};
  a.v_data = {set.v_data, kPageData, kKvHeads * kHeadDim / 2, kHeadDim / 2};
  a.k_scales = {set.k_sf, kPageScales, kKvHeads * kUnits, kUnits};
  a.v_scales = {set.v_sf, kPageScales, kKvHeads * kUnits, kUnits};
  a.nnz = rows;
  a.num_heads = kKvHeads;
  a.head_dim = kHeadDim;
  a.page_size = kPageSize;
  a.num_pages = rows;
  a.batch_size = rows;
  a.k_scale = a.v_scale = 1.0f / 2688;
  p.q_out = {set.q_out, kQHeads * kHeadDim, kHeadDim};
  p.k_out = {nullptr, 0, 0};
  p.cos_sin = table;
  p.cos_sin_row_stride = kHeadDim;
  p.cos_sin_type = nvfp4kv::rope::TableType::kFloat32;
  p.max_pos = kPageSize;
  p.rotary_dim = kHeadDim;
  p.rope_positions = a.positions;
  p.rows = rows;
  p.num_q_heads = kQHeads;
  p.neox = true;
  return p;
}

void probe_rows(int rows, const probe::Ceilings& ceilings, size_t l2_bytes, const probe::L2Flush& flush,
                const float* table, cudaStream_t s, std::mt19937& rng) {
  const size_t qkv_bytes = size_t(rows) * kRowUnits * 32, q_out_bytes = size_t(rows) * kQItems * 32;
  const size_t per_set = qkv_bytes + q_out_bytes + size_t(rows) * kKvItems * 9 + size_t(rows) * 16;
  const int count = std::max(2, std::min(1024, int((4.5 * l2_bytes + per_set - 1) / per_set)));
  const bool flushed = count * per_set < 4.5 * l2_bytes;
  std::vector<RopeSet> sets(count);
  std::vector<uint16_t> values(size_t(rows) * kRowUnits * 16);
  std::vector<int> position(rows), start(rows + 1), page(rows);
  std::normal_distribution<float> normal;
  for (RopeSet& set : sets) {
    for (uint16_t& v : values) {
      const float x = normal(rng);
      uint32_t bits;
      std::memcpy(&bits, &x, 4);
      v = uint16_t(bits >> 16);  // bf16 by truncation: any finite values do
    }
    for (int r = 0; r < rows; ++r) page[r] = r;
    std::shuffle(page.begin(), page.end(), rng);
    for (int r = 0; r <= rows; ++r) start[r] = r;
    for (int r = 0; r < rows; ++r) position[r] = int(rng() % kPageSize);
    const size_t cache_bytes = size_t(rows) * kPageData, scale_bytes = size_t(rows) * kPageScales;
    CHECK_CUDA(cudaMalloc(&set.qkv, qkv_bytes));
    CHECK_CUDA(cudaMemcpy(set.qkv, values.data(), qkv_bytes, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMalloc(&set.q_out, q_out_bytes));
    for (int** index : {&set.positions, &set.batch, &set.indptr, &set.indices}) {
      CHECK_CUDA(cudaMalloc(index, (rows + 1) * 4));
    }
    CHECK_CUDA(cudaMemcpy(set.positions, position.data(), rows * 4, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(set.batch, start.data(), rows * 4, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(set.indptr, start.data(), (rows + 1) * 4, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(set.indices, page.data(), rows * 4, cudaMemcpyHostToDevice));
    for (uint8_t** cache : {&set.k_data, &set.v_data}) CHECK_CUDA(cudaMalloc(cache, cache_bytes));
    for (uint8_t** scales : {&set.k_sf, &set.v_sf}) CHECK_CUDA(cudaMalloc(scales, scale_bytes));
  }
  const int launches = std::min(count, 1024);
  const probe::L2Flush* each_sample = flushed ? &flush : nullptr;
  std::printf("rope bf16 q decode nnz=%d (%d sets%s): launch floor %.2f us\n", rows, count,
              flushed ? ", L2 flushed" : "", ceilings.floor_us);
  using Kernel = void (*)(const uint4*, const int*, const int*, const int*, const uint4*, uint4*, uint8_t*, uint8_t*,
                          uint8_t*, uint8_t*);
  const Kernel kernels[4] = {rope_skeleton<kBytes>, rope_skeleton<kTable>, rope_skeleton<kChain>,
                             rope_skeleton<kStaged>};
  const char* names[4] = {"bytes", "+ table", "+ chain", "+ staged"};
  for (int k = 0; k < 4; ++k) {
    cudaGraphExec_t g = probe::capture(launches, s, [&](int i) {
      const RopeSet& set = sets[i];
      CHECK_CUDA(nvfp4kv::programmatic_launch::launch(
          kernels[k], dim3(rows, 2), dim3(kThreads), s, true, reinterpret_cast<const uint4*>(set.qkv), set.positions,
          set.indptr, set.indices, reinterpret_cast<const uint4*>(table), reinterpret_cast<uint4*>(set.q_out),
          set.k_data, set.v_data, set.k_sf, set.v_sf));
    });
    std::printf("  skeleton %-13s %6.2f us\n", names[k], probe::time_graph(g, launches, s, each_sample));
    CHECK_CUDA(cudaGraphExecDestroy(g));
  }
  // The op, then two parts of it: its K/V CTAs alone (no Q heads) and everything but the placement (no row placed:
  // no index chain, no quantization, K rotated and dropped).
  const char* op_names[3] = {"the op", "the op, no Q heads", "the op, no row placed"};
  for (int k = 0; k < 3; ++k) {
    cudaGraphExec_t g = probe::capture(launches, s, [&](int i) {
      nvfp4kv::RopeParams p = op_params(sets[i], rows, table);
      if (k == 1) p.num_q_heads = 0;
      if (k == 2) p.append.nnz = 0;
      const char* error = "";
      if (nvfp4kv::launch_rope_append_paged_kv_cache(p, s, &error) != 0) {
        std::printf("launch failed: %s\n", error);
        std::exit(2);
      }
    });
    std::printf("  %-22s %6.2f us\n", op_names[k], probe::time_graph(g, launches, s, each_sample));
    CHECK_CUDA(cudaGraphExecDestroy(g));
  }
  std::printf("\n");
  for (RopeSet& set : sets) {
    probe::free_all({set.qkv, set.q_out, set.positions, set.batch, set.indptr, set.indices, set.k_data, set.v_data,
                     set.k_sf, set.v_sf});
  }
}

}  // namespace

int main() {
  cudaDeviceProp props;
  const cudaStream_t s = probe::open_device(props);
  const probe::Ceilings ceilings = probe::measure_ceilings(props, s);

  // cos | sin of the positions the sets use (any finite values do: the skeletons fold the bits).
  std::vector<float> host_table(kPageSize * kHeadDim);
  for (int i = 0; i < kPageSize; ++i) {
    for (int j = 0; j < kHeadDim / 2; ++j) {
      const double angle = i * std::pow(500000.0, -2.0 * j / kHeadDim);
      host_table[i * kHeadDim + j] = float(std::cos(angle));
      host_table[i * kHeadDim + kHeadDim / 2 + j] = float(std::sin(angle));
    }
  }
  float* table;
  CHECK_CUDA(cudaMalloc(&table, host_table.size() * 4));
  CHECK_CUDA(cudaMemcpy(table, host_table.data(), host_table.size() * 4, cudaMemcpyHostToDevice));

  std::printf("rope decode: the fused op's memory dependencies alone (skeletons), and the op\n");
  probe::L2Flush flush(props.l2CacheSize);
  std::mt19937 rng(11);
  for (int rows : {1, 8, 64, 256}) probe_rows(rows, ceilings, props.l2CacheSize, flush, table, s, rng);
  CHECK_CUDA(cudaDeviceSynchronize());
  return 0;
}
