"""The target's own multi-token-prediction (MTP / NextN) layers as the drafter.

A model trained with MTP carries, after its trunk, a small block that reads
the embedding of token ``x_p`` together with the trunk's final hidden state
``h_{p-1}`` of the position before, and predicts ``x_{p+1}``. Drafting with
it needs no second model: the head runs in a second llama.cpp context over
the target's own weights (``backend.MtpContext``).

The head's cache is kept in step with the history lazily, as every head fed
the target's rows is (``fed.FedDrafter``): ``propose`` first feeds the head
the history it has not seen (the catch-up), each token ``x_p`` paired with the
target's ``h_{p-1}``, ending with the history's last token, whose logits give
the first draft token; then each further draft token is fed with the head's
OWN hidden output in place of the target's (the target has not computed it
yet). Those draft rows are dropped before the next catch-up, which rebuilds
them from the target's rows.

Several heads (Step 3.5 trains one NextN block per draft depth): head ``i``
drafts the token at depth ``i + 1``. Each head is its own layer of the head's
cache, so the catch-up runs every head over the new history (one pass each,
as llama.cpp's ``draft-mtp`` does). Draft step ``i`` runs head ``i`` over the
whole draft region again, ``[x_last, d_1 .. d_i]`` paired with
``[h_{last-1}, o_0 .. o_{i-1}]`` (``o_j``: head j's hidden output for the token
it drafted), since head i's layer holds nothing there yet. Beyond the last
head, the last head drafts on recursively as a single head does (its own
output for its input): llama.cpp stops at the last head instead; here the
controller, which learns the acceptance at every depth, decides how deep the
drafts are worth it. A tree (``propose_tree``) does the same per path: a node at
depth d < n_heads has head d rebuild its own path's region on a sequence of its
own (``mtp_tree``).

Memory: the target's hidden rows wait in ``rows`` until a catch-up consumes
them. While the controller keeps the head off, they would pile up with the
context (n_embd floats per token: 20 KiB for a 5120-wide model); at most
``max_row_bytes`` of them are kept (``fed``). The catch-up's time is
what the cost model charges the decision that causes it (``behind``;
``CostModel.catch_up_ms``, one pass per head).

At temperature > 0 the draft tokens are sampled from the head's distribution
q under the target's sampling settings, and the proposal carries q: the
verifier accepts by exact rejection sampling (min(1, p/q), resampling from
norm(max(p - q, 0))), so the output is distributed exactly as the target's.
llama.cpp's ``draft-mtp`` takes the head's top token and keeps it only on an
exact match. At temperature 0 both are greedy matches.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from localspec.drafting.base import Proposal, TreeProposal
from localspec.drafting.draft_tree import TREE_WIDTH
from localspec.drafting.fed import FedDrafter, FedHead, Target
from localspec.drafting.mtp_tree import grow_chained_tree
from localspec.sampling import Sampler


class MtpDrafter(FedDrafter):
    """Drafts with the target's MTP head(s) (``head``: ``backend.MtpContext``); the drafter protocol.

    ``p_min``: stop drafting when the head's own top probability falls below it.
    ``max_row_bytes``: the most target hidden rows (in bytes) kept for the next catch-up
    (default ``fed.MAX_ROW_BYTES``). ``propose_tree`` (a head context with sequences for the nodes): a tree
    grown level by level as a draft model's is, each node on a sequence of its own. One head: each node
    at the position after its parent's, fed its parent's own hidden output, sharing its parent's cells.
    Chained heads: a node at depth d < n_heads has head d rebuild its path's draft region in its layer,
    as the chain does, the nodes past the last head grow as one head's (``mtp_tree``).
    """

    name = "mtp"
    lag = 1  # row p: the token x_p with the target's h_{p-1}
    head: FedHead

    def __init__(self, head: FedHead, target: Target, sampler: Sampler, *, p_min: float = 0.0,
                 max_row_bytes: int | None = None) -> None:
        super().__init__(head, target, target.hidden_rows, head.n_embd, sampler, p_min=p_min,
                         max_row_bytes=max_row_bytes)
        self.n_heads = max(1, head.n_heads)
        self.tree_width = TREE_WIDTH if head.n_seq > 1 else 0

    def _rebuild(self, history: Sequence[int], start: int, end: int, *, logits: bool = True) -> int:
        # Every head over the new rows, head 0 last (its logits for the last token start the draft). All
        # heads share the cache's cells (one per position, a layer per head): each pass frees the cells
        # from start on and refills the same ones in its own layer.
        for h in [*range(1, self.n_heads), 0]:
            if self.n_heads > 1:
                self.head.set_head(h)
            row = super()._rebuild(history, start, end, logits=logits and h == 0)
        return row

    def _feed(self, tokens: Sequence[int], positions: Sequence[int], rows: np.ndarray,
              outputs: Sequence[bool]) -> None:
        self.head.decode(tokens, positions, rows, outputs)

    def _tree_nodes(self, history: Sequence[int], nodes: int) -> int:
        nodes = super()._tree_nodes(history, nodes)
        if self.n_heads > 1:  # and up to n_heads cells a node (a chained node rebuilds its draft region)
            nodes = min(nodes, (self.head.n_ctx - len(history)) // self.n_heads)
        return nodes

    def _next_logits(self, history: Sequence[int], row: int) -> Callable[[int, Sequence[int]], np.ndarray | None]:
        if self.n_heads == 1:
            return super()._next_logits(history, row)
        pos0 = len(history) - 1
        # The hidden rows the draft region is built from: the target's before the last token, then
        # each head's own output for the token it drafted.
        chain = [self.rows.row(history, pos0 - 1)]
        at = row

        def logits(depth: int, drafted: Sequence[int]) -> np.ndarray:
            nonlocal at
            if depth > 0:
                chain.append(np.array(self.head.hidden(at)))
                if depth < self.n_heads:
                    # Head `depth` drafts the next token over the whole draft region, rebuilt in its layer.
                    self.head.set_head(depth)
                    self.head.rollback_to(pos0)
                    n = len(chain)
                    self.head.decode([history[-1], *drafted], range(pos0, pos0 + n), np.stack(chain),
                                     [False] * (n - 1) + [True])
                    at = n - 1
                else:
                    # The last head drafts on from its own output.
                    self.head.decode([drafted[-1]], [pos0 + depth], chain[-1][None, :], [True])
                    at = 0
            return self.head.logits(at)

        return logits

    def _tree(self, history: Sequence[int], draft_len: int, nodes: int, row: int) -> Proposal | TreeProposal:
        if self.n_heads == 1:
            return super()._tree(history, draft_len, nodes, row)
        pos0 = len(history) - 1
        return grow_chained_tree(self.head, self.sampler, row, n_heads=self.n_heads, x_last=history[-1], pos0=pos0,
                                 target_row=self.rows.row(history, pos0 - 1), history=history, max_nodes=nodes,
                                 draft_len=draft_len,
                                 max_width=self.tree_width, drafter=self.name)
