#!/usr/bin/env bash
# Installs what is missing, builds, and runs the main job: `brisk train` on its embedded default
# (a small BERT on the built-in synthetic data), printing the summary and memory anatomy.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
exec build/brisk train "$@"
