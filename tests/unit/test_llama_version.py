"""The llama-cpp-python release is set in one place (pyproject.toml), and that is the one installed."""

from __future__ import annotations

import re
from importlib.metadata import version
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _pin() -> str:
    pins = re.findall(r'"llama-cpp-python==([0-9.]+)"', (REPO / "pyproject.toml").read_text())
    assert len(pins) == 1, pins
    return pins[0]


def test_setup_reads_the_version_from_pyproject() -> None:
    setup = (REPO / "scripts" / "setup.sh").read_text()
    assert "pyproject.toml" in setup and 'LLAMA_VERSION=$(sed' in setup
    assert _pin() not in setup  # no second copy of the number to forget on an upgrade


def test_the_installed_bindings_are_the_pinned_release() -> None:
    assert version("llama-cpp-python") == _pin()
