"""An EAGLE-3 GGUF as ``--draft``: a draft that reads three of its target's layers, on real llama.cpp.

The models are a tiny dense ``llama`` target and a tiny ``eagle3`` draft with random
weights (``tests/support/eagle3_model.py``), built so the draft agrees with its target
often: drafts are both accepted and rejected.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from localspec.backend import Context, Eagle3Context, Model, feature_taps
from localspec.engine import Engine, GenerateOptions
from localspec.errors import UnsupportedModelError
from localspec.sampling import Sampler, SamplingParams
from cli import localspec, one_error_line

PROMPT = "The quick brown fox jumps over the lazy dog, and then"
MIX = 0.3


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from eagle3_model import write_eagle3_draft, write_llama_target

    d = tmp_path_factory.mktemp("eagle3")
    return (write_llama_target(d / "llama-tiny.gguf", mix=MIX),
            write_eagle3_draft(d / "eagle3-tiny.gguf", agree=True))


def _run(engine: Engine, prompt: str, **kw) -> tuple[tuple[int, ...], dict[str, tuple[int, int]]]:
    done = engine.generate(prompt, GenerateOptions(**kw)).run()
    return done.tokens, {d.name: (d.drafted, d.accepted) for d in done.stats.drafters}


def test_the_draft_reads_the_target_layers(pair):
    """The decoder's logits depend on the target's features: zeroed features move them, and the features
    of a position are the tapped layers' inputs side by side (layer 0's input is the token embedding)."""
    target_path, draft_path = pair
    target, draft = Model(target_path), Model(draft_path)
    tctx = Context(target, n_ctx=256, n_threads=1)
    head = Eagle3Context(draft, tctx, n_threads=1)
    try:
        assert head.layers == (0, 1, 3) and head.n_features == 3 * 64
        tctx.enable_layer_taps(head.layers)
        tokens = target.tokenize(PROMPT)
        tctx.append(tokens, outputs="all")
        features = tctx.layer_features(len(tokens))
        assert features.shape == (len(tokens), 3 * 64)
        assert not np.allclose(features[:, :64], features[:, 64:128])  # layer 0's input is not layer 1's
        n = len(tokens) - 1
        g = head.encode(features[:n])
        head.decode(tokens[1:], range(n), g, [True] * n)
        with_features = np.array(head.logits(n - 1))
        head.clear()
        head.decode(tokens[1:], range(n), head.encode(np.zeros_like(features[:n])), [True] * n)
        assert not np.allclose(head.logits(n - 1), with_features, atol=1e-3)
    finally:
        head.close()
        tctx.close()
        target.close()
        draft.close()


def test_cli_refuses_an_eagle3_draft_for_a_target_without_layer_taps(pair, tmp_path):
    """A target whose graph exposes no layer inputs (here glm4moe): refused in one line, no abort."""
    from mtp_model import write_mtp_model

    _, draft = pair
    target = write_mtp_model(tmp_path / "glm4moe.gguf")
    line = one_error_line(localspec("generate", str(target), "--draft", str(draft), "--prompt", "Hi",
                                    "--threads", "1"))
    assert "cannot hand a glm4moe target's layer inputs to a draft" in line


def test_missing_tap_functions_refuse_eagle3(pair, monkeypatch):
    """A libllama without the C++-linkage layer taps: refused in one line, before weights load."""
    target, draft = pair
    monkeypatch.setitem(feature_taps._TAP_SYMBOLS, "get_embeddings_layer_inp", "_Z99llama_no_such_function")
    feature_taps.tap_api.cache_clear()
    try:
        with pytest.raises(UnsupportedModelError, match="llama_get_embeddings_layer_inp") as err:
            Engine.load(target, draft)
        assert "\n" not in str(err.value)
    finally:
        monkeypatch.undo()
        feature_taps.tap_api.cache_clear()
    assert feature_taps.eagle3_unavailable_reason() is None


def test_siblings_drawn_from_the_draft_follow_the_target(pair):
    """Multi-draft acceptance on a real pair's rows: three siblings drawn without replacement from the
    EAGLE-3 draft's q at a position, judged against the target's p there (``acceptance.accept_siblings``),
    emit tokens distributed as p (chi-square), and accept more often than one draft alone."""
    from localspec.acceptance import accept_siblings, draw_siblings
    from stats import assert_follows

    target_path, draft_path = pair
    target, draft = Model(target_path), Model(draft_path)
    tctx = Context(target, n_ctx=256, n_threads=1)
    head = Eagle3Context(draft, tctx, n_threads=1)
    try:
        tctx.enable_layer_taps(head.layers)
        sampler = Sampler(SamplingParams(temperature=1.0, top_k=8, seed=3))
        tokens = target.tokenize(PROMPT)
        tctx.append(tokens, outputs="all")
        n = len(tokens) - 1
        head.decode(tokens[1:], range(n), head.encode(tctx.layer_features(len(tokens))[:n]), [True] * n)
        p = sampler.distribution(tctx.logits(n)).copy()  # the target's next token after the prompt
        q = sampler.distribution(head.logits(n - 1)).copy()  # the draft's for the same token
        assert 0.05 < float(np.minimum(p, q).sum()) < 0.95  # the draft is neither right nor useless
        rng = np.random.default_rng(11)
        counts: dict[int, int] = {}
        accepted = {1: 0, 3: 0}
        trials = 4000
        for k in (1, 3):
            for _ in range(trials):
                verdict = accept_siblings(draw_siblings(q, k, rng), q, p, rng)
                accepted[k] += verdict.accepted is not None
                if k == 3:
                    counts[verdict.token] = counts.get(verdict.token, 0) + 1
        assert_follows(counts, {int(t): float(p[t]) for t in np.flatnonzero(p)}, trials, min_outcomes=3)
        assert accepted[3] > accepted[1]
    finally:
        head.close()
        tctx.close()
        target.close()
        draft.close()


def _direct_chain(target: Model, draft: Model, history: list[int], k: int) -> list[int]:
    """What a greedy EAGLE-3 chain after ``history`` is, computed from scratch: the target's features of
    every position but the last from one decode, every decoder row ``(x_{P+1}, g_P)`` in one batch that
    outputs them all, then each further token decoded one position on, fed the row before's pre-norm output."""
    tctx = Context(target, n_ctx=256, n_threads=1)
    head = Eagle3Context(draft, tctx, n_threads=1)
    try:
        tctx.enable_layer_taps(head.layers)
        n = len(history) - 1
        tctx.append(history[:-1], outputs="all")
        head.decode(history[1:], range(n), head.encode(tctx.layer_features(n)), [True] * n)
        row, chain = n - 1, []
        for depth in range(k):
            chain.append(int(np.argmax(head.logits(row))))
            head.decode(chain[-1:], [n + depth], np.array(head.hidden(row))[None, :], [True])
            row = 0
        return chain
    finally:
        head.close()
        tctx.close()


def test_greedy_drafts_are_the_draft_computed_from_scratch(pair):
    """The drafter's chain equals ``_direct_chain`` on the same history, after the prompt (a catch-up in
    several batches) and after a step that kept a draft (a catch-up of two rows): the rows it keeps and
    rebuilds pair each token with the features it should, and each chain's first token is read from the
    history's last row."""
    from localspec.drafting.eagle3 import Eagle3Drafter

    target_path, draft_path = pair
    target, draft = Model(target_path), Model(draft_path)
    tctx = Context(target, n_ctx=256, n_threads=1)
    head = Eagle3Context(draft, tctx, n_threads=1, n_batch=4)  # the prompt's rows take several batches
    drafter = Eagle3Drafter(head, tctx, Sampler(SamplingParams()))
    try:
        tctx.enable_layer_taps(head.layers)
        history = target.tokenize(PROMPT)
        tctx.append(history[:-1])
        first = drafter.propose(history, 3)
        assert list(first.tokens) == _direct_chain(target, draft, history, 3)
        # The target verified [last, d1, ...] and kept d1; the next history ends in d1 and its own token.
        kept = [history[-1], first.tokens[0]]
        tctx.append(kept, outputs="all")
        history = history + [first.tokens[0], int(np.argmax(tctx.logits(1)))]
        second = drafter.propose(history, 3)
        assert list(second.tokens) == _direct_chain(target, draft, history, 3)
    finally:
        drafter.close()
        head.close()
        tctx.close()
        target.close()
        draft.close()
