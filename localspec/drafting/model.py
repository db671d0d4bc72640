"""A small GGUF model as the drafter.

The draft keeps its own KV cache. Before drafting it brings that cache in
line with the history: it keeps the longest prefix it already holds, drops
the rest and decodes what is missing in one batch (the "catch-up": after a
fully accepted step this is the last draft token plus the target's bonus
token; the first time, the whole prompt). Nothing is decoded before the
controller first asks for a draft, and ``behind`` tells it beforehand how
many tokens that would cost, so a draft model it keeps off costs nothing. Then it drafts one token per decode, sampling from the same sampling
settings as the target, so rejection sampling can use q exactly.

A draft with a recurrent state (a hybrid model: ``Context.max_rollback`` is not
None) could not take back tokens it drafted one decode at a time (llama.cpp
snapshots a state only within one batch), so it drafts on a copy of its
sequence: sequence 1 shares the state of sequence 0, which stays at the
history, and is dropped after proposing. The context needs two sequences.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from localspec.backend import Context
from localspec.drafting.base import DrafterBase, Proposal, draft_token
from localspec.sampling import Sampler


_BRANCH = 1  # the sequence a draft with a recurrent state drafts on


class ModelDrafter(DrafterBase):
    """Drafts with a GGUF model that shares the target's vocabulary.

    ``p_min``: stop drafting when the draft's own top probability falls below
    it (a token the draft itself doubts is rarely accepted, and each drafted
    token costs a draft forward pass and a verification row).
    """

    def __init__(self, ctx: Context, sampler: Sampler, *, p_min: float = 0.0, name: str = "draft") -> None:
        self.ctx = ctx
        self.sampler = sampler
        self.p_min = p_min
        self.name = name
        self._branch = ctx.max_rollback is not None
        if self._branch and ctx.n_seq < 2:
            raise ValueError("a draft model with a recurrent state drafts on a second sequence: give its "
                             "context n_seq=2")
        # Positions of ctx.tokens known to equal the history: the history only
        # grows within a generation, so those never need comparing again.
        self._valid = 0

    def _kept(self, history: Sequence[int]) -> int:
        """How much of ``history`` the cache can keep (the last token is always decoded again:
        its logits start the draft)."""
        n = self.ctx.common_prefix(history, start=self._valid)
        # The history only grows within a generation: this prefix stays valid.
        self._valid = n
        # A recurrent state keeps only what its last batch allows (else the draft decodes afresh).
        return self.ctx.keepable(min(n, len(history) - 1))

    def behind(self, history: Sequence[int]) -> int:
        return len(history) - self._kept(history)

    def _sync(self, history: Sequence[int]) -> None:
        n = self._kept(history)
        self.ctx.rollback_to(n)
        self.ctx.append(history[n:])
        self._valid = len(history)

    def propose(self, history: Sequence[int], draft_len: int) -> Proposal:
        self._sync(history)
        if self._branch:
            self.ctx.copy_seq(0, _BRANCH)
        try:
            return self._draft(draft_len)
        finally:
            if self._branch:
                self.ctx.remove_seq(_BRANCH)

    def _draft(self, draft_len: int) -> Proposal:
        greedy = self.sampler.params.greedy
        pos = len(self.ctx.tokens)
        tokens: list[int] = []
        probs: list[np.ndarray] = []
        for i in range(draft_len):
            picked = draft_token(self.ctx.logits(-1), self.sampler, self.p_min)
            if picked is None:
                break
            tok, q = picked
            if q is not None:
                probs.append(q)
            tokens.append(tok)
            if i + 1 < draft_len:
                if self._branch:
                    self.ctx.decode([tok], [pos + i], [[_BRANCH]])
                else:
                    self.ctx.append([tok])
        return Proposal(tuple(tokens), tuple(probs) if not greedy else None, self.name)

    def accepted(self, history: Sequence[int], n_accepted: int) -> None:
        # Nothing to do eagerly: the next propose() keeps what matches the history.
        pass

    def reset(self) -> None:
        # Keep the cache (a new request often shares its prefix) but trust none of it.
        self._valid = 0

