#!/usr/bin/env bash
# Everything the GPU machine has to run for the CUDA kernels, in one call, from the repository root:
#
#   tests/gpu/run_device.sh [STAGE...]      stages: install check test sanitize cuobjdump bench (default: all)
#
#   install    pip-install the wheel carried in .carry/ (built elsewhere: pip wheel --no-build-isolation
#              --no-deps -w .carry .), or build from source when there is none
#   check      build (tests/gpu/build_codec_check.sh, for this GPU's architecture) and run
#              tests/gpu/codec_check.cu (exhaustive device checks of the quantizer; the test stage runs it
#              too, as tests/test_cuda.py::test_device_codec_check_passes)
#   test       pytest: every test module, on the CPU and on CUDA, in TEST_SHARDS parallel processes
#              (PYTEST_TARGETS narrows it, e.g. PYTEST_TARGETS=tests/test_cuda.py)
#   sanitize   compute-sanitizer memcheck and racecheck over the CUDA tests of tests/test_append.py,
#              tests/test_dequantize.py, tests/test_cuda.py, tests/test_fuzz.py, tests/test_bad_inputs.py,
#              tests/test_helper_bad_data.py, tests/test_mla.py and tests/test_rope.py (not its README example or
#              graph tests, which allocate while capturing); each property test (hypothesis) runs
#              NVFP4KV_FUZZ_EXAMPLES random cases (60 unless set)
#              (SANITIZE_TARGETS narrows it; small grid, no torch.compile tests, no codec check, no caching
#              allocator so that every tensor is its own allocation, hence no graph capture of allocating
#              helpers); runs last, each tool under SANITIZE_TIMEOUT seconds (default 900)
#   cuobjdump  the SASS/PTX listing of the installed library
#   bench      python -m nvfp4kv.bench
#   probe      build and run tools/ceiling_probe.cu: what a kernel that only moves each case's bytes
#              (prefill) or only follows decode's index chain reaches on this GPU, and
#              tools/rope_decode_probe.cu: the same for the fused RoPE append's decode (not in the default set)
#
# Logs, bench.json and bench.png go to $OUT (default ./device-out); a summary is printed last.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
STAGES=${*:-install check test sanitize cuobjdump bench}
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
declare -A RESULT

has_stage() { [[ " $STAGES " == *" $1 "* ]]; }
stage() {  # stage NAME LOG COMMAND...: run, tee to LOG, remember the exit status
  local name=$1 log=$2
  shift 2
  echo "=== $name ($(date +%T))"
  "$@" 2>&1 | tee "$log" | tail -n 25
  RESULT[$name]=${PIPESTATUS[0]}
}

if has_stage install; then
  install() {
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv
    $PY -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)'
    if ls .carry/*.whl >/dev/null 2>&1; then
      $PY -m pip install -q --no-deps --force-reinstall .carry/*.whl
    else
      $PY -m pip install -q --no-build-isolation --no-deps .
    fi
    cd /tmp && $PY -c 'import nvfp4kv, torch; print("nvfp4kv", nvfp4kv.__version__, nvfp4kv.library.library_path(),
                      "CUDA kernels:", nvfp4kv.library.has_cuda_kernels())'
  }
  stage install "$OUT/install.log" install
fi

if has_stage check; then
  check() {
    local arch
    arch=$($PY -c 'import torch; print("%d%d" % torch.cuda.get_device_capability())') &&
      tests/gpu/build_codec_check.sh "$arch" /tmp/codec_check && /tmp/codec_check
  }
  stage check "$OUT/codec_check.log" check
fi

if has_stage test; then
  # Run from the tests folder against the INSTALLED package (not python/ in the checkout), the modules
  # dealt round-robin into TEST_SHARDS parallel pytest processes (default 4), each under TEST_TIMEOUT
  # seconds (default 540); pytest.log is their logs one after the other.
  run_tests() {
    local shards=${TEST_SHARDS:-4} i=0 pids=() rc=0
    local -a modules groups
    # shellcheck disable=SC2207  # module paths have no spaces
    modules=($(ls ${PYTEST_TARGETS:-tests/test_*.py}))
    for module in "${modules[@]}"; do
      groups[i % shards]+=" $module"
      i=$((i + 1))
    done
    for ((i = 0; i < shards && i < ${#modules[@]}; i++)); do
      # shellcheck disable=SC2086  # a group is a list of paths
      timeout "${TEST_TIMEOUT:-540}" $PY -m pytest ${groups[i]} -q -rs -p no:cacheprovider --rootdir=. \
        > "$OUT/pytest-$i.log" 2>&1 &
      pids+=($!)
    done
    for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
    cat "$OUT"/pytest-*.log
    grep -hE "^(FAILED|ERROR)| (passed|failed)" "$OUT"/pytest-*.log
    return $rc
  }
  stage test "$OUT/pytest.log" run_tests
fi

if has_stage cuobjdump; then
  cuobjdump_listing() {
    local lib
    lib=$(cd /tmp && $PY -c 'import nvfp4kv; print(nvfp4kv.library.library_path())')
    cuobjdump --list-elf "$lib" && cuobjdump --list-ptx "$lib" || return 1
    echo "--- resource usage (sm_90)"
    cuobjdump --dump-resource-usage -arch sm_90 "$lib" 2>&1 | grep -E "Function|REG" | sed -E 's/_ZN7nvfp4kv[^ ]*(kernel[^ ]*)/\1/' \
      | head -80 || true
  }
  stage cuobjdump "$OUT/cuobjdump.txt" cuobjdump_listing
fi

if has_stage bench; then
  stage bench "$OUT/bench.log" bash -c "cd /tmp && $PY -m nvfp4kv.bench --accuracy --out '$OUT'"
fi

if has_stage probe; then
  probe() {
    local flags="-std=c++17 -O3 -DNDEBUG -arch=sm_90 --fmad=false --prec-div=true --ftz=false -Icpp/include -Icpp/src"
    nvcc $flags tools/ceiling_probe.cu -o /tmp/ceiling_probe && /tmp/ceiling_probe &&
      nvcc $flags tools/rope_decode_probe.cu cpp/src/cuda/rope_append_paged_kv_cache_kernel.cu \
        -o /tmp/rope_decode_probe && /tmp/rope_decode_probe
  }
  stage probe "$OUT/probe.log" probe
fi

if has_stage sanitize; then
  sanitize() {
    local tool=$1
    NVFP4KV_TEST_SMALL=1 PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout "${SANITIZE_TIMEOUT:-900}" \
      compute-sanitizer --tool "$tool" --error-exitcode 7 \
      --print-limit 20 $PY -m pytest ${SANITIZE_TARGETS:-tests/test_append.py tests/test_dequantize.py \
      tests/test_cuda.py tests/test_fuzz.py tests/test_bad_inputs.py tests/test_helper_bad_data.py tests/test_mla.py \
      tests/test_rope.py} -q -p no:cacheprovider \
      -k "not compiled and not first_call and not sass and not codec_check and not cpu and not capturable and not readme \
          and not (test_rope and graph)"
  }
  stage memcheck "$OUT/memcheck.log" sanitize memcheck
  stage racecheck "$OUT/racecheck.log" sanitize racecheck
fi

echo "=== summary"
for name in install check test memcheck racecheck cuobjdump bench probe; do
  [[ -n "${RESULT[$name]+x}" ]] && echo "$name: exit ${RESULT[$name]}"
done
grep -hE " (passed|failed)" "$OUT"/pytest-*.log 2>/dev/null
grep -hE "ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/memcheck.log" "$OUT/racecheck.log" 2>/dev/null
grep -hE "PASS|FAIL" "$OUT/codec_check.log" 2>/dev/null | tail -n 1
[[ -f "$OUT/bench.log" ]] && sed -n '/^device:/,$p' "$OUT/bench.log"
exit 0
