#!/usr/bin/env bash
# The README's test command: set up, configure, build, install the Python package,
# run every test (C++ and Python). Each source compiles once, in build/: the Python
# package installed into the project's environment is build/python's (install_python.sh).
# Each long step prints a line before it (about how long it takes on this project's
# 2-core machine) and one after (the seconds it took).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/progress.sh
bash scripts/setup.sh
step "configuring build/ (cmake --preset default)" "about 10 s, 2 s when configured" \
  cmake --preset default
step "building everything in build/ (ninja counts the files)" \
  "about 40 min on 2 cores from nothing, less with ccache's cache; seconds when built" \
  cmake --build --preset default
bash scripts/install_python.sh  # its steps print their own lines: seconds here
step "running every test (ctest: one entry per test binary; cli_tests alone takes about 13 min)" "about 20 min on 2 cores" \
  ctest --preset default
