#!/usr/bin/env bash
# Installs the Python package (import packtrain) into the project's environment —
# the cached virtual environment with torch 2.11.0 that scripts/setup.sh made —
# built by the project's CMake (pyproject.toml, scikit-build-core) against that
# torch, incrementally in build/wheel. Then checks that the installed package
# imports and trains outside the checkout.
#
# Into another environment with torch==2.11.0:  pip install --no-build-isolation .
set -euo pipefail
cd "$(dirname "$0")/.."
cache="${PACKTRAIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/packtrain}"
python="$cache/venv-torch-2.11.0/bin/python"
[[ -x "$python" ]] || { echo "install_python: no environment at $python: run scripts/setup.sh first" >&2; exit 1; }
echo "install_python: building and installing packtrain into $(dirname "$(dirname "$python")")"
"$python" -m pip install --quiet --disable-pip-version-check --no-build-isolation --no-deps .
(cd / && "$python" -c '
import numpy as np, packtrain
x = np.random.default_rng(0).normal(size=(64, 3))
mean, std = packtrain.EnsembleRegressor(members=2, epochs=2, batch_size=16).fit(x, x.sum(1)).predict(x, return_std=True)
assert mean.shape == std.shape == (64,)
print("install_python: import packtrain works:", packtrain.__file__)
')
