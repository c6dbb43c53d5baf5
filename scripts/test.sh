#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite with CTest and the Python
# package's tests (scripts/test_python.sh); then builds it again with AddressSanitizer +
# UndefinedBehaviorSanitizer (CPU only) and runs the C++ suite once more under them.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
# Sequential: every test already uses all cores through OpenMP, and two at once
# oversubscribe them badly.
(cd build && ctest --output-on-failure)
# The Python package, installed into a fresh venv, against the program just built.
scripts/test_python.sh
scripts/sanitize.sh
