"""A DFlash GGUF as ``--draft``: a block of drafts from one pass over the target's features, on real llama.cpp.

The models are the tiny dense ``llama`` target of ``tests/support/eagle3_model.py`` and a
tiny ``dflash`` draft built so its first draft agrees with the target often (deeper ones
rarely): drafts are both accepted and rejected.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from localspec.backend import Context, DFlashContext, Model
from localspec.drafting.dflash import DFlashDrafter
from localspec.engine import Engine, GenerateOptions
from localspec.sampling import Sampler, SamplingParams

PROMPT = "The quick brown fox jumps over the lazy dog, and then"
MIX = 0.3


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from eagle3_model import write_dflash_draft, write_llama_target

    d = tmp_path_factory.mktemp("dflash")
    return (write_llama_target(d / "llama-tiny.gguf", mix=MIX),
            write_dflash_draft(d / "dflash-tiny.gguf", agree=True))


def _run(engine: Engine, prompt: str, **kw) -> tuple[tuple[int, ...], dict[str, tuple[int, int]]]:
    done = engine.generate(prompt, GenerateOptions(**kw)).run()
    return done.tokens, {d.name: (d.drafted, d.accepted) for d in done.stats.drafters}


def test_one_pass_drafts_the_block(pair):
    """A proposal of k tokens is one draft decode (after the injection), never k; and at most block - 1."""
    target_path, draft_path = pair
    target, draft = Model(target_path), Model(draft_path)
    tctx = Context(target, n_ctx=256, n_threads=1)
    head = DFlashContext(draft, tctx, n_threads=1)
    tctx.enable_layer_taps(head.layers)
    calls: list[int] = []
    block = head.draft_block
    head.draft_block = lambda token, position, k: (calls.append(k), block(token, position, k))  # type: ignore[method-assign]
    drafter = DFlashDrafter(head, tctx, Sampler(SamplingParams(temperature=0.0)))
    try:
        prompt = target.tokenize(PROMPT)
        tctx.append(prompt[:-1])
        proposal = drafter.propose(prompt, 3)
        assert len(proposal.tokens) == 3 and calls == [3]
        assert len(drafter.propose(prompt, 10).tokens) == head.block_size - 1
        assert head.n_past == len(prompt) - 1  # the block left the cache; the features stay
    finally:
        drafter.close()
        head.close()
        tctx.close()
        target.close()
        draft.close()




@pytest.fixture(scope="module")
def dspark_files(pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """DSpark drafts over the same weights as ``pair``'s DFlash draft (its Markov head is drawn last):
    trained anchor first (with a confidence head) and with a bonus anchor."""
    from eagle3_model import write_dflash_draft

    d = tmp_path_factory.mktemp("dspark")
    return {"anchor": write_dflash_draft(d / "dspark-anchor.gguf", agree=True, markov_rank=8, confidence=True),
            "bonus": write_dflash_draft(d / "dspark-bonus.gguf", agree=True, markov_rank=8, anchor_first=False)}


def _markov_bias(path: Path):
    import gguf

    weights = {t.name: np.array(t.data) for t in gguf.GGUFReader(str(path)).tensors if t.name.startswith("markov")}
    w1, w2 = weights["markov_w1.weight"], weights["markov_w2.weight"]
    return lambda token: w2 @ w1[token]


def test_dspark_rows_are_dflash_rows_biased_by_the_token_before(pair, dspark_files):
    """Each DSpark draft's logits are the DFlash block row that predicts it plus the Markov bias of the
    token before: the anchor for the first, then the argmax of the draft before (llama.cpp's graph
    chains it greedily). Anchor first, draft i sits at block row i - 1 and a pass drafts a whole
    block; with a bonus anchor, at row i, as DFlash's do. A row read one place off, or a bias taken
    from the wrong token, would not add up."""
    target_path, dflash_path = pair
    target = Model(target_path)
    tctx = Context(target, n_ctx=256, n_threads=1)
    models = {"dflash": Model(dflash_path), **{k: Model(p) for k, p in dspark_files.items()}}
    heads = {k: DFlashContext(m, tctx, n_threads=1) for k, m in models.items()}
    try:
        assert [(h.markov, h.anchor_first, h.has_confidence, h.max_draft_len) for h in heads.values()] == [
            (False, False, False, 3), (True, True, True, 4), (True, False, False, 3)]
        tctx.enable_layer_taps(heads["dflash"].layers)
        prompt = target.tokenize(PROMPT)
        tctx.append(prompt[:-1])
        features = tctx.layer_features(len(prompt) - 1)
        x, at = prompt[-1], len(prompt) - 1
        rows = {}
        for name, head in heads.items():
            head.inject(features, range(at))
            k = 4 if name == "anchor" else 3  # the same four block rows: [x, MASK * 3]
            head.draft_block(x, at, k)
            rows[name] = [np.array(head.logits(i)) for i in range(1, k + 1)]
        bias = _markov_bias(dspark_files["anchor"])
        # Bonus anchor: row i of the same block as DFlash's, biased by the token before.
        before = x
        for dflash, dspark in zip(rows["dflash"], rows["bonus"]):
            np.testing.assert_allclose(dspark - dflash, bias(before), atol=1e-4)
            before = int(np.argmax(dspark))
        # Anchor first: draft i + 1 is block row i, which DFlash reads as its draft i.
        before = int(np.argmax(rows["anchor"][0]))
        for dflash, dspark in zip(rows["dflash"], rows["anchor"][1:]):
            np.testing.assert_allclose(dspark - dflash, bias(before), atol=1e-4)
            before = int(np.argmax(dspark))
        confidence = [heads["anchor"].confidence(i) for i in range(1, 5)]
        assert all(c is not None and 0.0 < c < 1.0 for c in confidence)
        assert heads["dflash"].confidence(1) is None and heads["bonus"].confidence(1) is None
    finally:
        for head in heads.values():
            head.close()
        tctx.close()
        for m in (target, *models.values()):
            m.close()


def softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max())
    return e / e.sum()


def test_dspark_cuts_its_block_where_its_confidence_falls_below_p_min(pair, dspark_files):
    """With a confidence head, ``p_min`` is a bound on it (as in llama.cpp's draft-dspark), not on the
    row's top probability; the stats name the drafter ``dspark``."""
    target_path, _ = pair
    target, draft = Model(target_path), Model(dspark_files["anchor"])
    tctx = Context(target, n_ctx=256, n_threads=1)
    head = DFlashContext(draft, tctx, n_threads=1)
    tctx.enable_layer_taps(head.layers)
    try:
        prompt = target.tokenize(PROMPT)
        tctx.append(prompt[:-1])
        greedy = Sampler(SamplingParams(temperature=0.0))
        full = DFlashDrafter(head, tctx, greedy)
        assert full.name == "dspark"
        assert len(full.propose(prompt, 4).tokens) == 4
        confidence = [head.confidence(i) for i in range(1, 5)]
        top = [float(np.max(softmax(np.array(head.logits(i))))) for i in range(1, 5)]
        full.close()
        # This draft's confidence (its head's bias is -4) lies below every row's top probability: a
        # bound between the two cuts the whole block by confidence, and would keep it all by top
        # probability; a bound below the confidence keeps it all.
        assert max(confidence) < min(top), (confidence, top)
        for bound, kept in (((max(confidence) + min(top)) / 2, 0), (min(confidence) / 2, 4)):
            cut = DFlashDrafter(head, tctx, greedy, p_min=bound)
            assert len(cut.propose(prompt, 4).tokens) == kept, (bound, confidence, top)
            cut.close()
    finally:
        head.close()
        tctx.close()
        target.close()
        draft.close()
