"""Penalties on the real SmolLM2: speculation stays exact under them. Greedy output is token-identical with
and without speculation (a draft model's chains, n-gram and lookahead trees); at T = 1 the first two
tokens of speculative steps follow the penalised target's own joint distribution."""

from __future__ import annotations

import pytest
from stats import assert_follows, first_two_joint

import localspec
from localspec.backend import Context, batch_invariant
from localspec.drafting.model import ModelDrafter
from localspec.drafting.specs import parse_draft
from localspec.engine import Engine, GenerateOptions
from localspec.penalties import Penalties, PenaltyShaper
from localspec.sampling import Sampler, SamplingParams
from localspec.speculative import speculative_step

PROMPT = "Repeat after me: the cat sat on the mat, the cat sat on the mat, the cat sat on the mat,"
STRONG = Penalties(presence=0.6, frequency=0.4, repeat=1.3, last_n=32)


@pytest.mark.skipif(not batch_invariant(), reason="token identity needs a batch-invariant build")
def test_greedy_under_penalties_is_identical_with_and_without_a_draft_model(smollm2_path, smollm2_q4_0_path) -> None:
    engine = localspec.load(smollm2_path, draft=smollm2_q4_0_path, n_ctx=1024, n_gpu_layers=0)
    try:
        plain = localspec.complete(engine, PROMPT, max_tokens=48, speculative=False, penalties=STRONG)
        spec = localspec.complete(engine, PROMPT, max_tokens=48, draft_len=4, penalties=STRONG, logprobs=0)
        free = localspec.complete(engine, PROMPT, max_tokens=48, speculative=False)
    finally:
        engine.close()
    assert spec.stats.drafted > 0 and spec.stats.accepted > 0
    assert spec.tokens == plain.tokens
    assert plain.tokens != free.tokens  # the penalties did change the reply
    # The reported numbers are the penalised rows': a repeated token is less likely than the model alone says.
    assert all(lp.logprob <= 0 for lp in spec.logprobs)


@pytest.mark.skipif(not batch_invariant(), reason="token identity needs a batch-invariant build")
@pytest.mark.parametrize("spec", ["ngram", "lookahead"])
def test_greedy_under_penalties_and_bias_is_identical_with_and_without_trees(target, spec: str) -> None:
    banned = target.tokenize(" cat", add_special=False)[0]
    penalties = Penalties(presence=0.3, frequency=0.3, repeat=1.1, logit_bias=((banned, -100.0),))
    engine = Engine(target, specs=parse_draft(spec), n_ctx=1024, personal_history=False)
    try:
        drafted = engine.generate(PROMPT, GenerateOptions(max_tokens=64, draft_len=6, penalties=penalties)).run()
        plain = engine.generate(PROMPT, GenerateOptions(max_tokens=64, speculative=False, penalties=penalties)).run()
    finally:
        engine.ctx.close()
    assert drafted.stats.drafted > 0
    assert drafted.tokens == plain.tokens
    assert banned not in plain.tokens


@pytest.mark.timeout(600)  # 600 speculative trials with two models: about a minute on a CPU of its own
def test_sampling_under_penalties_follows_the_penalised_target(target, smollm2_q4_0_path) -> None:
    """T = 1 with top-k 6 (a joint small enough to test): 600 trials of speculative steps with the Q4_0 draft,
    whose own q is shaped by the same penalties; the pairs follow the penalised joint, not the free one.
    Two drafted tokens a step: the pair is the first draft (or its correction) and the second (or its
    correction, or the bonus token after it); a third would only add decodes.

    Why 600 (multinomial draws from the exact joints, 500-1,000 draws each): the free joint, and one
    penalised at the first token only, fail at 300 trials every time; a joint that moves 15% of the
    mass to the free one fails 99.4% of the time at 600 (74% at 400), 25% every time from 400; the
    correct joint fails 0.1-0.3% at any count (the test's significance)."""
    from localspec.backend import Model

    prompt = target.tokenize("the cat sat on the mat, the cat sat on the")
    sampler = Sampler(SamplingParams(temperature=1.0, top_k=6, seed=11), PenaltyShaper(STRONG))
    ctx = Context(target, n_ctx=256)
    draft_model = Model(smollm2_q4_0_path)
    dctx = Context(draft_model, n_ctx=256)
    drafter = ModelDrafter(dctx, sampler)
    try:
        ctx.append(prompt[:-1])
        joint = first_two_joint(ctx, sampler, prompt[-1], sampler.shaper, prompt)
        free = first_two_joint(ctx, sampler, prompt[-1])
        assert max(abs(joint.get(k, 0.0) - free.get(k, 0.0)) for k in set(joint) | set(free)) > 0.05
        counts: dict[tuple[int, int], int] = {}
        accepted = drafted = 0
        trials = 600
        for _ in range(trials):
            history = list(prompt)
            emitted: list[int] = []
            while len(emitted) < 2:
                step = speculative_step(ctx, history, drafter, sampler, draft_len=2)
                emitted += step.tokens
                accepted += step.accepted
                drafted += step.drafted
            key = (emitted[0], emitted[1])
            counts[key] = counts.get(key, 0) + 1
            ctx.rollback_to(len(prompt) - 1)
    finally:
        dctx.close()
        draft_model.close()
        ctx.close()
    assert 0 < accepted < drafted  # both branches of the rule ran
    assert set(counts) <= set(joint)
    assert_follows(counts, joint, trials, min_outcomes=4)
