#!/usr/bin/env bash
# Run HERE (the development machine): downloads Debian's .deb files of the build and
# test dependencies the GPU machine lacks (fmt, GoogleTest/GMock, Google Benchmark,
# CLI11, nlohmann-json, libzip, PCRE2, SentencePiece; ccache is not needed) into .device/debs/, which .gitignore
# keeps out of git; and the wheels of the pure-Python optax and absl-py into
# .device/wheels/ for the peers benchmark (the GPU image has JAX and optax today; it
# has no network). Only for the fallback, building on the GPU machine
# (scripts/device/build_on_device.sh, carry: [".device/debs", ".device/wheels"]); the
# usual way carries the bundle of scripts/device/bundle.sh (scripts/device/README.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .device/debs
cd .device/debs
apt-get update -qq
apt-get download libfmt-dev libfmt9 libgtest-dev libgmock-dev googletest libbenchmark-dev \
  libbenchmark1debian libcli11-dev nlohmann-json3-dev libgloo-dev libzip-dev libzip4 \
  libpcre2-dev libpcre2-8-0 libsentencepiece-dev libsentencepiece0 2>&1 | tail -1
ls -1 *.deb
cd ../..
mkdir -p .device/wheels
"${PACKTRAIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/packtrain}/venv-torch-2.11.0/bin/python" -m pip download \
  --quiet --disable-pip-version-check --no-deps --only-binary=:all: -d .device/wheels optax==0.2.8 absl-py
ls -1 .device/wheels
