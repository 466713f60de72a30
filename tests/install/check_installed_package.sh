#!/usr/bin/env bash
# Installs the build tree into a temporary prefix, checks the installed layout
# (headers under include/packtrain/<layer>/, no CLI headers, no generic runtime/ or
# graphs/ at the include root), then configures, builds and runs a consumer project
# that finds it with find_package(packtrain).
# Usage: check_installed_package.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
work=$(mktemp -d "${TMPDIR:-/tmp}/packtrain_install_test.XXXXXX")
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
inc="$work/prefix/include"
for layer in base profiling ensemble graphs runtime; do
  [[ -d "$inc/packtrain/$layer" ]] || { echo "FAIL: no $inc/packtrain/$layer"; exit 1; }
  [[ ! -e "$inc/$layer" ]] || { echo "FAIL: generic $layer/ at the include root"; exit 1; }
done
[[ -f "$inc/packtrain/runtime/trainers/ensemble/ensemble_trainer.h" ]] || { echo "FAIL: trainer header not installed"; exit 1; }
[[ ! -e "$inc/packtrain/runtime/cli" ]] || { echo "FAIL: CLI headers installed"; exit 1; }
cmake -S "$src/tests/install" -B "$work/consumer" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$work/prefix" >"$work/configure.log" 2>&1 || { cat "$work/configure.log"; exit 1; }
cmake --build "$work/consumer" >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
"$work/consumer/consumer"
