#!/usr/bin/env bash
# Runs clang-tidy (.clang-tidy's checks) over the given sources, by hand — not part
# of CI. The build's compile commands force-include a GCC precompiled header that
# clang cannot read; this runs them with the header's three Torch includes instead
# (cmake/PacktrainHelpers.cmake: packtrain_torch_pch), from build/clang-tidy/.
#   bash scripts/clang_tidy.sh ensemble/packed_step.cpp runtime/trainers/ensemble/ensemble_trainer.cpp
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || { echo "usage: bash scripts/clang_tidy.sh FILE.cpp..." >&2; exit 2; }
[ -f build/compile_commands.json ] || { echo "no build/compile_commands.json: configure first (cmake --preset default)" >&2; exit 2; }
mkdir -p build/clang-tidy
sed -E 's# -Winvalid-pch -include [^ ]*cmake_pch\.hxx# -include ATen/ATen.h -include torch/nn.h -include torch/optim.h#g' \
  build/compile_commands.json > build/clang-tidy/compile_commands.json
exec clang-tidy -p build/clang-tidy --quiet "$@"
