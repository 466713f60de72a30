# shellcheck shell=bash
# Sourced by scripts/device/phase.sh: the budget, guarded steps with progress lines,
# the machine record, finding the binaries (the carried bundle, else a build made on
# the device) and publishing a phase's results into $OUT after every step. Bash; no
# `set -e`: every step is guarded, so one failure does not lose the rest.

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root" || exit 2

# --- the phase, its budget and its work dir

PHASE="${PHASE:?PHASE must be set}"
OUT="${OUT:-/tmp/packtrain-out/$PHASE}"
# The whole phase's seconds, the `run` call's time limit (600) less 40 for the
# machine's transfers; phase.sh's outer process stops the phase at BUDGET.
BUDGET="${PACKTRAIN_PHASE_BUDGET:-560}"
RESERVE=15  # kept back for the last summary and tarball
WORK="${PACKTRAIN_PHASE_WORK:-$(mktemp -d "${TMPDIR:-/tmp}/packtrain-$PHASE.XXXXXX")}"
mkdir -p "$OUT" "$WORK/logs" "$WORK/json"
STEPS="$WORK/steps.tsv"  # index, name, outcome, seconds, detail
: >"$STEPS"
RUNNING="$WORK/running.tsv"  # index, name, start second: the steps under way
: >"$RUNNING"
STEP_INDEX=0
STEP_TOTAL="${STEP_TOTAL:-0}"
BROKEN=""  # set once the binaries cannot run: every later step is skipped saying why

say() { echo "[$PHASE] $*"; }
remaining() { echo $((BUDGET - RESERVE - SECONDS)); }
slug() { echo "$1" | tr 'A-Z' 'a-z' | sed -e 's/[^a-z0-9]\+/_/g' -e 's/^_//' | cut -c1-60 | sed 's/_$//'; }

record() {  # record NAME OUTCOME SECONDS [DETAIL] [INDEX]
  printf '%s\t%s\t%s\t%s\t%s\n' "${5:-$STEP_INDEX}" "$1" "$2" "$3" "${4:-}" >>"$STEPS"
}

running_add() { printf '%s\t%s\t%s\n' "$1" "$2" "$SECONDS" >>"$RUNNING"; }   # INDEX NAME
running_remove() {  # INDEX
  awk -F'\t' -v i="$1" '$1 != i' "$RUNNING" >"$RUNNING.new" && mv -f "$RUNNING.new" "$RUNNING"
}

# skip_step NAME REASON
skip_step() {
  STEP_INDEX=$((STEP_INDEX + 1))
  echo "[$PHASE $STEP_INDEX/$STEP_TOTAL] $1 ... skipped ($2)"
  record "$1" "skipped" 0 "$2"
  publish
}

# step_outcome RC: sets OUTCOME (ok / timed out / failed (exit N)).
step_outcome() {
  if (($1 == 0)); then
    OUTCOME="ok"
  elif (($1 == 124 || $1 == 137)); then
    OUTCOME="timed out"
  else
    OUTCOME="failed (exit $1)"
  fi
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
  running_add "$STEP_INDEX" "$name"
  # In the background and waited for, so that a signal to the phase is handled at
  # once (bash runs traps only between foreground commands); finish() stops STEP_PID.
  if [[ -n "$stdout" ]]; then
    timeout --kill-after=10 "$limit" "$@" >"$stdout" 2>"$log" </dev/null &
  else
    timeout --kill-after=10 "$limit" "$@" >"$log" 2>&1 </dev/null &
  fi
  STEP_PID=$!
  wait "$STEP_PID"
  rc=$?
  STEP_PID=""
  running_remove "$STEP_INDEX"
  local took=$((SECONDS - start)) detail=""
  step_outcome "$rc"
  if ((rc == 124 || rc == 137)); then
    detail="stopped after $limit s"
  elif ((rc != 0)); then
    detail=$(grep -v '^\s*$' "$log" | tail -1 | cut -c1-200)
  fi
  echo "$OUTCOME ($took s)${detail:+: $detail}"
  record "$name" "$OUTCOME" "$took" "$detail"
  publish
  return $rc
}

# --- the machine

PY=""  # a Python with torch: the image's python3 on the GPU machine
find_python() {
  local cand
  for cand in "${PACKTRAIN_DEVICE_PYTHON:-}" python3 \
      "${PACKTRAIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/packtrain}/venv-torch-2.11.0/bin/python"; do
    [[ -n "$cand" ]] || continue
    # One import of torch (seconds) for both questions: is there torch, and a GPU?
    TORCH_CUDA=$("$cand" -c "import torch; print(int(torch.cuda.is_available()))" 2>/dev/null) && { PY="$cand"; return 0; }
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
  [[ -n "${TORCH_CUDA:-}" ]] || TORCH_CUDA=$("$PY" -c "import torch; print(int(torch.cuda.is_available()))" 2>/dev/null)
  if [[ "$TORCH_CUDA" == 1 ]]; then
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
# The bundle's C/C++ runtime against the image's (manifest's runtime_needs): an
# older libstdc++ is replaced by the one carried in lib-runtime/ (said in the
# notes); an older glibc cannot be, and is said as the reason binaries may not start.
check_runtime_versions() {
  local needs glibc glibcxx have_glibc have_cxx
  needs=$(sed -n 's/^runtime_needs: //p' "$BUNDLE/manifest.txt" 2>/dev/null)
  [[ -n "$needs" ]] || return 0
  glibc=$(echo "$needs" | grep -o 'GLIBC_[0-9.]*' | head -1 | sed 's/GLIBC_//')
  glibcxx=$(echo "$needs" | grep -o 'GLIBCXX_[0-9.]*' | head -1)
  have_glibc=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{ print $2 }')
  if [[ -n "$glibc" && -n "$have_glibc" ]] &&
     [[ "$(printf '%s\n%s\n' "$glibc" "$have_glibc" | sort -V | head -1)" != "$glibc" ]]; then
    echo "the bundle needs glibc >= $glibc, this image has $have_glibc: its binaries cannot start here (phase build)" \
      >>"$WORK/notes.txt"
  fi
  have_cxx=$(ldconfig -p 2>/dev/null | awk '$1 == "libstdc++.so.6" && /x86-64/ { print $NF; exit }')
  if [[ -n "$glibcxx" && -d "$BUNDLE/lib-runtime" ]] && { [[ -z "$have_cxx" ]] || ! grep -aq "$glibcxx" "$have_cxx"; }; then
    LD_LIBRARY_PATH="$BUNDLE/lib-runtime:$LD_LIBRARY_PATH"
    echo "the image's libstdc++ (${have_cxx:-none}) lacks $glibcxx: using the bundle's lib-runtime/" >>"$WORK/notes.txt"
  fi
}
# use_binaries TARGET...: the carried bundle, else build-device/ (a build made on this
# machine earlier), else build/ (this machine's own build: the dry run), else builds
# TARGETs on this machine (the fallback: carried .debs, the image's torch).
use_binaries() {
  local t missing=0
  # The bundle's bin/ and lib/ travel packed (scripts/device/bundle.sh): unpack in place.
  if [[ -f "$BUNDLE/binaries.tar.gz" && ! -x "$BUNDLE/bin/packtrain" ]]; then
    tar -xzf "$BUNDLE/binaries.tar.gz" -C "$BUNDLE" || say "could not unpack $BUNDLE/binaries.tar.gz"
  fi
  if [[ -x "$BUNDLE/bin/packtrain" ]]; then
    BIN_DIR="$BUNDLE/bin"
    BIN_FROM="bundle"
    LD_LIBRARY_PATH="$BUNDLE/lib:$(torch_library_path)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export LD_LIBRARY_PATH
    check_runtime_versions
    # The data sets: the working tree's (they travel with it), or an older bundle's copy.
    PACKTRAIN_DATA_DIR="$root/data"
    [[ -d "$BUNDLE/share/packtrain/data" ]] && PACKTRAIN_DATA_DIR="$BUNDLE/share/packtrain/data"
    export PACKTRAIN_DATA_DIR
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

# The fallback: the recipe of the former build_and_test.sh, for TARGETs only.
build_on_device() {
  BIN_DIR="$DEVICE_BUILD/bin"
  BIN_FROM="build-device (built by this phase; fallback)"
  STEP_TOTAL=$((STEP_TOTAL + 1))
  local reason=""
  if [[ -n "${NO_DEVICE_BUILD:-}" ]]; then
    reason="no bundle (.device/bundle) and no build: run scripts/device/bundle.sh here and carry .device/bundle (the $PHASE phase never builds: it cannot fit)"
  elif ! compgen -G ".device/debs/*.deb" >/dev/null; then
    reason="no bundle (.device/bundle) and no .device/debs to build with: run scripts/device/bundle.sh (or fetch_debs.sh) here and carry it"
  elif ((!HAVE_GPU)) && [[ -z "${PACKTRAIN_DEVICE_BUILD_ANYWAY:-}" ]]; then
    reason="no bundle and no build, and this is no GPU machine: not building here (PACKTRAIN_DEVICE_BUILD_ANYWAY=1 to build)"
  fi
  if [[ -n "$reason" ]]; then
    STEP_INDEX=$((STEP_INDEX + 1))
    echo "[$PHASE $STEP_INDEX/$STEP_TOTAL] find the binaries ... failed: $reason"
    record "find the binaries" "failed (no binaries)" 0 "$reason"
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

# --- results in $OUT, after every step: summary.txt, steps.tsv, tests.tsv, <phase>.tar.gz

# Each is written under a temporary name in $OUT and renamed over the last one, so
# a phase killed at any moment still returns the steps done so far (at most four
# files, and one temporary file while a rename is pending). One publisher at a time.
STEP_PID=""          # the sequential step under way
PUBLISHER_PID=""     # the background loop that publishes while long steps run
FINISHED=0
publish() {  # [final]
  local final="${1:-}" tag="$BASHPID" summary="$WORK/summary.txt" brief="$WORK/summary_brief.txt"
  (
    command -v flock >/dev/null && flock 9
    # A background publish that waited for the lock while the last one was written
    # must not replace it.
    [[ -z "$final" && -e "$WORK/.final" ]] && exit 0
    [[ -n "$final" ]] && touch "$WORK/.final"
    [[ -n "$STALE" ]] && echo "$STALE" >"$WORK/stale.txt"
    if ! timeout 60 python3 "$root/scripts/device/summarize.py" "$PHASE" "$WORK" "$BUDGET" "$SECONDS" \
        ${final:+--final} --tests-tsv "$OUT/.tests.tsv.$tag" --brief "$brief.$tag.tmp" >"$summary.$tag.tmp" 2>>"$WORK/logs/summarize.err"; then
      { echo "packtrain device phase $PHASE (summarize.py failed: $(tail -1 "$WORK/logs/summarize.err"))"
        cat "$WORK/machine_line.txt" 2>/dev/null
        column -t -s $'\t' "$STEPS" 2>/dev/null || cat "$STEPS"; } >"$summary.$tag.tmp"
      cp "$summary.$tag.tmp" "$brief.$tag.tmp"
    fi
    mv -f "$summary.$tag.tmp" "$summary"
    mv -f "$brief.$tag.tmp" "$brief"
    cp "$summary" "$OUT/.summary.txt.$tag" && mv -f "$OUT/.summary.txt.$tag" "$OUT/summary.txt"
    cp "$STEPS" "$OUT/.steps.tsv.$tag" && mv -f "$OUT/.steps.tsv.$tag" "$OUT/steps.tsv"
    [[ -f "$OUT/.tests.tsv.$tag" ]] && mv -f "$OUT/.tests.tsv.$tag" "$OUT/tests.tsv"
    # One tarball of everything so far, at most 15 MiB: the largest JSON (traces) left
    # out first when it would be bigger.
    local tarball="$OUT/.$PHASE.tar.gz.$tag" f
    pack() {
      tar -czf "$tarball" -C "$(dirname "$WORK")" --transform "s|^$(basename "$WORK")|$PHASE|" \
        --exclude='peers/work/k*' --exclude='*.tmp' --exclude='.publish.lock' --exclude='*.new' --exclude='.finished' --exclude='.final' "$(basename "$WORK")" 2>/dev/null
    }
    pack
    while [[ -n "$final" ]] && (($(stat -c %s "$tarball") > 15 * 1024 * 1024)); do
      f=$(find "$WORK" -type f -name '*.json' -size +512k -printf '%s %p\n' | sort -rn | head -1 | cut -d' ' -f2-)
      [[ -n "$f" ]] || break
      echo "left out of the tarball (size): ${f#$WORK/} ($(stat -c %s "$f") bytes)" >>"$WORK/notes.txt"
      rm -f "$f"
      pack
    done
    mv -f "$tarball" "$OUT/$PHASE.tar.gz"
  ) 9>"$WORK/.publish.lock"
}

# publish_every SECONDS: publish in the background while this phase runs (long steps
# and parallel tests report progress too); stops with the phase.
publish_every() {
  local parent=$BASHPID
  ( while sleep "$1"; do kill -0 "$parent" 2>/dev/null || exit 0; publish; done ) </dev/null >/dev/null 2>&1 &
  PUBLISHER_PID=$!
}

finish() {
  ((FINISHED)) && return
  FINISHED=1
  local p
  [[ -n "$PUBLISHER_PID" ]] && { kill "$PUBLISHER_PID" 2>/dev/null; wait "$PUBLISHER_PID" 2>/dev/null; }
  # The steps still under way (a signal stopped the phase): their timeouts pass the
  # signal on to the commands.
  for p in $STEP_PID ${POOL_PIDS:-}; do kill -TERM "$p" 2>/dev/null; done
  for p in $STEP_PID ${POOL_PIDS:-}; do wait "$p" 2>/dev/null; done
  find "$WORK" -type f -empty ! -name '*.tsv' -delete
  publish final
  rm -f "$OUT"/.*.[0-9]*  # a temporary file a killed publisher left
  echo
  cat "$WORK/summary_brief.txt"
  echo "[$PHASE] wrote $(cd "$OUT" && ls | paste -sd' ' -) to $OUT ($(du -sk "$OUT" | cut -f1) KiB) in $SECONDS s"
  touch "$WORK/.finished"
  [[ -n "${PACKTRAIN_KEEP_WORK:-}" ]] || rm -rf "$WORK"  # all of it is in the tarball
}

phase_status() {  # 0 when no step failed or timed out
  ! cut -f3 "$STEPS" | grep -qE '^(failed|timed out)'
}
