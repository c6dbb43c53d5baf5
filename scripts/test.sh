#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite with CTest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
cd build
# Sequential: every test already uses all cores through OpenMP, and two at once
# oversubscribe them badly.
ctest --output-on-failure
