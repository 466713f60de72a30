#!/usr/bin/env bash
# Installs what packtrain needs to build and test, idempotently. Fast when all is present.
#
#  - LibTorch 2.11.0 (PyPI torch==2.11.0, the CUDA 13.0 build, with its own CUDA
#    libraries) into a virtual environment kept in a cache outside the checkout:
#      ${PACKTRAIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/packtrain}/venv-torch-2.11.0
#    CMake finds Torch there (cmake/PacktrainDependencies.cmake).
#  - Debian packages: compiler, CMake, Ninja, ccache, GoogleTest/GMock, Google
#    Benchmark, fmt, CLI11, nlohmann-json, libzip (.npz archives), and Gloo's headers
#    (LibTorch's wheel ships Gloo compiled in but not its headers, which c10d's
#    ProcessGroupGloo.hpp includes).
#  - The CUDA toolkit (nvcc, NCCL, NVTX) is expected on the machine already; its
#    absence is reported, not installed.
#
# Each long step (only when something is missing) prints a line before it, with about
# how long it takes here, and one after, with the seconds it took; pip shows its
# download bars. --quiet silences only the lines saying that something is present.
#
# Usage: scripts/setup.sh [--quiet]
set -euo pipefail
source "$(dirname "$0")/progress.sh"

quiet=0
[[ "${1:-}" == "--quiet" ]] && quiet=1
say() { [[ $quiet == 1 ]] || echo "setup: $*"; }

TORCH_VERSION=2.11.0
cache="${PACKTRAIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/packtrain}"
venv="$cache/venv-torch-$TORCH_VERSION"

# --- Debian packages -------------------------------------------------------
debs=(cmake ninja-build g++ ccache libgtest-dev libgmock-dev libbenchmark-dev
      libfmt-dev libcli11-dev nlohmann-json3-dev pkg-config libzip-dev python3-venv libgloo-dev
      libpcre2-dev libsentencepiece-dev clang-format)
missing=()
for p in "${debs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo_cmd=""
  [[ $(id -u) == 0 ]] || sudo_cmd="sudo"
  step "setup: apt-get update" "under a minute" $sudo_cmd apt-get update -qq
  apt_install() { DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}" >/dev/null; }
  step "setup: installing Debian packages: ${missing[*]}" "1-3 min for all of them" apt_install
else
  say "Debian packages present"
fi

# --- LibTorch from PyPI, in a cached virtual environment -----------------------
torch_ok() {
  [[ -x "$venv/bin/python" ]] &&
    "$venv/bin/python" - "$TORCH_VERSION" <<'PY' 2>/dev/null
import sys, importlib.metadata as md
v = md.version("torch")
sys.exit(0 if v.split("+")[0] == sys.argv[1] else 1)
PY
}
if torch_ok; then
  say "torch $TORCH_VERSION present in $venv"
else
  mkdir -p "$cache"
  python3 -m venv "$venv"
  # Not --quiet: pip's lines name each wheel and its size, and its bars show the download.
  step "setup: downloading and installing torch==$TORCH_VERSION (the CUDA 13.0 build, with its CUDA libraries, about 4.7 GB) into $venv" \
       "minutes, at your network's speed" \
    "$venv/bin/pip" install --disable-pip-version-check --progress-bar on "torch==$TORCH_VERSION" numpy
  torch_ok || { echo "setup: torch $TORCH_VERSION did not install into $venv" >&2; exit 1; }
fi

# --- Python test and build tools, in the same environment -----------------------
# pytest, scikit-learn, BoTorch and baal for the Python package's tests (the
# adapters are tested against the real libraries), properscoring,
# uncertainty-toolbox and torchmetrics (the calibration metrics' references),
# scikit-build-core to build the package (pip install --no-build-isolation,
# against this torch), transformers with safetensors (the pretrained trunk's
# reference: tests build small random GPT-2 and Llama models with it; nothing is
# downloaded), sentencepiece (Llama's tokenizer's reference) and peft (the adapters').
py_tools=(pytest scikit-learn scikit-build-core botorch baal properscoring uncertainty-toolbox torchmetrics transformers safetensors sentencepiece peft)
if ! "$venv/bin/python" -c "import pytest, sklearn, scikit_build_core, botorch, baal, properscoring, uncertainty_toolbox, torchmetrics, transformers, safetensors, sentencepiece, peft" 2>/dev/null; then
  step "setup: installing ${py_tools[*]} into $venv" "a minute or two" \
    "$venv/bin/pip" install --quiet --disable-pip-version-check "${py_tools[@]}" "torch==$TORCH_VERSION"
else
  say "${py_tools[*]} present"
fi

# --- CUDA toolkit (already on the machine) ------------------------------------
if command -v nvcc >/dev/null 2>&1 || [[ -x /usr/local/cuda/bin/nvcc ]]; then
  say "CUDA toolkit: $( (command -v nvcc || echo /usr/local/cuda/bin/nvcc) )"
else
  say "warning: no CUDA toolkit found (nvcc); packtrain builds CPU-only"
fi
