"""Dynamic draft trees from a model drafter (a DFlash or DSpark block), verified in one batch, on real llama.cpp.

The pair is the tiny ``llama`` target and the agreeing ``dflash`` draft of
``tests/support/eagle3_model.py``, without and with DSpark's Markov head (trained anchor first). One draft pass gives a q per depth; the tree
grows where the cumulative draft probability is highest (``draft_tree.grow_tree``),
and is verified with the tree mask: greedy by the target's argmax, at T > 0 by
recursive rejection sampling over each node's sampled children.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from localspec.backend import Context, DFlashContext, Model
from localspec.drafting.base import TreeProposal
from localspec.drafting.dflash import DFlashDrafter
from localspec.sampling import Sampler, SamplingParams
from localspec.speculative import speculative_step
from stats import assert_first_two_follow, first_two_joint

PROMPT = "The quick brown fox jumps over the lazy dog, and then"


@pytest.fixture(scope="module", params=["dflash", "dspark"])
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from eagle3_model import write_dflash_draft, write_llama_target

    d = tmp_path_factory.mktemp("trees")
    return (write_llama_target(d / "llama-tiny.gguf", mix=0.3),
            write_dflash_draft(d / f"{request.param}-tiny.gguf", agree=True,
                               markov_rank=8 if request.param == "dspark" else 0))


@pytest.fixture
def models(pair):
    target, draft = Model(pair[0]), Model(pair[1])
    yield target, draft
    target.close()
    draft.close()


def test_greedy_with_a_draft_tree_is_plain_greedy(models):
    target, draft = models
    plain = Context(target, n_ctx=256, n_threads=1)
    tctx = Context(target, n_ctx=256, n_threads=1, n_seq=1 + 8)
    head = DFlashContext(draft, tctx, n_threads=1)
    tctx.enable_layer_taps(head.layers)
    sampler = Sampler(SamplingParams(temperature=0.0))
    drafter = DFlashDrafter(head, tctx, sampler, tree_width=3)
    try:
        prompt = target.tokenize(PROMPT)
        plain.append(prompt)
        want = list(prompt)
        for _ in range(30):
            want.append(int(np.argmax(plain.logits(-1))))
            plain.append(want[-1:])
        history = list(prompt)
        tctx.append(history[:-1])
        trees = widest = accepted_past_first = 0
        while len(history) < len(want):
            proposal = drafter.propose_tree(history, 3, 6)
            assert isinstance(proposal, TreeProposal) and proposal.child_q is None  # greedy: top tokens
            widest = max(widest, sum(1 for p in proposal.tree.parents if p == -1))
            step = speculative_step(tctx, history, drafter, sampler, 3, proposal=proposal)
            trees += 1
            accepted_past_first += step.accepted > 0 and proposal.tree.tokens[0] != step.tokens[0]
        assert history[:len(want)] == want
        assert widest > 1  # the tree branched at the root
        assert accepted_past_first > 0  # a sibling other than the most probable child was kept
    finally:
        drafter.close()
        head.close()
        tctx.close()
        plain.close()


def test_sampled_tokens_with_a_draft_tree_follow_the_target(models):
    """At T=1 the first two emitted tokens follow the target's joint distribution (chi-square), with the
    tree's children sampled from each depth's q and accepted by recursive rejection sampling."""
    target, draft = models
    tctx = Context(target, n_ctx=256, n_threads=1, n_seq=1 + 8)
    head = DFlashContext(draft, tctx, n_threads=1)
    tctx.enable_layer_taps(head.layers)
    sampler = Sampler(SamplingParams(temperature=1.0, top_k=8, seed=5))
    drafter = DFlashDrafter(head, tctx, sampler, tree_width=3)
    prompt = target.tokenize(PROMPT)
    tctx.append(prompt[:-1])
    n0 = len(tctx.tokens)
    joint = first_two_joint(tctx, sampler, prompt[-1])
    proposal = drafter.propose_tree(prompt, 3, 6)
    assert isinstance(proposal, TreeProposal) and proposal.child_q is not None
    assert () in proposal.child_q  # the root's children were drawn from the block's first row
    assert_first_two_follow(tctx, prompt, drafter, sampler, joint, lambda: tctx.rollback_to(n0), trials=1200,
                            tree_nodes=6)
    drafter.close()
    head.close()
    tctx.close()
