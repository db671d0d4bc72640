"""What a lookup finds and what it offers: the shapes every n-gram source answers with (``Candidate``,
``Lookup``), the seams for sources (``NgramSource``, ``ReplyStore``), continuations ranked into a lookup
(``rank_continuations``), the strongest of several lookups, and a lookup made a proposal (a chain, or a
trie when its evidence splits).

Shared by the context's own index (``ngram_index``), the personal store (``personal``), the REST
datastore (``suffix_array``, ``rest``) and the drafter that asks them (``ngram``). Pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

from localspec.drafting.base import Evidence, Proposal, TreeProposal
from localspec.drafting.tree import CandidateTree, build_tree, tree_from_branches


@dataclass(frozen=True)
class Candidate:
    """One continuation seen after the matched context.

    ``count``: occurrences (among those considered) followed by exactly these
    tokens. ``support[d]``: the (recency-weighted) share of considered
    occurrences whose continuation starts with ``tokens[:d + 1]``, so it is
    non-increasing and ``sum(support)`` is the expected number of leading
    tokens this candidate shares with a continuation drawn from the evidence.
    ``last_seen``: where the most recent such continuation starts (-1 unknown).
    """

    tokens: tuple[int, ...]
    count: int
    support: tuple[float, ...]
    last_seen: int = -1

    @property
    def score(self) -> float:
        return float(sum(self.support))


@dataclass(frozen=True)
class Lookup:
    """The evidence behind a draft: the longest match and what followed it.

    ``match_len``: tokens of context matched. ``occurrences``: earlier
    occurrences of the match in the source. ``considered``: how many of them
    (the most recent ones, or a sample) the candidates were gathered from.
    ``candidates`` are ranked best first (score, then recency). ``gapped``: the
    match has one token substituted (``NgramIndex.gapped``).
    """

    match_len: int
    occurrences: int
    considered: int
    candidates: tuple[Candidate, ...]
    gapped: bool = False


class NgramSource(Protocol):
    """Anything that can continue a context: the seam for a second n-gram source.

    The context index, a personal store of past outputs, or a REST datastore
    all answer this. ``context`` is the tail of the history (the source only
    needs its last few tokens); None means no match.
    """

    def lookup(self, context: Sequence[int], draft_len: int, max_candidates: int) -> Lookup | None: ...


class ReplyStore(Protocol):
    """Where finished replies are kept for later lookups (the personal store)."""

    def remember(self, reply: Sequence[int], context: Sequence[int] = ()) -> bool: ...


def continuation(tokens: list[int], start: int, draft_len: int) -> list[int]:
    """Up to ``draft_len`` of what follows ``tokens[:start]``, if the text ending ``tokens`` copies it.

    Where the copied span runs into the end of ``tokens`` (the match is itself
    recent: the text repeats with period ``len(tokens) - start``), the copy is
    carried on through what it has just produced, as the text will be if it
    keeps repeating: a loop or a table's rows then draft as deep as asked, not
    only up to the end of what is written so far.
    """
    end = len(tokens)
    if start + draft_len <= end or start >= end:
        return tokens[start : start + draft_len]
    period = end - start
    cont = tokens[start:end]
    while len(cont) < draft_len:
        cont.append(cont[len(cont) - period])
    return cont


def cut_at_separator(tokens: list[int]) -> list[int]:
    """``tokens`` up to (not including) the first negative one."""
    for i, t in enumerate(tokens):
        if t < 0:
            return tokens[:i]
    return tokens


def rank_continuations(
    match_len: int,
    occurrences: int,
    conts: list[list[int]],
    starts: list[int],
    weights: list[float],
    max_candidates: int,
) -> Lookup:
    """Group continuations into ranked candidates (see Candidate, Lookup).

    ``starts[i]`` is where ``conts[i]`` begins in its source and ``weights[i]``
    its weight (e.g. recency); ranking is by score, then by the latest start.
    Empty continuations count as evidence but make no candidate.
    """
    groups: dict[tuple[int, ...], list] = {}  # tokens -> [count, last_seen, weight]
    total = 0.0
    for cont, start, w in zip(conts, starts, weights):
        total += w
        key = tuple(cont)
        g = groups.get(key)
        if g is None:
            groups[key] = [1, start, w]
        else:
            g[0] += 1
            g[2] += w
            g[1] = max(g[1], start)
    groups.pop((), None)  # cut to nothing by a separator: evidence, but no candidate
    # Sorted, continuations sharing a prefix of length d form contiguous runs
    # (neighbours sharing >= d tokens), so support needs no prefix tuples.
    keys = sorted(groups)
    own = [groups[k][2] for k in keys]
    lcp = [0] * (len(keys) + 1)  # lcp[i]: tokens shared by keys[i - 1] and keys[i]
    for i in range(1, len(keys)):
        a, b = keys[i - 1], keys[i]
        n, m = 0, min(len(a), len(b))
        while n < m and a[n] == b[n]:
            n += 1
        lcp[i] = n
    support = [[w] * len(k) for k, w in zip(keys, own)]  # alone at a depth: its own weight
    for d in range(1, max(lcp) + 1):
        i = 0
        while i < len(keys):
            j = i + 1
            while lcp[j] >= d:
                j += 1
            if j - i > 1:
                shared = sum(own[i:j])
                for k in range(i, j):
                    support[k][d - 1] = shared
            i = j
    scores = [sum(sup) for sup in support]
    order = sorted(range(len(keys)), key=lambda i: (-scores[i], -groups[keys[i]][1]))
    candidates = tuple(
        Candidate(keys[i], groups[keys[i]][0], tuple(x / total for x in support[i]), groups[keys[i]][1])
        for i in order[:max_candidates]
    )
    return Lookup(match_len, occurrences, len(conts), candidates)


def evidence(lookup: Lookup, depth: int) -> Evidence:
    """The evidence behind ``lookup``'s best candidate, to ``depth`` tokens."""
    best = lookup.candidates[0]
    return Evidence(lookup.match_len, lookup.occurrences, best.support[:depth], gapped=lookup.gapped)


def strongest(lookups: Sequence[Lookup | None]) -> Lookup | None:
    """The lookup with the strongest evidence: the longest match, then the best candidate's score.

    Choosing among sources is not choosing a length: the controller judges the
    winner's evidence like any other.
    """
    found = [lk for lk in lookups if lk is not None and lk.candidates]
    return max(found, key=lambda lk: (lk.match_len, lk.candidates[0].score), default=None)


# A continuation holding less than this share of the evidence makes no branch of a
# trie: it would add nodes to verify for little chance (a tree's width, not its depth;
# the controller still chooses between the trie and its most probable path).
BRANCH_MIN_SHARE = 0.1


def candidate_tree(lookup: Lookup | None, depth: int, max_branches: int) -> CandidateTree:
    """The trie of up to ``max_branches`` continuations a lookup found, ``depth`` tokens deep."""
    if lookup is None or not lookup.candidates or depth <= 0:
        return tree_from_branches(())
    weighted = [(c.tokens, float(c.count)) for c in lookup.candidates]
    # Occurrences whose continuations were not kept as candidates still count in
    # the total (an empty continuation adds no node), so node probabilities stay
    # shares of all the evidence.
    rest = lookup.considered - sum(c.count for c in lookup.candidates)
    return build_tree(
        weighted + ([((), float(rest))] if rest > 0 else []),
        max_nodes=depth * max_branches,
        max_depth=depth,
        max_leaves=max_branches,
        min_prob=BRANCH_MIN_SHARE,
    )


def proposal_from_lookup(lookup: Lookup | None, draft_len: int, max_branches: int,
                         name: str) -> Proposal | TreeProposal:
    """All a lookup offers up to ``draft_len``, with its evidence: a chain when the evidence points
    one way (or ``max_branches`` is 1), else a trie."""
    if lookup is None or not lookup.candidates or draft_len <= 0:
        return Proposal(drafter=name)
    best = lookup.candidates[0].tokens[:draft_len]
    if max_branches > 1 and len(lookup.candidates) > 1:
        tree = candidate_tree(lookup, draft_len, max_branches)
        if len(tree.leaves) > 1:
            return TreeProposal(tree=tree, drafter=name, evidence=evidence(lookup, max(tree.depths)))
    return Proposal(tokens=tuple(best), probs=None, drafter=name, evidence=evidence(lookup, len(best)))
