#include "argument_checks.h"

#include <array>
#include <cmath>
#include <utility>

namespace nvfp4kv {
namespace {

// The shim's codes of the dtypes the ops take, looked up once. Any other dtype is only ever named in
// an error: its shim code is its c10 ScalarType value (torch's shim defines each code that way), read
// directly because torch's conversion refuses dtypes the stable ABI does not list (bits8, uint1, ...).
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
  return static_cast<ScalarType>(code);
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
  // torch's Python names (str(torch.dtype) without "torch."), so eager and fake messages agree.
  switch (type) {
    case ScalarType::Byte: return "uint8";
    case ScalarType::Char: return "int8";
    case ScalarType::Short: return "int16";
    case ScalarType::Int: return "int32";
    case ScalarType::Long: return "int64";
    case ScalarType::Half: return "float16";
    case ScalarType::Float: return "float32";
    case ScalarType::Double: return "float64";
    case ScalarType::ComplexHalf: return "complex32";
    case ScalarType::ComplexFloat: return "complex64";
    case ScalarType::ComplexDouble: return "complex128";
    case ScalarType::Bool: return "bool";
    case ScalarType::QInt8: return "qint8";
    case ScalarType::QUInt8: return "quint8";
    case ScalarType::QInt32: return "qint32";
    case ScalarType::BFloat16: return "bfloat16";
    case ScalarType::QUInt4x2: return "quint4x2";
    case ScalarType::QUInt2x4: return "quint2x4";
    case ScalarType::Bits1x8: return "bits1x8";
    case ScalarType::Bits2x4: return "bits2x4";
    case ScalarType::Bits4x2: return "bits4x2";
    case ScalarType::Bits8: return "bits8";
    case ScalarType::Bits16: return "bits16";
    case ScalarType::Float8_e5m2: return "float8_e5m2";
    case ScalarType::Float8_e4m3fn: return "float8_e4m3fn";
    case ScalarType::Float8_e5m2fnuz: return "float8_e5m2fnuz";
    case ScalarType::Float8_e4m3fnuz: return "float8_e4m3fnuz";
    case ScalarType::UInt16: return "uint16";
    case ScalarType::UInt32: return "uint32";
    case ScalarType::UInt64: return "uint64";
    case ScalarType::UInt1: return "uint1";
    case ScalarType::UInt2: return "uint2";
    case ScalarType::UInt3: return "uint3";
    case ScalarType::UInt4: return "uint4";
    case ScalarType::UInt5: return "uint5";
    case ScalarType::UInt6: return "uint6";
    case ScalarType::UInt7: return "uint7";
    case ScalarType::Int1: return "int1";
    case ScalarType::Int2: return "int2";
    case ScalarType::Int3: return "int3";
    case ScalarType::Int4: return "int4";
    case ScalarType::Int5: return "int5";
    case ScalarType::Int6: return "int6";
    case ScalarType::Int7: return "int7";
    case ScalarType::Float8_e8m0fnu: return "float8_e8m0fnu";
    case ScalarType::Float4_e2m1fn_x2: return "float4_e2m1fn_x2";
    // Codes newer than the torch headers this builds against (the stable ABI passes them through):
    case static_cast<ScalarType>(46): return "bcomplex32";  // torch 2.14
    default: return "an unknown dtype (scalar type code " + std::to_string(int(type)) + ")";
  }
}

bool is_index_dtype(ScalarType type) { return type == ScalarType::Int || type == ScalarType::Long; }

int64_t element_size(ScalarType type) {
  switch (type) {
    case ScalarType::Half:
    case ScalarType::BFloat16: return 2;
    case ScalarType::Int:
    case ScalarType::Float: return 4;
    case ScalarType::Long: return 8;
    default: return 1;
  }
}

float checked_global_scale(const char* op, const char* name, double scale) {
  const float value = static_cast<float>(scale);
  if (!(value > 0.0f) || !std::isfinite(value)) {
    fail(op, name, " must be a positive finite global decode scale in float32, got ", scale);
  }
  return value;
}

}  // namespace nvfp4kv
