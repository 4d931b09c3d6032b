// Reading a stable-ABI boxed call's argument stack in schema order: what TORCH_BOX does for an
// unboxed kernel, minus what costs on every decode step. TORCH_BOX wraps each tensor handle in a
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

  // Checks the call against the kernel's idea of the schema (registration.cpp): `schema_args`
  // arguments, no outputs.
  void expect(const char* op, uint64_t schema_args) const;

  // The next argument. Each must be read exactly once, in schema order; TensorInfos stay valid
  // while this object lives.
  TensorInfo tensor();
  std::optional<TensorInfo> optional_tensor();
  double real();
  std::string string();

 private:
  TensorInfo own(AtenTensorHandle handle);

  StableIValue* next_;
  uint64_t num_args_;
  uint64_t num_outputs_;
  std::array<AtenTensorHandle, 16> tensors_{};
  size_t num_tensors_ = 0;
};

}  // namespace nvfp4kv
