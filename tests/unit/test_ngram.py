"""The context n-gram index and the n-gram drafter (what it offers; the controller chooses the length)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from typing import Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localspec.drafting.base import Drafter, Evidence, Proposal, TreeProposal
from localspec.drafting.lookup import Candidate, Lookup, proposal_from_lookup, strongest
from localspec.drafting.loops import LOOP_MAX_RUN
from localspec.drafting.ngram import NgramDrafter
from localspec.drafting.ngram_index import NgramIndex, _suffix_keys

tokens = st.lists(st.integers(0, 3), max_size=80)


def repeated(hist: list[int], p: int, draft_len: int) -> tuple[int, ...]:
    """``hist[p:]`` continued as if ``hist`` went on copying from p (the text extended by its period)."""
    text = list(hist)
    while len(text) < p + draft_len:
        text.append(text[len(text) - (len(hist) - p)])
    return tuple(text[p : p + draft_len])


def brute_lookup(hist: list[int], context: list[int], n_min: int, n_max: int, draft_len: int, max_occ: int):
    """Longest suffix of ``context`` (n_max..n_min) ending before the end of
    ``hist``; the most recent ``max_occ`` continuations of it (when ``context`` is
    ``hist`` itself, a continuation reaching its end repeats as the text would)."""
    L = len(hist)
    for n in range(min(n_max, len(context)), n_min - 1, -1):
        pattern = context[len(context) - n :]
        ends = [p for p in range(n, L) if hist[p - n : p] == pattern]
        if ends:
            recent = ends[::-1][:max_occ]
            own = context is hist
            return n, len(ends), recent, [repeated(hist, p, draft_len) if own else tuple(hist[p : p + draft_len])
                                          for p in recent]
    return None


def check_against_brute(found: Lookup | None, expected, draft_len: int) -> None:
    if expected is None:
        assert found is None
        return
    n, occurrences, recent, conts = expected
    assert found is not None
    assert (found.match_len, found.occurrences, found.considered) == (n, occurrences, len(recent))
    assert {c.tokens: c.count for c in found.candidates} == Counter(conts)
    for cand in found.candidates:
        agree = [sum(c[: d + 1] == cand.tokens[: d + 1] for c in conts) / len(conts) for d in range(len(cand.tokens))]
        assert cand.support == pytest.approx(agree)
        assert cand.last_seen == max(p for p, c in zip(recent, conts) if c == cand.tokens)
    ranks = [(-round(c.score, 9), -c.last_seen) for c in found.candidates]
    assert ranks == sorted(ranks)


@settings(max_examples=300, deadline=None)
@given(
    hist=tokens,
    n_min=st.integers(1, 2),
    extra=st.integers(0, 3),
    draft_len=st.integers(1, 6),
    max_occ=st.integers(1, 8),
)
def test_query_matches_brute_force(hist: list[int], n_min: int, extra: int, draft_len: int, max_occ: int) -> None:
    index = NgramIndex(n_min, n_min + extra, max_occurrences=max_occ, recency_decay=1.0)
    index.extend(hist)
    found = index.query(draft_len, max_candidates=100)
    check_against_brute(found, brute_lookup(hist, hist, n_min, n_min + extra, draft_len, max_occ), draft_len)


@settings(max_examples=200, deadline=None)
@given(hist=tokens, context=tokens, draft_len=st.integers(1, 5))
def test_lookup_of_another_context_matches_brute_force(hist: list[int], context: list[int], draft_len: int) -> None:
    index = NgramIndex(1, 4, max_occurrences=6, recency_decay=1.0)
    index.extend(np.array(hist, dtype=np.int32))
    found = index.lookup(context, draft_len, max_candidates=100)
    check_against_brute(found, brute_lookup(hist, context, 1, 4, draft_len, 6), draft_len)


def brute_longest(hist: list[int], context: list[int], n_max: int, max_match: int, draft_len: int, max_occ: int):
    """brute_lookup (n_min 1), then a full-length match grown backwards up to ``max_match`` tokens at
    each considered occurrence; only the occurrences with the longest match stay."""
    found = brute_lookup(hist, context, 1, n_max, draft_len, max_occ)
    if found is None or found[0] < n_max:
        return found
    tail = context[-max_match:]

    def length(p: int) -> int:
        m = 0
        while m < len(tail) and m < p and hist[p - m - 1] == tail[-m - 1]:
            m += 1
        return m

    recent = found[2]
    best = max(length(p) for p in recent)
    if best == n_max:
        return found
    kept = [p for p in recent if length(p) == best]
    own = context is hist
    return best, len(kept), kept, [repeated(hist, p, draft_len) if own else tuple(hist[p : p + draft_len])
                                   for p in kept]


@settings(max_examples=300, deadline=None)
@given(hist=tokens, context=tokens, n_max=st.integers(1, 3), grow=st.integers(0, 6),
       draft_len=st.integers(1, 5), max_occ=st.integers(1, 8))
def test_longer_matches_match_brute_force(hist: list[int], context: list[int], n_max: int, grow: int,
                                          draft_len: int, max_occ: int) -> None:
    index = NgramIndex(1, n_max, max_occurrences=max_occ, recency_decay=1.0, max_match=n_max + grow)
    index.extend(hist)
    for ctx in (context, hist):
        found = index.lookup(ctx, draft_len, max_candidates=100, repeats=ctx is hist)
        check_against_brute(found, brute_longest(hist, ctx, n_max, n_max + grow, draft_len, max_occ), draft_len)


def test_a_longer_match_finds_the_place_being_copied() -> None:
    # "7 1 2 3" is followed by 4 once, "8 1 2 3" by 5 twice: the last 3 tokens alone vote for 5;
    # the history ends in "7 1 2 3", so the place it copies says 4.
    hist = [7, 1, 2, 3, 4, 0, 8, 1, 2, 3, 5, 0, 8, 1, 2, 3, 5, 0, 7, 1, 2, 3]
    index = NgramIndex(1, 3, recency_decay=1.0)
    index.extend(hist)
    assert index.query(1).candidates[0].tokens == (5,)
    longer = NgramIndex(1, 3, recency_decay=1.0, max_match=8)
    longer.extend(hist)
    found = longer.query(1)
    assert found is not None and found.match_len == 4 and found.candidates[0].tokens == (4,)
    drafter = NgramDrafter()
    assert drafter.propose(hist, 1).tokens == (4,)
    with pytest.raises(ValueError, match="max_match"):
        NgramIndex(1, 4, max_match=3)


def test_a_repeat_reaching_the_end_of_the_history_drafts_on_through_it() -> None:
    # "1 2 3" repeats: the place being copied is 3 tokens back, so what follows it runs into the
    # end after one "3 1 2"; the text repeating, the draft carries on as deep as asked.
    hist = [5, 1, 2, 3, 1, 2, 3, 1, 2]
    index = NgramIndex(1, 4, max_match=32)
    index.extend(hist)
    assert index.query(8).candidates[0].tokens == (3, 1, 2, 3, 1, 2, 3, 1)
    # another context matching the index has no such end: its continuation stops where the index does
    assert index.lookup([9, 1, 2, 3, 1, 2], 8).candidates[0].tokens == (3, 1, 2)
    assert NgramDrafter().propose(hist, 5).tokens == (3, 1, 2, 3, 1)


def brute_index_state(hist: list[int], n_min: int, n_max: int) -> tuple[object, ...]:
    """``NgramIndex._state()`` built the slow way: for each n and each position p (after the n-gram
    ending there), the previous position after the same n-gram and how many occurred up to p."""
    heads, prevs, counts = [], [], []
    for n in range(n_min, n_max + 1):
        head: dict[int, int] = {}
        prev, count = [0], [0]
        for p in range(1, len(hist) + 1):
            if n > p:
                prev.append(0)
                count.append(0)
                continue
            key = _suffix_keys(hist[p - n:p])[n]
            ends = [q for q in range(n, p) if hist[q - n:q] == hist[p - n:p]]
            prev.append(ends[-1] if ends else 0)
            count.append(len(ends) + 1)
            head[key] = p
        heads.append(head)
        prevs.append(prev)
        counts.append(count)
    return hist, heads, prevs, counts


# ids across the whole int32 range, and separators (negative)
any_tokens = st.lists(st.sampled_from([0, 1, 2, 7, -1, 2**31 - 1, 49151]), max_size=12)


@settings(max_examples=300, deadline=None)
@given(ops=st.lists(st.one_of(any_tokens, st.integers(0, 40)), max_size=14),
       shape=st.sampled_from([(1, 4), (1, 3), (2, 5), (1, 1)]))
def test_extend_in_any_steps_builds_the_brute_force_index(ops: list, shape: tuple[int, int]) -> None:
    """The n-gram drafter's shape (1..4) has extend's unrolled loop, the rest the general one: either way,
    extends of any length and truncations in between leave the index a brute force builds."""
    index = NgramIndex(*shape)
    hist: list[int] = []
    for op in ops:
        if isinstance(op, int):
            index.truncate(op)
            del hist[op:]
        else:
            index.extend(op)
            hist += op
        assert index._state() == brute_index_state(hist, *shape)


def test_recency_breaks_ties_and_decay_prefers_recent() -> None:
    # "1" was followed by 2 (long ago) and by 3 (recently).
    index = NgramIndex(1, 1, recency_decay=1.0)
    index.extend([1, 2, 0, 0, 1, 3, 0, 1])
    assert index.query(1).candidates[0].tokens == (3,)
    index = NgramIndex(1, 1, recency_decay=0.5)
    index.extend([1, 2, 0, 1, 2, 0, 1, 3, 0, 1])
    # Frequency alone says 2 (twice); recency weighting 1 : 0.5 + 0.25 still says 3.
    best = index.query(1).candidates[0]
    assert best.tokens == (3,) and best.support == pytest.approx((1 / 1.75,))


def test_separators_cut_continuations() -> None:
    index = NgramIndex(1, 2, recency_decay=1.0)
    index.extend([5, 6, 7, -1, 5, 6])
    found = index.query(4)
    assert found is not None and found.candidates[0].tokens == (7,)


def test_lookup_needs_n_min_tokens() -> None:
    index = NgramIndex(2, 4)
    index.extend([1, 1, 1])
    assert index.lookup([1], 3) is None
    assert index.query(3) is not None


def _lookup(match_len: int, considered: int, support: Sequence[float]) -> Lookup:
    return Lookup(match_len, considered, considered, (Candidate(tuple(range(len(support))), 1, tuple(support)),))


def test_a_lookup_offers_all_it_found_up_to_the_limit_with_its_evidence() -> None:
    """No length is decided here: a 1-gram guess and a long match are both offered as deep as asked."""
    weak = proposal_from_lookup(_lookup(1, 4, [0.25] * 16), 10, 1, "ngram")
    strong = proposal_from_lookup(_lookup(12, 1, [1.0] * 16), 10, 1, "ngram")
    assert weak.tokens == strong.tokens == tuple(range(10))
    assert weak.evidence == Evidence(1, 4, (0.25,) * 10)
    assert strong.evidence == Evidence(12, 1, (1.0,) * 10)
    assert proposal_from_lookup(None, 8, 1, "ngram") == Proposal(drafter="ngram")
    assert proposal_from_lookup(_lookup(4, 5, [1.0] * 16), 0, 1, "ngram").tokens == ()


def test_agreement_is_the_conditional_share_by_depth() -> None:
    ev = Evidence(2, 10, (0.8, 0.4, 0.4, 0.0))
    assert ev.agreement(4) == pytest.approx((0.8, 0.5, 1.0, 0.0))
    assert ev.agreement(2) == pytest.approx((0.8, 0.5))


def test_split_evidence_offers_a_trie_and_agreeing_evidence_a_chain() -> None:
    split = Lookup(2, 3, 3, (Candidate((1, 2, 3), 2, (2 / 3,) * 3), Candidate((4, 5, 6), 1, (1 / 3,) * 3)))
    tree = proposal_from_lookup(split, 2, 4, "ngram")
    assert isinstance(tree, TreeProposal) and set(tree.tree.branches) == {(1, 2), (4, 5)}
    assert tree.evidence == Evidence(2, 3, (2 / 3, 2 / 3))
    chain = proposal_from_lookup(split, 2, 1, "ngram")
    assert isinstance(chain, Proposal) and chain.tokens == (1, 2)


def test_drafter_follows_the_protocol_and_drafts_a_repeat() -> None:
    drafter = NgramDrafter()
    assert isinstance(drafter, Drafter)
    hist = [10, 11, 12, 13, 14, 15, 16, 17, 9, 10, 11, 12]
    proposal = drafter.propose(hist, 4)
    assert proposal == Proposal(tokens=(13, 14, 15, 16), probs=None, drafter="ngram")
    assert proposal.evidence == Evidence(3, 1, (1.0,) * 4)  # 10, 11, 12 matched once
    assert drafter.propose([1, 2, 3], 4).tokens == ()  # nothing repeats


def test_drafter_tree_has_bounded_branches() -> None:
    drafter = NgramDrafter(max_match=4, max_branches=2)  # longer matches would settle on one branch here
    hist = [1, 2, 3, 4, 5, 1, 2, 3, 4, 6, 1, 2, 3, 4, 5, 1, 2, 3, 4]
    proposal = drafter.propose(hist, 3)
    assert isinstance(proposal, TreeProposal)
    tree = proposal.tree
    assert set(tree.branches) == {(5, 1, 2), (6, 1, 2)}
    first, second = (tree.path(leaf)[0] for leaf in tree.leaves)
    assert tree.probs[first] >= tree.probs[second]  # 5 followed twice, 6 once
    assert drafter.propose([1, 2, 3], 3).tokens == ()


class _FixedSource:
    def __init__(self, lookup: Lookup | None):
        self.result = lookup
        self.contexts: list[list[int]] = []

    def lookup(self, context: Sequence[int], draft_len: int, max_candidates: int) -> Lookup | None:
        self.contexts.append(list(context))
        return self.result


def test_a_stronger_second_source_wins() -> None:
    strong = _FixedSource(Lookup(6, 9, 9, (Candidate((7, 7, 7), 9, (1.0, 1.0, 1.0)),)))
    drafter = NgramDrafter(sources=[strong])
    assert drafter.propose([1, 2, 3, 1], 3).tokens == (7, 7, 7)
    assert strong.contexts[-1] == [1, 2, 3, 1]
    weak = NgramDrafter(sources=[_FixedSource(None)])
    assert weak.propose([1, 2, 3, 1, 2, 3, 1, 2], 1).tokens == (3,)
    shorter = _FixedSource(Lookup(1, 9, 9, (Candidate((7, 7, 7), 9, (1.0, 1.0, 1.0)),)))
    assert NgramDrafter(sources=[shorter]).propose([1, 2, 3, 1, 2], 2).tokens == (3, 1)  # the 2-gram match wins


def test_strongest_prefers_the_longer_match_then_the_better_candidate() -> None:
    short = Lookup(2, 5, 5, (Candidate((1,), 5, (1.0,)),))
    long_ = Lookup(6, 1, 1, (Candidate((2,), 1, (1.0,)),))
    split = Lookup(6, 2, 2, (Candidate((3,), 1, (0.5,)),))
    assert strongest([short, long_, split]) is long_
    assert strongest([None, Lookup(9, 1, 1, ())]) is None


histories = st.lists(st.tuples(st.integers(0, 60), st.lists(st.integers(0, 3), max_size=15)), max_size=10)


@settings(max_examples=150, deadline=None)
@given(steps=histories, as_array=st.booleans())
def test_drafter_keeps_its_index_in_sync(steps: list, as_array: bool) -> None:
    """Appends, rollbacks and edits: after every call the index equals a fresh
    index of the history passed (edits are kept within the checked tail)."""
    drafter = NgramDrafter(n_min=1, n_max=3, sync_check=1000)
    hist: list[int] = []
    for keep, new in steps:
        hist = hist[:keep] + new
        passed = np.array(hist, dtype=np.int32) if as_array else tuple(hist)
        drafter.propose(passed, 4)
        fresh = NgramIndex(1, 3)
        fresh.extend(hist)
        assert drafter._index._state() == fresh._state()
        drafter.accepted(passed, 0)


sequences = st.lists(st.tuples(st.integers(0, 80), st.integers(0, 80), st.lists(st.integers(0, 3), max_size=40)),
                     min_size=1, max_size=6)


@settings(max_examples=150, deadline=None)
@given(turns=sequences, check=st.sampled_from([1, 4, 16]))
def test_a_new_sequence_reuses_the_index_only_where_it_agrees(turns: list, check: int) -> None:
    """Each turn a new sequence (``reset``): the last one cut at ``keep``, one token changed at ``edit``
    (anywhere: before the checked tail too) and extended. The kept index must equal a fresh index
    of the new history, which a drafter that trusted its tail check after a reset would miss."""
    drafter = NgramDrafter(n_min=1, n_max=4, sync_check=check)
    hist: list[int] = []
    for keep, edit, new in turns:
        hist = hist[:keep] + new
        if edit < len(hist):
            hist[edit] += 7  # a token the alphabet above never holds: the sequences now differ there
        drafter.reset()
        drafter.propose(list(hist), 4)
        fresh = NgramIndex(1, 4)
        fresh.extend(hist)
        assert drafter._index._state() == fresh._state()
        drafter.accepted(hist, 0)


def test_a_chat_turn_indexes_only_what_is_new() -> None:
    """The next turn of a conversation keeps the index and appends to it (its lists are the same ones)."""
    drafter = NgramDrafter()
    turn = [5, 6, 7, 8] * 50
    drafter.propose(turn, 4)
    kept = drafter._index
    drafter.reset()
    drafter.propose(turn + [9, 5, 6], 4)
    assert drafter._index is kept and len(kept) == len(turn) + 3
    drafter.reset()
    drafter.propose([1, 2, 3], 4)  # another text: most of the index would be undone, so it starts afresh
    assert drafter._index is not kept and drafter._index.tokens == [1, 2, 3]


def test_drafter_counts_what_was_kept() -> None:
    drafter = NgramDrafter()
    hist = [1, 2, 3, 4, 1, 2, 3]
    drafter.propose(hist, 2)
    drafter.accepted(hist + [4, 9], 1)
    assert drafter.stats.proposals == 1 and drafter.stats.accepted == 1


def test_model_free_drafting_never_imports_llama_cpp() -> None:
    code = (
        "import sys, localspec.drafting.ngram, localspec.drafting.suffix_array, "
        "localspec.drafting.tree, localspec.drafting.corpus; "
        "sys.exit('llama_cpp' in sys.modules)"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    assert subprocess.run([sys.executable, "-c", code], env=env).returncode == 0


def brute_gapped(hist: list[int], max_match: int, max_occ: int) -> tuple[int, list[int]]:
    """The longest match of ``hist``'s end with exactly one token substituted (never the last), by trying
    every window: (tokens matched besides the substituted one, the occurrences reaching it)."""
    end = len(hist)
    ends = [p for p in range(1, end) if hist[p - 1] == hist[-1]][::-1][:max_occ]
    best, found = 0, []
    for p in ends:
        windows = [w for w in range(2, min(max_match, p) + 1)
                   if sum(a != b for a, b in zip(hist[end - w :], hist[p - w : p])) == 1]
        matched = max(windows) - 1 if windows else 0
        if matched > best:
            best, found = matched, [p]
        elif matched == best and matched:
            found.append(p)
    return best, found


@settings(max_examples=300, deadline=None)
@given(hist=st.lists(st.integers(0, 3), min_size=2, max_size=80), max_match=st.integers(4, 12),
       max_occ=st.integers(1, 8), min_match=st.integers(1, 4))
def test_gapped_matches_match_brute_force(hist: list[int], max_match: int, max_occ: int, min_match: int) -> None:
    index = NgramIndex(1, 4, max_occurrences=max_occ, max_match=max_match)
    index.extend(hist)
    found = index.gapped(5, 8, min_match=min_match)
    best, ends = brute_gapped(hist, max_match, max_occ)
    if best < min_match:
        assert found is None
        return
    assert found is not None and found.gapped
    assert (found.match_len, found.occurrences) == (best, len(ends))
    assert {c.tokens: c.count for c in found.candidates} == Counter(repeated(hist, p, 5) for p in ends)


# A numbered list: "<n> . w1 w2 w3 w4 w5 w6 \n" for n = 1..6, then the seventh item's number and dot.
ITEMS = [tok for n in range(1, 7) for tok in (100 + n, 1, 20, 21, 22, 23, 24, 25, 2)]


def test_a_list_item_is_continued_from_the_last_one_but_for_its_number() -> None:
    """After "7 ." the exact match is the one token "." (followed by the words and by line ends alike);
    the last item matches "7 ." but for its number, and what followed it is offered, marked gapped."""
    history = ITEMS + [107, 1]
    proposal = NgramDrafter().propose(history, 8)
    assert proposal.tokens == (20, 21, 22, 23, 24, 25, 2, 107)
    assert proposal.evidence.gapped and proposal.evidence.match_len >= 8
    plain = NgramDrafter(gapped_min=0).propose(history, 8)
    assert not plain.evidence.gapped and plain.evidence.match_len == 1
    # a copy in progress (a long exact match) is never replaced by a gapped one
    copying = NgramDrafter().propose(ITEMS + [107, 1, 20, 21, 22, 23], 4)
    assert not copying.evidence.gapped and copying.tokens == (24, 25, 2, 107)


def test_a_gapped_match_needs_its_length() -> None:
    """One shared token before the substitution and one after is no evidence of a copy."""
    index = NgramIndex(1, 4, max_match=32)
    index.extend([5, 6, 7, 8, 9, 30, 7, 40, 9])  # "7 40 9" matches "7 8 9" but for one token: 2 matched
    assert index.gapped(3, min_match=3) is None
    found = index.gapped(3, min_match=2)
    assert found.match_len == 2 and found.candidates[0].tokens == (30, 7, 40)


def test_a_loop_is_marked_with_how_long_it_has_run() -> None:
    """An import line said five times over: the proposal carries the loop on and says it has run 15
    tokens; a text that copies an earlier span once (no loop) is not marked."""
    history = [1, 2, 3, 4] + [7, 8, 9] * 5
    proposal = NgramDrafter().propose(history, 8)
    assert proposal.tokens == (7, 8, 9, 7, 8, 9, 7, 8)
    assert proposal.evidence.loop == 15 and proposal.evidence.match_len == 12
    assert NgramDrafter(loops=False).propose(history, 8).evidence.loop == 0
    copy = [1, 2, 3, 4, 5, 6, 10, 11, 1, 2, 3, 4]
    proposal = NgramDrafter().propose(copy, 4)
    assert proposal.tokens == (5, 6, 10, 11) and proposal.evidence.loop == 0
    # a loop longer than the match grows is measured past it, up to LOOP_MAX_RUN
    drafter = NgramDrafter(max_match=8)
    assert drafter.propose([5] + [7, 8] * 8, 4).evidence.loop == 16 == 2 * drafter.max_match
    assert NgramDrafter().propose([7, 8] * 100, 4).evidence.loop == LOOP_MAX_RUN


@settings(max_examples=300, deadline=None)
@given(prefix=st.lists(st.integers(0, 3), max_size=30), unit=st.lists(st.integers(0, 3), min_size=1, max_size=6),
       times=st.integers(1, 12))
def test_loop_runs_match_brute_force(prefix: list[int], unit: list[int], times: int) -> None:
    """A span said three times over is a loop, and whatever the history, a proposal marked as a loop
    carries on a periodic end of the history:
    its last ``loop`` tokens repeat a period of at most half of them, the proposal continues that
    period, and the run is as long as the periodicity reaches (up to LOOP_MAX_RUN)."""
    history = prefix + unit * times
    proposal = NgramDrafter().propose(history, 6)
    run = proposal.evidence.loop if proposal.evidence is not None else 0
    assert run or times < 3  # a span said three times over is a loop
    if not run:
        return
    period = next(p for p in range(1, run // 2 + 1)
                  if history[-run + p:] == history[-run:-p] and all(
                      t == history[len(history) - p + j % p] for j, t in enumerate(proposal.tokens)))
    assert period * 2 <= run <= min(LOOP_MAX_RUN, len(history))
    if run < LOOP_MAX_RUN and run < len(history):
        assert history[-run - 1] != history[-run - 1 + period]  # the run reaches as far back as it goes
