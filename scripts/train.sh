#!/usr/bin/env bash
# The README's main command: set up, build, and train the default packed ensemble
# (arguments are passed to `packtrain train`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --quiet
cmake --preset default >/dev/null
cmake --build --preset default --target packtrain
exec build/bin/packtrain train "$@"
