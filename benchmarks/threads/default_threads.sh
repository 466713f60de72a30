#!/usr/bin/env bash
# The CLI's default CPU threads, side by side (issue 51, item 11): the same eager
# profile step (8 members, hidden 64, depth 1, batch 128; 10,000 timed steps) with
#   before   --threads 2: LibTorch's default on a 2-core machine, what `packtrain`
#            used before (libgomp's idle workers spin 300,000 times, then sleep);
#   default  no --threads: the threads runtime/distributed/cpu_share.h picks now;
#   passive  --threads 2 with OMP_WAIT_POLICY=PASSIVE (idle workers sleep at once);
#   one      --threads 1.
# ROUNDS rounds (default 11), the four in turn within each round; prints each run's
# us/step and the medians. LOAD=compile runs two compiles of one of the project's
# sources beside it, in a loop (a two-job build), for the whole measurement.
#   bash benchmarks/threads/default_threads.sh [ROUNDS]
#   LOAD=compile bash benchmarks/threads/default_threads.sh [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${PACKTRAIN_BINARY:-build/bin/packtrain}
ROUNDS=${1:-11}
ARGS=(profile --members 8 --hidden 64 --depth 1 --batch 128 --eager --steps 10000)
loads=()
if [[ ${LOAD:-} == compile ]]; then
  # The compile command of one source from build/compile_commands.json, its output in a temporary folder.
  scratch=$(mktemp -d)
  trap 'for p in "${loads[@]}"; do kill -- -"$p" 2>/dev/null; done; wait 2>/dev/null; rm -rf "$scratch"' EXIT
  cmd=$(python3 - "$scratch" <<'PY'
import json, re, sys
for e in json.load(open("build/compile_commands.json")):
    if e["file"].endswith("runtime/data/standardizer.cpp"):
        c = re.sub(r" -MD -MT \S+ -MF \S+", "", e["command"].replace("/usr/bin/ccache ", ""))
        print(f"cd {e['directory']} && " + re.sub(r" -o \S+", f" -o {sys.argv[1]}/load.$$.o", c))
PY
)
  for _ in 1 2; do setsid bash -c "while true; do $cmd >/dev/null 2>&1; done" & loads+=($!); done
  sleep 5
fi
step() { grep -o '  host *[0-9.]*' | awk '{print $2}'; }
declare -A runs
for _ in $(seq "$ROUNDS"); do
  runs[before]+="$(env -u OMP_WAIT_POLICY -u PACKTRAIN_THREADS "$BIN" --threads 2 "${ARGS[@]}" 2>/dev/null | step) "
  runs[default]+="$(env -u OMP_WAIT_POLICY -u PACKTRAIN_THREADS -u OMP_NUM_THREADS "$BIN" "${ARGS[@]}" 2>/dev/null | step) "
  runs[passive]+="$(OMP_WAIT_POLICY=PASSIVE "$BIN" --threads 2 "${ARGS[@]}" 2>/dev/null | step) "
  runs[one]+="$(env -u OMP_WAIT_POLICY "$BIN" --threads 1 "${ARGS[@]}" 2>/dev/null | step) "
done
echo "load: ${LOAD:-none}; $(nproc) CPUs; $(date -u '+%Y-%m-%d %H:%M UTC')"
for k in before default passive one; do
  median=$(tr ' ' '\n' <<<"${runs[$k]}" | grep . | sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}')
  echo "$k: ${runs[$k]}| median $median us/step"
done
