"""The speculative step: propose -> verify -> accept -> update.

Invariant, on entry and on exit: the target's cache holds every token of
``history`` except the last one, which has been chosen but not yet fed to
the model. A step feeds ``[last, d1, ..., dk]`` to the target in ONE batch
and reads k+1 rows of logits: row i is the target's distribution for the
position right after ``[last, d1..di]``. The acceptance rule keeps a prefix
d1..dn and yields the target's own next token t; the cache is cut back to
``[last, d1..dn]`` and ``t`` becomes the new unfed last token.

With k = 0 (no drafter, or the drafter has nothing) this is exactly one step
of plain decoding, so plain and speculative decoding share one loop.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from localspec.acceptance import Verdict, accept_greedy, accept_sampled
from localspec.backend import Context
from localspec.drafting.base import Drafter, Proposal
from localspec.sampling import Sampler

NO_PROPOSAL = Proposal()


@dataclass(frozen=True)
class StepResult:
    """What one step produced: ``tokens`` = the accepted drafts then the target's token."""

    tokens: tuple[int, ...]
    drafter: str | None
    drafted: int
    accepted: int
    draft_s: float
    verify_s: float
    python_s: float


class _LazyDistributions(Sequence[np.ndarray]):
    """Target distributions per verified row, computed only when the rule asks.

    Rejection sampling stops at the first rejection, so rows after it are never
    turned into probabilities (a softmax over a 262k vocabulary costs ~1 ms).
    """

    def __init__(self, ctx: Context, sampler: Sampler, n: int) -> None:
        self._ctx, self._sampler, self._n = ctx, sampler, n
        self._cache: dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._n))]
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError(i)
        hit = self._cache.get(i)
        if hit is None:
            hit = self._cache[i] = self._sampler.distribution(self._ctx.logits(i))
        return hit


def speculative_step(target: Context, history: list[int], drafter: Drafter | None,
                     sampler: Sampler, max_draft: int) -> StepResult:
    """Draft up to ``max_draft`` tokens, verify them in one target pass, keep the accepted prefix.

    ``history`` is extended in place with the emitted tokens.
    """
    t0 = time.perf_counter()
    # propose
    proposal = drafter.propose(history, max_draft) if drafter is not None and max_draft > 0 else NO_PROPOSAL
    draft = proposal.tokens[:max_draft]
    t1 = time.perf_counter()

    # verify: [last, d1..dk] in one batch, logits for every row
    n_past = len(target.tokens)
    batch = [history[-1], *draft]
    decode_before = target.decode_seconds
    target.decode(batch, range(n_past, n_past + len(batch)), None, [True] * len(batch))
    target.tokens.extend(batch)
    verify_s = target.decode_seconds - decode_before

    # accept: greedy compares argmaxes; otherwise exact rejection sampling
    verdict: Verdict
    if sampler.params.greedy:
        choice = [int(np.argmax(target.logits(i))) for i in range(len(batch))]
        verdict = accept_greedy(draft, choice)
    else:
        probs = proposal.probs[: len(draft)] if proposal.probs is not None else None
        verdict = accept_sampled(draft, probs, _LazyDistributions(target, sampler, len(batch)), sampler.rng)

    # update: drop the rejected tail from the target's cache, tell the drafter
    n_acc = verdict.n_accepted
    target.rollback_to(n_past + 1 + n_acc)
    emitted = (*draft[:n_acc], verdict.next_token)
    history.extend(emitted)
    if drafter is not None:
        drafter.accepted(history, n_acc)
    t2 = time.perf_counter()
    return StepResult(
        tokens=emitted,
        drafter=proposal.drafter or (drafter.name if drafter is not None and draft else None),
        drafted=len(draft),
        accepted=n_acc,
        draft_s=t1 - t0,
        verify_s=verify_s,
        python_s=(t2 - t1) - verify_s,
    )
