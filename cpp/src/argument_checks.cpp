#include "argument_checks.h"

#include <cmath>

namespace nvfp4kv {

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

std::string shape_string(const Tensor& t) {
  std::ostringstream out;
  out << '[';
  for (int64_t d = 0; d < t.dim(); ++d) out << (d ? ", " : "") << t.size(d);
  out << ']';
  return out.str();
}

std::string device_string(const Tensor& t) {
  const auto device = t.device();
  std::string name;
  switch (device.type()) {
    case torch::headeronly::DeviceType::CPU: return "cpu";
    case torch::headeronly::DeviceType::CUDA: name = "cuda"; break;
    case torch::headeronly::DeviceType::Meta: return "meta";
    default: name = "device type #" + std::to_string(int(device.type()));
  }
  return device.index() >= 0 ? name + ":" + std::to_string(device.index()) : name;
}

bool same_device(const Tensor& a, const Tensor& b) {
  return a.device().type() == b.device().type() && a.device().index() == b.device().index();
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
