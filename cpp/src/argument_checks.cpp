#include "argument_checks.h"

#include <array>
#include <cmath>
#include <utility>

namespace nvfp4kv {
namespace {

// The shim's codes of the dtypes the ops take, looked up once; any other dtype goes through torch's
// conversion (a chain of shim calls, only met on the way to an error).
ScalarType to_scalar_type(int32_t code) {
  static const std::array<std::pair<int32_t, ScalarType>, 7> common{{
      {aoti_torch_dtype_uint8(), ScalarType::Byte},
      {aoti_torch_dtype_float8_e4m3fn(), ScalarType::Float8_e4m3fn},
      {aoti_torch_dtype_bfloat16(), ScalarType::BFloat16},
      {aoti_torch_dtype_float16(), ScalarType::Half},
      {aoti_torch_dtype_int32(), ScalarType::Int},
      {aoti_torch_dtype_int64(), ScalarType::Long},
      {aoti_torch_dtype_float32(), ScalarType::Float},
  }};
  for (const auto& [shim_code, type] : common) {
    if (shim_code == code) return type;
  }
  return torch::stable::detail::to<ScalarType>(torch::stable::detail::from(code));
}

}  // namespace

TensorInfo::TensorInfo(AtenTensorHandle handle) {
  int32_t dtype;
  STABLE_TORCH_ERROR_CODE_CHECK(aoti_torch_get_dim(handle, &dim_));
  STABLE_TORCH_ERROR_CODE_CHECK(aoti_torch_get_sizes(handle, &sizes_));
  STABLE_TORCH_ERROR_CODE_CHECK(aoti_torch_get_strides(handle, &strides_));
  STABLE_TORCH_ERROR_CODE_CHECK(aoti_torch_get_dtype(handle, &dtype));
  STABLE_TORCH_ERROR_CODE_CHECK(aoti_torch_get_device_type(handle, &device_type_));
  STABLE_TORCH_ERROR_CODE_CHECK(aoti_torch_get_device_index(handle, &device_index_));
  STABLE_TORCH_ERROR_CODE_CHECK(aoti_torch_get_data_ptr(handle, &data_));
  dtype_ = to_scalar_type(dtype);
}

void TensorInfo::throw_bad_dim(int64_t d) const {
  throw std::out_of_range("nvfp4kv: dim " + std::to_string(d) + " of a " + std::to_string(dim_) + "-D tensor");
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d = 0; d < dim_; ++d) n *= sizes_[d];
  return n;
}

std::string TensorInfo::shape_string() const {
  std::ostringstream out;
  out << '[';
  for (int64_t d = 0; d < dim_; ++d) out << (d ? ", " : "") << sizes_[d];
  out << ']';
  return out.str();
}

std::string TensorInfo::device_string() const {
  const auto type = torch::stable::detail::to<torch::headeronly::DeviceType>(torch::stable::detail::from(device_type_));
  std::string name;
  switch (type) {
    case torch::headeronly::DeviceType::CPU: return "cpu";
    case torch::headeronly::DeviceType::CUDA: name = "cuda"; break;
    case torch::headeronly::DeviceType::Meta: return "meta";
    default: name = "device type #" + std::to_string(int(type));
  }
  return device_index_ >= 0 ? name + ":" + std::to_string(device_index_) : name;
}

std::string dtype_name(ScalarType type) {
  switch (type) {
    case ScalarType::Byte: return "uint8";
    case ScalarType::Char: return "int8";
    case ScalarType::Short: return "int16";
    case ScalarType::Int: return "int32";
    case ScalarType::Long: return "int64";
    case ScalarType::Half: return "float16";
    case ScalarType::BFloat16: return "bfloat16";
    case ScalarType::Float: return "float32";
    case ScalarType::Double: return "float64";
    case ScalarType::Bool: return "bool";
    case ScalarType::Float8_e4m3fn: return "float8_e4m3fn";
    case ScalarType::Float8_e5m2: return "float8_e5m2";
    default: return "scalar type #" + std::to_string(int(type));
  }
}

bool is_index_dtype(ScalarType type) { return type == ScalarType::Int || type == ScalarType::Long; }

float checked_global_scale(const char* op, const char* name, double scale) {
  const float value = static_cast<float>(scale);
  if (!(value > 0.0f) || !std::isfinite(value)) {
    fail(op, name, " must be a positive finite float32 value, got ", scale);
  }
  return value;
}

}  // namespace nvfp4kv
