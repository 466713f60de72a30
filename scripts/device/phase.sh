#!/usr/bin/env bash
# The GPU machine's run, one `run` tool command each (scripts/device/README.md):
#   scripts/device/phase.sh gpu|bench|peers|machine|build
# gpu      THE call: the whole GPU verdict in one command, the most evidence first,
#          each step under its own cap: the machine and `packtrain info` (NCCL world 1
#          too); every GPU test (names matching /cuda|gpu/i: scripts/device/gpu_tests.py)
#          of graphs, runtime, ensemble, distributed, multitask, active-learning,
#          checkpoint and cli tests, then any other binary's, up to
#          PACKTRAIN_TEST_JOBS (3) binaries at a time, a failing binary's failing tests
#          (and those it never reached) rerun at once with C++ stack traces; a short
#          `train --device cuda`; a reduced benchmark (captured unrolled step at
#          K = 1, 64, 2048, 4096, the naive loop at K = 64, multi-task graph vs two
#          forwards, captured vs eager decode, one repetition each) and the targets;
#          compute-sanitizer memcheck of packtrain's own kernels if 90 s remain.
#          (`smoke` and `test`, the earlier phases, now run `gpu`.)
# bench    a second call, when time remains: launch --nproc 1 (NCCL in the trainer),
#          profile at K = 64 and 4096, the all-reduce timings, the captured families
#          at every K with 3 repetitions, the baselines, the default train, targets
# conv     the CNN members' convolution forms (conv_pack_bench: grouped, grouped with
#          cuDNN's benchmark mode, the member loop), each
#          captured as a CUDA graph, at the peers' shapes (issue 38)
# peers    benchmarks/peers/run.sh under a time budget, then targets.py (a loan of its own)
# machine  only the machine record
# build    the fallback: build everything into build-device/ (no bundle carried)
# Binaries: .device/bundle (scripts/device/bundle.sh, run on the CPU machine and
# carried), else build-device/, else build/; `gpu` never builds. After every step,
# $OUT holds summary.txt, steps.tsv, tests.tsv (gpu) and <phase>.tar.gz (logs, JSON,
# machine record), each written under a temporary name and renamed, so a run killed
# at any moment returns what it did. Without a GPU every CUDA step is skipped with its
# reason and the GPU tests skip themselves (the dry run). Budget: the whole phase's
# seconds, PACKTRAIN_PHASE_BUDGET (default 560: the call's 600 less 40).
set -uo pipefail
phase="${1:-}"
case "$phase" in
  smoke | test) phase=gpu ;;  # folded into gpu
  gpu | bench | conv | peers | machine | build) ;;
  *) echo "usage: $0 gpu|bench|conv|peers|machine|build" >&2; exit 2 ;;
esac
here="$(cd "$(dirname "$0")" && pwd)"

# The outer process: the phase under its own timeout (the budget), a signal passed
# on to it; if it was stopped before its own last summary, the last summary it
# published is marked stopped and its work dir packed again.
if [[ -z "${PACKTRAIN_PHASE_INNER:-}" ]]; then
  budget="${PACKTRAIN_PHASE_BUDGET:-560}"
  out="${OUT:-/tmp/packtrain-out/$phase}"
  mkdir -p "$out"
  work=$(mktemp -d "${TMPDIR:-/tmp}/packtrain-$phase.XXXXXX")
  PACKTRAIN_PHASE_INNER=1 PACKTRAIN_PHASE_WORK="$work" OUT="$out" PACKTRAIN_PHASE_BUDGET="$budget" \
    timeout --kill-after=5 "$budget" bash "$0" "$phase" &
  inner=$!
  trap 'kill -TERM "$inner" 2>/dev/null' TERM INT
  rc=0
  while kill -0 "$inner" 2>/dev/null; do wait "$inner"; rc=$?; done
  if [[ -d "$work" && ! -e "$work/.finished" ]]; then
    # The inner phase did not finish (it marks its work dir, then removes it, when it does).
    echo "the phase was stopped by its time limit ($budget s) or a crash (exit $rc) before its last summary" \
      >>"$work/stopped.txt"
    python3 "$here/summarize.py" "$phase" "$work" "$budget" "$SECONDS" --final --tests-tsv "$out/.tests.tsv.$$" \
      --brief "$work/summary_brief.txt.tmp" >"$out/.summary.txt.$$" 2>/dev/null \
      || { cat "$work/stopped.txt"; cat "$work/steps.tsv"; } >"$out/.summary.txt.$$" 2>/dev/null
    mv -f "$out/.summary.txt.$$" "$out/summary.txt"
    [[ -f "$out/.tests.tsv.$$" ]] && mv -f "$out/.tests.tsv.$$" "$out/tests.tsv"
    cp "$work/steps.tsv" "$out/.steps.tsv.$$" 2>/dev/null && mv -f "$out/.steps.tsv.$$" "$out/steps.tsv"
    tar -czf "$out/.$phase.tar.gz.$$" -C "$(dirname "$work")" --transform "s|^$(basename "$work")|$phase|" \
      --exclude='*.tmp' --exclude='.publish.lock' "$(basename "$work")" 2>/dev/null \
      && mv -f "$out/.$phase.tar.gz.$$" "$out/$phase.tar.gz"
    rm -f "$out"/.*.[0-9]*
    cat "$work/summary_brief.txt.tmp" 2>/dev/null || cat "$out/summary.txt"
    echo "[$phase] wrote $(cd "$out" && ls | paste -sd' ' -) to $out after it was stopped"
    [[ -n "${PACKTRAIN_KEEP_WORK:-}" ]] || rm -rf "$work"
  fi
  exit "$rc"
fi

PHASE="$phase"
case "$phase" in
  gpu) STEP_TOTAL=8 ;;  # + one per test binary (and rerun), counted below
  bench) STEP_TOTAL=11 ;;
  conv) STEP_TOTAL=3 ;;
  peers) STEP_TOTAL=4 ;;
  machine) STEP_TOTAL=2 ;;
  build) STEP_TOTAL=3 ;;
esac
# shellcheck source=scripts/device/common.sh
source "$here/common.sh"
exec 3>&1  # the phase's own stdout, for the end even when a signal lands mid-redirection
trap 'finish >&3 2>&1' EXIT
trap 'echo "stopped by a signal after $SECONDS s" >>"$WORK/stopped.txt"; exit 143' TERM INT

machine_step() {
  STEP_INDEX=$((STEP_INDEX + 1))
  local start=$SECONDS
  record_machine
  echo "[$PHASE $STEP_INDEX/$STEP_TOTAL] machine ... ok ($((SECONDS - start)) s): $(cat "$WORK/machine_line.txt")"
  record "machine" "ok" $((SECONDS - start)) "$(cat "$WORK/machine_line.txt")"
  publish
}

# The GPU tests of BINARY, one a line: from the bundle's tests.txt, else listed by the
# binary itself (the same rule: scripts/device/gpu_tests.py).
gpu_tests_of() {
  if [[ "$BIN_FROM" == bundle && -f "$BUNDLE/tests.txt" ]]; then
    awk -v b="$1" '$1 == b && $3 > 0 { print $4 }' "$BUNDLE/tests.txt" | tr ':' '\n'
  else
    python3 "$here/gpu_tests.py" list "$BIN_DIR/$1" 2>/dev/null
  fi
}

test_binaries() {  # every gtest binary there is
  if [[ "$BIN_FROM" == bundle && -f "$BUNDLE/tests.txt" ]]; then
    awk '!/^#/ { print $1 }' "$BUNDLE/tests.txt"
  else
    (cd "$BIN_DIR" && ls -1 ./*_tests 2>/dev/null | sed 's|^\./||')
  fi
}

prepare() {  # TARGET...: the binaries the phase needs
  find_python || say "no Python with torch found (tried python3 and the packtrain venv)"
  detect_gpu
  find_sanitizer
  ((HAVE_GPU)) || { say "$NO_GPU: the CUDA steps are skipped"; echo "$NO_GPU" >"$WORK/no_gpu.txt"; }
  use_binaries "$@"
  say "binaries: $BIN_FROM ($BIN_DIR); budget $BUDGET s"
  echo "$BIN_FROM: $BIN_DIR" >"$WORK/binaries.txt"
  [[ -n "$STALE" ]] && say "WARNING: $STALE"
}

start_phase() {  # TARGET...: prepare, then the machine record and `packtrain info`
  prepare "$@"
  machine_step
  check_binaries
}

phase_machine() {
  start_phase packtrain
}

phase_build() {
  find_python
  detect_gpu
  find_sanitizer
  if ((!HAVE_GPU)) && [[ -z "${PACKTRAIN_DEVICE_BUILD_ANYWAY:-}" ]]; then
    skip_step "build everything on the device" "$NO_GPU: not building here (PACKTRAIN_DEVICE_BUILD_ANYWAY=1 to build)"
  elif compgen -G ".device/debs/*.deb" >/dev/null; then
    run_step "build everything on the device" "$(remaining)" bash "$here/build_on_device.sh" "$PY"
  else
    skip_step "build everything on the device" "no .device/debs: run scripts/device/fetch_debs.sh here and carry .device/debs"
  fi
  BIN_DIR="$DEVICE_BUILD/bin"
  BIN_FROM="build-device"
  echo "$BIN_FROM: $BIN_DIR" >"$WORK/binaries.txt"
  machine_step
  if [[ -x "$BIN_DIR/packtrain" ]]; then check_binaries; else skip_step "packtrain info" "no build-device/bin/packtrain"; fi
}

# --- gpu: the GPU tests, up to PACKTRAIN_TEST_JOBS binaries at a time

# The binaries in the order of their evidence, then any other with GPU tests; each's cap.
GPU_ORDER=(graphs_tests runtime_tests ensemble_tests distributed_tests multitask_tests active_learning_tests
           checkpoint_tests cli_tests)
declare -A GPU_CAP=([graphs_tests]=90 [runtime_tests]=180 [ensemble_tests]=90 [distributed_tests]=120
                    [multitask_tests]=150 [active_learning_tests]=120 [checkpoint_tests]=60 [cli_tests]=150)
# Seconds kept for train, the benchmark and the targets after the tests.
AFTER_TESTS="${PACKTRAIN_AFTER_TESTS:-150}"
test_cap() { echo "${PACKTRAIN_TEST_CAP:-${GPU_CAP[$1]:-90}}"; }  # PACKTRAIN_TEST_CAP: every binary's
QUEUE=()          # "binary|kind|names file|cap", run in order
declare -A JOB=() # pid -> "index|binary|kind|start|cap|names|log|label"
POOL_PIDS=""      # the jobs' timeout processes, for finish()

# plan.tsv: binary <TAB> test, every GPU test the phase would run, in order.
plan_gpu_tests() {
  local b all others=() none=() n names
  all=$(test_binaries)
  for b in $all; do
    [[ " ${GPU_ORDER[*]} " == *" $b "* ]] && continue
    if [[ -n "$(gpu_tests_of "$b")" ]]; then others+=("$b"); else none+=("$b"); fi
  done
  mkdir -p "$WORK/tests"
  : >"$WORK/plan.tsv"
  : >"$WORK/gtest_runs.tsv"
  for b in "${GPU_ORDER[@]}" "${others[@]}"; do
    if ! grep -qx "$b" <<<"$all"; then
      echo "$b: not in the binaries ($BIN_FROM): its GPU tests cannot run" >>"$WORK/notes.txt"
      continue
    fi
    names="$WORK/tests/$b.txt"
    gpu_tests_of "$b" >"$names"
    n=$(grep -c . "$names")
    if ((n == 0)); then none+=("$b"); continue; fi
    awk -v b="$b" 'NF { print b "\t" $0 }' "$names" >>"$WORK/plan.tsv"
    QUEUE+=("$b|main|$names|$(test_cap "$b")")
  done
  STEP_TOTAL=$((STEP_TOTAL + ${#QUEUE[@]}))
  echo "GPU tests: $(grep -c . "$WORK/plan.tsv") in ${#QUEUE[@]} binaries (full names matching /cuda|gpu/i);" \
       "binaries without any: ${none[*]:-none}" >>"$WORK/notes.txt"
  say "GPU tests: $(grep -c . "$WORK/plan.tsv") in ${#QUEUE[@]} binaries"
}

# gtest_states LOG: "<state><TAB><name>" for each test the log started, in order:
# ok, failed, skipped, or unfinished (started, never ended: the binary died or was stopped).
gtest_states() {
  awk '
    /^\[ RUN      \] / { if (!($4 in st)) order[++n] = $4; st[$4] = "unfinished"; next }
    /^\[       OK \] / { st[$4] = "ok"; next }
    /^\[  SKIPPED \] / { if ($4 in st) st[$4] = "skipped"; next }
    /^\[  FAILED  \] / { name = $4; sub(/,$/, "", name); if (name in st) st[name] = "failed"; next }
    END { for (i = 1; i <= n; i++) print st[order[i]] "\t" order[i] }' "$1" 2>/dev/null
}

pool_start() {  # ENTRY: one queued gtest run, started in the background
  local b kind names cap
  IFS='|' read -r b kind names cap <<<"$1"
  local n label
  n=$(grep -c . "$names")
  if [[ "$kind" == main ]]; then label="$b: $n GPU tests"; else label="$b: $kind"; fi
  local left=$((POOL_DEADLINE - SECONDS))
  if [[ -n "$BROKEN" ]] || ((left < 10)); then
    skip_step "$label" "${BROKEN:-the share of the budget for tests is spent}"
    printf '%s\t%s\t%s\t\t\t%s\n' "$STEP_INDEX" "$b" "$kind" "$names" >>"$WORK/gtest_runs.tsv"
    return
  fi
  ((cap > left)) && cap=$left
  STEP_INDEX=$((STEP_INDEX + 1))
  local stem log json
  stem="$(printf '%02d' "$STEP_INDEX")_$(slug "$b $kind")"
  log="$WORK/logs/$stem.log"
  json="$WORK/json/gtest_$stem.json"
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$STEP_INDEX" "$b" "$kind" "$json" "$log" "$names" >>"$WORK/gtest_runs.tsv"
  running_add "$STEP_INDEX" "$label"
  local env=()
  [[ "$kind" != main ]] && env=(TORCH_SHOW_CPP_STACKTRACES=1)
  echo "[$PHASE $STEP_INDEX/$STEP_TOTAL] $label ... started (cap $cap s)"
  # A subshell per run: it waits for the binary (passing a TERM on to it) and leaves
  # the exit status in a file, so a binary killed by a signal is reported like any other.
  (
    env "${env[@]}" timeout --kill-after=10 "$cap" "$BIN_DIR/$b" --gtest_filter="$(paste -sd: "$names")" \
      --gtest_output="json:$json" >"$log" 2>&1 </dev/null &
    child=$!
    trap 'kill -TERM "$child" 2>/dev/null' TERM
    rc=0
    while kill -0 "$child" 2>/dev/null; do wait "$child"; rc=$?; done
    echo "$rc" >"$log.rc.tmp" && mv -f "$log.rc.tmp" "$log.rc"
  ) 2>>"$log" &
  JOB[$!]="$STEP_INDEX|$b|$kind|$SECONDS|$cap|$names|$log|$label"
  POOL_PIDS="${!JOB[*]}"
}

pool_done() {  # PID RC: record a finished run; a failing first run queues its rerun first
  local index b kind start cap names log label
  IFS='|' read -r index b kind start cap names log label <<<"${JOB[$1]}"
  unset "JOB[$1]"
  POOL_PIDS="${!JOB[*]}"
  running_remove "$index"
  step_outcome "$2"
  local states took=$((SECONDS - start)) counts
  states=$(gtest_states "$log")
  counts="$(grep -c '^ok' <<<"$states") passed, $(grep -c '^failed' <<<"$states") failed,"
  counts+=" $(grep -c '^skipped' <<<"$states") skipped"
  local unfinished not_reached
  unfinished=$(awk -F'\t' '$1 == "unfinished" { print $2 }' <<<"$states")
  not_reached=$(cut -f2 <<<"$states" | grep -vxF -f - "$names" || true)
  [[ -n "$states" ]] || not_reached=$(cat "$names")
  [[ -n "$unfinished" ]] && counts+=", stopped in $(paste -sd' ' - <<<"$unfinished")"
  [[ -n "$not_reached" ]] && counts+=", $(grep -c . <<<"$not_reached") never reached"
  (($2 == 124 || $2 == 137)) && counts+=" (stopped after $cap s)"
  echo "[$PHASE $index/$STEP_TOTAL] $label ... $OUTCOME ($took s): $counts"
  record "$label" "$OUTCOME" "$took" "$counts" "$index"
  # A first attempt that did not pass everything: at once, the tests it never reached
  # (after a crash or a hang) run on, and its failed and crashed tests rerun, both
  # with C++ stack traces (TORCH_SHOW_CPP_STACKTRACES=1). A hung test is not rerun: it
  # would only hang again. A rerun is not rerun.
  if [[ "$kind" != rerun* && "$2" != 0 ]]; then
    local again="$WORK/tests/$b.$index.rerun.txt" rest="$WORK/tests/$b.$index.rest.txt" failed crashed="" why=()
    failed=$(awk -F'\t' '$1 == "failed" { print $2 }' <<<"$states")
    (($2 != 124 && $2 != 137)) && crashed="$unfinished"
    printf '%s\n' "$failed" "$crashed" | grep . >"$again"
    [[ -n "$failed" ]] && why+=("$(grep -c . <<<"$failed") failed")
    [[ -n "$crashed" ]] && why+=("$(grep -c . <<<"$crashed") crashed")
    if [[ -n "$not_reached" ]]; then
      echo "$not_reached" >"$rest"
      STEP_TOTAL=$((STEP_TOTAL + 1))
      QUEUE=("$b|rest: $(grep -c . "$rest") never reached, C++ stack traces|$rest|$(test_cap "$b")" "${QUEUE[@]}")
    fi
    if [[ -s "$again" ]]; then
      STEP_TOTAL=$((STEP_TOTAL + 1))
      QUEUE=("$b|rerun: $(IFS=,; echo "${why[*]}" | sed 's/,/, /g'), C++ stack traces|$again|$(test_cap "$b")" "${QUEUE[@]}")
    fi
  fi
  publish
}

run_test_pool() {
  local jobs="${PACKTRAIN_TEST_JOBS:-3}" pid log
  POOL_DEADLINE=$((BUDGET - RESERVE - AFTER_TESTS))
  while ((${#QUEUE[@]} > 0 || ${#JOB[@]} > 0)); do
    while ((${#QUEUE[@]} > 0 && ${#JOB[@]} < jobs)); do
      pool_start "${QUEUE[0]}"
      QUEUE=("${QUEUE[@]:1}")
    done
    ((${#JOB[@]} > 0)) || continue
    sleep 1
    for pid in "${!JOB[@]}"; do
      log=$(cut -d'|' -f7 <<<"${JOB[$pid]}")
      if [[ -s "$log.rc" ]]; then
        wait "$pid" 2>/dev/null
        pool_done "$pid" "$(cat "$log.rc")"
      elif ! kill -0 "$pid" 2>/dev/null; then
        pool_done "$pid" 137  # its subshell was killed
      fi
    done
  done
}

phase_gpu() {
  NO_DEVICE_BUILD=1  # the bundle is the only path: a build cannot fit
  prepare packtrain
  publish_every 20
  machine_step
  check_binaries
  run_step --needs-gpu "NCCL world 1 (packtrain info --collectives --device cuda)" 60 \
    "$BIN_DIR/packtrain" info --collectives --device cuda
  if [[ -z "$BROKEN" ]]; then plan_gpu_tests; fi
  publish
  run_test_pool
  run_step --needs-gpu --stdout "$WORK/json/train.json" "train --device cuda --epochs 3" 60 \
    "$BIN_DIR/packtrain" train --device cuda --epochs 3 --json
  # The reduced benchmark: the targets' shapes, one repetition each. On a CPU the
  # captured families do not exist; the baselines run briefly to prove the JSON flow.
  local bench="$BIN_DIR/packtrain_bench" min_time=0.1
  ((HAVE_GPU)) || min_time=0.01
  local common=(--benchmark_repetitions=1 "--benchmark_min_time=$min_time" --benchmark_out_format=json)
  run_step --needs-gpu "bench: captured unrolled step, K = 1, 64, 2048, 4096" 120 env PACKTRAIN_BENCH_DEPTH=1 "$bench" \
    '--benchmark_filter=^PackedGraphUnrolled/members:(1|64|2048|4096)/hidden:64/batch:128/depth:1/' \
    "${common[@]}" --benchmark_out="$WORK/json/bench_captured.json"
  run_step "bench: naive loop K = 64, multi-task graph vs two forwards, captured vs eager decode" 120 \
    env PACKTRAIN_BENCH_DEPTH=1 "$bench" \
    '--benchmark_filter=^NaiveLoop/members:64/hidden:64/batch:128/depth:1/|^MultiTask(Graph|TwoForward)(/|$)|^Decode(Graph|Eager)(/|$)' \
    "${common[@]}" --benchmark_out="$WORK/json/bench_baselines.json"
  local no_gpu=()
  ((HAVE_GPU)) || no_gpu=(--no-gpu "$NO_GPU")
  run_step --reserve --stdout "$WORK/targets.txt" "targets (scripts/device/targets.py)" 30 \
    bash -c 'cd "$1" && shift && python3 "$@" json/bench_*.json' targets "$WORK" "$here/targets.py" "${no_gpu[@]}"
  # compute-sanitizer memcheck of packtrain's own kernels (the CUDA Adam update, the
  # dropout masks), only when 90 s remain.
  local name="compute-sanitizer memcheck: packtrain's kernels (ensemble_tests PackedAdamStep, PackedModel on cuda)"
  if ((!HAVE_GPU)); then
    skip_step "$name" "$NO_GPU"
  elif [[ -z "$SANITIZER" ]]; then
    skip_step "$name" "compute-sanitizer not found"
  elif (($(remaining) < 90)); then
    skip_step "$name" "$(remaining) s left, it needs 90"
  else
    local only=()
    "$SANITIZER" --help 2>&1 | grep -q -- '--kernel-name' && only=(--kernel-name kns=packtrain)
    run_step "$name" "$(remaining)" "$SANITIZER" --tool memcheck --error-exitcode 3 --print-limit 20 --leak-check no \
      "${only[@]}" "$BIN_DIR/ensemble_tests" --gtest_filter='Devices/PackedAdamStep.*/cuda:Devices/PackedModel.*/cuda'
  fi
}

phase_bench() {
  start_phase packtrain packtrain_bench
  publish_every 20
  local bench="$BIN_DIR/packtrain_bench" reps=3 min_time=0.2 aggregates=true
  ((HAVE_GPU)) || { reps=1; min_time=0.01; aggregates=false; }
  local common=("--benchmark_repetitions=$reps" "--benchmark_min_time=$min_time"
                "--benchmark_report_aggregates_only=$aggregates" --benchmark_out_format=json)
  # What the gpu call leaves out first (NCCL inside the trainer, the profiles), then
  # the captured families at every K of the targets' shapes with repetitions.
  run_step --needs-gpu --stdout "$WORK/json/launch1.txt" "launch --nproc 1 -- train --device cuda (NCCL captured)" 150 \
    "$BIN_DIR/packtrain" launch --nproc 1 -- train --device cuda --json
  local k
  for k in 64 4096; do
    run_step --needs-gpu --stdout "$WORK/json/profile_k$k.json" "profile --members $k" 120 \
      "$BIN_DIR/packtrain" profile --members "$k" --device cuda --json --trace "$WORK/json/trace_k$k.json"
  done
  run_step --needs-gpu --stdout "$WORK/json/allreduce.json" "profile --collectives --device cuda (NCCL all-reduce)" 60 \
    "$BIN_DIR/packtrain" profile --collectives --device cuda --repeats 20 --json
  run_step --needs-gpu "bench: PackedGraph, PackedGraphUnrolled (every K, depth 1)" 200 env PACKTRAIN_BENCH_DEPTH=1 "$bench" \
    '--benchmark_filter=^PackedGraph(Unrolled)?/members:[0-9]+/hidden:64/batch:128/depth:1/|^PackedGraph(Unrolled)?/members:64/hidden:512/batch:128/depth:1/' \
    "${common[@]}" --benchmark_out="$WORK/json/bench_captured.json"
  run_step "bench: NaiveLoop K=64, MultiTask (graph, two forwards, shared), Decode*" 150 env PACKTRAIN_BENCH_DEPTH=1 "$bench" \
    '--benchmark_filter=^NaiveLoop/members:64/hidden:64/batch:128/depth:1/|^MultiTask(Graph|TwoForward|Shared)(/|$)|^Decode' \
    "${common[@]}" \
    --benchmark_out="$WORK/json/bench_baselines.json"
  run_step --needs-gpu --stdout "$WORK/json/train.json" "train --device cuda (the default run)" 120 \
    "$BIN_DIR/packtrain" train --device cuda --json
  local no_gpu=()
  ((HAVE_GPU)) || no_gpu=(--no-gpu "$NO_GPU")
  run_step --reserve --stdout "$WORK/targets.txt" "targets (scripts/device/targets.py)" 30 \
    bash -c 'cd "$1" && shift && python3 "$@" json/bench_*.json' targets "$WORK" "$here/targets.py" "${no_gpu[@]}"
}

phase_conv() {
  start_phase packtrain_bench
  publish_every 20
  local min_time=0.2
  ((HAVE_GPU)) || min_time=0.01
  run_step "bench: ConvPack (grouped, grouped tuned, member loop)" "$(($(remaining) - 10))" \
    "$BIN_DIR/packtrain_bench" '--benchmark_filter=^ConvPack' "--benchmark_min_time=$min_time" \
    --benchmark_out_format=json --benchmark_out="$WORK/json/bench_conv.json"
}

phase_peers() {
  start_phase packtrain_bench packtrain_peers
  publish_every 30
  if ! "$PY" -c "import optax" 2>/dev/null && compgen -G ".device/wheels/*.whl" >/dev/null; then
    "$PY" -m pip install --quiet --no-index --no-deps --target .device/pyextra .device/wheels/*.whl \
      >"$WORK/logs/optax_wheels.log" 2>&1 && export PYTHONPATH="$root/.device/pyextra${PYTHONPATH:+:$PYTHONPATH}"
  fi
  local left args
  left=$(remaining)
  if ((HAVE_GPU)); then
    args=(--repeats 3 --min-time 0.2 --peer-timeout 120 --time-budget $((left - 45)))
  else  # the dry run: one small workload, the Python loop only
    args=(--device cpu --members 8 --repeats 1 --min-time 0.01 --check-steps 2 --peers torch-loop --time-budget 60)
  fi
  # shellcheck disable=SC2206
  args+=(${PACKTRAIN_PEERS_ARGS:-})
  export PYTHONUNBUFFERED=1 PACKTRAIN_PEERS_PYTHON="$PY" PACKTRAIN_PEERS_NO_BUILD=1
  PACKTRAIN_BUILD_DIR="$(dirname "$BIN_DIR")"
  export PACKTRAIN_BUILD_DIR
  echo "peers: benchmarks/peers/run.sh ${args[*]}" >>"$WORK/notes.txt"
  run_step "peers (benchmarks/peers/run.sh)" $((left - 15)) \
    bash "$root/benchmarks/peers/run.sh" --out "$WORK/peers" "${args[@]}"
  run_step --reserve --stdout "$WORK/targets.txt" "targets (scripts/device/targets.py)" 30 \
    bash -c 'cd "$1" && python3 "$2" peers/results.json peers/work/packtrain_bench.json' targets "$WORK" "$here/targets.py"
}

"phase_$phase"
phase_status
