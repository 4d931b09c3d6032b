#!/usr/bin/env bash
# Builds tests/gpu/codec_check.cu for one GPU architecture: the one build command of run_device.sh's
# `check` stage and of tests/test_cuda.py::test_device_codec_check_passes.
#
#   tests/gpu/build_codec_check.sh ARCH OUTPUT      ARCH as in sm_ARCH (90 for H100 and H200); NVCC picks nvcc
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 ARCH OUTPUT" >&2; exit 2; }
arch=$1
case $2 in /*) output=$2 ;; *) output=$PWD/$2 ;; esac
cd "$(dirname "$0")/../.."
"${NVCC:-nvcc}" -std=c++17 -O3 "-arch=sm_$arch" --fmad=false --prec-div=true --ftz=false -Icpp/include -Icpp/src \
  tests/gpu/codec_check.cu -o "$output"
