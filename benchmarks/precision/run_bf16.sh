#!/usr/bin/env bash
# One command: bf16-mixed on the compute-bound rows (issue 40, item 3) — packtrain fp32,
# bf16-mixed and the peers in bfloat16, side by side in one run, with this CPU's
# float32 and bfloat16 GEMM rates. The peers' environment and build are
# benchmarks/peers/run.sh's (JAX and optax in their own cached directory).
#   benchmarks/precision/run_bf16.sh [--depths 2,3 --hiddens 256,512 --members 64,512
#                                     --peers torch-vmap,torch-compile,jax --out DIR]
# Results: benchmarks/precision/results/results.{md,json} (or --out DIR).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
PACKTRAIN_PEERS_DRIVER="$root/benchmarks/precision/bf16_rows.py" exec "$root/benchmarks/peers/run.sh" "$@"
