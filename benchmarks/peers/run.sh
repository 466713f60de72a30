#!/usr/bin/env bash
# One command: packtrain against the PyTorch and JAX peers on this machine, over the
# shapes users train (depth 1-3 x hidden 32-512 x K 1-4096, batch 128; packs over
# 1 GiB of training state left out and named), the CLI's default shape marked.
#   benchmarks/peers/run.sh [run_peers.py options: --depths 1,2,3 --hiddens 32,64,256,512
#                            --members 1,8,64,512,4096 (default: the whole grid),
#                            --peers jax:scan,torch-vmap:fused, --device, --repeats,
#                            --time-budget SECONDS, --unroll U, --out DIR ...]
#   e.g. one shape, one peer: benchmarks/peers/run.sh --depths 2 --hiddens 64 --members 8 --peers jax:scan
# CNN rows (issue 38: packtrain's default cnn shape on the digits network, input 1x8x8,
# and MNIST-1D's, 1x40; K 1, 8, 64, 512; results in results/<cpu|gpu>-cnn/):
#   benchmarks/peers/run.sh --model cnn [--networks digits,mnist1d] [--threads N] [--time-budget S]
#   the CPU table's command: PACKTRAIN_PEERS_NO_BUILD=1 benchmarks/peers/run.sh --model cnn --threads 1 \
#     --unroll 2 --check-steps 10 --repeats 3 --min-time 0.3 \
#     --peers jax:scan,torch-vmap,torch-compile,torch-loop --time-budget 2400
#   on the GPU machine: PACKTRAIN_PEERS_ARGS="--model cnn" bash scripts/device/phase.sh peers
# Builds packtrain_bench and packtrain_peers (scripts/setup.sh first installs what
# the build needs), prepares the peers' Python and runs benchmarks/peers/run_peers.py,
# which writes benchmarks/peers/results/<cpu|gpu>/results.{md,json,svg} (or --out DIR):
# each peer / packtrain, the best peer per row, packtrain's GFLOP/s against the
# machine's GEMM rate (CPU), and the verdict (packtrain >= 1.2x the best peer at
# every K >= 8 row).
#
# Python: by default the project's cached virtual environment (PyTorch 2.11.0), with
# JAX and optax installed for this benchmark only into their own cached directory
# (${PACKTRAIN_CACHE:-~/.cache/packtrain}/peers-jax-<version>, on PYTHONPATH; the
# project's environment is not changed). On a machine that already has them (the
# GPU machine), set PACKTRAIN_PEERS_PYTHON=python3 to use that interpreter as is.
# PACKTRAIN_BUILD_DIR picks the directory whose bin/ holds packtrain_bench and
# packtrain_peers (default: build, configured by the default preset). With
# PACKTRAIN_PEERS_NO_BUILD=1 nothing is built and any directory with those two in
# bin/ will do (a relocated bundle, no CMake cache needed). Relative paths — here
# and in --out — are taken from the directory run.sh is called from.
#
# On the GPU machine, fitted to one command of at most 10 minutes:
#   PACKTRAIN_PEERS_PYTHON=python3 PACKTRAIN_PEERS_NO_BUILD=1 PACKTRAIN_BUILD_DIR=DIR \
#     benchmarks/peers/run.sh --out OUT --time-budget 420
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
JAX_VERSION=0.10.2
OPTAX_VERSION=0.2.8
cache="${PACKTRAIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/packtrain}"
build="${PACKTRAIN_BUILD_DIR:-$root/build}"
[[ "$build" = /* ]] || build="$PWD/$build"

if [[ "${PACKTRAIN_PEERS_NO_BUILD:-0}" != 1 ]]; then
  (
    cd "$root"
    bash scripts/setup.sh --quiet
    [[ -f "$build/CMakeCache.txt" ]] || cmake --preset default >/dev/null
    cmake --build "$build" --target packtrain_bench packtrain_peers
  )
else
  for binary in packtrain_bench packtrain_peers; do
    if [[ ! -x "$build/bin/$binary" ]]; then
      echo "peers: PACKTRAIN_PEERS_NO_BUILD=1 but $build/bin/$binary is missing: set PACKTRAIN_BUILD_DIR to a" \
           "directory whose bin/ holds packtrain_bench and packtrain_peers, or build them" >&2
      exit 2
    fi
  done
fi

if [[ -n "${PACKTRAIN_PEERS_PYTHON:-}" ]]; then
  python="$PACKTRAIN_PEERS_PYTHON"
else
  python="$cache/venv-torch-2.11.0/bin/python"
  jax_dir="$cache/peers-jax-$JAX_VERSION-optax-$OPTAX_VERSION"
  if ! PYTHONPATH="$jax_dir" "$python" -c "import jax, optax" 2>/dev/null; then
    echo "peers: installing jax==$JAX_VERSION optax==$OPTAX_VERSION (CPU) into $jax_dir" >&2
    rm -rf "$jax_dir.partial"
    "$python" -m pip install --quiet --disable-pip-version-check --target "$jax_dir.partial" \
      "jax==$JAX_VERSION" "optax==$OPTAX_VERSION"
    rm -rf "$jax_dir" && mv "$jax_dir.partial" "$jax_dir"
  fi
  export PYTHONPATH="$jax_dir${PYTHONPATH:+:$PYTHONPATH}"
fi
# PACKTRAIN_PEERS_DRIVER: another driver of the same peers and environment
# (benchmarks/precision/run_bf16.sh: the bf16-mixed rows).
exec "$python" "${PACKTRAIN_PEERS_DRIVER:-$root/benchmarks/peers/run_peers.py}" --build-dir "$build" "$@"
