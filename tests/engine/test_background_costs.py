"""Costs not yet measured on this machine: the reply starts at once, plain, while they are measured
between its steps (issue 33: 15-70 s of silence before the first token)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from localspec.backend import Model
from localspec.drafting.specs import parse_draft
from localspec.engine import Engine, GenerateOptions
from localspec.events import DoneEvent, StepEvent, TokenEvent
from localspec.generation import MEASURING_REASON
from localspec.policy.measure import load_cached

from greedy import assert_matches_plain, plain_greedy

PROMPT = "red, green, blue, red, green, blue, red, green, blue, red,"


@pytest.fixture
def target(smollm2_path):
    """A model of each test's own: ``Engine.close`` closes it."""
    return Model(smollm2_path)


@pytest.fixture
def no_costs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty cost cache: this machine has measured nothing."""
    monkeypatch.setenv("LOCALSPEC_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_the_first_reply_starts_plain_at_once_and_speculates_once_costs_are_known(target, no_costs,
                                                                                   monkeypatch) -> None:
    from localspec.backend import batch_invariant
    from localspec.policy import measure

    complete: list[bool] = []
    original = measure.measure_verify_costs

    def recording(*args, **kwargs):  # type: ignore[no-untyped-def]
        result = original(*args, **kwargs)
        complete.append(result.complete)
        return result

    monkeypatch.setattr(measure, "measure_verify_costs", recording)

    engine = Engine(target, specs=parse_draft("ngram"), n_ctx=1024, personal_history=False)
    engine.measure_in_background = True
    try:
        assert load_cached(engine.ctx) is None
        t0 = time.perf_counter()
        gen = engine.generate(PROMPT, GenerateOptions(max_tokens=48))
        assert gen.measuring_costs and engine.costs_pending()
        events = []
        pending_at_first_token = None
        for event in gen:
            if isinstance(event, TokenEvent) and pending_at_first_token is None:
                pending_at_first_token = engine.costs_pending()
                first_token_s = time.perf_counter() - t0
            events.append(event)
        done = events[-1]
        assert isinstance(done, DoneEvent)
        # the first token came while the costs were still being measured, from a plain step that says why
        assert pending_at_first_token, f"the first token waited {first_token_s:.1f} s for the measurement"
        steps = [e for e in events if isinstance(e, StepEvent)]
        assert steps[0].drafted == 0 and steps[0].decision == MEASURING_REASON
        assert all(s.drafted == 0 for s in steps if s.decision == MEASURING_REASON)
        assert_matches_plain(done.tokens, plain_greedy(target, target.tokenize(PROMPT), 48),
                             strict=batch_invariant())

        # The measurement finishes (taking turns with nobody now) and is cached under the target's key.
        costs = engine.cost_model()
        assert costs is not None and costs.verify_ms(1) > 0 and costs.verify_ms(8) >= costs.verify_ms(1) * 0.5
        assert not engine.costs_pending() and complete == [complete[0]]
        # Kept for the next run unless the machine was so loaded that even the measurement's own time
        # (the steps it waited for do not count) overran its budget threefold.
        assert (load_cached(engine.ctx) is not None) is complete[0]

        # The next reply plans with them from its first step and drafts on this repetitive text.
        again = list(engine.generate(PROMPT, GenerateOptions(max_tokens=48)))
        steps = [e for e in again if isinstance(e, StepEvent)]
        assert steps[0].decision != MEASURING_REASON and not again[-1].stats.measuring_costs
        assert again[-1].stats.drafted > 0 and again[-1].tokens == done.tokens
    finally:
        engine.close()


def test_known_costs_are_used_at_once_and_an_engine_made_directly_measures_first(target, no_costs) -> None:
    from localspec.policy.cost_cache import Measurement, cost_key, cost_path, save_costs

    engine = Engine(target, specs=parse_draft("ngram"), n_ctx=1024, personal_history=False)
    try:
        gen = engine.generate(PROMPT, GenerateOptions(max_tokens=2))  # measure_in_background off
        assert not gen.measuring_costs and gen.controller is not None  # measured before the first token
        gen.run()
        # what this machine measured, kept as a complete measurement would be
        key = cost_key(engine.ctx)
        save_costs(cost_path(key), key, Measurement({1: 10.0, 4: 14.0, 16: 30.0}, 3, True))
    finally:
        engine.close()
    engine = Engine(Model(target.path), specs=parse_draft("ngram"), n_ctx=1024, personal_history=False)
    engine.measure_in_background = True
    try:
        gen = engine.generate(PROMPT, GenerateOptions(max_tokens=2))
        assert not gen.measuring_costs and gen.controller is not None  # cached: nothing to wait for
        assert engine._measurer is None and engine.cost_model(measure=False).verify_ms(1) == 10.0
        gen.run()
    finally:
        engine.close()


def test_closing_the_engine_stops_a_measurement_in_flight(target, no_costs) -> None:
    engine = Engine(target, specs=parse_draft("ngram"), n_ctx=1024, personal_history=False)
    engine.measure_in_background = True
    gen = engine.generate(PROMPT, GenerateOptions(max_tokens=4))
    assert gen.measuring_costs
    next(gen)
    thread = engine._measurer
    assert thread is not None and thread.is_alive()
    t0 = time.perf_counter()
    engine.close()  # frees the models only after the thread has stopped at its next sample
    assert not thread.is_alive() and time.perf_counter() - t0 < 30
    assert load_cached_is_absent(no_costs)


def load_cached_is_absent(cache: Path) -> bool:
    return not any((cache / "costs").glob("*.json")) if (cache / "costs").is_dir() else True


def test_generate_says_it_measures_and_starts_at_once(smollm2_path: Path, no_costs: Path) -> None:
    import json
    import os
    import subprocess
    import sys

    import pty

    # stderr a terminal: someone is watching, so the reply starts at once and says why it is plain.
    master, slave = pty.openpty()
    proc = subprocess.run([sys.executable, "-m", "localspec", "generate", str(smollm2_path), "--draft", "ngram",
                           "-p", PROMPT, "--max-tokens", "6", "--json"], stdout=subprocess.PIPE, stderr=slave,
                          text=True, timeout=300, env={**os.environ, "LOCALSPEC_NO_HISTORY": "1"})
    os.close(slave)
    err = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: the child's end is closed and everything was read
            break
        if not chunk:
            break
        err += chunk
    os.close(master)
    stderr = err.decode("utf-8", "replace").replace("\r\n", "\n")
    assert proc.returncode == 0, stderr
    assert ("localspec: measuring this machine's decode costs (once per model, build and thread count); "
            "decoding plain until they are known, then speculating\n") in stderr
    result = json.loads(proc.stdout)
    assert result["stats"]["measuring_costs"] is True and result["stats"]["tokens"] == 6


def test_a_long_prompt_reports_its_prefill_and_esc_stops_it(smollm2_path: Path) -> None:
    """A prompt longer than one batch: a PrefillEvent after each batch (issue 33: a 5,000-word prompt read
    for over a minute with nothing on screen); cancelling between batches ends the reply, and the part
    read stays in the cache for the next one."""
    from localspec.events import PrefillEvent

    engine = Engine(Model(smollm2_path), n_ctx=1024, n_batch=64, personal_history=False)
    try:
        prompt = engine.tokenize("word " * 300)
        total = len(prompt) - 1
        events = list(engine.generate(prompt, GenerateOptions(max_tokens=2)))
        progress = [(e.done, e.total) for e in events if isinstance(e, PrefillEvent)]
        assert progress == [(min(n, total), total) for n in range(64, total + 64, 64)]
        assert isinstance(events[-1], DoneEvent) and events[-1].finish_reason == "length"

        other = engine.tokenize("other " * 300)
        gen = engine.generate(other, GenerateOptions(max_tokens=2))
        first = next(gen)
        assert isinstance(first, PrefillEvent) and first.done == 64
        gen.cancel()
        rest = list(gen)
        assert not any(isinstance(e, PrefillEvent) for e in rest)
        assert rest[-1].finish_reason == "cancelled" and rest[-1].tokens == ()
        assert engine.ctx.tokens == other[:64]
        # the next reply on the same prompt starts after what was read
        again = [e for e in engine.generate(other, GenerateOptions(max_tokens=1)) if isinstance(e, PrefillEvent)]
        assert again[0].done == 128
    finally:
        engine.close()
