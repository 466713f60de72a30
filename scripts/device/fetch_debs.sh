#!/usr/bin/env bash
# Run HERE (the development machine): downloads Debian's .deb files of the build and
# test dependencies the GPU machine lacks (fmt, GoogleTest/GMock, Google Benchmark,
# CLI11, nlohmann-json, ccache is not needed) into .device/debs/, which .gitignore
# keeps out of git and the device tool carries (carry: [".device"]).
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .device/debs
cd .device/debs
apt-get update -qq
apt-get download libfmt-dev libfmt9 libgtest-dev libgmock-dev googletest libbenchmark-dev \
  libbenchmark1debian libcli11-dev nlohmann-json3-dev 2>&1 | tail -1
ls -1 *.deb
