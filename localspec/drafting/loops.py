"""Loops: the end of a history that repeats a span over and over, measured (``loop_run``, ``end_loop``)
and carried on as a lookup (``loop_lookup``), so the controller can learn such offers apart."""

from __future__ import annotations

from localspec.drafting.lookup import Candidate, Lookup


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
    last = tokens[-1] if end else 0
    for period in range(1, min(LOOP_MAX_RUN // 3, end // 3) + 1):
        # (the last token said three times over first: most periods fail there, without a slice)
        if (tokens[end - 1 - period] == last and tokens[end - 1 - 2 * period] == last
                and tokens[end - 2 * period:] == tokens[end - 3 * period:end - period]):
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
