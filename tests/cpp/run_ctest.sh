#!/usr/bin/env bash
# Configures, builds and runs the C++ tests (tests/cpp: codec, C++ API, TorchScript and AOTInductor
# round trips, the example built against the installed package) with ctest. The README's test command
# runs this after pytest, so CI covers it.
#
#   tests/cpp/run_ctest.sh [build_dir]        default build_dir: build/cpp-tests
#
# Tests the nvfp4kv and torch that $PYTHON (default: python3) imports. GoogleTest comes from Debian's
# libgtest-dev, installed here when missing; GTEST_PREFIX=<dir> uses a copy instead (tests/gpu/run_cpp_device.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build/cpp-tests}
python=$(command -v "${PYTHON:-python3}")

cmake_args=(-DPython3_EXECUTABLE="$python")
if [ -n "${GTEST_PREFIX:-}" ]; then
  cmake_args+=(-DGTest_ROOT="$GTEST_PREFIX")
elif ! compgen -G "/usr/lib/*/cmake/GTest/GTestConfig.cmake" >/dev/null; then
  echo "tests/cpp: installing GoogleTest (Debian libgtest-dev)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libgtest-dev >/dev/null
fi
if command -v ninja >/dev/null; then cmake_args+=(-G Ninja); fi

cmake -S tests/cpp -B "$build" "${cmake_args[@]}"
cmake --build "$build" -j "$(nproc)"
ctest --test-dir "$build" --output-on-failure -j "$(nproc)"
