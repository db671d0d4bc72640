"""The one drafter protocol that every drafter stands behind.

A drafter proposes up to ``max_tokens`` tokens that continue ``history`` (the
prompt plus everything generated so far, the last token included). After the
target has verified them, the engine tells the drafter how many it kept and
which token the target produced next, so the drafter can update its state
(KV cache, n-gram index, acceptance statistics). ``reset`` forgets everything
tied to the current sequence.

Proposals come in two kinds:

* ``probs`` set: the drafter *sampled* each token from a distribution q (a
  draft model). Verification uses exact rejection sampling with p and q.
* ``probs`` None: the tokens are deterministic guesses (n-gram lookup, a
  datastore, lookahead). Verification samples the target at each position and
  follows the draft while it matches, which is exact as well.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence, runtime_checkable

import numpy as np


@dataclass(frozen=True)
class Proposal:
    """Tokens proposed to follow the history, in order.

    ``probs[i]`` is the full draft distribution q that ``tokens[i]`` was sampled
    from (float array over the vocabulary), or ``probs`` is None for
    deterministic drafts.
    """

    tokens: tuple[int, ...] = ()
    probs: tuple[np.ndarray, ...] | None = None
    drafter: str = ""

    def __post_init__(self) -> None:
        if self.probs is not None and len(self.probs) != len(self.tokens):
            raise ValueError("a proposal needs one draft distribution per token")

    def __len__(self) -> int:
        return len(self.tokens)


@dataclass(frozen=True)
class TreeProposal:
    """Several candidate continuations that may share prefixes.

    ``branches`` are token sequences; a branch that is a prefix of another is
    redundant and may be dropped by the verifier. Deterministic only.
    """

    branches: tuple[tuple[int, ...], ...] = ()
    drafter: str = ""
    scores: tuple[float, ...] = field(default=())


@runtime_checkable
class Drafter(Protocol):
    """What the speculative step needs from any drafter."""

    name: str

    def propose(self, history: Sequence[int], max_tokens: int) -> Proposal:
        """Propose up to ``max_tokens`` tokens that continue ``history``."""
        ...

    def accepted(self, history: Sequence[int], n_accepted: int) -> None:
        """Learn the outcome of the last proposal.

        ``history`` now ends with the tokens that were kept: the first
        ``n_accepted`` proposed tokens and the target's own token after them.
        """
        ...

    def reset(self) -> None:
        """Forget all state tied to the current sequence."""
        ...
