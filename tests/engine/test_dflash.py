"""A DFlash GGUF as ``--draft``: a block of drafts from one pass over the target's features, on real llama.cpp.

The models are the tiny dense ``llama`` target of ``tests/support/eagle3_model.py`` and a
tiny ``dflash`` draft built so its first draft agrees with the target often (deeper ones
rarely): drafts are both accepted and rejected.
"""

from __future__ import annotations

from pathlib import Path

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


