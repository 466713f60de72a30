#!/usr/bin/env bash
# Peak resident memory of the largest rank of a pipeline run, for S = 1, 2, 4
# stages, each stage a separate process under `packtrain launch` (the benchmark
# MultiTaskPipeline runs its ranks as threads of one process, so it counts bytes
# from the tensors instead). A model whose state outweighs LibTorch's own resident
# memory (width 512, 8 blocks: 25 M parameters, ~400 MB of parameters, gradients
# and Adam moments), 2 steps of 32 CoLA sentences.
#
# GNU time's %M for `launch` is the largest peak RSS among launch and the ranks it
# waited for (Linux reports the maximum over children, not the sum).
#
# Usage: scripts/pipeline_memory.sh [BUILD_DIR]   (prints a Markdown table)
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${1:-build}/bin/packtrain"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
head -n 64 data/cola/in_domain_train.tsv > "$work/train.tsv"
echo "| stages S | ranks | largest rank's peak RSS (MB) | vs S = 1 | largest rank's parameters + gradients + Adam (MB, from the placement) |"
echo "|---|---|---|---|---|"
base=""
for S in 1 2 4; do
  launch=(launch --nproc "$S" --)
  ((S == 1)) && launch=()
  /usr/bin/time -f "%M" -o "$work/rss" "$bin" "${launch[@]}" multitask train --device cpu --width 512 --layers 8 \
    --heads 8 --max-length 64 --buckets 64 --batch 32 --epochs 1 --train "$work/train.tsv" --dev "$work/train.tsv" \
    --pipeline-stages "$S" --micro-batches 4 -o "$work/p$S.ckpt" > "$work/out$S" 2>&1 ||
    { cat "$work/out$S" >&2; exit 1; }
  rss_mb=$(( $(tail -n 1 "$work/rss") / 1024 ))
  [[ -z "$base" ]] && base=$rss_mb
  state=$(grep -o '[0-9.]* MB of parameters, gradients and Adam state' "$work/out$S" | awk '{ if ($1 > m) m = $1 } END { print m }' || true)
  [[ -z "$state" ]] && state="(whole model, not printed)"
  echo "| $S | $S | $rss_mb | $(awk -v a="$rss_mb" -v b="$base" 'BEGIN { printf "%.2f", a / b }') | $state |"
done
