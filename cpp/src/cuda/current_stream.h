// Torch's current CUDA stream, found at run time in the already-loaded libtorch_cuda.so, so the
// library builds against CPU-only torch and links nothing but libtorch_cpu.so.
#pragma once

#include <cstdint>

namespace nvfp4kv {

// The cudaStream_t torch would launch on for `device_index` (after a device guard selected it).
void* current_cuda_stream(int32_t device_index);

// Whether that stream is capturing a CUDA graph; a stream whose capture status cannot be read counts
// as capturing (e.g. the legacy default stream while another stream captures in global mode).
bool current_cuda_stream_is_capturing(int32_t device_index);

// Raises a clear error for a failed CUDA launch (e.g. no kernel image for the running GPU).
void check_cuda_launch(int error_code, const char* error_string, const char* op);

}  // namespace nvfp4kv
