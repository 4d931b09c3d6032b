// How the CUDA registrations run a torch-free launcher (kernels.h): on the tensors' device (with a device
// guard only when another device is current: the common case needs none, and skipping it keeps the eager
// host path short), on torch's current stream, raising a named error when the launch fails.
#pragma once

#include <torch/csrc/stable/accelerator.h>

#include <optional>

#include "current_stream.h"

namespace nvfp4kv {

template <typename Params>
void launch_on_device(int (*launcher)(const Params&, void*, const char**), const Params& params, int32_t device,
                      const char* op) {
  std::optional<torch::stable::accelerator::DeviceGuard> guard;
  if (torch::stable::accelerator::getCurrentDeviceIndex() != device) guard.emplace(device);
  const char* error_string = nullptr;
  const int error = launcher(params, current_cuda_stream(device), &error_string);
  check_cuda_launch(error, error_string, op);
}

}  // namespace nvfp4kv
