"""The one drafter protocol that every drafter stands behind.

A drafter proposes up to ``max_tokens`` tokens that continue ``history`` (the
prompt plus everything generated so far, the last token included). After the
target has verified them, the engine tells the drafter how many it kept and
which token the target produced next, so the drafter can update its state
(KV cache, n-gram index, acceptance statistics). ``reset`` forgets everything
tied to the current sequence.

Proposals are a chain (``Proposal``) or a trie of candidates (``TreeProposal``).
Chains come in two kinds:

* ``probs`` set: the drafter *sampled* each token from a distribution q (a
  draft model). Verification uses exact rejection sampling with p and q.
* ``probs`` None: the tokens are deterministic guesses (n-gram lookup, a
  datastore, lookahead). Verification samples the target at each position and
  follows the draft while it matches, which is exact as well.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence, runtime_checkable

import numpy as np

from localspec.drafting.tree import CandidateTree, tree_from_branches


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
class BatchExtra:
    """Tokens a drafter wants computed in the verification batch beside the candidates.

    Lookahead decoding runs its Jacobi window in the same ``llama_decode`` call
    as verification. ``positions`` are offsets from the history's last token
    (which sits at offset 0); ``seq_ids`` are the drafter's own sequence numbers
    0..k-1 (the step maps them onto free llama.cpp sequences, each of which sees
    the whole history); ``on_logits(row)`` is called after the decode with a
    function returning the logits of extra token ``j`` (None when not output).
    """

    tokens: tuple[int, ...]
    positions: tuple[int, ...]
    seq_ids: tuple[tuple[int, ...], ...]
    outputs: tuple[bool, ...]
    on_logits: Callable[[Callable[[int], np.ndarray]], None]

    @property
    def n_seqs(self) -> int:
        return 1 + max((s for ids in self.seq_ids for s in ids), default=-1)


@dataclass(frozen=True)
class TreeProposal:
    """Several deterministic candidate continuations sharing their prefixes, as one trie.

    All branches are verified in one batch: a token shared by several branches
    is computed once, carrying the sequence ids of every branch below it.
    """

    tree: CandidateTree = field(default_factory=lambda: tree_from_branches(()))
    drafter: str = ""
    extra: BatchExtra | None = None
    probs = None  # deterministic: verified by sampling the target and following the match

    @property
    def tokens(self) -> tuple[int, ...]:
        """The path that follows the most probable child at each depth (a chain's worth)."""
        t = self.tree
        out: list[int] = []
        node = -1  # the root
        while True:
            kids = [i for i in range(len(t)) if t.parents[i] == node]
            if not kids:
                return tuple(out)
            node = max(kids, key=lambda i: t.probs[i])
            out.append(t.tokens[node])

    def __len__(self) -> int:
        return len(self.tree)


@runtime_checkable
class Drafter(Protocol):
    """What the speculative step needs from any drafter.

    Optional, by attribute: ``cheap = True`` says ``propose`` is a lookup
    costing microseconds, so the engine proposes before the controller plans
    (the controller then sees the offer, and scores it even on plain steps);
    ``verified(depth)`` is then told how deep that proposal was verified (0:
    not at all) before ``accepted``; ``batch_extra_tokens`` counts tokens every
    verification batch carries besides the candidates (lookahead's window).
    """

    name: str

    def propose(self, history: Sequence[int], max_tokens: int) -> "Proposal | TreeProposal":
        """Propose up to ``max_tokens`` tokens (a tree: up to that depth) that continue ``history``."""
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
