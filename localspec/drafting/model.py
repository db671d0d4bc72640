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

Trees (``propose_tree``, when the controller asks for one): grown best-first by
the draft's cumulative probability (``draft_tree.grow_tree``), level by level:
every node that may get children and whose q is not known yet is decoded in one
batch, each node on a llama.cpp sequence of its own that first shares its
parent's cells (the history's, for a child of the root; ``copy_seq`` copies no
data), so it attends to exactly its path. The root's q is the catch-up's last
row. Afterwards every node's sequence is removed: the cache holds the history
again, as after a chain's rollback. Children are drawn from q without
replacement at temperature > 0 (what recursive rejection sampling needs) and
are q's most probable tokens at 0. A tree needs one sequence per decoded node,
so only a draft whose context has them (and no recurrent state) grows trees.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from localspec.backend import Context
from localspec.drafting.base import DrafterBase, Proposal, TreeProposal, draft_chain
from localspec.drafting.draft_tree import TREE_WIDTH, grow_on_node_sequences, tree_q
from localspec.sampling import Sampler


_BRANCH = 1  # the sequence a draft with a recurrent state drafts on


class ModelDrafter(DrafterBase):
    """Drafts with a GGUF model that shares the target's vocabulary.

    ``p_min``: stop drafting when the draft's own top probability falls below
    it (a token the draft itself doubts is rarely accepted, and each drafted
    token costs a draft forward pass and a verification row).
    """

    follows_each_step = False  # a step it had no part in changes nothing here (see Drafter)

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
        self.tree_width = TREE_WIDTH if not self._branch and ctx.n_seq > 1 else 0

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
            return self._draft(history, draft_len)
        finally:
            if self._branch:
                self.ctx.remove_seq(_BRANCH)

    def propose_tree(self, history: Sequence[int], draft_len: int, nodes: int) -> Proposal | TreeProposal:
        # Each decoded node takes a sequence; a node at the last depth is never decoded.
        nodes = min(nodes, self.ctx.n_seq)
        if self.tree_width <= 1 or nodes <= draft_len or draft_len <= 0:
            return self.propose(history, draft_len)
        self._sync(history)
        base = len(self.ctx.tokens)  # the position of the root's children
        seq_of: dict[tuple[int, ...], int] = {(): 0}
        root = tree_q(self.ctx.logits(-1), self.sampler, history)  # read before any node's decode overwrites it

        def q_at(paths: Sequence[tuple[int, ...]]) -> list[np.ndarray]:
            if list(paths) == [()]:
                return [root]
            tokens, positions, seqs = [], [], []
            for path in paths:
                seq = seq_of[path] = len(seq_of)
                at = base + len(path) - 1
                self.ctx.copy_seq(seq_of[path[:-1]], seq, 0, at)  # the history and the node's ancestors
                tokens.append(path[-1])
                positions.append(at)
                seqs.append((seq,))
            self.ctx.decode(tokens, positions, seqs, [True] * len(tokens))
            return [tree_q(self.ctx.logits(i), self.sampler, history, path) for i, path in enumerate(paths)]

        return grow_on_node_sequences(self.ctx.remove_seq, seq_of, q_at, self.sampler, max_nodes=nodes,
                                      draft_len=draft_len, max_width=self.tree_width, drafter=self.name)

    def _draft(self, history: Sequence[int], draft_len: int) -> Proposal:
        pos = len(self.ctx.tokens)

        def logits(depth: int, drafted: Sequence[int]) -> np.ndarray:
            if depth > 0:  # the token drafted last, one position further
                if self._branch:
                    self.ctx.decode([drafted[-1]], [pos + depth - 1], [[_BRANCH]])
                else:
                    self.ctx.append([drafted[-1]])
            return self.ctx.logits(-1)

        return draft_chain(logits, self.sampler, self.p_min, history, draft_len, self.name)

    def accepted(self, history: Sequence[int], n_accepted: int) -> None:
        # Nothing to do eagerly: the next propose() keeps what matches the history.
        pass

    def reset(self) -> None:
        # Keep the cache (a new request often shares its prefix) but trust none of it.
        self._valid = 0

