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




def _block_logits(head: DFlashContext, token: int, position: int, k: int) -> list[np.ndarray]:
    """The logits of every row of ``[token, MASK * k]``, decoded as llama.cpp's own draft-dflash does
    (``common/speculative.cpp``: every row of the block an output), built here on the batch API itself."""
    import llama_cpp

    b = head._batch
    llama_cpp.llama_batch_ext_clear(b)
    for i in range(k + 1):
        idx = llama_cpp.llama_batch_ext_add_token(b, 0, token if i == 0 else head.mask_token)
        head._pos[0] = position + i
        llama_cpp.llama_batch_ext_set_pos(b, idx, head._pos)
        llama_cpp.llama_batch_ext_set_output_logits(b, idx, True)
    assert llama_cpp.llama_process(head._ctx, llama_cpp.LLAMA_PROCESS_TYPE_DECODE, b) == 0
    rows = [np.array(head.logits(i)) for i in range(k + 1)]
    head.rollback_to(position)
    return rows


def test_block_row_i_reads_row_i(pair):
    """``logits(i)`` after ``draft_block`` is row i's of the block: the graph hands back every row and llama.cpp
    copies the first n_outputs, so a block asking for rows 1..k only read row 0's (the anchor's) as row 1's."""
    target_path, draft_path = pair
    target, draft = Model(target_path), Model(draft_path)
    tctx = Context(target, n_ctx=256, n_threads=1)
    head = DFlashContext(draft, tctx, n_threads=1)
    try:
        tctx.enable_layer_taps(head.layers)
        prompt = target.tokenize(PROMPT)
        tctx.append(prompt[:-1])
        last = len(prompt) - 1
        head.inject(tctx.layer_features(last), range(last))
        want = _block_logits(head, prompt[-1], last, 3)
        assert not np.allclose(want[0], want[1], atol=1e-2)  # the anchor's row is not the first draft's
        head.draft_block(prompt[-1], last, 3)
        for i in range(1, 4):
            np.testing.assert_allclose(head.logits(i), want[i], atol=1e-4)
    finally:
        head.close()
        tctx.close()
        target.close()
        draft.close()
