"""Speculation on a hybrid target llama.cpp rolls back by snapshots (a real, tiny random LFM2).

The rollback itself (exact within the last batch, refused beyond it), greedy
identity with n-gram and draft-model drafting, the draft-length cap, chains
only, and the rejection-sampling distribution on the hybrid target.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from localspec import backend
from localspec.backend import Context, Model
from localspec.drafting.model import ModelDrafter
from localspec.drafting.specs import DrafterSpec
from localspec.engine import Engine, GenerateOptions
from localspec.errors import UnsupportedModelError
from localspec.events import StepEvent
from localspec.llama_facts import ROLLBACK_SNAPSHOTS
from localspec.sampling import Sampler, SamplingParams
from localspec.speculative import speculative_step

from greedy import assert_matches_plain, plain_greedy
from hybrid_model import write_lfm2
from stats import assert_follows
from cli import assert_clean_error, localspec

REPETITIVE = "one two three four one two three four one two three four one two three"


@pytest.fixture(scope="module")
def lfm2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("lfm2")


@pytest.fixture(scope="module")
def lfm2_path(lfm2_dir: Path) -> Path:
    return write_lfm2(lfm2_dir / "lfm2-tiny.gguf")


@pytest.fixture(scope="module")
def lfm2_draft_path(lfm2_dir: Path) -> Path:
    """The same model with noise on its output matrix: it agrees with it on about half the tokens."""
    return write_lfm2(lfm2_dir / "lfm2-tiny-perturbed.gguf", perturb=0.1)


@pytest.fixture(scope="module")
def target(lfm2_path: Path):
    model = Model(lfm2_path)
    yield model
    model.close()


@pytest.fixture(scope="module")
def reference(target: Model):
    return plain_greedy(target, target.tokenize(REPETITIVE), 80)


def steps_of(engine: Engine, prompt: str, **kw) -> tuple[tuple[int, ...], list[StepEvent]]:
    events = list(engine.generate(prompt, GenerateOptions(**kw)))
    return events[-1].tokens, [e for e in events if isinstance(e, StepEvent)]


# --- the backend -------------------------------------------------------------------------


def test_lfm2_is_a_hybrid_that_rolls_back_by_snapshots(target, smollm2_path):
    assert target.is_hybrid and target.architecture == "lfm2"
    assert target.rollback == "snapshots" and target.can_rollback
    ctx = Context(target, n_ctx=256)
    small = Context(target, n_ctx=256, n_rs_seq=3)
    try:
        # llama.cpp granted what was asked (it sets n_rs_seq to 0 for an architecture it cannot snapshot).
        assert ctx.n_rs_seq == ctx.max_rollback == ROLLBACK_SNAPSHOTS
        assert small.max_rollback == 3
    finally:
        ctx.close()
        small.close()
    smollm2 = Model(smollm2_path)
    plain = Context(smollm2, n_ctx=256)
    try:
        assert smollm2.rollback == "cache" and plain.max_rollback is None and plain.n_rs_seq == 0
    finally:
        plain.close()
        smollm2.close()


def _next_logits(target: Model, history: list[int], split: int) -> np.ndarray:
    """Logits after ``history``, decoded as one batch up to ``split`` and then token by token."""
    ctx = Context(target, n_ctx=256)
    try:
        ctx.append(history[:split])
        for tok in history[split:]:
            ctx.append([tok])
        return ctx.logits(-1).copy()
    finally:
        ctx.close()


def test_rollback_within_the_last_batch_restores_the_state_exactly(target):
    toks = target.tokenize("Once upon a time, there was a little girl who lived")
    ctx = Context(target, n_ctx=256)
    try:
        ctx.append(toks[:4])
        ctx.append(toks[4:14])  # a batch of 10: up to 9 of its tokens can be taken back
        assert ctx.keepable(5) == 5
        ctx.rollback_to(5)
        ctx.append(toks[5:6])
        rolled_back = ctx.logits(-1).copy()
    finally:
        ctx.close()
    expected = _next_logits(target, toks[:6], 5)
    np.testing.assert_array_equal(rolled_back, expected)


def test_rollback_beyond_the_last_batch_is_refused_not_silently_wrong(target):
    toks = target.tokenize("Once upon a time, there was a little girl who lived")
    ctx = Context(target, n_ctx=256)
    try:
        ctx.append(toks[:6])
        for tok in toks[6:9]:  # one-token decodes: each writes only the current state
            ctx.append([tok])
        # llama.cpp itself would accept these (both are within n_rs_seq) and restore a wrong state.
        for n in (7, 8):
            assert ctx.keepable(n) == 0
            with pytest.raises(UnsupportedModelError, match="snapshots"):
                ctx.rollback_to(n)
        assert ctx.tokens == toks[:9]
        ctx.append(toks[9:12])
        assert ctx.keepable(9) == 0  # the whole last batch: its first token has no snapshot before it
        assert ctx.keepable(10) == 10
        ctx.rollback_to(11)
        assert ctx.keepable(10) == 0  # a snapshot is used once, until the next batch
        ctx.rollback_to(0)  # clearing always works
        assert ctx.tokens == [] and ctx.seq_pos_max(0) == -1
    finally:
        ctx.close()


# --- the engine --------------------------------------------------------------------------


@pytest.mark.parametrize("draft_len", [None, 3, 16, 40])
def test_greedy_ngram_speculation_on_the_hybrid_is_plain_greedy(target, reference, draft_len):
    engine = Engine(target, specs=[DrafterSpec("ngram")], n_ctx=512, personal_history=False, n_threads=1)
    try:
        assert engine.ctx.n_seq == 1  # chains only
        tokens, steps = steps_of(engine, REPETITIVE, max_tokens=80, draft_len=draft_len)
    finally:
        engine.ctx.close()
    assert_matches_plain(tokens, reference, strict=backend.batch_invariant())
    if draft_len is not None:
        assert sum(s.drafted for s in steps) > 0  # the prompt's n-grams were proposed and rolled back
    assert max(s.drafted for s in steps) <= min(draft_len or ROLLBACK_SNAPSHOTS, ROLLBACK_SNAPSHOTS)


def test_greedy_self_draft_on_the_hybrid_is_plain_greedy_and_always_accepted(target, lfm2_path, reference):
    engine = Engine(target, draft=Model(lfm2_path), n_ctx=512, n_threads=1)
    try:
        assert engine.draft_ctx is not None and engine.draft_ctx.n_seq == 2
        tokens, steps = steps_of(engine, REPETITIVE, max_tokens=80, draft_len=6)
        drafted = sum(s.drafted for s in steps)
        assert drafted > 0 and sum(s.accepted for s in steps) == drafted
        assert_matches_plain(tokens, reference, strict=backend.batch_invariant())
        # The next turn shares the first one: the draft keeps its cache or decodes afresh, never wrongly.
        again, _ = steps_of(engine, REPETITIVE, max_tokens=80, draft_len=6)
        assert again == tokens
    finally:
        engine.ctx.close()
        engine.draft_ctx.close()
        engine.draft.close()


def test_greedy_perturbed_draft_on_the_hybrid_is_plain_greedy(target, lfm2_draft_path, reference):
    engine = Engine(target, draft=Model(lfm2_draft_path), n_ctx=512, n_threads=1)
    try:
        tokens, steps = steps_of(engine, REPETITIVE, max_tokens=80, draft_len=5)
    finally:
        engine.ctx.close()
        engine.draft_ctx.close()
        engine.draft.close()
    drafted, accepted = sum(s.drafted for s in steps), sum(s.accepted for s in steps)
    assert 0 < accepted < drafted  # drafts were accepted and rejected: partial rollbacks ran
    assert_matches_plain(tokens, reference, strict=backend.batch_invariant())


def test_draft_length_is_capped_by_the_snapshots(target, lfm2_path, reference, monkeypatch):
    """A --draft-max above the snapshots the context keeps is cut to them: no rollback goes deeper."""
    monkeypatch.setattr(backend.context, "ROLLBACK_SNAPSHOTS", 3)
    cuts: list[int] = []
    real = Context.rollback_to

    def recording(ctx: Context, n: int, seq_id: int = 0) -> None:
        if ctx.model is target and seq_id == 0 and n > 0:  # n = 0 clears, which is no rollback
            cuts.append(len(ctx.tokens) - n)
        real(ctx, n, seq_id)

    monkeypatch.setattr(Context, "rollback_to", recording)
    engine = Engine(target, draft=Model(lfm2_path), specs=[DrafterSpec("ngram")], n_ctx=512,
                    personal_history=False, n_threads=1)
    try:
        assert engine.ctx.max_rollback == 3
        for drafter in ("draft", "ngram"):
            tokens, steps = steps_of(engine, REPETITIVE, max_tokens=40, draft_len=12, drafter=drafter)
            assert max(s.drafted for s in steps) == 3
            head = replace(reference, tokens=reference.tokens[:40], margins=reference.margins[:40])
            assert_matches_plain(tokens, head, strict=backend.batch_invariant())
    finally:
        engine.ctx.close()
        engine.draft_ctx.close()
        engine.draft.close()
    assert max(cuts) <= 3 and any(c > 0 for c in cuts)


def test_lookahead_is_refused_on_the_hybrid_in_one_line(target):
    with pytest.raises(UnsupportedModelError) as err:
        Engine(target, specs=[DrafterSpec("lookahead")], n_ctx=256)
    message = str(err.value)
    assert "\n" not in message
    for needle in ("hybrid model (lfm2)", "lookahead", "ngram"):
        assert needle in message


def test_cli_speculates_on_the_hybrid(lfm2_path):
    proc = localspec("generate", str(lfm2_path), "--draft", "ngram", "--draft-max", "4", "-p", REPETITIVE,
                     "--max-tokens", "12")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip()


def test_cli_refuses_lookahead_on_the_hybrid(lfm2_path):
    proc = localspec("generate", str(lfm2_path), "--draft", "lookahead", "-p", "hi")
    assert_clean_error(proc, "hybrid model (lfm2)", "lookahead")


# --- the distribution --------------------------------------------------------------------


def test_first_token_distribution_on_the_hybrid_is_the_targets(target, lfm2_draft_path):
    """At T=0.7 the first token of a speculative step follows the hybrid target's own distribution.

    Every trial verifies a 3-token draft on the hybrid target and cuts its cache
    back by snapshot; the draft is a hybrid too, drafting on its branch sequence.
    """
    params = SamplingParams(temperature=0.7, seed=4321)
    sampler = Sampler(params)
    prompt = target.tokenize("My favourite fruit is the")
    # One thread each: a model this small gains nothing from more, and on a busy machine OpenMP's
    # waiting threads made the trials take minutes.
    tctx = Context(target, n_ctx=256, n_threads=1)
    tctx.append(prompt)
    p = sampler.distribution(tctx.logits(-1)).copy()
    draft = Model(lfm2_draft_path)
    dctx = Context(draft, n_ctx=256, n_seq=2, n_rs_seq=0, n_threads=1)
    drafter = ModelDrafter(dctx, sampler)

    trials = 800
    counts: Counter[int] = Counter()
    accepted_first = 0
    try:
        for _ in range(trials):
            # The last step's rollback used the snapshot: start each trial from the prompt afresh.
            tctx.clear()
            tctx.append(prompt[:-1])
            history = list(prompt)
            step = speculative_step(tctx, history, drafter, sampler, draft_len=3)
            counts[step.tokens[0]] += 1
            accepted_first += step.accepted > 0
    finally:
        tctx.close()
        dctx.close()
        draft.close()
    assert 0 < accepted_first < trials  # both paths of the rule ran
    assert_follows(counts, dict(enumerate(p.tolist())), trials, min_outcomes=5)
