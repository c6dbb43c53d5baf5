#!/usr/bin/env bash
# Configures and builds brisk (Release) into build/: every target, or only those named
# (e.g. `scripts/build.sh brisk` for the program alone).
set -euo pipefail
cd "$(dirname "$0")/.."
generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
cmake -S . -B build "${generator[@]}" -DCMAKE_BUILD_TYPE=Release >/dev/null
targets=()
[ $# -gt 0 ] && targets=(--target "$@")
cmake --build build -j "$(nproc)" "${targets[@]}"
