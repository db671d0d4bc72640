"""Shared fixtures (real GGUF models fetched once from PyPI into the cache) and the test layers.

The folders are the layers: ``unit/`` holds pure logic on hand-built data and
runs in seconds; ``engine/``, ``cli/``, ``tui/`` (and ``server/``) run real
llama.cpp on real models, the command line or the app. Every test outside
``unit/``, and every test anywhere that asks for a real model (directly or
through another fixture), is marked ``slow`` here, so ``-m "not slow"`` is the
quick layer without anyone remembering a mark. A quick run in which a test
initialises llama.cpp fails, so a slow test cannot hide in ``unit/``.
"""

from __future__ import annotations

import os
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


def _pin_worker() -> None:
    """Under pytest-xdist (scripts/test.sh runs a worker per CPU), keep each worker and what it starts
    (llama.cpp's threads, a CLI's or a server's process) on CPUs of its own.

    Why: llama.cpp takes a thread per physical core among the CPUs the process may use (``default_threads``,
    from its CPU affinity), and ggml's threads spin while they wait for each other; two workers each running two
    threads on two CPUs would spend their decodes waiting for a thread the other worker has preempted.
    """
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    if not worker.startswith("gw") or count <= 1 or not hasattr(os, "sched_setaffinity"):
        return
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return
    share = cpus[int(worker[2:]) % count::count] or cpus
    os.sched_setaffinity(0, share)


_pin_worker()


def _llama_initialised() -> bool:
    """Whether anything has run llama.cpp in this process (the backend initialises it before any load)."""
    return bool(getattr(sys.modules.get("localspec.backend.build"), "_initialized", False))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):  # noqa: ANN201  (a hook wrapper)
    """In the quick layer (-m 'not slow'), the test during which llama.cpp was first initialised in this
    process fails, named: it belongs outside tests/unit (or should ask for a model fixture). A failure of
    the test itself, so that it shows whether or not the tests run in several worker processes."""
    before = _llama_initialised()
    result = yield
    markexpr = item.config.getoption("markexpr", "") or ""
    if "not slow" in markexpr and not before and _llama_initialised():
        pytest.fail("the quick layer (-m 'not slow') ran llama.cpp in this test: a test that runs llama.cpp "
                    "belongs outside tests/unit (or asks for a model fixture)", pytrace=False)
    return result


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
