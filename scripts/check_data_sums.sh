#!/usr/bin/env bash
# The bundled data are the files their provenance describes: every file under data/
# (but data/README.md and SHA256SUMS itself) is listed in data/SHA256SUMS, and each
# listed file has its sum. Usage: scripts/check_data_sums.sh [DATA_DIR]
set -euo pipefail
cd "${1:-$(dirname "$0")/../data}"
sha256sum --check --quiet --strict SHA256SUMS
unlisted=$(comm -23 <(find . -type f ! -name SHA256SUMS ! -path ./README.md | LC_ALL=C sort) \
                    <(awk '{print $2}' SHA256SUMS | LC_ALL=C sort))
if [[ -n $unlisted ]]; then
  echo "data/: files not listed in SHA256SUMS (add: sha256sum ./PATH >> SHA256SUMS):" >&2
  echo "$unlisted" >&2
  exit 1
fi
echo "data/: $(wc -l < SHA256SUMS) files match SHA256SUMS"
