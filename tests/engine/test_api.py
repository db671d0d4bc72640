"""The Python API as a script uses it, on the real SmolLM2 pair; and the draft's p_min cut-off."""

from __future__ import annotations

import numpy as np
import pytest

import localspec
from localspec import GenerateOptions, SamplingParams, TokenEvent
from localspec.backend import Context, Model
from localspec.drafting.model import ModelDrafter
from localspec.events import DoneEvent, StepEvent
from localspec.sampling import Sampler

PROMPT = "The three primary colours are"


@pytest.fixture(scope="module")
def engine(smollm2_path, smollm2_q4_0_path):
    eng = localspec.load(smollm2_path, draft=smollm2_q4_0_path, n_ctx=1024, n_gpu_layers=0)
    yield eng
    eng.close()


def test_complete_returns_the_text_and_consistent_stats(engine):
    spec = localspec.complete(engine, PROMPT, max_tokens=40, draft_len=4)
    plain = localspec.complete(engine, PROMPT, max_tokens=40, speculative=False)
    assert spec.text and spec.finish_reason in ("length", "stop")
    assert len(spec.tokens) == spec.stats.tokens <= 40
    assert 0 < spec.stats.drafted and spec.stats.accepted <= spec.stats.drafted
    assert plain.stats.drafted == 0 and plain.stats.steps == plain.stats.tokens
    # Exact: greedy speculative text is the target's own greedy text (batch-invariant build;
    # see tests/support/greedy.py for the comparison that tolerates near-ties elsewhere).
    from localspec.backend import batch_invariant

    if batch_invariant():
        assert spec.tokens == plain.tokens


def test_generate_streams_events_that_add_up(engine):
    gen = engine.generate(PROMPT, GenerateOptions(max_tokens=32, draft_len=3,
                                                  sampling=SamplingParams(temperature=0.8, seed=7)))
    events = list(gen)
    done = events[-1]
    assert isinstance(done, DoneEvent)
    pieces = [e for e in events if isinstance(e, TokenEvent)]
    assert "".join(e.text for e in pieces) == done.text
    steps = [e for e in events if isinstance(e, StepEvent)]
    assert len(steps) == done.stats.steps
    assert sum(e.drafted for e in steps) == done.stats.drafted > 0
    assert sum(e.accepted for e in steps) == done.stats.accepted
    assert gen.stats() == done.stats
    # Seeded sampling through the API is reproducible.
    again = localspec.complete(engine, PROMPT, max_tokens=32, draft_len=3, temperature=0.8, seed=7)
    assert again.tokens == done.tokens


def test_cancel_stops_a_generation(engine):
    gen = engine.generate(PROMPT, GenerateOptions(max_tokens=200, draft_len=2))
    for event in gen:
        if isinstance(event, TokenEvent):
            gen.cancel()
        if isinstance(event, DoneEvent):
            break
    assert event.finish_reason == "cancelled" and event.stats.tokens < 200


def _top_probability(ctx: Context) -> float:
    logits = ctx.logits(-1).astype(np.float64)
    w = np.exp(logits - logits.max())
    return float(w.max() / w.sum())


def test_the_draft_stops_where_its_own_confidence_falls_below_p_min(smollm2_q4_0_path):
    model = Model(smollm2_q4_0_path, n_gpu_layers=0)
    history = model.tokenize("Monday, Tuesday, Wednesday, Thursday, and the colour of the sky is")
    lengths = []
    for p_min in (0.0, 0.3, 0.6, 0.9):
        drafter = ModelDrafter(Context(model, n_ctx=512), Sampler(SamplingParams()), p_min=p_min)
        proposal = drafter.propose(history, 12)
        drafter.ctx.close()
        lengths.append(len(proposal.tokens))
        # Replay the draft's own view: every proposed token was drafted with top probability
        # >= p_min, and a proposal that ended early ended where it fell below.
        check = Context(model, n_ctx=512)
        check.append(history)
        for tok in proposal.tokens:
            assert _top_probability(check) >= p_min
            assert int(np.argmax(check.logits(-1))) == tok
            check.append([tok])
        if len(proposal.tokens) < 12:
            assert _top_probability(check) < p_min
        check.close()
    model.close()
    assert lengths[0] == 12  # no cut-off: the full request
    assert lengths == sorted(lengths, reverse=True) and lengths[-1] < 12  # a stricter p_min cuts sooner
