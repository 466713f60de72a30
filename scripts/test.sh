#!/usr/bin/env bash
# The README's test command: set up, configure, build, install the Python package,
# run every test (C++ and Python).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake --preset default
cmake --build --preset default
bash scripts/install_python.sh
ctest --preset default
