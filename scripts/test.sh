#!/usr/bin/env bash
# Sets up .venv (scripts/setup.sh, with the test extras), then runs the whole test suite.
# The real models the tests use come from PyPI packages and are cached in ~/.cache/localspec.
# Extra arguments go to pytest, e.g. `scripts/test.sh -m "not slow"` for the quick layer only.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh test
# One worker process per CPU (pytest-xdist); a worker that runs out of tests takes queued ones from the
# other (worksteal), so one long chi-square test does not leave a CPU idle at the end (854 s against
# 912-974 s with whole files per worker, on a 2-core Xeon VM). tests/conftest.py gives each worker CPUs
# of its own. LOCALSPEC_TEST_WORKERS=0 runs everything in this process.
exec .venv/bin/python -m pytest -q -n "${LOCALSPEC_TEST_WORKERS:-auto}" --dist worksteal "$@"
