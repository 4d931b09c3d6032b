// Host-side argument checks shared by the ops. Every failure throws std::invalid_argument (ValueError
// in Python) with a
// message naming the argument, what was expected and what was given; python/nvfp4kv/fake.py
// mirrors these checks word for word so that eager, fake and meta calls fail alike.
#pragma once

#include <torch/csrc/stable/tensor.h>

#include <sstream>
#include <stdexcept>
#include <string>

namespace nvfp4kv {

using torch::stable::Tensor;
using ScalarType = torch::headeronly::ScalarType;

template <typename... Parts>
[[noreturn]] void fail(const char* op, const Parts&... parts) {
  std::ostringstream message;
  message << "nvfp4kv." << op << ": ";
  (message << ... << parts);
  throw std::invalid_argument(message.str());
}

std::string dtype_name(ScalarType type);  // "float16", "uint8", ... as torch prints them
std::string shape_string(const Tensor& t); // "[2, 16, 8, 64]"
std::string device_string(const Tensor& t); // "cpu", "cuda:0"
bool same_device(const Tensor& a, const Tensor& b);
bool is_index_dtype(ScalarType type);

// A positive finite global scale as the fp32 the kernels use (the double is rounded first).
float checked_global_scale(const char* op, const char* name, double scale);

}  // namespace nvfp4kv
