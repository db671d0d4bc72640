#!/usr/bin/env bash
# Sets up .venv (scripts/setup.sh, with the test extras), then runs the whole test suite.
# The real models the tests use come from PyPI packages and are cached in ~/.cache/localspec.
# Extra arguments go to pytest, e.g. `scripts/test.sh -m "not slow"` for the quick layer only.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh test
exec .venv/bin/python -m pytest -q "$@"
