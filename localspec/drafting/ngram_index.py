"""The context's own n-gram index: every n-gram of the history mapped to the positions right after its
occurrences, kept up to date token by token, and asked for the longest suffix of the history seen before
(exactly, or with one token substituted). Pure Python on token lists."""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from localspec.drafting.lookup import Lookup, continuation, cut_at_separator, rank_continuations
from localspec.token_ids import as_list


# A token's bits in an n-gram's key (see NgramIndex): ids are int32, separators negative.
_TOKEN_BITS = 32
_TOKEN_MASK = (1 << _TOKEN_BITS) - 1


class NgramIndex:
    """An incrementally built index from n-grams to the positions following them.

    Kept as hash chains, one per n: ``_heads[n]`` maps an n-gram's key to the
    last position p (right after the n-gram) it occurred at, ``_prev[n][p]``
    is the occurrence before the one ending at p (0: none) and ``_count[n][p]``
    how many occurred up to p. A key is the n-gram's ids packed into one int
    (32 bits each): ints, unlike a tuple per n-gram and a list of positions per
    key, are no work for the garbage collector, which otherwise came due in
    the middle of a decode loop every few lookups.

    Cost: ``extend`` does (n_max - n_min + 1) dict updates per new token (for the n-gram drafter's
    n = 1..4 in a loop with the levels written out, ``_extend_one_to_four``);
    ``truncate`` undoes them per removed token (exact, not lazy: the chains
    grow at their heads, so a removed token's entry is always a head).
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
        # per n (index n; the ones below n_min unused): see the class notes. Position 0 holds no n-gram.
        self._heads: list[dict[int, int]] = [{} for _ in range(n_max + 1)]
        self._prev: list[list[int]] = [[0] for _ in range(n_max + 1)]
        self._count: list[list[int]] = [[0] for _ in range(n_max + 1)]
        self._has_separators = False
        # What extend updates per level (the dicts and lists themselves: never replaced, only changed).
        self._levels = [(n, self._heads[n], self._prev[n], self._count[n]) for n in range(n_min, n_max + 1)]
        self._one_to_four = (n_min, n_max) == (1, 4)  # the n-gram drafter's shape: extend's unrolled loop

    def __len__(self) -> int:
        return len(self._tokens)

    @property
    def tokens(self) -> list[int]:
        """The indexed history itself (not a copy: read it, never change it)."""
        return self._tokens

    def _chain(self, n: int, head: int, limit: int) -> list[int]:
        """The positions of ``head``'s n-gram, most recent first, ``head`` included, at most ``limit``."""
        prev = self._prev[n]
        out = []
        p = head
        while p and len(out) < limit:
            out.append(p)
            p = prev[p]
        return out

    def extend(self, tokens: Sequence[int] | np.ndarray) -> None:
        """Append ``tokens`` and index every n-gram that now ends in them."""
        new = as_list(tokens)
        if not new:
            return
        self._has_separators = self._has_separators or min(new) < 0
        h = self._tokens
        start = len(h)
        h.extend(new)
        if self._one_to_four and len(h) > 3:
            if start < 3:
                self._extend_general(start, 3)
                start = 3
            self._extend_one_to_four(start)
        else:
            self._extend_general(start, len(h))

    def _extend_general(self, start: int, end: int) -> None:
        """Index the n-grams ending at positions ``start`` + 1 .. ``end`` of the history (any n_min, n_max)."""
        h, n_max = self._tokens, self.n_max
        # keys[n]: the key of the n tokens ending at the position being indexed, rolled on token by token
        # (the n-gram ending at p is the (n-1)-gram ending at p - 1 and the token at p - 1)
        keys = [0] * (n_max + 1)
        for p in range(max(0, start - n_max + 1), start):
            t = h[p] & _TOKEN_MASK
            for n in range(n_max, 1, -1):
                keys[n] = keys[n - 1] << _TOKEN_BITS | t
            keys[1] = t
        levels = self._levels
        for p in range(start + 1, end + 1):
            t = h[p - 1] & _TOKEN_MASK
            for n in range(n_max, 1, -1):
                keys[n] = keys[n - 1] << _TOKEN_BITS | t
            keys[1] = t
            for n, chain, prev, count in levels:
                if n > p:  # no n-gram of n tokens ends this early
                    prev.append(0)
                    count.append(0)
                    continue
                key = keys[n]
                last = chain.get(key, 0)
                chain[key] = p
                prev.append(last)
                count.append(count[last] + 1)

    def _extend_one_to_four(self, start: int) -> None:
        """``_extend_general`` for n = 1..4 (the n-gram drafter's index) from position ``start`` >= 3 to the
        history's end: the same updates, the four levels written out (a third to a half less time a token:
        this runs on every step that drafts with a lookup, and over the whole prompt at the first)."""
        h, bits, mask = self._tokens, _TOKEN_BITS, _TOKEN_MASK
        a, b, k1 = h[start - 3] & mask, h[start - 2] & mask, h[start - 1] & mask
        k2, k3 = b << bits | k1, (a << bits | b) << bits | k1  # the keys of the n-grams ending at start - 1
        (_, c1, p1, n1), (_, c2, p2, n2), (_, c3, p3, n3), (_, c4, p4, n4) = self._levels
        for p in range(start + 1, len(h) + 1):
            t = h[p - 1] & mask
            k4 = k3 << bits | t
            k3 = k2 << bits | t
            k2 = k1 << bits | t
            k1 = t
            last = c1.get(k1, 0)
            c1[k1] = p
            p1.append(last)
            n1.append(n1[last] + 1)
            last = c2.get(k2, 0)
            c2[k2] = p
            p2.append(last)
            n2.append(n2[last] + 1)
            last = c3.get(k3, 0)
            c3[k3] = p
            p3.append(last)
            n3.append(n3[last] + 1)
            last = c4.get(k4, 0)
            c4[k4] = p
            p4.append(last)
            n4.append(n4[last] + 1)

    def truncate(self, length: int) -> None:
        """Roll the history back to its first ``length`` tokens."""
        h = self._tokens
        length = max(length, 0)
        n_min, n_max = self.n_min, self.n_max
        heads, prev, count = self._heads, self._prev, self._count
        for p in range(len(h), length, -1):
            keys = _suffix_keys(h[max(0, p - n_max):p])
            for n in range(n_min, min(n_max, p) + 1):
                last = prev[n][p]
                if last:
                    heads[n][keys[n]] = last
                else:
                    del heads[n][keys[n]]
            for n in range(n_min, n_max + 1):
                prev[n].pop()
                count[n].pop()
        del h[length:]

    def _state(self) -> tuple[object, ...]:
        """Everything the index holds (two indexes of the same history hold the same)."""
        return self._tokens, self._heads[self.n_min:], self._prev[self.n_min:], self._count[self.n_min:]

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
        tail = as_list(context[-self.max_match :])
        keys = _suffix_keys(tail[-self.n_max:])
        for n in range(len(keys) - 1, self.n_min - 1, -1):
            head = self._heads[n].get(keys[n])
            if head is None:
                continue
            occurrences = self._count[n][head] - (head >= end)
            if occurrences == 0:
                continue
            recent = self._chain(n, head, self.max_occurrences + 1)
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
        head = self._heads[1].get(h[-1] & _TOKEN_MASK) if self.n_min <= 1 else None
        if not head:
            return None
        recent = [p for p in self._chain(1, head, self.max_occurrences + 1) if p < end][: self.max_occurrences]
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


def _suffix_keys(tokens: list[int]) -> list[int]:
    """``keys[n]``: the key of the last n of ``tokens`` (n = 1..len; keys[0] = 0), as ``NgramIndex.extend`` rolls
    them on: the last token in the lowest bits."""
    keys = [0] * (len(tokens) + 1)
    for n in range(1, len(tokens) + 1):
        keys[n] = keys[n - 1] | (tokens[-n] & _TOKEN_MASK) << (_TOKEN_BITS * (n - 1))
    return keys
