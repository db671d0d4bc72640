"""Timings booked to the work they name, on a device that works asynchronously.

On CUDA ``llama_decode`` returns once the work is queued; the wait lands where the rows are first read
(``llama_get_logits_ith`` synchronizes). A CPU cannot show that, so these tests put a fake asynchronous
device under the real ``Context`` on a real model: every decode really runs (on the CPU), then the
"device" stays busy for ``DEVICE_MS`` more, which ``llama_synchronize`` and a row read wait out, as
CUDA's do. What a step reports (``verify_ms``, ``draft_ms``, ``python_ms``) and what the cost
measurement learns must then hold the device's time where it belongs: in the decode.
"""

from __future__ import annotations

import time
from typing import Any

import llama_cpp
import pytest

from localspec.backend import Context, Model
from localspec.engine import Engine, GenerateOptions
from localspec.events import StepEvent
from localspec.policy.measure import measure_verify_costs

DEVICE_MS = 100.0  # far above a decode of SmolLM2 (a 4-row batch took up to 35 ms on a CPU shared with another
# test worker) and the step's own Python work: one wait too many in a decode shows, whatever the load


class AsyncDevice:
    """llama.cpp's decode made asynchronous: the call returns at once and the device stays busy for
    ``DEVICE_MS`` after it; ``llama_synchronize`` and a context's row reads wait for it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.busy_until = 0.0
        self.waits = 0
        real_decode, real_sync = llama_cpp.llama_decode, llama_cpp.llama_synchronize

        def decode(ctx: Any, batch: Any) -> int:
            rc = real_decode(ctx, batch)
            self.busy_until = time.perf_counter() + DEVICE_MS / 1e3
            return rc

        def synchronize(ctx: Any) -> None:
            self.wait()
            real_sync(ctx)

        monkeypatch.setattr(llama_cpp, "llama_decode", decode)
        monkeypatch.setattr(llama_cpp, "llama_synchronize", synchronize)

    def wait(self) -> None:
        left = self.busy_until - time.perf_counter()
        if left > 0:
            self.waits += 1
            time.sleep(left)

    def reads_wait(self, ctx: Context, monkeypatch: pytest.MonkeyPatch) -> None:
        """A row read of ``ctx`` waits for the device first, as llama_get_logits_ith does."""
        rows = ctx._rows
        real = rows._address

        def address(c: Any, row: int) -> int:
            self.wait()
            return real(c, row)

        monkeypatch.setattr(rows, "_address", address)


@pytest.fixture(scope="module")
def engines(target, smollm2_q4_0_path):
    plain = Engine(target, n_ctx=512, personal_history=False)
    draft = Engine(target, draft=Model(smollm2_q4_0_path), n_ctx=512, personal_history=False)
    plain.cost_model()  # measured on the real (synchronous) CPU, before any test fakes the device
    draft.cost_model()
    return plain, draft


def steps_of(engine: Engine, opts: GenerateOptions) -> list[StepEvent]:
    return [ev for ev in engine.generate("The capital of France is", opts) if isinstance(ev, StepEvent)]


def test_a_plain_step_books_the_device_time_to_its_decode(engines, monkeypatch) -> None:
    plain, _ = engines
    device = AsyncDevice(monkeypatch)
    device.reads_wait(plain.ctx, monkeypatch)
    steps = steps_of(plain, GenerateOptions(max_tokens=6, speculative=False))
    assert device.waits >= len(steps)  # the fake device really made the decodes wait
    for step in steps:
        assert step.verify_ms >= DEVICE_MS
        assert step.python_ms < DEVICE_MS / 2, step


def test_a_speculative_step_books_each_decode_to_draft_or_verify(engines, monkeypatch) -> None:
    _, engine = engines
    device = AsyncDevice(monkeypatch)
    device.reads_wait(engine.ctx, monkeypatch)
    assert engine.draft_ctx is not None
    device.reads_wait(engine.draft_ctx, monkeypatch)
    steps = steps_of(engine, GenerateOptions(max_tokens=12, draft_len=3))
    drafting = [s for s in steps if s.drafted]
    assert drafting, "the fixed draft length drafts"
    for step in drafting:
        # a catch-up and at least (drafted - 1) one-token decodes of the draft, one verification
        assert step.draft_ms >= DEVICE_MS * step.drafted
        assert DEVICE_MS <= step.verify_ms < 2 * DEVICE_MS
        assert step.python_ms < DEVICE_MS / 2, step


def test_the_cost_measurement_times_the_device(target, monkeypatch) -> None:
    ctx = Context(target, n_ctx=256)
    try:
        ctx.append([1, 2, 3, 4])
        device = AsyncDevice(monkeypatch)
        device.reads_wait(ctx, monkeypatch)
        measured = measure_verify_costs(ctx, (1, 4), budget_s=0.3, min_reps=1, max_reps=2, depth_cells=0)
        assert min(measured.values()) >= DEVICE_MS
    finally:
        ctx.close()
