"""Dynamic draft trees from a model's distributions (EAGLE-2's growth, SpecInfer's verification).

``grow_tree`` builds a tree of at most ``max_nodes`` drafted tokens, best-first by
the draft's cumulative probability: each step it takes the open slot with the
highest score and adds one node there. A slot is "the next child of node v",
scored ``score(v) * (the draft mass at v not yet drawn)``; a node's score is its
parent's times the probability of its token. So the tree grows where the draft
is confident, deep along a sure path, wide where it hesitates.

At temperature > 0 a child is DRAWN from q at its parent, without replacement
among its siblings, and the proposal carries each parent's q (``child_q``), so
verification is recursive rejection sampling over the siblings
(``acceptance.accept_siblings``), exact. Which slot grows next depends only on
draws already made (a stopping rule), never on draws to come or on the target:
each node's children are a sequential sample without replacement, what the
rule's proof assumes. (Taking each node's top-k tokens instead would not be a
sample from q, and the rule would no longer be exact at T > 0.) At temperature
0 the children are the most probable tokens in order, verified by following
the target's argmax.

``q_at(paths)`` gives the draft's distributions after each of several nodes'
token paths (``()``: right after the history). A DFlash block has one per depth,
whatever the path; a draft model must decode a node to know its q. So ``q_at``
is asked in batches: when the slot to grow belongs to a node whose q is not
known yet, it is asked for that node AND every other node still waiting for its
q (added since the last ask, and deep enough to get children), in one call: a
draft model decodes them in one batch, level by level as the tree grows. Asking
early changes no draw (the sequence of slots and draws is the same as asking
one node at a time), only how many draft decodes it takes and how many rows
each holds; a node asked for may never get children (its row is then spent for
nothing, which the controller prices: ``CostModel.tree_draft_ms``).
"""

from __future__ import annotations

import heapq
from typing import Callable, Sequence

import numpy as np

from localspec.acceptance import ROOT
from localspec.drafting.base import TreeProposal
from localspec.drafting.tree import CandidateTree
from localspec.sampling import Sampler


TREE_WIDTH = 3
"""The most children a node of a model drafter's tree may have (the controller chooses how many nodes)."""


def tree_q(logits: np.ndarray, sampler: Sampler, history: Sequence[int] = (), path: Sequence[int] = ()) -> np.ndarray:
    """The q a tree's children are grown from: the target's own sampling settings applied to the draft's
    logits (the children are drawn from it), or at temperature 0 the plain softmax (scores only: the
    children are its most probable tokens, whatever the sampling settings cut). With the sampler's
    shaper (a grammar), the logits are first shaped as the target's row after ``history`` + ``path``
    (the node's token path); a row it rules out whole gets no children (q all zero)."""
    logits = sampler.shaped(logits, history, path)
    if sampler.shaper is not None and not np.isfinite(logits.max()):
        return np.zeros(logits.size)
    if sampler.params.greedy:
        logits = np.asarray(logits, dtype=np.float64)
        e = np.exp(logits - logits.max())
        return e / e.sum()
    return sampler.draft_distribution(logits)


QBatch = Callable[[Sequence[tuple[int, ...]]], Sequence[np.ndarray]]


def grow_tree(q_at: QBatch, *, max_nodes: int, draft_len: int, max_width: int,
              rng: np.random.Generator | None, drafter: str = "") -> TreeProposal:
    """A tree of at most ``max_nodes`` nodes, ``draft_len`` deep, ``max_width`` children a node.

    ``rng`` None: deterministic (temperature 0), the children being q's most probable tokens in
    order; else children are drawn from q without replacement and the proposal carries ``child_q``.
    ``q_at``: the draft's q after each of a list of token paths (see the module notes).
    """
    tokens: list[int] = []
    parents: list[int] = []
    depths: list[int] = []
    scores: list[float] = []
    paths: dict[int, tuple[int, ...]] = {ROOT: ()}
    q_of: dict[int, np.ndarray] = {}
    left: dict[int, np.ndarray] = {}  # q at a node, its drawn children removed (unnormalised)
    width: dict[int, int] = {}
    waiting: list[int] = []  # nodes that may get children and whose q is not asked for yet
    # Slots: (-priority, order, node); order breaks ties by age.
    slots: list[tuple[float, int, int]] = [(-1.0, 0, ROOT)]
    order = 1
    while slots and len(tokens) < max_nodes:
        _, _, node = heapq.heappop(slots)
        if node not in q_of:
            batch = [node, *(n for n in waiting if n != node)] if node != ROOT else [ROOT]
            for n, q in zip(batch, q_at([paths[n] for n in batch]), strict=True):
                q_of[n] = np.asarray(q, dtype=np.float64)
                left[n] = q_of[n].copy()
            if node != ROOT:
                waiting.clear()
        rest = left[node]
        mass = float(rest.sum())
        if not mass > 0.0:
            continue
        if rng is None:
            tok = int(np.argmax(rest))
        else:
            tok = int(rng.choice(rest.size, p=rest / mass))
        prob = float(q_of[node][tok])
        rest[tok] = 0.0
        width[node] = width.get(node, 0) + 1
        parent_score = 1.0 if node == ROOT else scores[node]
        child = len(tokens)
        tokens.append(tok)
        parents.append(node)
        depths.append(1 if node == ROOT else depths[node] + 1)
        scores.append(parent_score * prob)
        paths[child] = (*paths[node], tok)
        if depths[child] < draft_len and len(tokens) < max_nodes:
            heapq.heappush(slots, (-scores[child], order, child))
            waiting.append(child)
            order += 1
        if width[node] < max_width and rest.sum() > 0.0:
            heapq.heappush(slots, (-parent_score * float(rest.sum()), order, node))
            order += 1
    tree = CandidateTree(tuple(tokens), tuple(parents), tuple(depths), tuple(scores))
    child_q = None if rng is None else {paths[n]: q for n, q in q_of.items() if width.get(n, 0) > 0}
    return TreeProposal(tree, drafter, child_q=child_q)


def grow_on_node_sequences(remove_seq: Callable[[int], None], seq_of: dict[tuple[int, ...], int],
                           q_at: QBatch, sampler: Sampler, *,
                           max_nodes: int, draft_len: int, max_width: int, drafter: str) -> TreeProposal:
    """``grow_tree`` over ``q_at``, which decodes each node on a sequence of a draft cache's own (``seq_of``:
    path -> sequence, the root's 0); every node sequence is removed afterwards (``remove_seq``), whatever
    happened, so the cache holds the history again."""
    try:
        return grow_tree(q_at, max_nodes=max_nodes, draft_len=draft_len, max_width=max_width,
                         rng=None if sampler.params.greedy else sampler.rng, drafter=drafter)
    finally:
        for seq in range(1, len(seq_of)):
            remove_seq(seq)
