#!/usr/bin/env bash
# The Python package's tests: `pip install .` into a fresh venv (.venv-python) holding pytest,
# pandas, datasets and transformers but no torch, then pytest on tests/python, which compares the
# API with the brisk program of build/ (scripts/build.sh builds it).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv-python
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --upgrade pip
"$venv/bin/pip" install --quiet pytest pandas datasets transformers
# (Its build folder, build-python/, stays: a second run builds only what changed.)
"$venv/bin/pip" install --quiet .
# From outside the checkout, so `import brisk` is the installed package.
(cd tests/python && BRISK_PROGRAM="$PWD/../../build/brisk" "../../$venv/bin/python" -m pytest -q -p no:cacheprovider .)
