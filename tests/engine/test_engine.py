"""The real engine on real GGUF models: exactness of speculative decoding."""

from __future__ import annotations

from collections import Counter

import pytest

from localspec.backend import Context, Model, batch_invariant
from localspec.drafting.model import ModelDrafter
from localspec.engine import Engine, GenerateOptions
from localspec.events import DoneEvent, StepEvent, TokenEvent
from localspec.sampling import Sampler, SamplingParams
from localspec.speculative import speculative_step

from greedy import assert_matches_plain, plain_greedy
from stats import assert_follows

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "List the planets of the solar system in order from the sun:\n1.",
    "Once upon a time, in a small village by the sea,",
    "Translate to French: 'The cat sleeps on the warm windowsill.'\nFrench:",
    "import numpy as np\n\n# Compute the mean of each column of a matrix\n",
    "Q: What is 17 times 23?\nA: Let's think step by step.",
    "<html>\n<head>\n<title>My page</title>\n</head>\n<body>\n<ul>\n<li>One</li>\n<li>Two</li>\n",
]


@pytest.fixture(scope="module")
def plain_engine(target):
    return Engine(target, n_ctx=1024)


@pytest.fixture(scope="module")
def q4_0_engine(target, smollm2_q4_0_path):
    return Engine(target, draft=Model(smollm2_q4_0_path), n_ctx=1024)


@pytest.fixture(scope="module")
def self_engine(target, smollm2_path):
    return Engine(target, draft=Model(smollm2_path), n_ctx=1024)


def run(engine: Engine, prompt: str, **kw) -> DoneEvent:
    events = list(engine.generate(prompt, GenerateOptions(**kw)))
    done = events[-1]
    assert isinstance(done, DoneEvent)
    return done


@pytest.fixture(scope="module")
def plain_outputs(plain_engine):
    return [run(plain_engine, p, max_tokens=200) for p in PROMPTS]


@pytest.fixture(scope="module")
def references(target):
    return [plain_greedy(target, target.tokenize(p), 200) for p in PROMPTS]


def test_the_controller_knows_where_the_models_lines_end(target, plain_engine):
    newline = [t for t in target.tokenize("one\ntwo") if b"\n" in target.piece(t)]
    assert newline and target.ends_line(newline[0])
    assert not any(target.ends_line(t) for t in target.tokenize("one two three"))
    assert plain_engine.controller().ends_line == target.ends_line  # line starts are judged apart


def test_plain_engine_is_plain_greedy(plain_outputs, references):
    for done, ref in zip(plain_outputs, references):
        assert done.tokens == ref.tokens


@pytest.mark.parametrize("i", range(len(PROMPTS)))
def test_greedy_speculative_matches_plain_with_q4_0_draft(q4_0_engine, plain_outputs, references, i):
    spec = run(q4_0_engine, PROMPTS[i], max_tokens=200, draft_len=5)
    assert spec.stats.drafted > 0
    if assert_matches_plain(spec.tokens, references[i], strict=batch_invariant()):
        assert spec.text == plain_outputs[i].text
        assert spec.finish_reason == plain_outputs[i].finish_reason


def test_q4_0_draft_is_rejected_sometimes(q4_0_engine):
    stats = [run(q4_0_engine, p, max_tokens=100, draft_len=5).stats for p in PROMPTS[:4]]
    drafted = sum(s.drafted for s in stats)
    accepted = sum(s.accepted for s in stats)
    # A realistic draft: most tokens agree, some are rejected (so the rejection path ran).
    assert 0 < accepted < drafted


@pytest.mark.parametrize("i", range(len(PROMPTS)))
def test_target_as_its_own_draft_is_exact_and_always_accepted(self_engine, references, i):
    spec = run(self_engine, PROMPTS[i], max_tokens=200, draft_len=4)
    assert_matches_plain(spec.tokens, references[i], strict=batch_invariant())
    # The draft computes the same logits one token at a time as plain decoding does. On a
    # batch-invariant build verification computes them bit for bit too: every draft is accepted.
    # Elsewhere verification batches may differ in rounding only, so rejections are near-ties.
    assert spec.stats.acceptance_rate == 1.0 if batch_invariant() else spec.stats.acceptance_rate >= 0.97
    assert spec.stats.tokens_per_step > 4.0 or spec.finish_reason == "stop"


def test_verification_batches_stay_below_flash_attentions_tiles(target, smollm2_path, monkeypatch):
    # Our build's batch-invariant CPU flash attention still tiles batches of GGML_CPU_FA_TILES_FROM
    # queries or more (prefill speed), and tiled rows differ from one-token decodes: every
    # verification must stay below that, however long the draft asked for.
    from localspec.backend import cpu_flash_attention, gpu_offload_supported

    if not cpu_flash_attention() or gpu_offload_supported():
        pytest.skip("flash attention is not our batch-invariant CPU kernel in this build")
    monkeypatch.setenv("GGML_CPU_FA_TILES_FROM", "9")
    engine = Engine(target, draft=Model(smollm2_path), n_ctx=1024)
    assert engine.ctx.max_verify_rows == 8
    events = list(engine.generate(PROMPTS[2], GenerateOptions(max_tokens=120, draft_len=16)))
    steps = [e for e in events if isinstance(e, StepEvent)]
    assert max(s.batch_tokens for s in steps) == 8  # 7 drafted + the last token, not 17
    assert_matches_plain(events[-1].tokens, plain_greedy(target, target.tokenize(PROMPTS[2]), 120), strict=True)


def test_events_carry_provenance_and_consistent_stats(q4_0_engine):
    events = list(q4_0_engine.generate(PROMPTS[3], GenerateOptions(max_tokens=60, draft_len=4)))
    tokens = [e for e in events if isinstance(e, TokenEvent)]
    steps = [e for e in events if isinstance(e, StepEvent)]
    done = events[-1]
    assert isinstance(done, DoneEvent)
    assert "".join(e.text for e in tokens) == done.text
    assert tuple(e.token for e in tokens) == done.tokens
    from_draft = sum(1 for e in tokens if e.drafter == "draft")
    assert from_draft <= done.stats.accepted
    if done.finish_reason == "length":  # nothing was cut by an end-of-generation token
        assert from_draft == done.stats.accepted
    assert sum(s.accepted for s in steps) == done.stats.accepted
    assert sum(s.drafted for s in steps) == done.stats.drafted
    assert len(steps) == done.stats.steps
    s = done.stats
    assert s.accepted <= s.drafted
    assert sum(s.position_drafted) == s.accepted + sum(1 for st in steps if st.accepted < st.drafted)
    assert all(a <= d for a, d in zip(s.position_accepted, s.position_drafted))


def test_seeded_sampling_is_reproducible(q4_0_engine, plain_engine):
    # A seed fixes the random numbers; which of them a step consumes depends on what was drafted. So a
    # seed reproduces a run for plain decoding and for a fixed draft length (the adaptive controller's
    # choices follow measured timings, which vary from run to run; the distribution is the target's either way).
    def sample(engine, seed, **kwargs):
        return run(engine, PROMPTS[3], max_tokens=40, sampling=SamplingParams(temperature=0.8, seed=seed), **kwargs)
    for engine, kwargs in ((plain_engine, {}), (q4_0_engine, {"draft_len": 5})):
        a, b, c = sample(engine, 7, **kwargs), sample(engine, 7, **kwargs), sample(engine, 8, **kwargs)
        assert a.tokens == b.tokens
        assert a.tokens != c.tokens


def test_stop_strings_and_max_tokens(plain_engine):
    full = run(plain_engine, PROMPTS[2], max_tokens=60)
    assert full.finish_reason in ("length", "stop")
    stop = full.text[10:14]
    cut = run(plain_engine, PROMPTS[2], max_tokens=60, stop=(stop,))
    assert cut.finish_reason == "stop"
    assert cut.text == full.text[: full.text.index(stop)]
    short = run(plain_engine, PROMPTS[2], max_tokens=7)
    assert short.finish_reason == "length" and len(short.tokens) == 7


def test_context_limit_ends_generation(target):
    engine = Engine(target, n_ctx=64)  # llama.cpp rounds the window up (to 256 today)
    prompt = target.tokenize(PROMPTS[0])
    done = run(engine, PROMPTS[0], max_tokens=2000)
    assert done.finish_reason == "context"
    # Every position of the window was used: the prompt, then all but the last generated token.
    assert len(prompt) + len(done.tokens) == engine.n_ctx + 1


def test_first_token_distribution_matches_target_at_temperature(target, smollm2_q4_0_path):
    """At T=0.8 the token emitted first by a speculative step follows the target's own distribution."""
    params = SamplingParams(temperature=0.8, seed=1234)
    sampler = Sampler(params)
    prompt = target.tokenize("My favourite fruit is the")
    tctx = Context(target, n_ctx=256)
    tctx.append(prompt[:-1])
    tctx.append(prompt[-1:])
    p = sampler.distribution(tctx.logits(-1)).copy()
    tctx.rollback_to(len(prompt) - 1)
    drafter = ModelDrafter(Context(Model(smollm2_q4_0_path), n_ctx=256), sampler)

    # The acceptance rule's arithmetic is tested on hand-built arrays (test_acceptance.py, 100,000 trials);
    # this checks its wiring through real models, where an error (a wrong row of logits, a q that is not
    # the one the draft was sampled from) moves the distribution far more than 800 trials resolve.
    trials = 800
    counts: Counter[int] = Counter()
    accepted_first = 0
    for _ in range(trials):
        history = list(prompt)
        # One drafted token: the first emitted token is that draft or the residual's sample, which is
        # all this checks; a longer draft would only add decodes (this test is among the suite's slowest).
        step = speculative_step(tctx, history, drafter, sampler, draft_len=1)
        counts[step.tokens[0]] += 1
        accepted_first += step.accepted > 0
        tctx.rollback_to(len(prompt) - 1)
    # Both paths of the rule ran: some first tokens were accepted drafts, some corrections.
    assert 0 < accepted_first < trials
    assert_follows(counts, dict(enumerate(p.tolist())), trials)


def test_a_draft_model_that_cannot_win_is_never_even_prefilled(target, smollm2_q4_0_path, references):
    """A draft that costs as much per token as the target: drafting can only lose.

    With no fixed draft length the controller keeps it off from the first step: its prefill and
    catch-up are charged to the decisions that would cause them, so within a 200-token reply it
    neither drafts nor probes, and the draft model decodes nothing (the first token waits for no
    draft prefill). Every step says why, and the reason is the true one. The output stays the
    target's greedy output.

    The costs are given, not measured: both models at one curve, set far above what a decode takes
    on any machine. Measured ones made this test depend on the load (a draft timed in a quiet moment
    and a target in a busy one look like a cheap draft), and the target's observed steps only lower
    its own curve, so the draft never looks cheaper than the target however the machine is loaded.
    """
    from localspec.policy.costs import CostModel

    curve = {1: 500.0, 2: 510.0, 4: 530.0, 8: 570.0, 16: 650.0, 32: 810.0}
    engine = Engine(target, draft=Model(smollm2_q4_0_path), n_ctx=1024)
    engine._costs = engine._compose_costs(CostModel(curve), CostModel(curve))
    events = list(engine.generate(PROMPTS[0], GenerateOptions(max_tokens=200)))
    done = events[-1]
    steps = [e for e in events if isinstance(e, StepEvent)]
    # The first token waits for no draft prefill (whatever the costs say), and whatever drafted was a
    # probe the budget paid for; without one the draft model decoded nothing at all.
    assert not steps[0].drafted and steps[0].decision.startswith("plain: the first token waits for no catch-up")
    assert all(s.decision.startswith("probe") for s in steps if s.drafted)
    if not any(s.drafted for s in steps):
        assert engine.draft_ctx is not None and engine.draft_ctx.tokens == []
    assert all(s.decision for s in steps)  # every step says why
    assert all(s.decision.startswith(("speculation off", "probe")) for s in steps[1:-1])
    assert done.stats.control is not None and done.stats.control.last_reason.startswith("speculation off")
    assert_matches_plain(done.tokens, references[0])


def test_a_fixed_draft_length_above_the_automatic_cap_is_honoured(self_engine, references):
    """Issue 9: --draft-max 40 ran at 16. The target as its own draft is always right, so a fixed 40
    drafts 40 tokens a step while that many are left."""
    spec = run(self_engine, PROMPTS[2], max_tokens=120, draft_len=40)
    assert_matches_plain(spec.tokens, references[2], strict=batch_invariant())
    assert spec.stats.drafted >= 40 and len(spec.stats.position_drafted) == 40
