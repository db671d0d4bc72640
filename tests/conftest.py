"""Shared fixtures (real GGUF models fetched once from PyPI into the cache) and the test layers.

The folders are the layers: ``unit/`` holds pure logic on hand-built data and
runs in seconds; ``engine/``, ``cli/``, ``tui/`` (and ``server/``) run real
llama.cpp on real models, the command line or the app. Every test outside
``unit/``, and every test anywhere that asks for a real model (directly or
through another fixture), is marked ``slow`` here, so ``-m "not slow"`` is the
quick layer without anyone remembering a mark. A quick run in which a test
initialises llama.cpp fails at the end, naming that test, so a slow test
cannot hide in ``unit/``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
# The helpers (model writers, the fake hub, CLI runners) are imported by name from tests/support.
sys.path.insert(0, str(TESTS / "support"))

from localspec.models.pypi_models import GEMMA3_270M, SMOLLM2_135M, cache_dir, ensure_pypi_model  # noqa: E402

# Fixtures that hand a test a real model file: asking for one (even through another fixture) makes it slow.
MODEL_FIXTURES = frozenset({"smollm2_path", "gemma_path", "smollm2_q4_0_path", "mamba_path"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    unit = TESTS / "unit"
    for item in items:
        in_unit = unit in Path(str(item.fspath)).resolve().parents
        if not in_unit or MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


_first_to_run_llama: list[str] = []  # the first test during which llama.cpp was initialised


def _llama_initialised() -> bool:
    """Whether anything has run llama.cpp in this process (the backend initialises it before any load)."""
    return bool(getattr(sys.modules.get("localspec.backend.build"), "_initialized", False))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):  # noqa: ANN201  (a hook wrapper)
    before = _llama_initialised()
    try:
        return (yield)
    finally:
        if not before and _llama_initialised() and not _first_to_run_llama:
            _first_to_run_llama.append(item.nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    markexpr = session.config.getoption("markexpr", "") or ""
    if "not slow" in markexpr and _first_to_run_llama:
        print(f"\nconftest: the quick layer (-m 'not slow') ran llama.cpp in {_first_to_run_llama[0]}: a test "
              "that runs llama.cpp belongs outside tests/unit (or asks for a model fixture)", file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


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
