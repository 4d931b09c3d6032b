// Which kernel an aligned append call runs: chosen from the call's size, or forced by a test hook so
// that one process can check every kernel mode's bytes (tests/test_cuda.py, tests/test_mla.py). Not a
// user setting. The MLA latent append reads it too: "split" forces its row kernel, "pair" its chain kernel; the
// fused RoPE append: "oneshot" forces one CTA per row instead of CTAs of 128-thread chunks of a row, "split" its
// decode kernel, "pair" its rows kernel with 2 (common shape) or 4 rows per CTA.
#pragma once

#include <atomic>

namespace nvfp4kv {
namespace kernel_mode {

// "oneshot" is pair mode without the shared index chain.
enum Forced { kAuto = 0, kForcePair = 1, kForceSplit = 2, kForceOneShot = 3 };

inline std::atomic<int>& forced_storage() {
  static std::atomic<int> mode{kAuto};
  return mode;
}

inline int forced() { return forced_storage().load(std::memory_order_relaxed); }

}  // namespace kernel_mode
}  // namespace nvfp4kv
