"""What `localspec doctor` says of a build, from its self-test record (no llama.cpp runs here)."""

from __future__ import annotations

from localspec.commands.doctor import _patches


def test_a_stock_build_is_called_unpatched_with_what_that_costs() -> None:
    line = _patches({"patched": False})
    assert line.startswith("none: a stock llama-cpp-python")
    assert "near-ties" in line and "flash attention stays off" in line and "scripts/setup.sh" in line


def test_a_patched_build_says_so() -> None:
    assert "patches" in _patches({"patched": True}) and "none" not in _patches({"patched": True})
