"""Model-free drafting on the real model: lossless alone, combined, and at temperature."""

from __future__ import annotations

from collections import Counter

import pytest

from localspec.backend import Context, Model, batch_invariant
from localspec.drafting.specs import parse_draft
from localspec.engine import Engine, GenerateOptions
from localspec.events import DoneEvent, StepEvent
from localspec.sampling import Sampler, SamplingParams
from localspec.speculative import speculative_step

from greedy import assert_matches_plain, plain_greedy
from stats import assert_follows

SOURCE = '''def parse_config(path):
    """Read a key = value file into a dict."""
    result = {}
    with open(path) as fh:
        for line in fh:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            key, _, value = line.partition("=")
            result[key.strip()] = value.strip()
    return result
'''

PROMPTS = [
    # input-grounded: the answer repeats the prompt's text
    "Here is a Python function:\n\n" + SOURCE + "\nRepeat the function exactly, then stop.\n\n" + SOURCE[:40],
    "Passage: The committee met on Tuesday. It approved the budget for the new library and postponed the "
    "vote on the park.\nQuote the sentence about the library: \"",
    "monday: 1\ntuesday: 2\nwednesday: 3\nthursday: 4\nfriday: 5\nmonday: 1\ntuesday: 2\n",
    # free-form
    "Once upon a time, in a small village by the sea,",
]


@pytest.fixture(scope="module")
def references(target):
    return [plain_greedy(target, target.tokenize(p), 96) for p in PROMPTS]


@pytest.fixture(scope="module")
def store(tmp_path_factory, smollm2_path):
    """A REST datastore built from a small corpus that contains the source above."""
    from localspec.drafting.corpus import build_store_from_corpus
    from localspec.models.gguf_info import tokenizer_fingerprint

    folder = tmp_path_factory.mktemp("corpus")
    (folder / "config.py").write_text(SOURCE * 2)
    (folder / "notes.txt").write_text("monday: 1\ntuesday: 2\nwednesday: 3\nthursday: 4\nfriday: 5\n" * 3)
    model = Model(smollm2_path, vocab_only=True)
    out = folder / "corpus.lsstore"
    build_store_from_corpus([str(folder)], lambda text: model.tokenize(text, add_special=False),
                            tokenizer_fingerprint(smollm2_path), out)
    return out


def generate(engine: Engine, prompt: str, **kw):
    events = list(engine.generate(prompt, GenerateOptions(**kw)))
    assert isinstance(events[-1], DoneEvent)
    return events[-1], [e for e in events if isinstance(e, StepEvent)]


# Lookahead alone is held to plain greedy in test_lookahead.py; here its window (every batch ~20 tokens)
# made it the slowest case, 30 s, for the same check.
@pytest.mark.parametrize("drafters", ["ngram", "rest:STORE", "ngram,rest:STORE", "ngram,DRAFT"])
def test_greedy_output_with_each_drafter_is_plain_greedy(target, references, store, smollm2_q4_0_path,
                                                         drafters, monkeypatch):
    monkeypatch.setenv("LOCALSPEC_NO_HISTORY", "1")  # the personal store is tested on its own
    text = drafters.replace("STORE", str(store)).replace("DRAFT", str(smollm2_q4_0_path))
    specs = parse_draft(text)
    draft_model = next((Model(s.arg) for s in specs if s.kind == "model"), None)
    engine = Engine(target, draft=draft_model, specs=[s for s in specs if s.kind != "model"], n_ctx=1024)
    accepted = 0
    for prompt, ref in zip(PROMPTS, references):
        done, steps = generate(engine, prompt, max_tokens=96, draft_len=6)
        assert_matches_plain(done.tokens, ref, strict=batch_invariant())  # trees too
        accepted += done.stats.accepted
        # Provenance names the drafter that proposed each accepted token.
        names = {s.drafter for s in steps if s.accepted}
        assert names <= set(engine.drafter_names()[-len(specs):])
    assert accepted > 0, f"{drafters} never had a token accepted on input-grounded prompts"


def test_combined_stats_report_acceptance_per_drafter(target, store, monkeypatch):
    monkeypatch.setenv("LOCALSPEC_NO_HISTORY", "1")
    engine = Engine(target, specs=parse_draft(f"ngram,rest:{store}"), n_ctx=1024)
    done, steps = generate(engine, PROMPTS[0], max_tokens=64, draft_len=6)
    per = {d.name: d for d in done.stats.drafters}
    assert set(per) <= {"ngram", "rest:corpus"} and per
    assert sum(d.accepted for d in per.values()) == done.stats.accepted
    assert sum(d.drafted for d in per.values()) == done.stats.drafted


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_verification_reads_rows_only_up_to_the_first_rejection(target, monkeypatch, temperature):
    """An argmax over a 262k vocabulary costs ~0.15 ms a row and a softmax ~1 ms: a 16-token draft
    rejected early reads the rows up to its rejection, not all 17."""
    from localspec.drafting.base import Proposal
    from localspec.drafting.ngram import NgramDrafter

    prompt = target.tokenize("red, blue, red, green, red, blue, red, green, red,")
    ctx = Context(target, n_ctx=256)
    ctx.append(prompt[:-1])
    reads: list[int] = []
    logits = ctx.logits
    monkeypatch.setattr(ctx, "logits", lambda row: reads.append(row) or logits(row))
    junk = target.tokenize(" zebra", add_special=False)[-1]
    draft = Proposal((junk,) * 16, None, "ngram")
    sampler = Sampler(SamplingParams(temperature=temperature, seed=3))
    step = speculative_step(ctx, list(prompt), NgramDrafter(), sampler, 16, draft)
    assert step.accepted < 16
    assert sorted(set(reads)) == list(range(step.accepted + 1))


def test_first_token_distribution_with_ngram_at_temperature(target):
    """T=0.9: with deterministic n-gram drafts, the first emitted token follows the target's p."""
    from localspec.drafting.ngram import NgramDrafter

    params = SamplingParams(temperature=0.9, seed=99)
    sampler = Sampler(params)
    # A context that repeats, so the n-gram drafter proposes (and is sometimes rejected).
    prompt = target.tokenize("red, blue, red, green, red, blue, red, green, red,")
    ctx = Context(target, n_ctx=256, n_seq=8)
    ctx.append(prompt[:-1])
    ctx.append(prompt[-1:])
    p = sampler.distribution(ctx.logits(-1)).copy()
    ctx.rollback_to(len(prompt) - 1)
    drafter = NgramDrafter(max_branches=3)

    trials, counts, drafted = 1000, Counter(), 0  # the rule's arithmetic: test_acceptance.py; here its wiring
    for _ in range(trials):
        history = list(prompt)
        # Depth 1 keeps the up-to-3 sibling candidates the first token is judged over, in a smaller batch.
        step = speculative_step(ctx, history, drafter, sampler, draft_len=1)
        counts[step.tokens[0]] += 1
        drafted += step.drafted > 0
        ctx.rollback_to(len(prompt) - 1)
        drafter.reset()
    assert drafted == trials  # every step verified a proposal
    assert_follows(counts, dict(enumerate(p.tolist())), trials)


def test_the_controllers_own_time_counts_in_each_step(target, monkeypatch):
    """The controller's planning and observing are the step's Python work (``StepEvent.python_ms``), so
    the overhead estimate and the statistics see them. Its clock here jumps 5 ms at every reading, so
    whatever the machine's speed each step's planning reads at least 5 ms beyond its lookups."""
    import itertools
    import time

    monkeypatch.setenv("LOCALSPEC_NO_HISTORY", "1")
    engine = Engine(target, specs=parse_draft("ngram"), n_ctx=1024)
    ticks = itertools.count()
    engine.controller().clock = lambda: time.perf_counter() + 0.005 * next(ticks)
    done, steps = generate(engine, PROMPTS[2], max_tokens=24)
    assert steps and all(s.python_ms >= 5.0 for s in steps)
    assert done.stats.python_ms >= 5.0 * len(steps)


@pytest.mark.parametrize("drafters", ["ngram", "ngram,rest:STORE"])
def test_adaptive_lookups_are_planned_from_their_offers_and_learn_on_plain_steps(target, references, store,
                                                                                 drafters, monkeypatch):
    """No --draft-max: a lookup proposes before the controller plans, which drafts no deeper than the
    offer (and no more confidently than the lookup itself), and the output stays plain greedy."""
    monkeypatch.setenv("LOCALSPEC_NO_HISTORY", "1")
    engine = Engine(target, specs=parse_draft(drafters.replace("STORE", str(store))), n_ctx=1024)
    done, steps = generate(engine, PROMPTS[0], max_tokens=96)
    assert_matches_plain(done.tokens, references[0], strict=batch_invariant())
    c = done.stats.control
    assert c is not None and c.draft_steps > 0 and done.stats.accepted > 0
    assert all(s.decision for s in steps)
    # Steps where the lookup had nothing decode plainly, and say so.
    assert any(not s.drafted and "no drafter has a proposal" in s.decision for s in steps)
