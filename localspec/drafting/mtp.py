"""The target's own multi-token-prediction (MTP / NextN) layers as the drafter.

A model trained with MTP carries, after its trunk, a small block that reads
the embedding of token ``x_p`` together with the trunk's final hidden state
``h_{p-1}`` of the position before, and predicts ``x_{p+1}``. Drafting with
it needs no second model: the head runs in a second llama.cpp context over
the target's own weights (``backend.MtpContext``).

The head's cache is kept in step with the history lazily:

* every target decode hands its hidden rows to ``observe`` (registered on the
  target context), keyed by (position, token) so a tree verification's
  accepted path is found too (a key two nodes share is ambiguous and dropped);
* ``propose`` first feeds the head the history it has not seen (the
  catch-up), each token ``x_p`` paired with the target's ``h_{p-1}``, ending
  with the history's last token, whose logits give the first draft token; then
  each further draft token is fed with the head's OWN hidden output in place
  of the target's (the target has not computed it yet). Those draft rows are
  dropped before the next catch-up, which rebuilds them from the target's rows.

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

Memory: the target's hidden rows wait in ``rows`` (``HiddenRows``) until a catch-up consumes
them. While the controller keeps the head off, they would pile up with the
context (n_embd floats per token: 20 KiB for a 5120-wide model); at most
``max_row_bytes`` of them are kept, the oldest positions dropped first. A
catch-up over a dropped position feeds zeros for ``h`` there: the head's
cache is then less informed at those old positions, which costs acceptance,
never correctness (the target verifies every draft). The catch-up's time is
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

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from localspec.drafting.base import DrafterBase, Proposal, TreeProposal, draft_token
from localspec.drafting.draft_tree import TREE_WIDTH, grow_fed_tree
from localspec.drafting.hidden_rows import HiddenRows
from localspec.drafting.mtp_tree import grow_chained_tree
from localspec.models.memory import DRAFT_ROWS_MAX_BYTES
from localspec.sampling import Sampler

MAX_ROW_BYTES = DRAFT_ROWS_MAX_BYTES
"""Default cap on the target hidden rows an MTP drafter keeps for its next catch-up."""


class HiddenSource(Protocol):
    """The target context, as far as the MTP drafter needs it (``backend.Context``)."""

    def hidden_rows(self, n: int) -> np.ndarray: ...

    def add_decode_listener(self, listener) -> None: ...

    def remove_decode_listener(self, listener) -> None: ...


class HeadContext(Protocol):
    """The MTP head's own context (``backend.MtpContext``)."""

    n_embd: int
    n_batch: int
    n_ctx: int
    n_heads: int
    n_seq: int

    def set_head(self, head: int) -> None: ...

    def decode(self, tokens: Sequence[int], positions: Sequence[int], hidden: np.ndarray,
               outputs: Sequence[bool], seqs: Sequence[int] | None = None) -> None: ...

    def copy_seq(self, src: int, dst: int, p0: int = 0, p1: int = -1) -> None: ...

    def remove_seq(self, seq_id: int) -> None: ...

    def logits(self, row: int) -> np.ndarray: ...

    def hidden(self, row: int) -> np.ndarray: ...

    def rollback_to(self, n: int) -> None: ...


class MtpDrafter(DrafterBase):
    """Drafts with the target's MTP head(s); ``accepted``/``reset`` follow the drafter protocol.

    ``p_min``: stop drafting when the head's own top probability falls below it.
    ``max_row_bytes``: the most target hidden rows (in bytes) kept for the next catch-up
    (default ``MAX_ROW_BYTES``). ``propose_tree`` (a head context with sequences for the nodes): a tree
    grown level by level as a draft model's is, each node on a sequence of its own. One head: each node
    at the position after its parent's, fed its parent's own hidden output, sharing its parent's cells.
    Chained heads: a node at depth d < n_heads has head d rebuild its path's draft region in its layer,
    as the chain does, the nodes past the last head grow as one head's (``mtp_tree``).
    """

    name = "mtp"

    def __init__(self, head: HeadContext, target: HiddenSource, sampler: Sampler, *, p_min: float = 0.0,
                 max_row_bytes: int | None = None) -> None:
        self.head = head
        self.target = target
        self.sampler = sampler
        self.p_min = p_min
        self.n_heads = max(1, head.n_heads)
        max_rows = (MAX_ROW_BYTES if max_row_bytes is None else max_row_bytes) // (4 * head.n_embd)
        self.rows = HiddenRows(head.n_embd, max(2, max_rows))
        self.tree_width = TREE_WIDTH if head.n_seq > 1 else 0
        # Tokens the head's cache holds at positions 0.., each built from the target's hidden row
        # (in every head's layer).
        self._tokens: list[int] = []
        target.add_decode_listener(self.observe)

    # --- the target's hidden rows ------------------------------------------
    def observe(self, tokens: Sequence[int], positions: Sequence[int],
                seq_ids: Sequence[Sequence[int]] | None) -> None:
        """Keep the hidden rows of a target decode (called by the target context after each one)."""
        if tokens:
            self.rows.add(tokens, positions, self.target.hidden_rows(len(tokens)))

    # --- the protocol ------------------------------------------------------
    def _fed(self, history: Sequence[int]) -> int:
        """How much of ``history`` the head's cache holds (the last token is always fed again)."""
        n = 0
        for a, b in zip(self._tokens, history):
            if a != b:
                break
            n += 1
        return min(n, len(history) - 1)

    def behind(self, history: Sequence[int]) -> int:
        return len(history) - self._fed(history)

    def _catch_up(self, history: Sequence[int], n: int, *, logits: bool) -> int:
        """Feed the current head ``history[n:]``; return the batch row holding the last token (with its
        logits when ``logits``: only the head that drafts first needs them)."""
        self.head.rollback_to(n)
        row = 0
        while n < len(history):
            end = min(len(history), n + self.head.n_batch)
            positions = range(n, end)
            hidden = np.stack([self.rows.row(history, p - 1) for p in positions])
            outputs = [logits and p == len(history) - 1 for p in positions]
            self.head.decode(history[n:end], positions, hidden, outputs)
            row = end - 1 - n
            n = end
        return row

    def _sync(self, history: Sequence[int]) -> int:
        """Catch every head up on ``history`` (head 0 last: its logits for the last token start the
        draft); return the batch row holding those logits."""
        n = self._fed(history)
        del self._tokens[n:]
        try:
            # All heads share the cache's cells (one per position, a layer per head): each pass
            # frees the cells from n on and refills the same ones in its own layer.
            for h in [*range(1, self.n_heads), 0]:
                if self.n_heads > 1:
                    self.head.set_head(h)
                row = self._catch_up(history, n, logits=h == 0)
        except BaseException:
            self._tokens.clear()  # a failed decode leaves the head's cache unknown (it was cleared)
            raise
        self._tokens.extend(history[n:])
        self.rows.drop_before(len(history) - 2)  # consumed; the next catch-up needs no more
        return row

    def propose(self, history: Sequence[int], draft_len: int) -> Proposal:
        if draft_len <= 0 or not history:
            return Proposal(drafter=self.name)
        row = self._sync(history)
        try:
            return self._draft(history, draft_len, row)
        except BaseException:
            self._tokens.clear()  # a failed draft decode cleared the head's cache: catch up from 0 next time
            raise

    def propose_tree(self, history: Sequence[int], draft_len: int, nodes: int) -> Proposal | TreeProposal:
        nodes = min(nodes, self.head.n_seq)  # each decoded node takes a sequence
        if self.n_heads > 1:  # and up to n_heads cells (a chained node rebuilds its draft region)
            nodes = min(nodes, (self.head.n_ctx - len(history)) // self.n_heads)
        if self.tree_width <= 1 or nodes <= draft_len or draft_len <= 0 or not history:
            return self.propose(history, draft_len)
        row = self._sync(history)
        try:
            if self.n_heads > 1:
                pos0 = len(history) - 1
                return grow_chained_tree(self.head, self.sampler, row, n_heads=self.n_heads, x_last=history[-1],
                                         pos0=pos0, target_row=self.rows.row(history, pos0 - 1), max_nodes=nodes,
                                         max_depth=draft_len, max_width=self.tree_width, drafter=self.name)
            # The last token's row is len(history) - 1; a node of depth d sits d further.
            return grow_fed_tree(self.head, self.sampler, row, len(history), max_nodes=nodes,
                                 max_depth=draft_len, max_width=self.tree_width, drafter=self.name)
        except BaseException:
            self._tokens.clear()  # a failed draft decode cleared the head's cache: catch up from 0 next time
            raise

    def _draft(self, history: Sequence[int], draft_len: int, row: int) -> Proposal:
        """Draft from the logits at batch row ``row`` of the catch-up (``propose``, after ``_sync``)."""
        greedy = self.sampler.params.greedy
        tokens: list[int] = []
        probs: list[np.ndarray] = []
        pos0 = len(history) - 1
        # The hidden rows the draft region is built from: the target's before the last token, then
        # each head's own output for the token it drafted.
        chain = [self.rows.row(history, pos0 - 1)]
        for depth in range(draft_len):
            picked = draft_token(self.head.logits(row), self.sampler, self.p_min, history, tokens)
            if picked is None:
                break
            tok, q = picked
            if q is not None:
                probs.append(q)
            tokens.append(tok)
            if depth + 1 == draft_len:
                break
            chain.append(np.array(self.head.hidden(row)))
            if depth + 1 < self.n_heads:
                # Head depth+1 drafts the next token over the whole draft region, rebuilt in its layer.
                self.head.set_head(depth + 1)
                self.head.rollback_to(pos0)
                n = len(chain)
                self.head.decode([history[-1], *tokens], range(pos0, pos0 + n), np.stack(chain),
                                 [False] * (n - 1) + [True])
                row = n - 1
            else:
                # The last head (or the only one) drafts on from its own output.
                self.head.decode([tok], [pos0 + depth + 1], chain[-1][None, :], [True])
                row = 0
        return Proposal(tuple(tokens), None if greedy else tuple(probs), self.name)

    def accepted(self, history: Sequence[int], n_accepted: int) -> None:
        # Nothing eager: the next propose() rebuilds the head's rows from the target's hidden rows.
        pass

    def reset(self) -> None:
        # The head's cache may keep a prefix the new history shares (its rows came from the target's);
        # _sync compares it afresh.
        pass

    def close(self) -> None:
        self.target.remove_decode_listener(self.observe)
