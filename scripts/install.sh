#!/usr/bin/env bash
# Install hetprune with its test extra into the current Python.
# torch and torchvision must be a matching pair: the versions below are the
# pair this project is tested with (pip takes them from the local wheel cache
# on our machines, from PyPI elsewhere).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
"$PY" -m pip install -q --disable-pip-version-check "torch==2.14.1" "torchvision==0.29.1"
"$PY" -m pip install -q --disable-pip-version-check -e ".[test]"
