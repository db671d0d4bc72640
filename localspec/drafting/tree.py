"""Candidate trees: several deterministic continuations verified in one batch.

A tree is built from continuations with counts (from the n-gram index or the
REST datastore). Its root is the last token of the history, which is *not* a
node; every node is one drafted token. A node's probability is the product of
the conditional frequencies along its path, which equals the share of the
continuations' weight that starts with the node's path. The tree keeps the
most probable nodes under a size budget.

Verification (``localspec.acceptance.accept_tree``) walks the tree with the
target's own choices; children of a node hold distinct tokens (``child``).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

from localspec.acceptance import ROOT



@dataclass(frozen=True)
class CandidateTree:
    """A trie of drafted tokens, flattened for one verification batch.

    Node ``i`` holds ``tokens[i]`` at ``depths[i]`` (1 = right after the
    history) below ``parents[i]`` (``ROOT`` for depth 1). Parents come before
    their children, and nodes are listed most probable first, so every prefix
    of the node list is itself a valid (smaller) tree.
    """

    tokens: tuple[int, ...] = ()
    parents: tuple[int, ...] = ()
    depths: tuple[int, ...] = ()
    probs: tuple[float, ...] = ()
    _children: dict[tuple[int, int], int] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        n = len(self.tokens)
        if not (len(self.parents) == len(self.depths) == len(self.probs) == n):
            raise ValueError("a tree needs one parent, depth and probability per token")
        children: dict[tuple[int, int], int] = {}
        for i, (token, parent, depth) in enumerate(zip(self.tokens, self.parents, self.depths)):
            if parent >= i or parent < ROOT:
                raise ValueError(f"node {i}: its parent {parent} must come before it")
            if depth != (1 if parent == ROOT else self.depths[parent] + 1):
                raise ValueError(f"node {i}: depth {depth} does not follow its parent's")
            if (parent, token) in children:
                raise ValueError(f"node {i}: token {token} repeats under parent {parent}")
            children[(parent, token)] = i
        object.__setattr__(self, "_children", children)

    def __len__(self) -> int:
        return len(self.tokens)

    def truncated(self, depth: int) -> "CandidateTree":
        """The nodes at depth <= ``depth``, in the same order (a parent is never cut before its child)."""
        keep = [i for i, d in enumerate(self.depths) if d <= depth]
        if len(keep) == len(self):
            return self
        index = {old: new for new, old in enumerate(keep)}
        return CandidateTree(tuple(self.tokens[i] for i in keep),
                             tuple(ROOT if self.parents[i] == ROOT else index[self.parents[i]] for i in keep),
                             tuple(self.depths[i] for i in keep), tuple(self.probs[i] for i in keep))

    def child(self, node: int, token: int) -> int | None:
        """The child of ``node`` (``ROOT`` for the root) holding ``token``, if any."""
        return self._children.get((node, token))

    @property
    def leaves(self) -> tuple[int, ...]:
        """Nodes without children, in node order."""
        has_child = set(self.parents)
        return tuple(i for i in range(len(self)) if i not in has_child)

    def path(self, node: int) -> tuple[int, ...]:
        """Node indices from depth 1 down to ``node``."""
        out: list[int] = []
        while node != ROOT:
            out.append(node)
            node = self.parents[node]
        return tuple(reversed(out))

    def walk(self, accepted: Sequence[int]) -> tuple[tuple[int, int], ...]:
        """How verification went down the tree, keeping the tokens ``accepted``: for the root and each
        kept node, (the children it has, the rank among them, in node order, of the one kept; -1 at
        the last, where none was). The ranks say where a tree beat its chain (a sibling kept) and
        teach the controller how often siblings are (``Controller``)."""
        children: dict[int, list[int]] = {}
        for i, parent in enumerate(self.parents):
            children.setdefault(parent, []).append(i)
        out: list[tuple[int, int]] = []
        node = ROOT
        for token in accepted:
            kids = children.get(node, [])
            child = self.child(node, token)
            if child is None:
                break
            out.append((len(kids), kids.index(child)))
            node = child
        out.append((len(children.get(node, [])), -1))
        return tuple(out)

    @property
    def leaf_paths(self) -> tuple[tuple[int, ...], ...]:
        """For each leaf (in ``leaves`` order), the node indices of its path."""
        return tuple(self.path(leaf) for leaf in self.leaves)

    @property
    def branches(self) -> tuple[tuple[int, ...], ...]:
        """For each leaf, the token sequence from the root to it."""
        return tuple(tuple(self.tokens[i] for i in p) for p in self.leaf_paths)

    def ancestor_mask(self) -> np.ndarray:
        """``mask[i, j]`` is True when node ``j`` is ``i`` or one of its ancestors.

        This is the attention pattern of tree verification: each drafted token
        sees the history plus its own path.
        """
        n = len(self)
        mask = np.zeros((n, n), dtype=bool)
        for i, parent in enumerate(self.parents):
            if parent != ROOT:
                mask[i] = mask[parent]  # parents come first, so their row is complete
            mask[i, i] = True
        return mask


def build_tree(
    continuations: Iterable[tuple[Sequence[int], float]],
    *,
    max_nodes: int = 64,
    max_depth: int = 8,
    max_leaves: int | None = None,
    min_prob: float = 0.0,
) -> CandidateTree:
    """The most probable part of the trie of ``continuations``.

    Each continuation is ``(tokens, weight)`` with weight > 0 (a count, or a
    recency-weighted count). Nodes are chosen best-first by probability (ties:
    shallower first, then smaller token path) until ``max_nodes`` are chosen,
    no candidate reaches ``min_prob``, or every remaining candidate would open
    a branch beyond ``max_leaves``. Nodes deeper than ``max_depth`` are never
    built. Best-first selection keeps parents before children, because a
    child is never more probable than its parent.
    """
    if max_nodes < 0 or max_depth < 0:
        raise ValueError("max_nodes and max_depth must be >= 0")
    # The full trie up to max_depth, as nested dicts: token -> [weight, children].
    root: dict[int, list] = {}
    total = 0.0
    for tokens, weight in continuations:
        if weight <= 0:
            raise ValueError("continuation weights must be positive")
        total += weight
        level = root
        for token in list(tokens)[:max_depth]:
            entry = level.get(int(token))
            if entry is None:
                entry = level[int(token)] = [0.0, {}]
            entry[0] += weight
            level = entry[1]
    if total <= 0:
        return CandidateTree()

    tokens_out: list[int] = []
    parents: list[int] = []
    depths: list[int] = []
    probs: list[float] = []
    child_count: dict[int, int] = {}  # selected children per selected node (ROOT included)
    n_leaves = 0
    # Heap of (-prob, depth, token path, parent index, children dict).
    frontier: list[tuple[float, int, tuple[int, ...], int, dict]] = []
    for token, (weight, kids) in root.items():
        heapq.heappush(frontier, (-weight / total, 1, (token,), ROOT, kids))
    while frontier and len(tokens_out) < max_nodes:
        neg_prob, depth, path, parent, kids = heapq.heappop(frontier)
        if -neg_prob < min_prob:
            break  # everything left is less probable still
        # A child of a node that already has one opens a new branch; the first
        # child of a leaf only lengthens it (the root counts as a leaf of none).
        opens_branch = child_count.get(parent, 0) > 0 or parent == ROOT
        if opens_branch and max_leaves is not None and n_leaves >= max_leaves:
            continue
        n_leaves += opens_branch
        child_count[parent] = child_count.get(parent, 0) + 1
        node = len(tokens_out)
        tokens_out.append(path[-1])
        parents.append(parent)
        depths.append(depth)
        probs.append(-neg_prob)
        for token, (weight, grandkids) in kids.items():
            heapq.heappush(frontier, (-weight / total, depth + 1, path + (token,), node, grandkids))
    return CandidateTree(tuple(tokens_out), tuple(parents), tuple(depths), tuple(probs))


def tree_from_branches(branches: Iterable[Sequence[int]]) -> CandidateTree:
    """A tree holding exactly ``branches`` (equal weights), without pruning."""
    items = [(tuple(b), 1.0) for b in branches if len(b)]
    depth = max((len(b) for b, _ in items), default=0)
    return build_tree(items, max_nodes=sum(len(b) for b, _ in items), max_depth=depth)
