#!/usr/bin/env bash
# The fallback when no bundle was carried: builds TARGETs ON THE GPU MACHINE into
# build-device/ against the image's own PyTorch, with the build dependencies it lacks
# (fmt, GoogleTest, Google Benchmark, CLI11, nlohmann-json) unpacked from the carried
# .debs (scripts/device/fetch_debs.sh) into .device/prefix. Called by phase.sh
# (a phase builds what it needs; `phase.sh build` builds everything).
#   scripts/device/build_on_device.sh PYTHON [TARGET...]   (no TARGET: all)
set -euo pipefail
cd "$(dirname "$0")/../.."
python="${1:?usage: build_on_device.sh PYTHON [TARGET...]}"
shift
prefix="$PWD/.device/prefix"
mkdir -p "$prefix"
for deb in .device/debs/*.deb; do dpkg -x "$deb" "$prefix"; done
echo "unpacked $(ls .device/debs/*.deb | wc -l) .debs into $prefix"
torch_prefix=$("$python" -c "import torch.utils; print(torch.utils.cmake_prefix_path)")
if [[ ! -f build-device/CMakeCache.txt ]]; then
  echo "configuring build-device against $torch_prefix"
  cmake -S . -B build-device -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$prefix/usr;$prefix/usr/lib/x86_64-linux-gnu/cmake;$torch_prefix" \
    -DCMAKE_CXX_FLAGS="-isystem $prefix/usr/include" -DPACKTRAIN_USE_CCACHE=OFF \
    -DPACKTRAIN_TEST_PYTHON="$(command -v "$python")"
fi
targets=()
for t in "$@"; do targets+=(--target "$t"); done
echo "building ${*:-everything} with $(nproc) jobs"
time cmake --build build-device -j "$(nproc)" "${targets[@]}"
