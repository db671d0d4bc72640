"""Log-probabilities on the real SmolLM2: the same numbers with speculation on or off (chains, trees,
a path placed again after a rejected branch), one per token, aligned with held-back text."""

from __future__ import annotations

import numpy as np
import pytest

import localspec
from localspec.acceptance import ROOT
from localspec.backend import Context, batch_invariant
from localspec.drafting.specs import parse_draft
from localspec.drafting.tree import CandidateTree
from localspec.engine import Engine, GenerateOptions
from localspec.events import DoneEvent, TokenEvent
from localspec.logprobs import token_logprob
from localspec.sampling import Sampler, SamplingParams
from localspec.speculative import speculative_step

pytestmark = pytest.mark.skipif(not batch_invariant(), reason="bit identity needs a batch-invariant build")

PROMPT = "List the planets of the solar system in order from the sun:\n1."


def _logprobs(engine: Engine, opts: GenerateOptions) -> tuple[tuple[int, ...], list]:
    events = list(engine.generate(PROMPT, opts))
    done = events[-1]
    assert isinstance(done, DoneEvent)
    lps = [e.logprob for e in events if isinstance(e, TokenEvent)]
    assert all(lp is not None for lp in lps) and [lp.token for lp in lps] == list(done.tokens)
    return done.tokens, lps


def test_a_draft_model_chain_gives_the_plain_numbers(smollm2_path, smollm2_q4_0_path) -> None:
    engine = localspec.load(smollm2_path, draft=smollm2_q4_0_path, n_ctx=1024, n_gpu_layers=0)
    try:
        spec_tokens, spec = _logprobs(engine, GenerateOptions(max_tokens=48, draft_len=4, logprobs=5))
        plain_tokens, plain = _logprobs(engine, GenerateOptions(max_tokens=48, speculative=False, logprobs=5))
        assert engine.generate(PROMPT, GenerateOptions(max_tokens=48, draft_len=4)).run().stats.accepted > 0
    finally:
        engine.close()
    assert spec_tokens == plain_tokens
    assert spec == plain  # bit for bit: the verified rows are the rows plain decoding reads
    assert all(len(lp.top) == 5 and lp.top[0][1] >= lp.logprob for lp in spec)
    # Greedy: the chosen token is the most probable one.
    assert all(lp.top[0][0] == lp.token for lp in spec)


def test_lookahead_trees_give_the_plain_numbers(target) -> None:
    engine = Engine(target, specs=parse_draft("lookahead"), n_ctx=1024, personal_history=False)
    try:
        spec_tokens, spec = _logprobs(engine, GenerateOptions(max_tokens=64, draft_len=6, logprobs=2))
        plain_tokens, plain = _logprobs(engine, GenerateOptions(max_tokens=64, speculative=False, logprobs=2))
    finally:
        engine.ctx.close()
    assert spec_tokens == plain_tokens and spec == plain


class OneTree:
    """Proposes one hand-built tree."""

    name = "hand"

    def __init__(self, tree: CandidateTree) -> None:
        self.tree = tree

    def propose(self, history, draft_len):
        from localspec.drafting.base import TreeProposal

        return TreeProposal(self.tree, self.name)

    def verified(self, n) -> None:
        pass

    def accepted(self, history, n_accepted) -> None:
        pass


def test_a_path_placed_again_after_a_rejected_branch_reports_the_plain_rows(target) -> None:
    # The wrong branch comes first in the batch, so the accepted path is decoded again where plain decoding
    # puts it (speculative._place_rest); its tokens' numbers come from those rows.
    prompt = target.tokenize("Once upon a time, in a small village by the sea,")
    ref = Context(target, n_ctx=512)
    ctx = Context(target, n_ctx=512, n_seq=3)
    try:
        ref.append(prompt[:-1])
        token, plain = prompt[-1], []
        for _ in range(3):
            ref.append([token])
            row = np.array(ref.logits(-1))
            token = int(np.argmax(row))
            plain.append(token_logprob(row, token, 3))
        a1, a2, _ = (lp.token for lp in plain)
        wrong = next(t for t in range(10, 1000) if t not in (a1, a2))
        tree = CandidateTree(tokens=(wrong, wrong + 1, a1, a2), parents=(ROOT, 0, ROOT, 2),
                             depths=(1, 2, 1, 2), probs=(0.6, 0.5, 0.4, 0.4))
        ctx.append(prompt[:-1])
        step = speculative_step(ctx, list(prompt), OneTree(tree), Sampler(SamplingParams()), 2, logprobs=3)
    finally:
        ctx.close()
        ref.close()
    assert step.accepted == 2 and step.tokens == tuple(lp.token for lp in plain)
    assert step.logprobs == tuple(plain)


def test_sampled_tokens_held_by_a_stop_string_keep_their_own_numbers(target) -> None:
    engine = Engine(target, specs=parse_draft("ngram"), n_ctx=1024, personal_history=False)
    try:
        opts = GenerateOptions(max_tokens=40, draft_len=3, logprobs=1, stop=("Mars", "Jupiter"),
                               sampling=SamplingParams(temperature=0.9, seed=3))
        events = list(engine.generate(PROMPT, opts))
        without = list(engine.generate(PROMPT, GenerateOptions(max_tokens=8, draft_len=3)))
    finally:
        engine.ctx.close()
    tokens = [e for e in events if isinstance(e, TokenEvent)]
    assert tokens and all(e.logprob is not None and e.logprob.token == e.token for e in tokens)
    assert all(e.logprob.logprob <= 0 and len(e.logprob.top) == 1 for e in tokens)
    assert all(e.logprob is None for e in without if isinstance(e, TokenEvent))  # none asked, none made
