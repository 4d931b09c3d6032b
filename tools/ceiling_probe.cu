// What no append kernel can beat on this GPU, measured the way `python -m nvfp4kv.bench` times the op
// (run by tests/gpu/run_device.sh, stage "probe"; prints a table):
//
//   1. stream: kernels that move exactly a prefill case's bytes - per 16-value block 32 bytes read,
//      8 + 1 bytes written - and compute nothing but an XOR of what they read, best of several launch
//      shapes (thread-contiguous blocks like the op's pair kernel, warp-coalesced blocks, grid-stride
//      loops). Per launch inside a CUDA graph of launches over buffer sets rotated through > 4.5x L2.
//   2. chain: decode's memory latency alone: a thread per block reads its 32 bytes and stores 9 at an
//      address found through 0, 1 (slot mapping) or 2 (page table with the op's b == row guess)
//      dependent index loads; the page table plus the op's quantization of the block; and the op
//      itself (this file compiles the op's kernels in and calls launch_append_paged_kv_cache on the
//      same sets). Programmatic launch on and off; per launch inside a CUDA graph of 1024 launches
//      over rotated sets, L2 flushed before each sample when they do not fill 4.5x L2.
//
// Ratios are to this program's own 2 GiB device-to-device copy and empty-kernel graph.
// Build and run from the repository root: tests/gpu/run_device.sh probe (its nvcc command).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "cuda/append_paged_kv_cache_kernel.cu"  // the op's own kernels and launcher
#include "cuda/block_quantizer.cuh"
#include "cuda/programmatic_launch.cuh"
#include "probe_timing.cuh"

namespace {

constexpr int kThreads = 256;
constexpr int kHeads = 8;
constexpr int kPageSize = 16;

using probe::capture;
using probe::L2Flush;
using probe::time_graph;

__device__ __forceinline__ uint2 fold(uint4 lo, uint4 hi) {
  return make_uint2(lo.x ^ lo.z ^ hi.x ^ hi.z, lo.y ^ lo.w ^ hi.y ^ hi.w);
}
__device__ __forceinline__ uint8_t fold_byte(uint2 d) { return uint8_t(d.x ^ (d.y >> 8)); }

// --- 1. stream ------------------------------------------------------------------------------------

// Block b: in[2b], in[2b + 1] -> data[b], sf[b]. A thread takes kPerThread blocks: consecutive ones
// (kCoalesced false: the op's pair kernel, 32 kPerThread contiguous bytes per thread) or one per
// kThreads-block stride (each load instruction of a warp reads 512 contiguous bytes). kLoop: a
// grid-stride loop over such chunks instead of one chunk per thread.
template <int kPerThread, bool kCoalesced, bool kLoop>
__global__ void __launch_bounds__(kThreads)
    stream_blocks(const uint4* __restrict__ in, uint2* __restrict__ data, uint8_t* __restrict__ sf, uint32_t blocks) {
  constexpr uint32_t kChunk = kThreads * kPerThread;
  const uint32_t step = kLoop ? gridDim.x * kChunk : blocks;
  for (uint32_t base = blockIdx.x * kChunk; base < blocks; base += step) {
    uint4 lo[kPerThread], hi[kPerThread];
    uint32_t b[kPerThread];
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      b[j] = kCoalesced ? base + j * kThreads + threadIdx.x : base + threadIdx.x * kPerThread + j;
      if (b[j] < blocks) {
        lo[j] = in[2 * size_t(b[j])];
        hi[j] = in[2 * size_t(b[j]) + 1];
      }
    }
    if constexpr (!kCoalesced && kPerThread % 2 == 0) {
      if (b[kPerThread - 1] < blocks) {  // blocks is a multiple of kPerThread: all or none
        uint8_t bytes[kPerThread];
#pragma unroll
        for (int j = 0; j < kPerThread; j += 2) {
          const uint2 d0 = fold(lo[j], hi[j]), d1 = fold(lo[j + 1], hi[j + 1]);
          reinterpret_cast<uint4*>(data)[b[j] / 2] = make_uint4(d0.x, d0.y, d1.x, d1.y);
          bytes[j] = fold_byte(d0);
          bytes[j + 1] = fold_byte(d1);
        }
        if constexpr (kPerThread == 2) {
          reinterpret_cast<uint16_t*>(sf)[b[0] / 2] = uint16_t(bytes[0] | bytes[1] << 8);
        } else {
#pragma unroll
          for (int j = 0; j < kPerThread; j += 4) {
            reinterpret_cast<uint32_t*>(sf)[b[j] / 4] =
                bytes[j] | bytes[j + 1] << 8 | bytes[j + 2] << 16 | uint32_t(bytes[j + 3]) << 24;
          }
        }
      }
    } else {
#pragma unroll
      for (int j = 0; j < kPerThread; ++j) {
        if (b[j] < blocks) {
          const uint2 d = fold(lo[j], hi[j]);
          data[b[j]] = d;
          sf[b[j]] = fold_byte(d);
        }
      }
    }
  }
}

struct StreamSet {
  uint4* in;
  uint8_t* copy;  // the same-size copy's destination
  uint2* data;
  uint8_t* sf;
};

struct StreamShape {
  const char* name;
  void (*kernel)(const uint4*, uint2*, uint8_t*, uint32_t);
  int per_thread;
  int ctas_per_sm;  // 0: one chunk per thread (grid covers the call)
};

const StreamShape kStreamShapes[] = {
    {"contiguous x2 (the op's pair kernel)", stream_blocks<2, false, false>, 2, 0},
    {"contiguous x4", stream_blocks<4, false, false>, 4, 0},
    {"contiguous x1", stream_blocks<1, false, false>, 1, 0},
    {"coalesced x1", stream_blocks<1, true, false>, 1, 0},
    {"coalesced x2", stream_blocks<2, true, false>, 2, 0},
    {"coalesced x4", stream_blocks<4, true, false>, 4, 0},
    {"coalesced x8", stream_blocks<8, true, false>, 8, 0},
    {"coalesced x2, grid-stride 4 CTAs/SM", stream_blocks<2, true, true>, 2, 4},
    {"coalesced x2, grid-stride 8 CTAs/SM", stream_blocks<2, true, true>, 2, 8},
    {"coalesced x4, grid-stride 4 CTAs/SM", stream_blocks<4, true, true>, 4, 4},
};

struct PrefillCase {
  const char* name;
  int nnz;
  int head_dim;
  double target;  // the speed this case is meant to reach, as a fraction of the copy ceiling
};

void probe_stream(const PrefillCase& c, size_t l2_bytes, int sms, double ceiling_gbps, cudaStream_t s) {
  const uint32_t blocks = uint32_t(2) * c.nnz * kHeads * c.head_dim / 16;  // K and V
  const size_t bytes = size_t(blocks) * (32 + 8 + 1);
  const int count = std::max(2, std::min(64, int((4.5 * l2_bytes + bytes - 1) / bytes)));
  std::vector<StreamSet> sets(count);
  for (StreamSet& set : sets) {
    CHECK_CUDA(cudaMalloc(&set.in, size_t(blocks) * 32));
    CHECK_CUDA(cudaMalloc(&set.data, size_t(blocks) * 8));
    CHECK_CUDA(cudaMalloc(&set.sf, blocks));
    CHECK_CUDA(cudaMalloc(&set.copy, bytes / 2));
    CHECK_CUDA(cudaMemset(set.in, 0x3F, size_t(blocks) * 32));
  }
  auto report = [&](const char* shape, double us) {
    const double gbps = bytes / us / 1e3;
    std::printf("  %-40s %9.2f us %7.0f GB/s %6.1f%%\n", shape, us, gbps, 100 * gbps / ceiling_gbps);
    return us;
  };
  std::printf("%s: %.1f MB moved, %d sets, target %.0f%% = %.2f us\n", c.name, bytes / 1e6, count, 100 * c.target,
              bytes / (c.target * ceiling_gbps * 1e3));
  double best = 1e30;
  std::string best_name;
  for (const StreamShape& shape : kStreamShapes) {
    const uint32_t chunk = kThreads * shape.per_thread;
    const uint32_t grid = shape.ctas_per_sm ? std::min<uint32_t>(sms * shape.ctas_per_sm, (blocks + chunk - 1) / chunk)
                                            : (blocks + chunk - 1) / chunk;
    cudaGraphExec_t g = capture(
        count, s, [&](int i) { shape.kernel<<<grid, kThreads, 0, s>>>(sets[i].in, sets[i].data, sets[i].sf, blocks); });
    const double us = report(shape.name, time_graph(g, count, s, nullptr));
    if (us < best) best = us, best_name = shape.name;
    CHECK_CUDA(cudaGraphExecDestroy(g));
  }
  // A plain copy of the same bytes (half read, half written): the bench's "copy" column.
  cudaGraphExec_t g = capture(count, s, [&](int i) {
    CHECK_CUDA(cudaMemcpyAsync(sets[i].copy, sets[i].in, bytes / 2, cudaMemcpyDeviceToDevice, s));
  });
  report("cudaMemcpyAsync of the same bytes", time_graph(g, count, s, nullptr));
  CHECK_CUDA(cudaGraphExecDestroy(g));
  const double best_gbps = bytes / best / 1e3;
  std::printf("  => best %s: %.1f%% of the copy ceiling (target %.0f%%)\n\n", best_name.c_str(),
              100 * best_gbps / ceiling_gbps, 100 * c.target);
  for (StreamSet& set : sets) probe::free_all({set.in, set.data, set.sf, set.copy});
}

// --- 2. chain -------------------------------------------------------------------------------------

constexpr uint32_t kBlocksPerRow = 2 * kHeads * 128 / 16;  // K and V of 8 heads, head_dim 128

// One thread per block of a decode row: read 32 bytes, find the row's slot through kLevels dependent
// index loads, store 8 + 1 bytes there: an XOR of the input, or (kQuantize) the op's decode
// quantization of the block (bf16, global scale s, block_quantizer::quantize_blocks' split-mode
// arithmetic). kLevels 0: slot = row; 1: slot = first[row] (slot mapping); 2: page = indices[second[row]
// + first[row] / 16] with first = position, second = kv_indptr read at the row (the op's guess
// b == row), slot = page * 16 + position % 16.
template <int kLevels, bool kQuantize>
__global__ void __launch_bounds__(kThreads)
    chain_blocks(const uint4* __restrict__ in, const int* __restrict__ first, const int* __restrict__ second,
                 const int* __restrict__ indices, uint2* __restrict__ data, uint8_t* __restrict__ sf, uint32_t rows,
                 float s) {
  nvfp4kv::programmatic_launch::wait_for_previous_kernel();
  nvfp4kv::programmatic_launch::allow_next_kernel();
  const uint32_t t = blockIdx.x * kThreads + threadIdx.x;
  if (t >= rows * kBlocksPerRow) return;
  const uint32_t row = t / kBlocksPerRow, block = t - row * kBlocksPerRow;
  const uint4 lo = in[2 * size_t(t)], hi = in[2 * size_t(t) + 1];
  size_t slot = row;
  if constexpr (kLevels == 1) slot = uint32_t(first[row]);
  if constexpr (kLevels == 2) {
    const int position = first[row], start = second[row];
    slot = size_t(uint32_t(indices[start + position / kPageSize])) * kPageSize + position % kPageSize;
  }
  uint2 d = fold(lo, hi);
  uint8_t byte = fold_byte(d);
  if constexpr (kQuantize) {
    const uint32_t w[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    const float six_s = 6.0f * s, division = 0.0f;
    const float* no_table = nullptr;
    nvfp4kv::block_quantizer::quantize_blocks<true, 1, false>(w, &s, &six_s, &division, &no_table, &d, &byte);
  }
  data[slot * kBlocksPerRow + block] = d;
  sf[slot * kBlocksPerRow + block] = byte;
}

struct ChainSet {
  uint4* in;
  int* first;
  int* second;
  int* indptr;
  int* indices;
  uint2* data;
  uint8_t* sf;
};

// The op's parameters for set `set` (bf16 K then V rows in set.in, NHD caches in set.data / set.sf,
// request r = row r with one page, batch_indices = second = r, kv_indptr = indptr).
nvfp4kv::AppendParams op_params(const ChainSet& set, int rows) {
  nvfp4kv::AppendParams p{};
  const int64_t values = int64_t(rows) * kHeads * 128;
  const uint16_t* keys = reinterpret_cast<const uint16_t*>(set.in);
  p.key = {keys, kHeads * 128, 128};
  p.value = {keys + values, kHeads * 128, 128};
  p.input_is_bf16 = true;
  p.batch_indices = {set.second, 1, rows, false};
  p.positions = {set.first, 1, rows, false};
  p.kv_indices = {set.indices, 1, rows, false};
  p.kv_indptr = {set.indptr, 1, rows + 1, false};
  uint8_t* data = reinterpret_cast<uint8_t*>(set.data);
  const int64_t page_data = kPageSize * kHeads * 64, page_scales = kPageSize * kHeads * 8;
  p.k_data = {data, page_data, kHeads * 64, 64};
  p.v_data = {data + rows * page_data, page_data, kHeads * 64, 64};
  p.k_scales = {set.sf, page_scales, kHeads * 8, 8};
  p.v_scales = {set.sf + rows * page_scales, page_scales, kHeads * 8, 8};
  p.nnz = rows;
  p.num_heads = kHeads;
  p.head_dim = 128;
  p.page_size = kPageSize;
  p.num_pages = rows;
  p.batch_size = rows;
  p.k_scale = p.v_scale = 1.0f / 2688;
  return p;
}

void probe_chain(int rows, double target_us, size_t l2_bytes, const L2Flush& flush, cudaStream_t s, std::mt19937& rng) {
  const size_t per_set = size_t(rows) * kBlocksPerRow * (32 + 9) + size_t(rows) * 12;
  const int count = std::max(2, std::min(1024, int((4.5 * l2_bytes + per_set - 1) / per_set)));
  const bool flushed = count * per_set < 4.5 * l2_bytes;
  std::vector<ChainSet> sets(count);
  std::vector<int> position(rows), start(rows), page(rows), slot(rows);
  for (ChainSet& set : sets) {  // one page per request, the row at a random slot of it
    for (int r = 0; r < rows; ++r) page[r] = r;
    std::shuffle(page.begin(), page.end(), rng);
    for (int r = 0; r < rows; ++r) {
      position[r] = int(rng() % kPageSize);
      start[r] = r;
      slot[r] = page[r] * kPageSize + position[r];
    }
    CHECK_CUDA(cudaMalloc(&set.in, size_t(rows) * kBlocksPerRow * 32));
    CHECK_CUDA(cudaMemset(set.in, 0x3F, size_t(rows) * kBlocksPerRow * 32));  // bf16 0.746
    CHECK_CUDA(cudaMalloc(&set.first, rows * 4 * 2));
    CHECK_CUDA(cudaMalloc(&set.second, rows * 4));
    CHECK_CUDA(cudaMalloc(&set.indptr, (rows + 1) * 4));
    CHECK_CUDA(cudaMemcpy(set.indptr + 1, start.data(), rows * 4, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(set.indptr + rows, &rows, 4, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMalloc(&set.indices, rows * 4));
    CHECK_CUDA(cudaMemcpy(set.first, position.data(), rows * 4, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(set.first + rows, slot.data(), rows * 4, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(set.second, start.data(), rows * 4, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(set.indices, page.data(), rows * 4, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMalloc(&set.data, size_t(rows) * kPageSize * kBlocksPerRow * 8));
    CHECK_CUDA(cudaMalloc(&set.sf, size_t(rows) * kPageSize * kBlocksPerRow));
  }
  const uint32_t grid = (rows * kBlocksPerRow + kThreads - 1) / kThreads;
  std::printf("decode nnz=%d (target %.1f us; %d sets%s):", rows, target_us, count, flushed ? ", L2 flushed" : "");
  using Kernel = void (*)(const uint4*, const int*, const int*, const int*, uint2*, uint8_t*, uint32_t, float);
  const Kernel kernels[4] = {chain_blocks<0, false>, chain_blocks<1, false>, chain_blocks<2, false>,
                             chain_blocks<2, true>};
  const char* names[4] = {"no index", "slot mapping", "page table", "page table + quantize"};
  for (int pdl = 1; pdl >= 0; --pdl) {
    std::printf("\n  %s:", pdl ? "programmatic launch" : "plain launch       ");
    const int launches = std::min(count, 1024);
    for (int k = 0; k < 4; ++k) {
      cudaGraphExec_t g = capture(launches, s, [&](int i) {
        const ChainSet& set = sets[i % count];
        const int* first = k == 1 ? set.first + rows : set.first;  // slot mapping: the slots
        CHECK_CUDA(nvfp4kv::programmatic_launch::launch(kernels[k], dim3(grid), dim3(kThreads), s, pdl != 0, set.in,
                                                        first, set.second, set.indices, set.data, set.sf,
                                                        uint32_t(rows), 1.0f / 2688));
      });
      std::printf("  %s %.2f us", names[k], time_graph(g, launches, s, flushed ? &flush : nullptr));
      CHECK_CUDA(cudaGraphExecDestroy(g));
    }
    if (pdl) {  // the op launches programmatically unless NVFP4KV_PDL=0 (read once per process)
      cudaGraphExec_t g = capture(launches, s, [&](int i) {
        const char* error = "";
        if (nvfp4kv::launch_append_paged_kv_cache(op_params(sets[i % count], rows), s, &error) != 0) {
          std::printf("launch failed: %s\n", error);
          std::exit(2);
        }
      });
      std::printf("  the op %.2f us", time_graph(g, launches, s, flushed ? &flush : nullptr));
      CHECK_CUDA(cudaGraphExecDestroy(g));
    }
  }
  std::printf("\n");
  for (ChainSet& set : sets)
    probe::free_all({set.in, set.first, set.second, set.indptr, set.indices, set.data, set.sf});
}

}  // namespace

int main() {
  cudaDeviceProp props;
  const cudaStream_t s = probe::open_device(props);
  const size_t l2 = props.l2CacheSize;

  const probe::Ceilings ceilings = probe::measure_ceilings(props, s);
  const double ceiling = ceilings.copy_gbps;

  std::printf("1. stream: only the bytes of each prefill case (32 read, 9 written per 16-value block)\n");
  const PrefillCase cases[] = {{"prefill nnz=4096 D=128", 4096, 128, 0.9},
                               {"prefill nnz=16384 D=128", 16384, 128, 0.9},
                               {"prefill nnz=65536 D=128", 65536, 128, 0.9},
                               {"prefill nnz=16384 D=64", 16384, 64, 0.8},
                               {"prefill nnz=16384 D=256", 16384, 256, 0.8}};
  for (const PrefillCase& c : cases) probe_stream(c, l2, props.multiProcessorCount, ceiling, s);

  std::printf("2. chain: decode's dependent loads alone (read a block, store it where the indices say)\n");
  L2Flush flush(l2);
  std::mt19937 rng(7);
  const int rows[] = {1, 8, 64, 256, 1024};
  const double targets[] = {1.8, 1.8, 1.8, 2.5, 4.0};
  for (int i = 0; i < 5; ++i) probe_chain(rows[i], targets[i], l2, flush, s, rng);
  CHECK_CUDA(cudaDeviceSynchronize());
  return 0;
}
