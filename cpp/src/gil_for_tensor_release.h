// Releasing a call's tensor handles with the GIL held once, instead of once per tensor.
//
// A tensor that Python also holds has a C++ reference count of 2 while the op has its handle; deleting
// the handle takes it to 1, and torch then drops its own reference to the Python object
// (TensorImpl::decref_pyobject, c10/util/intrusive_ptr.h in torch 2.13), taking the GIL for it. Called
// from Python, an op runs with the GIL released (torch's invokeOperatorFromPython), so a call with 11
// tensors would take and drop the GIL 11 times. GilForTensorRelease takes it once around all the deletions, and only
// where that is what the deletions would do anyway: Python is running in this process (found at run time, the library
// does not link it) and this thread came from Python (it has a Python thread state) but does not hold the GIL now.
// Elsewhere (C++ programs, C++ threads, a caller that holds the GIL) it does nothing.
#pragma once

namespace nvfp4kv {

class GilForTensorRelease {
 public:
  GilForTensorRelease();
  ~GilForTensorRelease();
  GilForTensorRelease(const GilForTensorRelease&) = delete;
  GilForTensorRelease& operator=(const GilForTensorRelease&) = delete;

 private:
  bool acquired_ = false;
  int state_ = 0;  // PyGILState_STATE
};

}  // namespace nvfp4kv
