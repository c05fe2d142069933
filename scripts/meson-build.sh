#!/usr/bin/env bash
# meson's custom target: build through the Makefile, then hand meson its outputs.
#   usage: meson-build.sh SOURCE_ROOT OUTDIR
set -euo pipefail
make -s -C "$1" build/criu-rocm build/criu-rocm.8
cp "$1/build/criu-rocm" "$2/criu-rocm"
cp "$1/build/criu-rocm.8" "$2/criu-rocm.8"
