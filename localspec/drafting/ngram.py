"""Model-free drafting from the context itself (prompt lookup).

``NgramIndex`` maps every n-gram of the history (n_min <= n <= n_max) to the
positions right after its occurrences. To draft, take the longest suffix of
the history that occurred before and propose what followed it. Text that
repeats its context (code edits, quoting, summaries, structured output) then
drafts whole spans for free; the target verifies them, so a wrong guess costs
a little compute and never changes the output.

All of this is pure Python on token lists: no model, no llama_cpp.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar, Protocol, Sequence

import numpy as np

from localspec.drafting.base import DrafterBase, Evidence, Proposal, TreeProposal
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


def _as_list(tokens: Sequence[int] | np.ndarray) -> list[int]:
    """``tokens`` as a list of ints: a list is taken as it is (a history is one; only read, never kept
    or changed here), anything else converted (numpy ids hash and compare as the ints they hold)."""
    if type(tokens) is list:
        return tokens
    return tokens.tolist() if isinstance(tokens, np.ndarray) else [int(t) for t in tokens]


class NgramIndex:
    """An incrementally built index from n-grams to the positions following them.

    Cost: ``extend`` does (n_max - n_min + 1) dict updates per new token;
    ``truncate`` undoes them per removed token (position lists grow in order,
    so the stale entry is always the last one; removal is exact, not lazy).
    ``lookup`` looks at the ``max_occurrences`` most recent occurrences only,
    so it stays cheap when a short n-gram occurs thousands of times.
    ``max_match`` > n_max lets a full-length match grow backwards, token by
    token, up to ``max_match`` tokens at each of those occurrences; only the
    occurrences with the longest match are then kept. Text that repeats a
    source with many look-alike spans (code: ``self.items[name]`` in every
    method) is then continued from the one place it is copying, not from a
    vote among every place that shares the last few tokens.
    Negative tokens are separators: no continuation runs past one, and as no
    context contains one, no match spans one.
    """

    def __init__(self, n_min: int = 1, n_max: int = 4, *, max_occurrences: int = 32, recency_decay: float = 0.95,
                 max_match: int | None = None):
        if not 1 <= n_min <= n_max:
            raise ValueError("need 1 <= n_min <= n_max")
        if max_occurrences < 1 or not 0 < recency_decay <= 1:
            raise ValueError("need max_occurrences >= 1 and 0 < recency_decay <= 1")
        if max_match is not None and max_match < n_max:
            raise ValueError("need max_match >= n_max")
        self.n_min, self.n_max = n_min, n_max
        self.max_match = n_max if max_match is None else max_match
        self.max_occurrences = max_occurrences
        self._weights = [recency_decay**r for r in range(max_occurrences)]  # most recent first
        self._tokens: list[int] = []
        self._index: dict[tuple[int, ...], list[int]] = {}
        self._has_separators = False

    def __len__(self) -> int:
        return len(self._tokens)

    @property
    def tokens(self) -> list[int]:
        """The indexed history itself (not a copy: read it, never change it)."""
        return self._tokens

    def tail(self, k: int) -> list[int]:
        """The last ``k`` indexed tokens (fewer if the history is shorter)."""
        return self._tokens[-k:] if k > 0 else []

    def extend(self, tokens: Sequence[int] | np.ndarray) -> None:
        """Append ``tokens`` and index every n-gram that now ends in them."""
        new = _as_list(tokens)
        if not new:
            return
        self._has_separators = self._has_separators or min(new) < 0
        h, idx = self._tokens, self._index
        start = len(h)
        h.extend(new)
        end = len(h)
        if end - start <= 16:
            # A decode step adds a few tokens: a plain loop beats setting up zips.
            for p in range(start + 1, end + 1):
                for n in range(self.n_min, min(self.n_max, p) + 1):
                    key = tuple(h[p - n : p])
                    positions = idx.get(key)
                    if positions is None:
                        idx[key] = [p]
                    else:
                        positions.append(p)
            return
        for n in range(self.n_min, self.n_max + 1):
            lo = max(start + 1, n)  # first end position p whose n-gram h[p-n:p] is new
            if lo > end:
                continue
            # zip over shifted slices builds the n-tuples in C, not per token in Python
            keys = zip(*(h[lo - n + j : end - n + j + 1] for j in range(n)))
            for p, key in zip(range(lo, end + 1), keys):
                positions = idx.get(key)
                if positions is None:
                    idx[key] = [p]
                else:
                    positions.append(p)

    def truncate(self, length: int) -> None:
        """Roll the history back to its first ``length`` tokens."""
        h, idx = self._tokens, self._index
        for p in range(len(h), max(length, 0), -1):
            for n in range(self.n_min, min(self.n_max, p) + 1):
                key = tuple(h[p - n : p])
                positions = idx[key]
                positions.pop()  # == p: positions are appended in increasing order
                if not positions:
                    del idx[key]
        del h[max(length, 0) :]

    def query(self, draft_len: int, max_candidates: int = 8) -> Lookup | None:
        """Continue the indexed history itself: its longest suffix seen before (a continuation that
        runs into the history's end carries on as the text repeats: see ``continuation``)."""
        return self.lookup(self._tokens, draft_len, max_candidates, repeats=True)

    def lookup(self, context: Sequence[int], draft_len: int, max_candidates: int = 8, *,
               repeats: bool = False) -> Lookup | None:
        """Find the longest suffix of ``context`` (n_max down to n_min tokens)
        that occurs in the index with a continuation, and rank what followed.

        Only the last ``max_match`` tokens of ``context`` are read (see the
        class notes for matches longer than n_max). Occurrences at the very
        end of the index (nothing follows yet) do not count, so querying the
        index with its own history finds *earlier* occurrences only.
        ``repeats``: ``context`` is the index's own history, so a continuation
        that reaches its end may carry on through it (``continuation``).
        """
        h, end = self._tokens, len(self._tokens)
        tail = _as_list(context[-self.max_match :])
        for n in range(min(self.n_max, len(tail)), self.n_min - 1, -1):
            positions = self._index.get(tuple(tail[len(tail) - n :]))
            if positions is None:
                continue
            occurrences = len(positions) - (positions[-1] >= end)
            if occurrences == 0:
                continue
            recent = positions[-self.max_occurrences - 1 :][::-1]
            if recent[0] >= end:
                recent = recent[1:]
            recent = recent[: self.max_occurrences]
            if n == self.n_max and len(tail) > n:
                grown, recent = self._longest(tail, n, recent)
                if grown > n:  # the evidence is now the occurrences of the longer match
                    n, occurrences = grown, len(recent)
            conts = [continuation(h, p, draft_len) if repeats else h[p : p + draft_len] for p in recent]
            if self._has_separators:
                conts = [cut_at_separator(c) for c in conts]
            return rank_continuations(n, occurrences, conts, recent, self._weights, max_candidates)
        return None

    def gapped(self, draft_len: int, max_candidates: int = 8, *, min_match: int = 6) -> Lookup | None:
        """Continue the indexed history from the place its end copies but for one token: the longest
        suffix that occurred before with exactly one token substituted (never the last one), at least
        ``min_match`` tokens matched besides it. A numbered list's next line (``7.`` after ``6.``) or a
        copied line after a renamed identifier matches so, where its exact match is a token or two.
        Returns the occurrences with the longest such match (``Lookup.match_len``: its matched tokens)."""
        h, end = self._tokens, len(self._tokens)
        if end < 2:
            return None
        positions = self._index.get((h[-1],)) if self.n_min <= 1 else None
        if not positions:
            return None
        recent = [p for p in positions[-self.max_occurrences - 1 :][::-1] if p < end][: self.max_occurrences]
        limit = self.max_match
        best, found = 0, []
        for p in recent:
            # h[p - 1] == h[-1] (the key): walk back to the first difference, step over it, walk on.
            # (Allowing a token inserted or dropped there too was tried: more look-alike places then
            # match, and replayed replies drafted worse.)
            k = _run_back(h, end - 1, p - 1, limit)
            if k >= limit or k >= p:
                continue  # an exact match: the exact lookup's
            t, q = end - 1 - k, p - 1 - k
            matched = k + _run_back(h, t - 1, q - 1, limit - k - 1)
            if matched > best:
                best, found = matched, [p]
            elif matched == best and matched:
                found.append(p)
        if best < min_match:
            return None
        conts = [continuation(h, p, draft_len) for p in found]
        if self._has_separators:
            conts = [cut_at_separator(c) for c in conts]
        return dataclasses.replace(rank_continuations(best, len(found), conts, found, self._weights, max_candidates),
                                   gapped=True)

    def _longest(self, tail: list[int], n: int, recent: list[int]) -> tuple[int, list[int]]:
        """Grow the match of ``tail``'s last ``n`` tokens backwards at each occurrence (ending before
        position p in ``recent``); the longest match length and the occurrences that reach it."""
        h, limit = self._tokens, len(tail)
        lengths = []
        for p in recent:
            m = n
            while m < limit and m < p and h[p - m - 1] == tail[-m - 1]:
                m += 1
            lengths.append(m)
        best = max(lengths)
        if best == n:
            return n, recent
        return best, [p for p, m in zip(recent, lengths) if m == best]


def _run_back(h: list[int], t: int, q: int, limit: int) -> int:
    """How many tokens ending at h[t] and at h[q] agree, walking back, at most ``limit`` (0 unless q < t:
    a span is never matched against itself)."""
    if q >= t:
        return 0
    n = 0
    while n < limit and q - n >= 0 and h[t - n] == h[q - n]:
        n += 1
    return n


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


@dataclass
class DrafterStats:
    proposals: int = 0
    drafted: int = 0
    accepted: int = 0


# The tokens a match with one substituted token needs besides it to be offered (NgramDrafter.gapped_min).
GAPPED_MIN = 6


@dataclass
class NgramDrafter(DrafterBase):
    """Prompt-lookup drafting behind the Drafter protocol (deterministic drafts).

    The engine passes the whole history every call. The index follows it by
    bookkeeping, not by comparing it whole: when the history is at least as
    long as the index and agrees on the index's last ``sync_check`` tokens,
    only the new tokens are indexed; otherwise the common prefix is found
    (C-speed list comparison) and the index is rolled back to it. A change
    hidden before the checked tail would only make drafts worse, never the
    output wrong, since every draft is verified by the target.

    ``sources`` are extra n-gram sources (e.g. a personal store of past
    outputs, or a REST datastore); the lookup with the strongest evidence
    (``strongest``) proposes. The drafter decides no length: it offers its
    best candidate (or a trie of them) as deep as asked, with the evidence,
    and the controller chooses how much of it to verify.

    A match with one token substituted: where the context's own match is
    short or split (no copy in progress), the history's end is also matched
    allowing one substituted token (``NgramIndex.gapped``); with at least
    ``gapped_min`` tokens matched besides it, and more than the exact match,
    what followed that place is offered, its evidence marked ``gapped`` (a
    class the controller learns apart). A numbered list's next item (``7.``
    where the last line began ``6.``) or a copied line after a renamed
    identifier is continued so at once, where the exact match is one token
    (``.``) whose continuations split (``benchmarks/replay_ngram.py`` compares
    ``gapped_min`` values on recorded replies).

    A loop: where the history's end repeats a span over and over and the
    proposal carries it on, its evidence says how long the loop has run
    (``Evidence.loop``, see ``loop_run``), and the controller learns such
    offers apart from other matches of their length (``loops=False`` turns it off).
    A span said three times over at the end is carried on as a loop even when
    the index's longest match points elsewhere (``end_loop``).
    """

    n_min: int = 1
    n_max: int = 4
    max_match: int = 32  # see NgramIndex: a match may grow past n_max to find the place being copied
    sources: list[NgramSource] = field(default_factory=list)
    reply_store: ReplyStore | None = None  # where finished replies are kept (one of ``sources`` too)
    max_candidates: int = 8
    sync_check: int = 16
    max_branches: int = 1  # > 1: propose a trie of continuations when the evidence splits
    gapped_min: int = GAPPED_MIN  # see the class notes: 0 turns matches with a substituted token off
    loops: bool = True  # see the class notes: mark proposals that carry on a loop (``loop_run``)
    name: str = "ngram"
    stats: DrafterStats = field(default_factory=DrafterStats)
    cheap: ClassVar[bool] = True  # a lookup: the controller may ask it before planning (see Drafter)

    def __post_init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._index = NgramIndex(self.n_min, self.n_max, max_match=self.max_match)
        self._last_own: Lookup | None = None  # the context index's own lookup of the last proposal

    def remember_reply(self, reply: Sequence[int], context: Sequence[int]) -> bool:
        return self.reply_store.remember(reply, context) if self.reply_store is not None else False

    def _sync(self, history: Sequence[int]) -> None:
        index, n_idx = self._index, len(self._index)
        k = min(self.sync_check, n_idx)
        if len(history) >= n_idx and _as_list(history[n_idx - k : n_idx]) == index.tail(k):
            index.extend(history[n_idx:])
            return
        hist = _as_list(history)
        ours = index.tail(n_idx)
        limit, common, step = min(len(hist), n_idx), 0, 256
        # Whole blocks compare in C; only the first unequal block is walked token by token.
        while common < limit and hist[common : common + step] == ours[common : common + step]:
            common += step
        while common < limit and hist[common] == ours[common]:
            common += 1
        common = min(common, limit)
        index.truncate(common)
        index.extend(hist[common:])

    def _best_lookup(self, history: Sequence[int], draft_len: int) -> Lookup | None:
        self._sync(history)
        lookup = self._last_own = self._index.query(draft_len, self.max_candidates)
        if not self.sources:
            return lookup
        tail = _as_list(history[-64:])
        return strongest([lookup] + [s.lookup(tail, draft_len, self.max_candidates) for s in self.sources])

    def propose(self, history: Sequence[int], draft_len: int) -> Proposal | TreeProposal:
        lookup = self._best_lookup(history, draft_len)
        own = lookup is not None and lookup is self._last_own
        run = loop_run(self._index.tokens, lookup) if self.loops and own else 0
        if self.loops and not run:
            period, run = end_loop(self._index.tokens)
            if run:  # the end repeats a span three times over, and the lookup chose another match
                lookup = loop_lookup(self._index.tokens, period, run, draft_len)
        # A copy or a loop in progress proposes as it is; otherwise a match with one token substituted
        # may propose instead, when it is longer.
        copying = run > 0 or (lookup is not None and lookup.match_len >= COPY_MIN_MATCH
                              and lookup.candidates[0].support[0] >= 0.999)
        proposal = None
        if not copying and self.gapped_min > 0:
            gapped = self._index.gapped(draft_len, self.max_candidates, min_match=self.gapped_min)
            if gapped is not None and gapped.candidates and (lookup is None or gapped.match_len > lookup.match_len):
                proposal = proposal_from_lookup(gapped, draft_len, self.max_branches, self.name)
        if proposal is None:
            proposal = proposal_from_lookup(lookup, draft_len, self.max_branches, self.name)
            if run and proposal.evidence is not None:
                proposal = dataclasses.replace(proposal, evidence=dataclasses.replace(proposal.evidence, loop=run))
        self.stats.proposals += 1
        self.stats.drafted += len(proposal)
        return proposal

    def accepted(self, history: Sequence[int], n_accepted: int) -> None:
        self.stats.accepted += n_accepted
        self._sync(history)


# The longest loop run ``loop_run`` measures: a run longer still is as telling (the longest match class;
# splitting loops further by length only made each new class learn the same loop again).
LOOP_MAX_RUN = 32


def loop_run(tokens: list[int], lookup: Lookup) -> int:
    """How long the loop that ``lookup``'s best candidate carries on has run: the tokens at the end of
    ``tokens`` (the history the lookup matched) that repeat a period of them, the first period
    included (at most ``LOOP_MAX_RUN``); 0 when the candidate carries on no loop.

    The candidate continues a loop when its most recent occurrence lies within the match itself:
    the history's end then equals itself shifted by ``period`` tokens for at least the match's length."""
    if not lookup.candidates:
        return 0
    end = len(tokens)
    period = end - lookup.candidates[0].last_seen
    if not 0 < period <= lookup.match_len:
        return 0
    n = lookup.match_len  # tokens known to equal the ones ``period`` before them
    while n + period < LOOP_MAX_RUN and n + period < end and tokens[end - 1 - n] == tokens[end - 1 - n - period]:
        n += 1
    return min(n + period, LOOP_MAX_RUN)


def end_loop(tokens: list[int]) -> tuple[int, int]:
    """(period, run) of the loop the end of ``tokens`` is in, when a span of at most ``LOOP_MAX_RUN // 3``
    tokens ends them three times over (the shortest such span); (0, 0) when none does. ``run`` counts,
    as ``loop_run`` does, the tokens at the end that repeat the period, the first period included."""
    end = len(tokens)
    for period in range(1, min(LOOP_MAX_RUN // 3, end // 3) + 1):
        if tokens[end - 2 * period:] == tokens[end - 3 * period:end - period]:
            n = 2 * period
            while n + period < LOOP_MAX_RUN and n + period < end and tokens[end - 1 - n] == tokens[end - 1 - n - period]:
                n += 1
            return period, min(n + period, LOOP_MAX_RUN)
    return 0, 0


def loop_lookup(tokens: list[int], period: int, run: int, draft_len: int) -> Lookup:
    """The loop at the end of ``tokens`` carried on for ``draft_len``, as a lookup of its last period."""
    cycle = tokens[len(tokens) - period:]
    carried = tuple(cycle[i % period] for i in range(draft_len))
    match = run - period
    return Lookup(match, 1, 1, (Candidate(carried, 1, (1.0,) * len(carried), len(tokens) - period),))


# A match shorter than this (or one whose occurrences disagree) is no copy in progress: it gives way to a
# match with one token substituted.
COPY_MIN_MATCH = 4


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
