#!/usr/bin/env bash
# Sets up .venv (if needed) with localspec and its test extras, then runs the whole test suite.
# The real models the tests use come from PyPI packages and are cached in ~/.cache/localspec.
# Extra arguments go to pytest, e.g. `scripts/test.sh -m "not slow"` for the quick layer only.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[test]"
exec .venv/bin/python -m pytest -q "$@"
