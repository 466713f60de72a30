# shellcheck shell=bash
# Sourced by scripts/device/phase.sh: the budget, guarded steps with progress lines,
# the machine record, finding the binaries (the carried bundle, else a build made on
# the device) and packing a phase's logs into $OUT. Bash; no `set -e`: every step is
# guarded, so one failure does not lose the rest.

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root" || exit 2

# --- the phase, its budget and its work dir

PHASE="${PHASE:?PHASE must be set}"
OUT="${OUT:-/tmp/packtrain-out/$PHASE}"
BUDGET="${PACKTRAIN_PHASE_BUDGET:-540}"  # seconds for all steps, well inside the tool's 600
RESERVE=20                               # kept back for the summary and the tarball
WORK="${PACKTRAIN_PHASE_WORK:-$(mktemp -d "${TMPDIR:-/tmp}/packtrain-$PHASE.XXXXXX")}"
mkdir -p "$OUT" "$WORK/logs" "$WORK/json"
STEPS="$WORK/steps.tsv"  # index, name, outcome, seconds, detail
: >"$STEPS"
STEP_INDEX=0
STEP_TOTAL="${STEP_TOTAL:-0}"
BROKEN=""  # set once the binaries cannot run: every later step is skipped saying why

say() { echo "[$PHASE] $*"; }
remaining() { echo $((BUDGET - RESERVE - SECONDS)); }
slug() { echo "$1" | tr 'A-Z' 'a-z' | sed -e 's/[^a-z0-9]\+/_/g' -e 's/^_//' | cut -c1-60 | sed 's/_$//'; }

record() {  # record NAME OUTCOME SECONDS [DETAIL]
  printf '%s\t%s\t%s\t%s\t%s\n' "$STEP_INDEX" "$1" "$2" "$3" "${4:-}" >>"$STEPS"
}

# skip_step NAME REASON
skip_step() {
  STEP_INDEX=$((STEP_INDEX + 1))
  echo "[$PHASE $STEP_INDEX/$STEP_TOTAL] $1 ... skipped ($2)"
  record "$1" "skipped" 0 "$2"
}

# run_step [--stdout FILE] [--needs-gpu] [--reserve] NAME TIMEOUT CMD ARGS...
# Runs CMD under `timeout` (TIMEOUT, or less when the budget has less left), its
# output in $WORK/logs/<name>.log (stdout in FILE with --stdout); prints one progress
# line; records ok / failed (exit N) / timed out / skipped (why). Returns CMD's status.
# --reserve: a last, cheap step (targets.py) that may also use the packing reserve.
run_step() {
  local stdout="" needs_gpu=0 reserve=0
  while [[ "$1" == --* ]]; do
    case "$1" in
      --stdout) stdout="$2"; shift 2 ;;
      --needs-gpu) needs_gpu=1; shift ;;
      --reserve) reserve=1; shift ;;
      *) echo "run_step: unknown option $1" >&2; return 2 ;;
    esac
  done
  local name="$1" limit="$2"
  shift 2
  if [[ -n "$BROKEN" ]]; then skip_step "$name" "$BROKEN"; return 0; fi
  if ((needs_gpu)) && ((!HAVE_GPU)); then skip_step "$name" "$NO_GPU"; return 0; fi
  local left
  left=$(remaining)
  ((reserve)) && left=$((left + RESERVE - 10))
  if ((left < 5)); then skip_step "$name" "phase budget of $BUDGET s spent"; return 0; fi
  ((limit > left)) && limit=$left
  STEP_INDEX=$((STEP_INDEX + 1))
  local log
  log="$WORK/logs/$(printf '%02d' "$STEP_INDEX")_$(slug "$name").log"
  printf '[%s %d/%d] %s ... ' "$PHASE" "$STEP_INDEX" "$STEP_TOTAL" "$name"
  local start=$SECONDS rc
  if [[ -n "$stdout" ]]; then
    timeout --kill-after=10 "$limit" "$@" >"$stdout" 2>"$log"
  else
    timeout --kill-after=10 "$limit" "$@" >"$log" 2>&1
  fi
  rc=$?
  local took=$((SECONDS - start)) outcome detail=""
  if ((rc == 0)); then
    outcome="ok"
  elif ((rc == 124 || rc == 137)); then
    outcome="timed out"
    detail="stopped after $limit s"
  else
    outcome="failed (exit $rc)"
    detail=$(grep -v '^\s*$' "$log" | tail -1 | cut -c1-200)
  fi
  echo "$outcome ($took s)${detail:+: $detail}"
  record "$name" "$outcome" "$took" "$detail"
  return $rc
}

# --- the machine

PY=""  # a Python with torch: the image's python3 on the GPU machine
find_python() {
  local cand
  for cand in "${PACKTRAIN_DEVICE_PYTHON:-}" python3 \
      "${PACKTRAIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/packtrain}/venv-torch-2.11.0/bin/python"; do
    [[ -n "$cand" ]] || continue
    if "$cand" -c "import torch" >/dev/null 2>&1; then PY="$cand"; return 0; fi
  done
  PY=python3
  return 1
}

HAVE_GPU=0
NO_GPU=""
detect_gpu() {
  local problems=()
  if ! command -v nvidia-smi >/dev/null 2>&1; then
    problems+=("nvidia-smi not found")
  elif ! nvidia-smi -L >/dev/null 2>&1; then
    problems+=("nvidia-smi sees no GPU")
  fi
  if "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" >/dev/null 2>&1; then
    HAVE_GPU=1
    return 0
  fi
  problems+=("torch.cuda.is_available() is False")
  NO_GPU="no GPU: $(IFS=';'; echo "${problems[*]}" | sed 's/;/; /g')"
}

SANITIZER=""
find_sanitizer() {
  local c
  for c in "$(command -v compute-sanitizer 2>/dev/null)" /usr/local/cuda/bin/compute-sanitizer \
      /usr/local/cuda/compute-sanitizer/compute-sanitizer $(ls -d /usr/local/cuda-*/bin/compute-sanitizer 2>/dev/null); do
    [[ -n "$c" && -x "$c" ]] && { SANITIZER="$c"; return 0; }
  done
  return 1
}

# machine.txt (everything) and machine_line.txt (one line for the summary).
record_machine() {
  local f="$WORK/machine.txt"
  {
    echo "== date";        date -u '+%Y-%m-%d %H:%M:%S UTC'
    echo "== host";        uname -a; echo "cpus: $(nproc)"; free -g 2>/dev/null | head -2
    echo "== nvidia-smi";  (timeout 30 nvidia-smi 2>&1 || echo "nvidia-smi: not found or failed")
    echo "== gpu";         (timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem \
                              --format=csv 2>&1 || echo "none")
    echo "== nvcc";        (nvcc --version 2>&1 || echo "nvcc: not found")
    echo "== g++";         (g++ --version 2>&1 | head -1 || echo "g++: not found")
    echo "== cmake";       (cmake --version 2>&1 | head -1 || echo "cmake: not found")
    echo "== ninja";       (ninja --version 2>&1 || echo "ninja: not found")
    echo "== compute-sanitizer"; if [[ -n "$SANITIZER" ]]; then "$SANITIZER" --version 2>&1 | tail -2; else echo "not found"; fi
    echo "== python";      echo "$PY"
    timeout 60 "$PY" - <<'EOF' 2>&1
import platform
print("python", platform.python_version())
try:
    import torch
    print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())
    print("torch_lib", torch.__file__.rsplit("/", 1)[0] + "/lib")
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        print("device", torch.cuda.get_device_name(0), f"sm_{p.major}{p.minor}", f"{p.total_memory / 2**30:.0f} GiB",
              f"{p.multi_processor_count} SMs")
        print("nccl", ".".join(map(str, torch.cuda.nccl.version())))
    else:
        print("device none (torch.cuda.is_available() is False)")
except Exception as e:
    print("torch: not importable:", e)
for m in ("jax", "optax", "numpy"):
    try:
        print(m, __import__(m).__version__)
    except Exception:
        print(m, "missing")
EOF
    echo "== binaries";    echo "$BIN_FROM: $BIN_DIR"
    [[ -f "$BUNDLE/manifest.txt" ]] && { echo "== bundle manifest"; cat "$BUNDLE/manifest.txt"; }
    echo "== LD_LIBRARY_PATH"; echo "${LD_LIBRARY_PATH:-}" | tr ':' '\n'
  } >"$f" 2>&1
  local gpu driver nvcc gxx cm torch
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
  driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)
  nvcc=$(nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p')
  gxx=$(g++ -dumpfullversion 2>/dev/null)
  cm=$(cmake --version 2>/dev/null | head -1 | awk '{print $3}')
  torch=$(grep -m1 '^torch ' "$f" | awk '{print $2 " (CUDA " $4 ")"}')
  echo "GPU ${gpu:-none}, driver ${driver:-none}, nvcc ${nvcc:-none}, g++ ${gxx:-none}, CMake ${cm:-none}," \
       "torch ${torch:-none}, sanitizer ${SANITIZER:+$("$SANITIZER" --version 2>/dev/null | sed -n 's/.*Version \([^ ]*\).*/\1/p' | head -1)}${SANITIZER:-none}" \
       >"$WORK/machine_line.txt"
}

# --- the binaries

BIN_DIR=""
BIN_FROM=""
BUNDLE="${PACKTRAIN_DEVICE_BUNDLE:-$root/.device/bundle}"
DEVICE_BUILD="$root/build-device"

# The image's torch/lib and the nvidia wheels' lib dirs (cudart, NCCL, cuBLAS ...).
torch_library_path() {
  "$PY" - <<'EOF' 2>/dev/null
import glob, os, torch
torch_dir = os.path.dirname(torch.__file__)
site = os.path.dirname(torch_dir)
dirs = [os.path.join(torch_dir, "lib")] + sorted(glob.glob(os.path.join(site, "nvidia", "*", "lib")))
print(":".join(d for d in dirs if os.path.isdir(d)))
EOF
}

source "$(dirname "${BASH_SOURCE[0]}")/source_hash.sh"

STALE=""
# use_binaries TARGET...: the carried bundle, else build-device/ (a build made on this
# machine earlier), else build/ (this machine's own build: the dry run), else builds
# TARGETs on this machine (the fallback: carried .debs, the image's torch).
use_binaries() {
  local t missing=0
  if [[ -x "$BUNDLE/bin/packtrain" ]]; then
    BIN_DIR="$BUNDLE/bin"
    BIN_FROM="bundle"
    LD_LIBRARY_PATH="$BUNDLE/lib:$(torch_library_path)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export LD_LIBRARY_PATH
    export PACKTRAIN_DATA_DIR="$BUNDLE/share/packtrain/data"
    local built now
    built=$(sed -n 's/^source_hash: //p' "$BUNDLE/manifest.txt" 2>/dev/null)
    now=$(source_hash)
    [[ -n "$built" && "$built" != "$now" ]] && STALE="the bundle was built from sources $built, the tree here is $now: run scripts/device/bundle.sh again"
  else
    for t in "$@"; do [[ -x "$DEVICE_BUILD/bin/$t" ]] || missing=1; done
    if ((missing == 0)) && [[ -d "$DEVICE_BUILD/bin" ]]; then
      BIN_DIR="$DEVICE_BUILD/bin"; BIN_FROM="build-device (built on this machine earlier)"
    else
      missing=0
      for t in "$@"; do [[ -x "$root/build/bin/$t" ]] || missing=1; done
      if ((missing == 0)); then
        BIN_DIR="$root/build/bin"; BIN_FROM="build (this machine's own build)"
      else
        build_on_device "$@"
      fi
    fi
    export PACKTRAIN_DATA_DIR="$root/data"
  fi
  export PACKTRAIN_BINARY="$BIN_DIR/packtrain"
  export PACKTRAIN_SOURCE_DIR="$root"
  export PACKTRAIN_TEST_PYTHON="$PY"
  return 0
}

# The fallback: the old scripts/device/build_and_test.sh recipe, for TARGETs only.
build_on_device() {
  BIN_DIR="$DEVICE_BUILD/bin"
  BIN_FROM="build-device (built by this phase; fallback)"
  STEP_TOTAL=$((STEP_TOTAL + 1))
  local reason=""
  if ! compgen -G ".device/debs/*.deb" >/dev/null; then
    reason="no bundle (.device/bundle) and no .device/debs to build with: run scripts/device/bundle.sh (or fetch_debs.sh) here and carry it"
  elif ((!HAVE_GPU)) && [[ -z "${PACKTRAIN_DEVICE_BUILD_ANYWAY:-}" ]]; then
    reason="no bundle and no build, and this is no GPU machine: not building here (PACKTRAIN_DEVICE_BUILD_ANYWAY=1 to build)"
  fi
  if [[ -n "$reason" ]]; then
    STEP_INDEX=$((STEP_INDEX + 1))
    echo "[$PHASE $STEP_INDEX/$STEP_TOTAL] build on the device ... failed: $reason"
    record "build on the device" "failed (no binaries)" 0 "$reason"
    BROKEN="no binaries (see the build step)"
    return 1
  fi
  run_step "build on the device: ${*}" "${PACKTRAIN_BUILD_TIMEOUT:-420}" bash "$root/scripts/device/build_on_device.sh" "$PY" "$@" \
    || BROKEN="the build on the device failed (see its log)"
}

# A first step of every phase: the binaries start and name their devices.
check_binaries() {
  if ! run_step --stdout "$WORK/json/info.json" "packtrain info (the binaries start)" 60 "$BIN_DIR/packtrain" info --json; then
    BROKEN="packtrain does not start here (see the 'packtrain info' log)"
    { echo "== ldd $BIN_DIR/packtrain"; ldd "$BIN_DIR/packtrain"; } >>"$WORK/logs/ldd.log" 2>&1
  fi
}

# --- the end: summary.txt and <phase>.tar.gz in $OUT

FINISHED=0
finish() {
  ((FINISHED)) && return
  FINISHED=1
  local summary="$WORK/summary.txt"
  [[ -n "$STALE" ]] && echo "$STALE" >"$WORK/stale.txt"
  if ! timeout 60 python3 "$root/scripts/device/summarize.py" "$PHASE" "$WORK" "$BUDGET" "$SECONDS" >"$summary" 2>"$WORK/logs/summarize.err"; then
    { echo "packtrain device phase $PHASE (summarize.py failed: $(tail -1 "$WORK/logs/summarize.err"))"
      cat "$WORK/machine_line.txt" 2>/dev/null
      column -t -s $'\t' "$STEPS" 2>/dev/null || cat "$STEPS"; } >"$summary"
  fi
  find "$WORK" -type f -empty -delete
  # One tarball, at most 15 MiB: the largest traces go first when it would be bigger.
  local name="$PHASE" tarball="$OUT/$PHASE.tar.gz" excludes=(--exclude='peers/work/k*')
  tar -czf "$tarball" -C "$(dirname "$WORK")" --transform "s|^$(basename "$WORK")|$name|" "${excludes[@]}" "$(basename "$WORK")" 2>/dev/null
  local f
  while (($(stat -c %s "$tarball") > 15 * 1024 * 1024)); do
    f=$(find "$WORK" -type f -name '*.json' -size +512k -printf '%s %p\n' | sort -rn | head -1 | cut -d' ' -f2-)
    [[ -n "$f" ]] || break
    echo "left out of the tarball (size): ${f#$WORK/} ($(stat -c %s "$f") bytes)" | tee -a "$summary"
    rm -f "$f"
    tar -czf "$tarball" -C "$(dirname "$WORK")" --transform "s|^$(basename "$WORK")|$name|" "${excludes[@]}" "$(basename "$WORK")"
  done
  cp "$summary" "$OUT/summary.txt"
  echo
  cat "$summary"
  echo "[$PHASE] wrote $OUT/summary.txt and $tarball ($(du -k "$tarball" | cut -f1) KiB) in $SECONDS s"
  [[ -n "${PACKTRAIN_KEEP_WORK:-}" ]] || rm -rf "$WORK"  # all of it is in the tarball
}

phase_status() {  # 0 when no step failed or timed out
  ! cut -f3 "$STEPS" | grep -qE '^(failed|timed out)'
}
