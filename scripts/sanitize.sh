#!/usr/bin/env bash
# AddressSanitizer + UndefinedBehaviorSanitizer over a subset of the C++ tests, in
# build-sanitize/ (the `sanitize` preset: Debug at -O1, PACKTRAIN_SANITIZE=address,undefined).
# CI runs it after the test command (.ci/run); any finding fails it. The subset is the
# layers below runtime/ and the two rooms that read files: base/, profiling/, graphs/,
# ensemble/'s raw-pointer CPU kernels (the rest of ensemble/ runs instrumented under
# checkpoint_tests), runtime/data/, runtime/io/ (CONTRIBUTING.md says why and what it
# costs; `scripts/sanitize.sh ensemble_tests` runs the rest of ensemble/'s tests).
#
# Usage: scripts/sanitize.sh [test binary ...]   (default: the subset below)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/progress.sh

tests=(fmt_tests profiling_tests graphs_tests ensemble_kernel_tests data_tests checkpoint_tests)
(($#)) && tests=("$@")

# LibTorch is the prebuilt, uninstrumented one. No finding inside it needs silencing
# today; the suppression files are where one would go (LibTorch's frames only, never
# packtrain's). A finding stops the test binary (no recovery) with a stack.
supp="$PWD/scripts/sanitizers"
export ASAN_OPTIONS="detect_leaks=1:check_initialization_order=1:strict_init_order=1:detect_stack_use_after_return=1:strict_string_checks=1"
export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:suppressions=$supp/ubsan.supp"
export PACKTRAIN_DATA_DIR="$PWD/data"

step "sanitize: configuring build-sanitize/ (cmake --preset sanitize)" "about 10 s, 2 s when configured" \
  cmake --preset sanitize
step "sanitize: building ${tests[*]} with AddressSanitizer + UBSan" \
  "about 10 min on 2 cores from nothing, less with ccache's cache; seconds when built" \
  cmake --build --preset sanitize --target "${tests[@]}"
failed=()
for t in "${tests[@]}"; do
  # --gtest_brief: only failures (and a sanitizer's report) print; the CUDA instances
  # (they skip without a GPU) are left out; 10 min per binary at most.
  step "sanitize: running $t" "under a minute" \
    timeout 600 "build-sanitize/bin/$t" --gtest_brief=1 "--gtest_filter=-*/cuda:*_cuda" || failed+=("$t")
done
if ((${#failed[@]})); then
  echo "sanitize: a sanitizer finding or a failed test in: ${failed[*]} (the report is above)" >&2
  exit 1
fi
echo "sanitize: ${tests[*]}: no finding"
