"""Lookahead decoding: the window's batch layout and bookkeeping on arrays, then the real engine."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localspec.drafting.base import DrafterBase, TreeProposal
from localspec.drafting.lookahead import (
    LookaheadDrafter,
    NgramPool,
    column_ngrams,
    seed_levels,
    shift_levels,
    window_batch,
)

VOCAB = 64


def one_hot_logits(tokens: Sequence[int]):
    """A fake ``get``: extra row j's argmax is ``tokens[j]`` (rows not listed are all zero)."""

    def get(j: int) -> np.ndarray:
        row = np.zeros(VOCAB, dtype=np.float32)
        if j < len(tokens):
            row[tokens[j]] = 1.0
        return row

    return get


def visible_rows(seqs: Sequence[Sequence[int]], offsets: Sequence[int], k: int) -> list[int]:
    """Rows that row ``k`` attends to under llama.cpp's rule: its FIRST sequence id, offsets <= its own."""
    me = seqs[k][0]
    return [r for r in range(len(seqs)) if me in seqs[r] and offsets[r] <= offsets[k]]


# --- the window's batch layout -------------------------------------------------


@pytest.mark.parametrize("width,n_levels", [(1, 2), (3, 2), (3, 3), (5, 3)])
def test_each_window_token_sees_its_chain_of_consecutive_guesses(width: int, n_levels: int) -> None:
    levels = [[100 * j + i for i in range(width)] for j in range(n_levels)]
    tokens, offsets, seqs, outputs = window_batch(levels)
    assert len(tokens) == width - 1 + width * (n_levels - 1)
    # Row 0 of the real batch is the last token at offset 0 in every sequence.
    all_seqs = [tuple(range(width)), *seqs]
    all_offsets = [0, *offsets]
    all_tokens = [-1, *tokens]
    for k in range(1, len(all_seqs)):
        seen = visible_rows(all_seqs, all_offsets, k)
        # a causal chain: exactly one token per offset 0..own offset, itself last
        assert sorted(all_offsets[r] for r in seen) == list(range(all_offsets[k] + 1))
        j, i = divmod(all_tokens[k], 100)
        # the last token, level 0 up to its column, then its own column upward
        expected = [-1] + [levels[0][c] for c in range(1, i + 1)] + [levels[jj][i] for jj in range(1, j + 1)]
        assert [all_tokens[r] for r in sorted(seen, key=lambda r: all_offsets[r])] == expected
    # only the newest level asks for logits, one row per column, last in the batch
    assert outputs == [False] * (len(tokens) - width) + [True] * width
    assert tokens[-width:] == levels[-1]


def test_level_zero_rows_list_their_own_column_first() -> None:
    _, _, seqs, _ = window_batch([[0, 1, 2, 3], [4, 5, 6, 7]])
    assert seqs[:3] == [(1, 2, 3), (2, 3), (3,)]
    assert seqs[3:] == [(0,), (1,), (2,), (3,)]


# --- Jacobi update, n-grams and the shift --------------------------------------


def test_column_ngrams_run_along_consecutive_offsets() -> None:
    levels = [[9, 1, 2], [3, 4, 5]]  # offsets: level 0 -> 0,1,2; level 1 -> 1,2,3
    assert column_ngrams(levels, last=7, fresh=[10, 11, 12]) == [[7, 3, 10], [1, 4, 11], [2, 5, 12]]


def test_shift_keeps_every_guess_at_its_position() -> None:
    stack = [[0, 1, 2], [10, 11, 12], [20, 21, 22]]  # window of 2 levels + the fresh level
    assert shift_levels(stack, 1, 2) == [[10, 11, 12], [20, 21, 22]]
    # by 2: the fresh level becomes level 0; level 1 is it moved one column left
    assert shift_levels(stack, 2, 2) == [[20, 21, 22], [21, 22, 22]]
    assert shift_levels(stack, 3, 2) is None
    assert shift_levels(stack, -1, 2) is None


def test_seed_is_consistent_along_positions() -> None:
    levels = seed_levels([5, 6, 7, 8, 9], width=3, n_levels=2)
    for j in range(1, 2):
        for i in range(2):
            assert levels[j][i] == levels[j - 1][i + 1]  # same offset, same guess
    assert set(t for level in levels for t in level) <= {5, 6, 7, 8, 9}


def test_pool_is_bounded_most_recent_first_and_deduplicated() -> None:
    pool = NgramPool(n=3, per_key=2, max_keys=2)
    pool.add([1, 2, 3])
    pool.add([1, 4, 5])
    pool.add([1, 2, 3])
    assert pool.get(1) == [(2, 3), (4, 5)]
    pool.add([1, 6, 7])
    assert pool.get(1) == [(6, 7), (2, 3)]
    pool.add([2, 0, 0])
    pool.add([3, 0, 0])  # a third key: the least recently updated (1) goes
    assert pool.get(1) == [] and len(pool) == 2
    with pytest.raises(ValueError):
        pool.add([1, 2])


def drafter_after_one_window(history: list[int], fresh: list[int]) -> tuple[LookaheadDrafter, TreeProposal]:
    d = LookaheadDrafter(width=3, ngram=3, max_candidates=2, max_seqs=5)
    proposal = d.propose(history, 4)
    assert proposal.extra is not None
    proposal.extra.on_logits(one_hot_logits([0] * (len(proposal.extra.tokens) - 3) + fresh))
    return d, proposal


def test_on_logits_harvests_column_ngrams_and_accepted_shifts_by_emitted_tokens() -> None:
    history = [40, 41, 42, 43, 44]
    d, proposal = drafter_after_one_window(history, [50, 51, 52])
    window = [list(level) for level in d._levels or []]
    assert d.stats.window_steps == 1
    for gram in column_ngrams(window, 44, [50, 51, 52]):
        assert tuple(gram[1:]) in d.pool.get(gram[0])
    # one token emitted (nothing accepted): the fresh level becomes the newest
    d.accepted(history + [60], 0)
    assert d._levels == [window[1], [50, 51, 52]]
    # next step: two tokens emitted, the window moves two positions on
    d2, _ = drafter_after_one_window(history, [50, 51, 52])
    d2.accepted(history + [60, 61], 1)
    assert d2._levels == [[50, 51, 52], [51, 52, 52]]
    assert d2.stats.accepted == 1


def test_a_window_that_was_not_decoded_still_moves_or_is_reseeded() -> None:
    history = list(range(30, 40))
    d = LookaheadDrafter(width=3, ngram=4, max_candidates=2, max_seqs=5)
    d.propose(history, 4)  # another drafter's proposal is decoded instead: no on_logits
    window = [list(level) for level in d._levels or []]
    d.accepted(history + [1], 0)
    assert d._levels == [window[1], window[2], window[2][1:] + window[2][-1:]]
    reseeds = d.stats.reseeds
    d.accepted(history + [1, 2, 3, 4, 5], 0)  # further than the window reaches
    assert d.stats.reseeds == reseeds + 1
    d.accepted([7, 7, 7], 0)  # a different history altogether
    assert d.stats.reseeds == reseeds + 2
    d.propose([7, 7, 7], 4)  # and it proposes from there without complaint


def test_logits_of_an_older_proposal_are_ignored() -> None:
    d = LookaheadDrafter(width=2, ngram=3, max_candidates=1, max_seqs=3)
    old = d.propose([1, 2, 3], 2)
    d.accepted([1, 2, 3, 4], 0)
    d.propose([1, 2, 3, 4], 2)
    assert old.extra is not None
    old.extra.on_logits(one_hot_logits([9] * 8))
    assert d.stats.window_steps == 0


def test_candidates_continue_the_last_token_as_a_trie() -> None:
    d = LookaheadDrafter(width=2, ngram=4, max_candidates=3, max_seqs=5)
    for gram in ([5, 1, 2, 3], [5, 1, 2, 4], [5, 7, 8, 9], [5, 6, 6, 6], [6, 1, 1, 1]):
        d.pool.add(gram)
    proposal = d.propose([0, 5], draft_len=2)
    assert isinstance(proposal, TreeProposal) and proposal.drafter == "lookahead"
    # the 3 most recent continuations of 5, cut to depth 2; (1, 2) is shared
    assert sorted(proposal.tree.branches) == [(1, 2), (6, 6), (7, 8)]
    assert len(proposal.tree.leaves) <= d.max_candidates
    assert proposal.extra is not None and proposal.extra.n_seqs == d.width
    assert len(proposal.tree.leaves) + proposal.extra.n_seqs <= d.max_seqs


def test_history_ngrams_feed_the_pool() -> None:
    d = LookaheadDrafter(width=2, ngram=3, max_candidates=2, max_seqs=4)
    history = [1, 2, 3, 1, 2]
    proposal = d.propose(history, 3)
    assert proposal.tree.branches == ((3, 1),)  # 2 was followed by 3, 1
    d.accepted(history + [8], 0)
    assert d.pool.get(1)[0] == (2, 8)  # the newest occurrence comes first


turns = st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40), st.lists(st.integers(0, 3), max_size=20),
                          st.integers(1, 3)), min_size=1, max_size=6)


@settings(max_examples=150, deadline=None)
@given(turns=turns)
def test_a_new_history_adds_only_the_ngrams_past_what_it_shares(turns: list) -> None:
    """Each turn a new history (``reset``): the last one cut at ``keep``, one token changed at ``edit``
    (anywhere), extended, and followed over a few steps. The pool holds every n-gram of it, and only
    the n-grams not wholly within the part shared with the last history were added: the rest were
    added already (a drafter that trusted the old history would miss the edit; one that forgot it
    added everything again)."""
    d = LookaheadDrafter(width=1, ngram=3, max_candidates=16, max_seqs=17)
    added: list[tuple[int, ...]] = []
    add = d.pool.add
    d.pool.add = lambda gram: (added.append(tuple(gram)), add(gram))  # type: ignore[method-assign]
    hist: list[int] = []
    for keep, edit, new, steps in turns:
        last = hist
        hist = hist[:keep] + new
        if edit < len(hist):
            hist[edit] += 4  # a token the alphabet above never holds
        first = max(0, len(hist) - steps + 1)  # the history's length when the drafter first sees it
        shared = next((i for i, (a, b) in enumerate(zip(last, hist[:first])) if a != b), min(len(last), first))
        d.reset()
        added.clear()
        for cut in range(first, len(hist) + 1):  # the history grows step by step
            d.accepted(tuple(hist[:cut]), 0)
        grams = [tuple(hist[i:i + 3]) for i in range(len(hist) - 2)]
        assert added == grams[max(0, shared - 2):]
        assert all(g[1:] in d.pool.get(g[0]) for g in grams)


def test_parameters_must_fit_the_sequences() -> None:
    with pytest.raises(ValueError):
        LookaheadDrafter(width=20, max_candidates=15, max_seqs=32)
    with pytest.raises(ValueError):
        LookaheadDrafter(ngram=2)
    fits = LookaheadDrafter(width=15, max_candidates=15, max_seqs=32)  # the largest window that fits
    assert fits.batch_extra_tokens == fits.width * (fits.ngram - 1) - 1


def test_lookahead_never_imports_llama_cpp() -> None:
    code = "import sys, localspec.drafting.lookahead; sys.exit('llama_cpp' in sys.modules)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    assert subprocess.run([sys.executable, "-c", code], env=env).returncode == 0


# --- the real engine ------------------------------------------------------------

REPETITIVE = "red, green, blue, red, green, blue, red, green, blue, red,"
CODE = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n"
PROMPTS = [REPETITIVE, CODE, "<ul>\n<li>One</li>\n<li>Two</li>\n<li>Three</li>\n", "The capital of France is"]


@pytest.fixture(scope="module")
def la_engine(target):
    from localspec.drafting.specs import DrafterSpec
    from localspec.engine import Engine

    return Engine(target, specs=[DrafterSpec("lookahead")], n_ctx=1024)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_output_equals_plain_decoding(la_engine, target, prompt: str) -> None:
    """Token-identical to plain greedy on a batch-invariant build (elsewhere up to near-ties).

    The window's cells and rejected branches' are freed after each step, and an
    accepted path after a rejected branch is decoded again where plain decoding
    puts it (``speculative._place_rest``), so the cache lists positions in order
    and attention sums as plain decoding does. ``tests/engine/test_exact_trees.py``
    holds the issue's 6 prompts of 96 tokens to the same.
    """
    from greedy import assert_matches_plain, plain_greedy

    from localspec.backend import batch_invariant
    from localspec.engine import GenerateOptions

    plain = plain_greedy(target, la_engine.tokenize(prompt), 64)
    done = list(la_engine.generate(prompt, GenerateOptions(max_tokens=64, draft_len=5)))[-1]
    assert_matches_plain(done.tokens, plain, strict=batch_invariant())


def test_lookahead_gets_tokens_accepted_on_repetitive_text(la_engine) -> None:
    from localspec.engine import GenerateOptions
    from localspec.events import DoneEvent, StepEvent, TokenEvent

    events = list(la_engine.generate(REPETITIVE, GenerateOptions(max_tokens=48, draft_len=5)))
    done = events[-1]
    assert isinstance(done, DoneEvent)
    assert done.stats.accepted > 0
    assert any(isinstance(e, StepEvent) and e.drafter == "lookahead" and e.accepted > 0 for e in events)
    assert any(isinstance(e, TokenEvent) and e.drafter == "lookahead" for e in events)


def test_the_jacobi_window_alone_gets_tokens_accepted(target) -> None:
    """With the history's n-grams kept out of the pool, every candidate comes from the window."""
    from localspec.drafting.specs import DrafterSpec
    from localspec.engine import Engine, GenerateOptions

    engine = Engine(target, specs=[DrafterSpec("lookahead")], n_ctx=512)
    drafter = LookaheadDrafter(learn_history=False)
    engine._factories["lookahead"] = lambda sampler, opts: drafter
    done = list(engine.generate(REPETITIVE, GenerateOptions(max_tokens=48, draft_len=5)))[-1]
    assert drafter.stats.window_steps > 0
    assert done.stats.accepted >= 10


class Capturing(DrafterBase):
    """A LookaheadDrafter whose window levels are set by hand and whose window logits are kept."""

    def __init__(self, inner: LookaheadDrafter, levels: list[list[int]]) -> None:
        self.inner, self.levels, self.name = inner, levels, inner.name
        self.rows: list[np.ndarray] = []

    def propose(self, history, draft_len):
        from dataclasses import replace

        self.inner.propose(history, draft_len)  # anchors the window here
        self.inner._levels = self.levels
        proposal = self.inner.propose(history, draft_len)
        extra = proposal.extra
        assert extra is not None
        first = len(extra.tokens) - self.inner.width

        def keep(get):
            self.rows = [np.array(get(first + i)) for i in range(self.inner.width)]
            extra.on_logits(get)

        return replace(proposal, extra=replace(extra, on_logits=keep))

    def accepted(self, history, n_accepted):
        self.inner.accepted(history, n_accepted)

    def reset(self):
        self.inner.reset()


def test_each_window_column_computes_the_logits_of_its_own_chain(target) -> None:
    """The sequence-id mapping, checked against the model: column i's newest token
    gets the logits of [history, last, level 0 up to column i, column i upward] decoded alone.

    A token leaking into or missing from a chain moved logits by 4 to 17 when
    measured; where the cells sit (other sequences' cells interleaved between
    a chain's) moved them by up to ~0.8, even on a batch-invariant build.
    """
    from localspec.backend import Context
    from localspec.sampling import Sampler, SamplingParams
    from localspec.speculative import speculative_step

    history = target.tokenize(CODE)
    rng = np.random.default_rng(0)
    width, n_levels = 4, 3
    levels = [[int(t) for t in rng.choice(history, width)] for _ in range(n_levels)]
    drafter = Capturing(LookaheadDrafter(width=width, ngram=n_levels + 1, max_candidates=3, max_seqs=8), levels)
    ctx = Context(target, n_ctx=256, n_seq=9)
    ctx.append(history[:-1])
    last = history[-1]
    speculative_step(ctx, list(history), drafter, Sampler(SamplingParams()), 3)
    assert len(drafter.rows) == width
    alone = Context(target, n_ctx=256)
    for i in range(width):
        chain = [last, *levels[0][1:i + 1], *(levels[j][i] for j in range(1, n_levels))]
        alone.rollback_to(0)
        alone.append(history[:-1])
        alone.append(chain)
        want, got = np.asarray(alone.logits(-1)), drafter.rows[i]
        assert float(np.abs(got - want).max()) < 2.0, f"column {i} does not see exactly its chain"
    ctx.close()
    alone.close()


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_after_each_step_the_cache_holds_the_history_minus_its_last_token(la_engine, temperature: float) -> None:
    from localspec.engine import GenerateOptions
    from localspec.sampling import Sampler, SamplingParams
    from localspec.speculative import speculative_step

    ctx = la_engine.ctx
    opts = GenerateOptions(sampling=SamplingParams(temperature=temperature, seed=1), draft_len=4)
    sampler = Sampler(opts.sampling)
    [drafter] = la_engine.make_drafters(sampler, opts)
    assert isinstance(drafter, LookaheadDrafter)
    history = la_engine.tokenize(REPETITIVE)
    ctx.clear()
    ctx.append(history[:-1])
    drafter.reset()
    windows = drafter.stats.window_steps
    for _ in range(5):
        speculative_step(ctx, history, drafter, sampler, 4)
        assert ctx.tokens == history[:-1]
        # sequence 0 holds exactly those positions; the window's and leaves' sequences are gone
        assert ctx.seq_pos_max(0) == len(history) - 2
        assert [ctx.seq_pos_max(s) for s in range(1, ctx.n_seq)] == [-1] * (ctx.n_seq - 1)
    assert drafter.stats.window_steps == windows + 5


@pytest.mark.parametrize("specs", ["lookahead", "ngram,lookahead"])
def test_drafting_runs_to_the_end_of_the_context(target, specs: str) -> None:
    """Near the end of the window the batch (candidates and the Jacobi window) is shrunk to what fits."""
    from localspec.drafting.specs import parse_draft
    from localspec.engine import Engine, GenerateOptions

    engine = Engine(target, specs=parse_draft(specs), n_ctx=256)
    prompt = REPETITIVE * 8
    n_prompt = len(engine.tokenize(prompt))
    assert n_prompt < 220
    done = list(engine.generate(prompt, GenerateOptions(max_tokens=1000, draft_len=5)))[-1]
    assert done.finish_reason == "context"
    assert n_prompt + len(done.tokens) == engine.n_ctx + 1
    if specs == "lookahead":
        assert done.stats.verified > done.stats.drafted  # the window was decoded beside the candidates
    else:
        # Combined, the controller picks each step's drafter (lookahead's window only when it pays).
        assert done.stats.drafted > 0
