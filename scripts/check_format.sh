#!/usr/bin/env bash
# The tree is formatted as .clang-format says: every tracked C++/CUDA file, checked
# with clang-format 14 (Debian 12's; another version formats some lines otherwise,
# so it skips, exit 77, as it does without clang-format). Registered as the CTest
# test Formatting. Fix with `git clang-format` (the lines you changed) or
# `clang-format -i FILE`.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v clang-format >/dev/null; then
  echo "skipped: no clang-format (Debian: apt install clang-format)"
  exit 77
fi
version=$(clang-format --version)
if [[ "$version" != *"version 14."* ]]; then
  echo "skipped: $version is not clang-format 14, which .clang-format is checked with"
  exit 77
fi
mapfile -t files < <(git ls-files '*.h' '*.cpp' '*.cu' '*.cuh')
if ! clang-format --dry-run --Werror "${files[@]}" 2>/tmp/check_format.$$; then
  grep -E "^[^ ].*: (error|warning):" /tmp/check_format.$$ | cut -d: -f1 | sort -u | sed 's/^/not formatted: /'
  rm -f /tmp/check_format.$$
  exit 1
fi
rm -f /tmp/check_format.$$
echo "${#files[@]} files formatted as .clang-format says"
