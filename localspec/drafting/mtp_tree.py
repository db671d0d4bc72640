"""Draft trees for chained MTP heads (Step 3.5: one NextN block per draft depth).

Head ``i`` gives the q of the token at depth ``i + 1``. A chain (``MtpDrafter._draft``) runs head ``d``
over the whole draft region ``[x_last, t_1 .. t_d]`` in its own layer of the head's cache, fed the chain of
hidden rows ``[h_target, o_0 .. o_{d-1}]`` (``h_target``: the target's row before ``x_last``; ``o_j``: head
j's own output for the token it drafted), because head d's layer holds nothing past the history. A tree
does the same per path: a node whose path is ``d`` < n_heads tokens long decodes its own region on a
sequence of its own, which shares the history's cells of sequence 0 (positions before ``x_last``'s) and
nothing of its parent's (those are another head's layer), fed its own path's chain of outputs. Past the
last head a node is one row, as a single head's tree grows (``fed.grow_fed_tree``): the last head
at its parent's position + 1, on a sequence sharing its parent's cells, fed its parent's output.

A tree level costs more rows than a one-head tree's: ``d + 1`` a node at depth ``d`` < n_heads
(``CostModel.tree_draft_ms`` prices them so). ``grow_tree`` may ask in one call for nodes of several
depths (hence several heads): a decode runs one head, so a call is one decode per head it needs (more
when the rows exceed the head's batch). In each decode every node's rows but its last go first and the
last rows (the outputs) after them, so llama.cpp computes logits for the outputs only; the order of a
batch's rows changes nothing in what they attend to (each row sees its own sequence's cells at its
position or before, in this decode or earlier).

The q of each node is the one its children are drawn from, whatever head and path produced it, so the
tree's verification (recursive rejection sampling over sampled siblings) stays exact at T > 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from localspec.drafting.base import TreeProposal
from localspec.drafting.draft_tree import grow_on_node_sequences, tree_q
from localspec.drafting.fed import FedHead
from localspec.sampling import Sampler

Path = tuple[int, ...]


@dataclass(frozen=True)
class NodeDecode:
    """The rows one tree node decodes to give the q after its ``path``.

    ``share``: (sequence, position): the node's sequence first shares that sequence's cells before the
    position. ``fed[i]``: the path whose node's hidden output row i is fed (None: the target's row
    before ``x_last``). The last row is the output.
    """

    path: Path
    seq: int
    share: tuple[int, int]
    tokens: tuple[int, ...]
    positions: tuple[int, ...]
    fed: tuple[Path | None, ...]


def head_for(depth: int, n_heads: int) -> int:
    """The head giving the q after a path ``depth`` tokens long: head ``depth``, the last one past it."""
    return min(depth, n_heads - 1)


def node_decode(path: Path, seq: int, parent_seq: int, *, x_last: int, pos0: int, n_heads: int) -> NodeDecode:
    """What node ``path`` decodes on sequence ``seq`` (its parent's: ``parent_seq``); ``x_last`` sits at
    ``pos0``, the node's last token at ``pos0 + len(path)``."""
    depth = len(path)
    if depth < n_heads:
        # Head `depth` rebuilds the draft region in its layer, over the history alone.
        return NodeDecode(path, seq, (0, pos0), (x_last, *path), tuple(range(pos0, pos0 + depth + 1)),
                          (None, *(path[:j] for j in range(depth))))
    # Past the last head: one row over the parent's cells, fed the parent's output.
    return NodeDecode(path, seq, (parent_seq, pos0 + depth), (path[-1],), (pos0 + depth,), (path[:-1],))


def level_batches(nodes: Sequence[NodeDecode], n_heads: int, n_batch: int) -> list[tuple[int, list[NodeDecode]]]:
    """The decodes for ``nodes``: (head, its nodes), one per head needed, split where the rows would
    exceed ``n_batch`` (a node's rows stay in one decode)."""
    batches: list[tuple[int, list[NodeDecode]]] = []
    for head in sorted({head_for(len(n.path), n_heads) for n in nodes}):
        batch: list[NodeDecode] = []
        rows = 0
        for node in (n for n in nodes if head_for(len(n.path), n_heads) == head):
            if len(node.tokens) > n_batch:
                raise ValueError(f"a tree node of {len(node.tokens)} rows exceeds n_batch={n_batch}")
            if rows + len(node.tokens) > n_batch:
                batches.append((head, batch))
                batch, rows = [], 0
            batch.append(node)
            rows += len(node.tokens)
        batches.append((head, batch))
    return batches


@dataclass(frozen=True)
class BatchRows:
    """One decode's rows, every node's last row (its output) at the end, in the order of the nodes."""

    tokens: list[int]
    positions: list[int]
    seqs: list[int]
    fed: list[Path | None]
    outputs: list[bool]

    @property
    def first_output(self) -> int:
        return len(self.tokens) - sum(self.outputs)


def batch_rows(nodes: Sequence[NodeDecode]) -> BatchRows:
    """The rows of one decode of ``nodes``: the rows before each node's last first, then the last rows, so
    that the outputs are a suffix of the batch (``MtpContext.decode`` computes logits from the first output
    on)."""
    order = [(n, i) for n in nodes for i in range(len(n.tokens) - 1)] + [(n, len(n.tokens) - 1) for n in nodes]
    return BatchRows([n.tokens[i] for n, i in order], [n.positions[i] for n, i in order], [n.seq for n, _ in order],
                     [n.fed[i] for n, i in order], [i == len(n.tokens) - 1 for n, i in order])


def grow_chained_tree(head: FedHead, sampler: Sampler, row: int, *, n_heads: int, x_last: int, pos0: int,
                      target_row: np.ndarray, history: Sequence[int], max_nodes: int, draft_len: int,
                      max_width: int, drafter: str) -> TreeProposal:
    """``grow_tree`` for chained heads, after a catch-up that left head 0's logits and hidden output for
    ``x_last`` (at ``pos0``) at batch row ``row``; ``target_row``: the target's hidden row before ``x_last``;
    each node's q is shaped as the target's row after ``history`` and the node's path (``tree_q``).

    Every node decoded takes a sequence (``max_nodes`` within the head's), removed afterwards: the head's
    cache then holds the history again (sequence 0).
    """
    seq_of: dict[Path, int] = {(): 0}
    hidden_of: dict[Path, np.ndarray] = {(): np.array(head.hidden(row))}
    root = tree_q(head.logits(row), sampler, history)

    def q_at(paths: Sequence[Path]) -> list[np.ndarray]:
        if list(paths) == [()]:
            return [root]
        nodes = []
        for path in paths:
            seq = seq_of[path] = len(seq_of)
            nodes.append(node_decode(path, seq, seq_of[path[:-1]], x_last=x_last, pos0=pos0, n_heads=n_heads))
        q_of: dict[Path, np.ndarray] = {}
        for h, batch in level_batches(nodes, n_heads, head.n_batch):
            for node in batch:
                head.copy_seq(node.share[0], node.seq, 0, node.share[1])
            rows = batch_rows(batch)
            fed = np.stack([target_row if key is None else hidden_of[key] for key in rows.fed])
            head.set_head(h)
            head.decode(rows.tokens, rows.positions, fed, rows.outputs, rows.seqs)
            for i, node in enumerate(batch, start=rows.first_output):
                hidden_of[node.path] = np.array(head.hidden(i))
                q_of[node.path] = tree_q(head.logits(i), sampler, history, node.path)
        return [q_of[path] for path in paths]

    return grow_on_node_sequences(head.remove_seq, seq_of, q_at, sampler, max_nodes=max_nodes,
                                  draft_len=draft_len, max_width=max_width, drafter=drafter)
