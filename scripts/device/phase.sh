#!/usr/bin/env bash
# One phase of the GPU-machine run, one `run` tool command each, ending well inside
# the tool's 10 minutes under its own `timeout`:
#   scripts/device/phase.sh smoke|test|bench|peers|machine|build
# smoke    fail fast: the binaries start, NCCL world 1, captured step == eager step
#          on the GPU, a 2-epoch train on the GPU
# test     every CUDA test instance, then compute-sanitizer memcheck on the
#          captured-step, CUDA Adam and device-batcher tests
# bench    the captured benchmark families and the targets' baselines, profile at
#          K = 64 and 4096, the default train, launch --nproc 1 (NCCL captured),
#          the all-reduce timings, then scripts/device/targets.py
# peers    benchmarks/peers/run.sh under a time budget, then targets.py
# machine  only the machine record
# build    the fallback: build everything into build-device/ (no bundle carried)
# Binaries: .device/bundle (scripts/device/bundle.sh, run on the CPU machine and
# carried), else build-device/, else build/, else a build made here
# (scripts/device/build_on_device.sh). Each step runs under `timeout`, prints one
# progress line and is guarded; at the end $OUT holds <phase>.tar.gz (logs, JSON,
# machine.txt) and summary.txt. Without a GPU every CUDA step is skipped with its
# reason (the dry run). Budget: PACKTRAIN_PHASE_BUDGET (default 540 s).
# See scripts/device/README.md.
set -uo pipefail
phase="${1:-}"
case "$phase" in
  smoke | test | bench | peers | machine | build) ;;
  *) echo "usage: $0 smoke|test|bench|peers|machine|build" >&2; exit 2 ;;
esac
here="$(cd "$(dirname "$0")" && pwd)"

# The outer process: the phase under its own timeout; if even that fires, whatever
# the phase left is still packed.
if [[ -z "${PACKTRAIN_PHASE_INNER:-}" ]]; then
  budget="${PACKTRAIN_PHASE_BUDGET:-540}"
  out="${OUT:-/tmp/packtrain-out/$phase}"
  work=$(mktemp -d "${TMPDIR:-/tmp}/packtrain-$phase.XXXXXX")
  PACKTRAIN_PHASE_INNER=1 PACKTRAIN_PHASE_WORK="$work" OUT="$out" \
    timeout --kill-after=10 $((budget + 30)) bash "$0" "$@"
  rc=$?
  if [[ ! -f "$out/summary.txt" ]]; then
    mkdir -p "$out"
    { echo "packtrain device phase $phase: stopped by its outer timeout ($((budget + 30)) s) or a crash (exit $rc)"
      cat "$work/machine_line.txt" 2>/dev/null
      cat "$work/steps.tsv" 2>/dev/null; } >"$out/summary.txt"
    tar -czf "$out/$phase.tar.gz" -C "$work" . 2>/dev/null
    cat "$out/summary.txt"
  fi
  exit $rc
fi

PHASE="$phase"
case "$phase" in
  smoke) STEP_TOTAL=6 ;;
  test) STEP_TOTAL=2 ;;  # + one per test binary with CUDA instances + 3 memchecks, counted below
  bench) STEP_TOTAL=10 ;;
  peers) STEP_TOTAL=4 ;;
  machine) STEP_TOTAL=2 ;;
  build) STEP_TOTAL=3 ;;
esac
# shellcheck source=scripts/device/common.sh
source "$here/common.sh"
exec 3>&1  # the phase's own stdout, for the end even when a signal lands mid-redirection
trap 'finish >&3 2>&1' EXIT
trap 'echo "stopped by a signal after $SECONDS s, in step $STEP_INDEX" >"$WORK/stopped.txt"; exit 143' TERM INT

machine_step() {
  STEP_INDEX=$((STEP_INDEX + 1))
  local start=$SECONDS
  record_machine
  echo "[$PHASE $STEP_INDEX/$STEP_TOTAL] machine ... ok ($((SECONDS - start)) s): $(cat "$WORK/machine_line.txt")"
  record "machine" "ok" $((SECONDS - start)) "$(cat "$WORK/machine_line.txt")"
}

# gtest_step NAME TIMEOUT BINARY FILTER [WRAPPER...]: one test binary, its outcomes in
# json/<slug>.json (gtest's own JSON), output in the step's log.
gtest_step() {
  local name="$1" limit="$2" binary="$3" filter="$4"
  shift 4
  run_step "$name" "$limit" "$@" "$BIN_DIR/$binary" --gtest_filter="$filter" \
    --gtest_output="json:$WORK/json/$(slug "$name").json"
}

# The exact CUDA instances of BINARY, ':'-separated (a gtest filter): from the
# bundle's tests.txt, else listed by the binary itself.
cuda_filter() {
  if [[ "$BIN_FROM" == bundle && -f "$BUNDLE/tests.txt" ]]; then
    awk -v b="$1" '$1 == b && $3 > 0 { print $4 }' "$BUNDLE/tests.txt"
  else
    timeout 60 "$BIN_DIR/$1" --gtest_list_tests 2>/dev/null \
      | awk '/^[^ ]/ { suite = $1 } /^  / { print suite $1 }' | grep -i cuda | paste -sd: -
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
  ((HAVE_GPU)) || say "$NO_GPU: the CUDA steps are skipped"
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

phase_smoke() {
  start_phase packtrain graphs_tests runtime_tests
  run_step --needs-gpu "NCCL world 1 (info --collectives --device cuda)" 90 \
    "$BIN_DIR/packtrain" info --collectives --device cuda
  gtest_step "captured step == eager step (graphs_tests, cuda)" 90 graphs_tests \
    'Devices/CapturedStepTest.EveryCallIsOneStepAndMatchesTheEagerStep/cuda'
  gtest_step "trainer steps == eager loop (runtime_tests, cuda)" 120 runtime_tests \
    'Devices/EnsembleStepsTest.MatchesTheEagerLoop*/cuda'
  run_step --needs-gpu --stdout "$WORK/json/train_smoke.json" "train --device cuda --epochs 2" 90 \
    "$BIN_DIR/packtrain" train --device cuda --epochs 2 --json
}

phase_test() {
  prepare ensemble_tests graphs_tests runtime_tests multitask_tests distributed_tests active_learning_tests \
    checkpoint_tests
  # The test binaries, those with CUDA instances first in this order, memcheck after
  # the three core ones (so a slow trainer test cannot starve it).
  local first=(graphs_tests ensemble_tests runtime_tests) rest=() none=() b filter
  local all
  all=$(test_binaries)
  for b in $all; do
    [[ " ${first[*]} " == *" $b "* ]] && continue
    if [[ -n "$(cuda_filter "$b")" ]]; then rest+=("$b"); else none+=("$b"); fi
  done
  STEP_TOTAL=$((STEP_TOTAL + ${#first[@]} + ${#rest[@]} + 3))
  echo "test binaries without CUDA instances (not run here): ${none[*]:-none}" >>"$WORK/notes.txt"
  machine_step
  check_binaries
  declare -A limits=([graphs_tests]=60 [ensemble_tests]=90 [runtime_tests]=90 [multitask_tests]=90
                     [distributed_tests]=45 [checkpoint_tests]=45 [active_learning_tests]=90)
  for b in "${first[@]}"; do
    filter=$(cuda_filter "$b")
    if [[ -z "$filter" ]]; then skip_step "$b (cuda)" "no CUDA instances found"; continue; fi
    gtest_step "$b (cuda)" "${limits[$b]:-90}" "$b" "$filter"
  done
  local why=""
  ((HAVE_GPU)) || why="$NO_GPU"
  [[ -z "$SANITIZER" ]] && why="${why:+$why; }compute-sanitizer not found"
  local memchecks=(
    "graphs_tests|Devices/CapturedStepTest.*/cuda|memcheck: captured step"
    "ensemble_tests|Devices/PackedAdamStep.*/cuda|memcheck: CUDA Adam"
    "graphs_tests|Devices/DeviceBatcherTest.*/cuda|memcheck: device batcher"
  )
  local m bin pattern name
  for m in "${memchecks[@]}"; do
    IFS='|' read -r bin pattern name <<<"$m"
    if [[ -n "$why" ]]; then skip_step "$name ($bin)" "$why"; continue; fi
    gtest_step "$name ($bin)" 120 "$bin" "$pattern" \
      "$SANITIZER" --tool memcheck --error-exitcode 3 --print-limit 20 --leak-check no
  done
  for b in "${rest[@]}"; do
    gtest_step "$b (cuda)" "${limits[$b]:-90}" "$b" "$(cuda_filter "$b")"
  done
}

phase_bench() {
  start_phase packtrain packtrain_bench
  local bench="$BIN_DIR/packtrain_bench" reps=3 min_time=0.2 aggregates=true
  ((HAVE_GPU)) || { reps=1; min_time=0.01; aggregates=false; }
  local common=("--benchmark_repetitions=$reps" "--benchmark_min_time=$min_time"
                "--benchmark_report_aggregates_only=$aggregates" --benchmark_out_format=json)
  # The targets' shapes (depth 1: every K at hidden 64, K 64 at hidden 512); the full
  # grid of depths and widths is the peers phase's.
  run_step --needs-gpu "bench: PackedGraph, PackedGraphUnrolled (every K, depth 1)" 200 "$bench" \
    '--benchmark_filter=^PackedGraph(Unrolled)?/members:[0-9]+/hidden:64/batch:128/depth:1/|^PackedGraph(Unrolled)?/members:64/hidden:512/batch:128/depth:1/' \
    "${common[@]}" --benchmark_out="$WORK/json/bench_captured.json"
  # The baselines of the targets (on CPU too: the dry run proves the JSON flow).
  run_step "bench: NaiveLoop K=64, MultiTask*, Decode*" 150 "$bench" \
    '--benchmark_filter=^NaiveLoop/members:64/hidden:64/batch:128/depth:1/|^MultiTask|^Decode' "${common[@]}" \
    --benchmark_out="$WORK/json/bench_baselines.json"
  local k
  for k in 64 4096; do
    run_step --needs-gpu --stdout "$WORK/json/profile_k$k.json" "profile --members $k" 120 \
      "$BIN_DIR/packtrain" profile --members "$k" --device cuda --json --trace "$WORK/json/trace_k$k.json"
  done
  run_step --needs-gpu --stdout "$WORK/json/train.json" "train --device cuda (the default run)" 120 \
    "$BIN_DIR/packtrain" train --device cuda --json
  run_step --needs-gpu --stdout "$WORK/json/launch1.txt" "launch --nproc 1 -- train --device cuda (NCCL captured)" 150 \
    "$BIN_DIR/packtrain" launch --nproc 1 -- train --device cuda --json
  run_step --needs-gpu --stdout "$WORK/json/allreduce.json" "profile --collectives --device cuda (NCCL all-reduce)" 60 \
    "$BIN_DIR/packtrain" profile --collectives --device cuda --repeats 20 --json
  run_step --reserve --stdout "$WORK/targets.txt" "targets (scripts/device/targets.py)" 30 \
    bash -c 'cd "$1" && python3 "$2" json/bench_*.json' targets "$WORK" "$here/targets.py"
}

phase_peers() {
  start_phase packtrain_bench packtrain_peers
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
