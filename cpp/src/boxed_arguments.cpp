#include "boxed_arguments.h"

#include "gil_for_tensor_release.h"

namespace nvfp4kv {

BoxedArguments::BoxedArguments(StableIValue* stack, uint64_t num_args, uint64_t num_outputs)
    : stack_(stack), num_args_(num_args), num_outputs_(num_outputs) {}

StableIValue& BoxedArguments::next() {
  STD_TORCH_CHECK(num_read_ < num_args_, "nvfp4kv: the kernel reads more arguments than the registered schema's ",
                  num_args_);
  return stack_[num_read_++];
}

void BoxedArguments::finish(const char* op, uint64_t outputs) const {
  STD_TORCH_CHECK(num_read_ == num_args_ && num_outputs_ == outputs, "nvfp4kv.", op, ": the registered schema has ",
                  num_args_, " arguments and ", num_outputs_, " outputs, the kernel reads ", num_read_, " and returns ",
                  outputs);
}

void BoxedArguments::return_tensor(const torch::stable::Tensor& out) { stack_[0] = torch::stable::detail::from(out); }

BoxedArguments::~BoxedArguments() {
  if (num_tensors_ == 0) return;
  const GilForTensorRelease gil;
  for (size_t i = 0; i < num_tensors_; ++i) aoti_torch_delete_tensor_object(tensors_[i]);
}

TensorInfo BoxedArguments::own(AtenTensorHandle handle) {
  STD_TORCH_CHECK(num_tensors_ < tensors_.size(), "nvfp4kv: too many tensor arguments");
  tensors_[num_tensors_++] = handle;
  return TensorInfo(handle);
}

TensorInfo BoxedArguments::tensor() { return own(torch::stable::detail::to<AtenTensorHandle>(next())); }

std::optional<TensorInfo> BoxedArguments::optional_tensor() {
  // None, or a heap StableIValue holding the handle (freed by the conversion).
  const auto handle = torch::stable::detail::to<std::optional<AtenTensorHandle>>(next());
  if (!handle) return std::nullopt;
  return own(*handle);
}

torch::stable::Tensor BoxedArguments::owned_tensor() {
  return torch::stable::Tensor(torch::stable::detail::to<AtenTensorHandle>(next()));
}

double BoxedArguments::real() { return torch::stable::detail::to<double>(next()); }

std::optional<double> BoxedArguments::optional_real() {
  return torch::stable::detail::to<std::optional<double>>(next());
}

bool BoxedArguments::flag() { return torch::stable::detail::to<bool>(next()); }

std::string BoxedArguments::string() {
  const auto handle = torch::stable::detail::to<StringHandle>(next());
  const char* data = nullptr;
  size_t length = 0;
  STABLE_TORCH_ERROR_CODE_CHECK(torch_string_c_str(handle, &data));
  STABLE_TORCH_ERROR_CODE_CHECK(torch_string_length(handle, &length));
  std::string value(data, length);
  STABLE_TORCH_ERROR_CODE_CHECK(torch_delete_string(handle));
  return value;
}

}  // namespace nvfp4kv
