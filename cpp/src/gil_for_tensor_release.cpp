#include "gil_for_tensor_release.h"

#include <dlfcn.h>

namespace nvfp4kv {
namespace {

// The few CPython functions used, looked up in the process (libpython or a python executable that
// exports its symbols); all null when Python is not loaded.
struct PythonApi {
  int (*is_initialized)() = nullptr;       // Py_IsInitialized
  int (*gil_check)() = nullptr;            // PyGILState_Check
  void* (*this_thread_state)() = nullptr;  // PyGILState_GetThisThreadState
  int (*gil_ensure)() = nullptr;           // PyGILState_Ensure
  void (*gil_release)(int) = nullptr;      // PyGILState_Release

  PythonApi() {
    is_initialized = reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "Py_IsInitialized"));
    gil_check = reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "PyGILState_Check"));
    this_thread_state = reinterpret_cast<void* (*)()>(dlsym(RTLD_DEFAULT, "PyGILState_GetThisThreadState"));
    gil_ensure = reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "PyGILState_Ensure"));
    gil_release = reinterpret_cast<void (*)(int)>(dlsym(RTLD_DEFAULT, "PyGILState_Release"));
    available = is_initialized && gil_check && this_thread_state && gil_ensure && gil_release;
  }
  bool available = false;  // every function above was found
};

const PythonApi& python_api() {
  static const PythonApi api;
  return api;
}

}  // namespace

GilForTensorRelease::GilForTensorRelease() {
  const PythonApi& api = python_api();
  if (!api.available || !api.is_initialized() || api.gil_check() || !api.this_thread_state()) return;
  state_ = api.gil_ensure();
  acquired_ = true;
}

GilForTensorRelease::~GilForTensorRelease() {
  if (acquired_) python_api().gil_release(state_);
}

}  // namespace nvfp4kv
