#include "current_stream.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <stdexcept>
#include <string>

namespace nvfp4kv {
namespace {

// Signature of aoti_torch_get_current_cuda_stream in torch/csrc/inductor/aoti_torch/c/shim.h.
using GetCurrentCudaStream = int32_t (*)(int32_t device_index, void** stream);

GetCurrentCudaStream lookup_get_current_cuda_stream() {
  void* library = dlopen("libtorch_cuda.so", RTLD_NOLOAD | RTLD_LAZY);
  if (library == nullptr) return nullptr;
  return reinterpret_cast<GetCurrentCudaStream>(dlsym(library, "aoti_torch_get_current_cuda_stream"));
}

}  // namespace

void* current_cuda_stream(int32_t device_index) {
  static const GetCurrentCudaStream get_stream = lookup_get_current_cuda_stream();
  if (get_stream == nullptr) {
    throw std::runtime_error(
        "nvfp4kv: CUDA tensors need a CUDA build of torch, but libtorch_cuda.so (with "
        "aoti_torch_get_current_cuda_stream) is not loaded in this process");
  }
  void* stream = nullptr;
  if (get_stream(device_index, &stream) != 0) {
    throw std::runtime_error("nvfp4kv: could not get torch's current CUDA stream for device " +
                             std::to_string(device_index));
  }
  return stream;
}

bool current_cuda_stream_is_capturing(int32_t device_index) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(static_cast<cudaStream_t>(current_cuda_stream(device_index)), &status) != cudaSuccess) {
    cudaGetLastError();  // clear it: the launchers read cudaGetLastError after each launch
    return true;
  }
  return status != cudaStreamCaptureStatusNone;
}

void check_cuda_launch(int error_code, const char* error_string, const char* op) {
  if (error_code == 0) return;
  std::string message = std::string("nvfp4kv.") + op + ": CUDA kernel launch failed: " + error_string;
  if (error_code == 209 /* cudaErrorNoKernelImageForDevice */) {
    message += " (this build has code for the CUDA architectures " NVFP4KV_CUDA_ARCHITECTURES
               "; rebuild with "
               "-C cmake.define.NVFP4KV_CUDA_ARCHITECTURES including this GPU)";
  }
  throw std::runtime_error(message);
}

}  // namespace nvfp4kv
