#!/usr/bin/env bash
# The C++ API on a GPU machine: the example (cpp/examples) built against the installed
# package and run on the CPU and the GPU, and every ctest test of tests/cpp, whose CUDA tests (C++ API
# on CUDA tensors, TorchScript on CUDA, an AOTInductor package compiled for CUDA) skip only where no GPU
# is seen; here a skipped test is a failure.
#
# The GPU machine reaches no package registry, so GoogleTest travels with the working tree:
#   here:   tests/gpu/run_cpp_device.sh --stage      copies Debian's libgtest-dev into .carry/gtest (git-ignored)
#   there:  bash tests/gpu/run_cpp_device.sh         with .carry/gtest carried and the nvfp4kv wheel installed
#           (CUDA build; when `import nvfp4kv` fails it tries `pip install --no-build-isolation --no-deps .`)
# Logs go to $OUT when it is set.
set -euo pipefail
cd "$(dirname "$0")/../.."

if [ "${1:-}" = "--stage" ]; then
  if ! dpkg -s libgtest-dev >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libgtest-dev >/dev/null
  fi
  rm -rf .carry/gtest && mkdir -p .carry/gtest
  # Same layout as under /usr, so GTest's relocatable CMake config finds its files.
  dpkg -L libgtest-dev | grep -E '^/usr/(include|lib)/' | while read -r f; do
    if [ -f "$f" ]; then mkdir -p ".carry/gtest/$(dirname "${f#/usr/}")" && cp "$f" ".carry/gtest/${f#/usr/}"; fi
  done
  echo "staged GoogleTest in .carry/gtest ($(du -sh .carry/gtest | cut -f1)); carry .carry/gtest to the GPU machine"
  exit 0
fi

python=$(command -v "${PYTHON:-python3}")
out=${OUT:-/tmp/nvfp4kv-cpp-device}
mkdir -p "$out"
[ -d .carry/gtest ] || { echo "no .carry/gtest: run tests/gpu/run_cpp_device.sh --stage first and carry it" >&2; exit 1; }
"$python" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print('torch', torch.__version__, torch.cuda.get_device_name())"
if ! "$python" -c "import nvfp4kv" 2>/dev/null; then
  "$python" -m pip install --no-build-isolation --no-deps . > "$out/pip_install.log" 2>&1
fi
"$python" -c "import nvfp4kv, nvfp4kv.library as l; print('nvfp4kv at', nvfp4kv.cmake_prefix_path); assert l.has_cuda_kernels(), 'nvfp4kv was built without CUDA kernels'"

status=0
PYTHON="$python" GTEST_PREFIX="$PWD/.carry/gtest" tests/cpp/run_ctest.sh build/cpp-tests-gpu 2>&1 | tee "$out/ctest.log" || status=1
echo "--- the example, as built by ctest against the installed package:"
build/cpp-tests-gpu/example/paged_kv_cache_example 2>&1 | tee "$out/example.log" || status=1
grep -q "^cuda appended" "$out/example.log" || { echo "FAIL: the example did not run on CUDA"; status=1; }
if grep -q "(Skipped)" "$out/ctest.log"; then
  echo "FAIL: tests were skipped on a GPU machine:"; grep "(Skipped)" "$out/ctest.log"; status=1
fi
[ "$status" = 0 ] && echo "run_cpp_device: all C++ tests and the example passed on CUDA"
exit "$status"
