#!/usr/bin/env bash
# Run ON THE GPU MACHINE (through the device tool, carry: [".device"]): unpacks the
# carried .deb files into a prefix, configures against the machine's own PyTorch
# (python3 -c "import torch.utils; print(torch.utils.cmake_prefix_path)"), builds,
# runs every test (CUDA instances included) and the benchmark, and leaves logs and
# JSON in $OUT (ctest, benchmark, `packtrain profile` reports and traces, the main job,
# the peers benchmark in $OUT/peers).
#   scripts/device/build_and_test.sh [extra packtrain_bench args]
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-/tmp/packtrain-out}"
mkdir -p "$out"
prefix="$PWD/.device/prefix"
mkdir -p "$prefix"
for deb in .device/debs/*.deb; do dpkg -x "$deb" "$prefix"; done
{ nvidia-smi || true; nvcc --version | tail -1; python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda)"; } \
  > "$out/machine.txt" 2>&1
torch_prefix=$(python3 -c "import torch.utils; print(torch.utils.cmake_prefix_path)")
cmake -S . -B build-device -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix/usr;$prefix/usr/lib/x86_64-linux-gnu/cmake;$torch_prefix" \
  -DCMAKE_CXX_FLAGS="-isystem $prefix/usr/include" -DPACKTRAIN_USE_CCACHE=OFF > "$out/configure.log" 2>&1
cmake --build build-device -j 16 > "$out/build.log" 2>&1
ctest --test-dir build-device --output-on-failure -j 4 > "$out/ctest.log" 2>&1 || true
build-device/bin/packtrain_bench --benchmark_repetitions=5 --benchmark_min_time=0.5 \
  --benchmark_out="$out/bench.json" --benchmark_out_format=json "$@" > "$out/bench.txt" 2>&1 || true
for k in 64 4096; do
  build-device/bin/packtrain profile --members "$k" --json --trace "$out/trace_k$k.json" > "$out/profile_k$k.json" 2>&1 || true
  build-device/bin/packtrain profile --members "$k" --unroll 8 > "$out/profile_k${k}_u8.txt" 2>&1 || true
done
build-device/bin/packtrain train --json > "$out/train.json" 2> "$out/train.err" || true
# NCCL on this GPU (world size 1): the collectives check, all-reduce time against
# bytes (RESULTS.md's scaling model), and a data-parallel run under the launcher
# with its all-reduce captured inside the step.
build-device/bin/packtrain info --collectives --device cuda > "$out/nccl_check.txt" 2>&1 || true
build-device/bin/packtrain profile --collectives --device cuda --repeats 50 --json > "$out/nccl_allreduce.json" 2>&1 || true
build-device/bin/packtrain launch --nproc 1 -- train --device cuda --json > "$out/train_launch1.json" 2>&1 || true
# The peers benchmark (benchmarks/peers/run.sh) on this machine's PyTorch and JAX;
# optax from the carried wheels when the machine lacks it.
if ! python3 -c "import optax" 2>/dev/null; then
  python3 -m pip install --quiet --no-index --no-deps --target .device/pyextra .device/wheels/*.whl
  export PYTHONPATH="$PWD/.device/pyextra${PYTHONPATH:+:$PYTHONPATH}"
fi
PACKTRAIN_PEERS_PYTHON=python3 PACKTRAIN_PEERS_NO_BUILD=1 PACKTRAIN_BUILD_DIR=build-device \
  timeout 1500 benchmarks/peers/run.sh --out "$out/peers" > "$out/peers.txt" 2>&1 || true
tail -3 "$out/ctest.log"
