// Host-side argument checks shared by the ops. Every failure throws std::invalid_argument (ValueError
// in Python) with a message naming the argument, what was expected and what was given. They are the
// only copy of the checks: they run whenever the op runs (eager, compiled, exported, C++), and the
// fakes (python/nvfp4kv/fake.py) only propagate shapes.
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

// A tensor's metadata, read once through the stable C shim: Tensor's accessors pay one shim call per
// size or stride and convert dtype and device through chains of shim calls on every use, and the
// checks run on every decode step. Sizes and strides are borrowed: the tensor must outlive this.
class TensorInfo {
 public:
  explicit TensorInfo(AtenTensorHandle handle);
  explicit TensorInfo(const Tensor& t) : TensorInfo(t.get()) {}

  int64_t dim() const { return dim_; }
  int64_t size(int64_t d) const { return sizes_[checked_dim(d)]; }
  // The stride of a dim of size 1 never moves an address, so it reads as 0: no check and no
  // alignment test depends on it (torch leaves such strides arbitrary).
  int64_t stride(int64_t d) const { return sizes_[checked_dim(d)] == 1 ? 0 : strides_[d]; }
  int64_t numel() const;
  ScalarType scalar_type() const { return dtype_; }
  void* data_ptr() const { return data_; }
  int32_t device_index() const { return device_index_; }
  bool same_device(const TensorInfo& other) const {
    return device_type_ == other.device_type_ && device_index_ == other.device_index_;
  }
  bool is_cpu() const { return device_type_ == aoti_torch_device_type_cpu(); }
  std::string shape_string() const;   // "[2, 16, 8, 64]"
  std::string device_string() const;  // "cpu", "cuda:0"

 private:
  int64_t checked_dim(int64_t d) const {
    if (d < 0 || d >= dim_) throw_bad_dim(d);
    return d;
  }
  [[noreturn]] void throw_bad_dim(int64_t d) const;

  int64_t dim_;
  int64_t* sizes_;
  int64_t* strides_;
  ScalarType dtype_;
  int32_t device_type_;  // the shim's device type code
  int32_t device_index_;
  void* data_;
};

std::string dtype_name(ScalarType type);  // "float16", "uint8", ... as torch prints them, for every dtype
bool is_index_dtype(ScalarType type);
int64_t element_size(ScalarType type);  // bytes; only for the dtypes the ops accept

// A positive finite global scale as the fp32 the kernels use (the double is rounded first).
float checked_global_scale(const char* op, const char* name, double scale);

}  // namespace nvfp4kv
