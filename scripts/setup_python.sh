#!/usr/bin/env bash
# Creates the Python venv used only to regenerate test fixtures and to run benchmarks
# (torch, transformers, safetensors, bitsandbytes, peft, trl, datasets, gguf from PyPI). The product and CI never need it.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
venv="${BRISK_VENV:-$here/.venv}"
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --upgrade pip
"$venv/bin/pip" install --quiet numpy torch transformers safetensors accelerate bitsandbytes \
  tokenizers sentencepiece protobuf gguf peft trl datasets
echo "venv ready: $venv"
