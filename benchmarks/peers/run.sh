#!/usr/bin/env bash
# One command: packtrain against the PyTorch and JAX peers on this machine.
#   benchmarks/peers/run.sh [run_peers.py options: --device, --repeats, --members 1,8 ...]
# Builds packtrain_bench and packtrain_peers (scripts/setup.sh first installs what
# the build needs), prepares the peers' Python and runs benchmarks/peers/run_peers.py,
# which writes benchmarks/peers/results/<cpu|gpu>/results.{md,json,svg}.
#
# Python: by default the project's cached virtual environment (PyTorch 2.11.0), with
# JAX and optax installed for this benchmark only into their own cached directory
# (${PACKTRAIN_CACHE:-~/.cache/packtrain}/peers-jax-<version>, on PYTHONPATH; the
# project's environment is not changed). On a machine that already has them (the
# GPU machine), set PACKTRAIN_PEERS_PYTHON=python3 to use that interpreter as is.
# PACKTRAIN_BUILD_DIR picks the build directory (default: build, configured by the
# default preset); with PACKTRAIN_PEERS_NO_BUILD=1 it must already hold the binaries.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
JAX_VERSION=0.10.2
OPTAX_VERSION=0.2.8
cache="${PACKTRAIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/packtrain}"
build="${PACKTRAIN_BUILD_DIR:-build}"

if [[ "${PACKTRAIN_PEERS_NO_BUILD:-0}" != 1 ]]; then
  bash scripts/setup.sh --quiet
  [[ -f "$build/CMakeCache.txt" ]] || cmake --preset default >/dev/null
  cmake --build "$build" --target packtrain_bench packtrain_peers
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
exec "$python" benchmarks/peers/run_peers.py --build-dir "$build" "$@"
