// Environment switches of the append kernels, read once per process: tuning aids for the benchmark's
// A/B runs (README, PERFORMANCE_LOG.md), each checked to give the same bytes
// (tests/test_cuda.py::test_every_forced_kernel_mode). NVFP4KV_PDL lives in programmatic_launch.cuh.
#pragma once

#include <cstdlib>
#include <cstring>

namespace nvfp4kv {
namespace append_tuning {

// Whether the switch `name` is on: unset or anything but "0".
inline bool on_unless_zero(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr || std::strcmp(v, "0") != 0;
}

// NVFP4KV_KERNEL=pair|oneshot|split forces a mode for vector-aligned calls (a tuning aid for the
// benchmark; "oneshot" is pair mode without the shared index chain).
enum Forced { kAuto = 0, kForcePair = 1, kForceSplit = 2, kForceOneShot = 3 };

inline int forced_mode() {
  static const int mode = [] {
    const char* v = std::getenv("NVFP4KV_KERNEL");
    if (v == nullptr) return int(kAuto);
    if (std::strcmp(v, "pair") == 0) return int(kForcePair);
    if (std::strcmp(v, "split") == 0) return int(kForceSplit);
    if (std::strcmp(v, "oneshot") == 0) return int(kForceOneShot);
    return int(kAuto);
  }();
  return mode;
}

// NVFP4KV_HOISTED_DIVISION=0 makes every mode divide per block (a tuning aid).
inline bool hoisted_division_enabled() {
  static const bool enabled = on_unless_zero("NVFP4KV_HOISTED_DIVISION");
  return enabled;
}

// NVFP4KV_SPLIT_THREADS=32|64|...|256: threads per CTA in split mode (decode), kDefaultSplitThreads
// otherwise (a tuning aid).
constexpr int kDefaultSplitThreads = 128;  // PERFORMANCE_LOG v10b

inline int split_mode_threads() {
  static const int threads = [] {
    const char* v = std::getenv("NVFP4KV_SPLIT_THREADS");
    const int n = v == nullptr ? 0 : std::atoi(v);
    return n >= 32 && n <= 256 && n % 32 == 0 ? n : kDefaultSplitThreads;
  }();
  return threads;
}

// NVFP4KV_CHAIN_WARP=0 lets warp 0 of the pair kernel quantize too in the page-table variant (a tuning aid).
inline bool chain_only_warp_enabled() {
  static const bool enabled = on_unless_zero("NVFP4KV_CHAIN_WARP");
  return enabled;
}

}  // namespace append_tuning
}  // namespace nvfp4kv
