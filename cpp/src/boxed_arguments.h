// Reading a stable-ABI boxed call's argument stack in schema order, for every op: what TORCH_BOX does
// for an unboxed kernel, minus what costs on every decode step. TORCH_BOX wraps each tensor handle in a
// shared_ptr (a heap allocation), copies the arguments once more into the kernel's parameters, and
// torch 2.13's StableIValue -> std::string conversion leaks a heap std::string per `str` argument
// (pytorch/pytorch#191340). Here each tensor handle is kept as is until the call ends.
#pragma once

#include <torch/csrc/stable/library.h>

#include <array>
#include <optional>
#include <string>

#include "argument_checks.h"

namespace nvfp4kv {

class BoxedArguments {
 public:
  BoxedArguments(StableIValue* stack, uint64_t num_args, uint64_t num_outputs);
  BoxedArguments(const BoxedArguments&) = delete;
  BoxedArguments& operator=(const BoxedArguments&) = delete;
  // Deletes every tensor handle read (the call's ownership of its arguments), under one GIL
  // acquisition when called from Python (gil_for_tensor_release.h).
  ~BoxedArguments();

  // The next argument, in schema order (registration.cpp); reading past the call's arguments throws.
  // TensorInfos stay valid while this object lives; owned_tensor() hands the handle to a Tensor.
  TensorInfo tensor();
  std::optional<TensorInfo> optional_tensor();
  torch::stable::Tensor owned_tensor();
  double real();
  std::optional<double> optional_real();
  bool flag();
  std::string string();

  // After the last read: the kernel read every argument of the registered schema, which has
  // `outputs` outputs. Catches a schema edited without its kernel.
  void finish(const char* op, uint64_t outputs) const;
  // The op's one output (after finish).
  void return_tensor(const torch::stable::Tensor& out);

 private:
  TensorInfo own(AtenTensorHandle handle);
  StableIValue& next();

  StableIValue* stack_;
  uint64_t num_args_;
  uint64_t num_outputs_;
  uint64_t num_read_ = 0;
  std::array<AtenTensorHandle, 24> tensors_{};
  size_t num_tensors_ = 0;
};

}  // namespace nvfp4kv
