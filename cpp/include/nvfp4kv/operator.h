// Calling an nvfp4kv operator through the c10 dispatcher (used by the C++ API headers).
//
// Arguments are matched to the registered schema by NAME, and every schema argument the caller does
// not pass takes its schema default, so the C++ API keeps working when an op gains a trailing
// defaulted argument. The kernels are boxed (they are registered through the stable ABI), so a boxed
// call costs nothing extra.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <initializer_list>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace nvfp4kv {
namespace detail {

// The registered operator; a clear error when libnvfp4kv.so is not loaded.
inline c10::OperatorHandle find_op(const char* name) {
  const auto handle = c10::Dispatcher::singleton().findSchema({name, ""});
  if (!handle.has_value()) {
    throw std::runtime_error(std::string("nvfp4kv: operator ") + name +
                             " is not registered; link the CMake target nvfp4kv::nvfp4kv (which loads "
                             "libnvfp4kv.so at program start) or load the library before calling it");
  }
  return *handle;
}

struct NamedArgument {
  std::string_view name;
  c10::IValue value;
};

// Calls `op` with the named arguments (schema defaults for the others); returns the outputs.
template <typename Arguments>
inline torch::jit::Stack call_with(const c10::OperatorHandle& op, const Arguments& arguments) {
  const c10::FunctionSchema& schema = op.schema();
  for (const NamedArgument& given : arguments) {
    if (!schema.argumentIndexWithName(given.name).has_value()) {
      throw std::invalid_argument("nvfp4kv: the loaded library's " + schema.name() + " has no argument '" +
                                  std::string(given.name) + "' (schema: " + toString(schema) +
                                  "); the headers and libnvfp4kv.so come from different versions");
    }
  }
  torch::jit::Stack stack;
  stack.reserve(schema.arguments().size());
  for (const c10::Argument& argument : schema.arguments()) {
    const NamedArgument* found = nullptr;
    for (const NamedArgument& given : arguments) {
      if (given.name == argument.name()) found = &given;
    }
    if (found != nullptr) {
      stack.push_back(found->value);
    } else if (argument.default_value().has_value()) {
      stack.push_back(*argument.default_value());
    } else {
      throw std::invalid_argument("nvfp4kv: " + schema.name() + " needs argument '" + argument.name() +
                                  "', which this C++ API does not pass (schema: " + toString(schema) +
                                  "); the headers and libnvfp4kv.so come from different versions");
    }
  }
  op.callBoxed(stack);
  return stack;
}

inline torch::jit::Stack call(const c10::OperatorHandle& op, std::initializer_list<NamedArgument> arguments) {
  return call_with(op, arguments);
}

inline torch::jit::Stack call(const c10::OperatorHandle& op, const std::vector<NamedArgument>& arguments) {
  return call_with(op, arguments);
}

}  // namespace detail
}  // namespace nvfp4kv
