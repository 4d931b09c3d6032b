// Timing for the standalone ceiling probes (tools/ceiling_probe.cu, tools/rope_decode_probe.cu), the way
// `python -m nvfp4kv.bench` times the op: per launch inside a CUDA graph of launches over input sets, the median
// of kSamples replays; the same program's 2 GiB device-to-device copy and empty-kernel graph as the ceilings.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <initializer_list>
#include <vector>

#include "../tests/gpu/check_cuda.h"

namespace probe {

constexpr int kSamples = 25;

__global__ void empty_kernel() {}

__global__ void read_all(const uint4* p, size_t n, uint32_t* sink) {  // the L2 flush
  uint32_t x = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint4 v = p[i];
    x ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (x == 0x9E3779B9u) *sink = x;  // keeps the loads
}

// Reads twice the L2's bytes, so that the next kernel finds none of its inputs there.
struct L2Flush {
  uint4* buffer = nullptr;
  size_t words = 0;
  uint32_t* sink = nullptr;
  explicit L2Flush(size_t l2_bytes) {
    words = 2 * l2_bytes / sizeof(uint4);
    CHECK_CUDA(cudaMalloc(&buffer, words * sizeof(uint4)));
    CHECK_CUDA(cudaMemset(buffer, 1, words * sizeof(uint4)));
    CHECK_CUDA(cudaMalloc(&sink, 4));
  }
  void operator()(cudaStream_t s) const { read_all<<<1056, 512, 0, s>>>(buffer, words, sink); }
};

// Median over kSamples replays of `graph` (after 2 warm-up replays), divided by `launches`, in us.
inline double time_graph(cudaGraphExec_t graph, int launches, cudaStream_t s, const L2Flush* flush) {
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  for (int i = 0; i < 2; ++i) CHECK_CUDA(cudaGraphLaunch(graph, s));
  std::vector<double> times;
  for (int i = 0; i < kSamples; ++i) {
    if (flush != nullptr) (*flush)(s);
    CHECK_CUDA(cudaEventRecord(start, s));
    CHECK_CUDA(cudaGraphLaunch(graph, s));
    CHECK_CUDA(cudaEventRecord(stop, s));
    CHECK_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(ms * 1e3 / launches);
  }
  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// A graph of the launches `record(i)` makes on the capturing stream, i = 0 .. launches - 1.
inline cudaGraphExec_t capture(int launches, cudaStream_t s, const std::function<void(int)>& record) {
  cudaGraph_t graph;
  CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < launches; ++i) record(i);
  CHECK_CUDA(cudaStreamEndCapture(s, &graph));
  cudaGraphExec_t exec;
  CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  CHECK_CUDA(cudaGraphDestroy(graph));
  return exec;
}

// The first GPU's properties and a stream to time on.
inline cudaStream_t open_device(cudaDeviceProp& props) {
  CHECK_CUDA(cudaGetDeviceProperties(&props, 0));
  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return s;
}

inline void free_all(std::initializer_list<void*> buffers) {
  for (void* p : buffers) CHECK_CUDA(cudaFree(p));
}

struct Ceilings {
  double copy_gbps;  // a 2 GiB device-to-device copy, read + write bytes
  double floor_us;   // an empty kernel per launch in a graph
};

// Measures both ceilings and prints them with the GPU's name.
inline Ceilings measure_ceilings(const cudaDeviceProp& props, cudaStream_t s) {
  const size_t copy_bytes = size_t(2) << 30;
  void *src, *dst;
  CHECK_CUDA(cudaMalloc(&src, copy_bytes));
  CHECK_CUDA(cudaMalloc(&dst, copy_bytes));
  CHECK_CUDA(cudaMemset(src, 1, copy_bytes));
  // Eager, as torch's copy_ in the bench (a memcpy node in a graph runs slower at this size).
  std::vector<double> copy_times;
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  for (int i = 0; i < kSamples + 3; ++i) {
    CHECK_CUDA(cudaEventRecord(start, s));
    CHECK_CUDA(cudaMemcpyAsync(dst, src, copy_bytes, cudaMemcpyDeviceToDevice, s));
    CHECK_CUDA(cudaEventRecord(stop, s));
    CHECK_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
    if (i >= 3) copy_times.push_back(ms * 1e3);
  }
  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
  std::sort(copy_times.begin(), copy_times.end());
  Ceilings c{};
  c.copy_gbps = 2.0 * copy_bytes / copy_times[copy_times.size() / 2] / 1e3;
  CHECK_CUDA(cudaFree(src));
  CHECK_CUDA(cudaFree(dst));
  cudaGraphExec_t empty = capture(1000, s, [&](int) { empty_kernel<<<1, 32, 0, s>>>(); });
  c.floor_us = time_graph(empty, 1000, s, nullptr);
  CHECK_CUDA(cudaGraphExecDestroy(empty));
  std::printf("%s, %d SMs, L2 %.0f MiB: copy ceiling %.0f GB/s (2 GiB), launch floor %.2f us\n\n", props.name,
              props.multiProcessorCount, props.l2CacheSize / 1048576.0, c.copy_gbps, c.floor_us);
  return c;
}

}  // namespace probe
