"""Fixtures the engine tests share."""

from __future__ import annotations

import pytest

from localspec.backend import Model


@pytest.fixture(scope="module")
def target(smollm2_path):
    """SmolLM2 loaded once a module: the target most engine tests run on."""
    model = Model(smollm2_path)
    yield model
    model.close()


@pytest.fixture(scope="module")
def gemma(gemma_path):
    """Gemma 3 270M loaded once a module (262k vocabulary; another tokenizer than SmolLM2's)."""
    model = Model(gemma_path)
    yield model
    model.close()
