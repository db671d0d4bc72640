"""What the drafters fed the target's own rows share: MTP, EAGLE-3, DFlash (and Gemma 4's assistant, which
keeps the rows but no cache of its own).

Each keeps, from every target decode, the rows it drafts from (``observe``: the target's hidden state or the
inputs of the layers it taps), keyed by (position, token) in ``rows`` (``HiddenRows``), at most
``max_row_bytes`` of them, the oldest first dropped. A head with a cache keeps it in step with the history
lazily: ``propose`` first rebuilds the rows the cache lacks (the catch-up), then drafts; its draft rows are
dropped before the next catch-up rebuilds them from the target's.

The catch-up is one loop for every head. Row ``p`` of the head's cache reads the target's row at
``p - lag`` and, where the head reads tokens, the token after it, ``history[p - lag + 1]``:

============  ===  ===========  ============================================================
head          lag  reads token  row p
============  ===  ===========  ============================================================
MTP           1    yes          ``x_p`` with the target's ``h_{p-1}`` (predicts ``x_{p+1}``)
EAGLE-3       0    yes          ``x_{p+1}`` with ``g_p``, the encoded features at p
DFlash        0    no           the features at p, injected
============  ===  ===========  ============================================================

The rows run up to the one that reads the history's last token, or for DFlash the last target row
(the last token is its block's anchor). A row stays valid while the history it read is unchanged;
the row that reads the last token is rebuilt every time, as its logits start the draft.
A row the target never kept (dropped for the cap, or a key two tree branches share) is read as
zeros: that costs acceptance, never correctness (the target verifies every draft).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Protocol

import numpy as np

from localspec.drafting.base import DrafterBase, Proposal, TreeProposal, draft_chain
from localspec.drafting.draft_tree import grow_on_node_sequences, tree_q
from localspec.drafting.hidden_rows import HiddenRows
from localspec.models.memory import DRAFT_ROWS_MAX_BYTES
from localspec.sampling import Sampler
from localspec.token_ids import as_list, held_prefix

MAX_ROW_BYTES = DRAFT_ROWS_MAX_BYTES
"""Default cap on the target rows a drafter keeps for its next catch-up."""
SYNC_CHECK = 16
"""The tokens at the end of what the cache was built from that a growing history is checked against."""


class Target(Protocol):
    """The target context, as far as a drafter fed its rows needs it (``backend.Context``)."""

    def hidden_rows(self, n: int) -> np.ndarray: ...

    def layer_features(self, n: int) -> np.ndarray: ...

    def add_decode_listener(self, listener) -> None: ...

    def remove_decode_listener(self, listener) -> None: ...


class DraftCache(Protocol):
    """What the catch-up needs of a head's cache (every head below, and ``dflash.BlockHead``)."""

    n_batch: int

    def rollback_to(self, n: int) -> None: ...


class FedHead(DraftCache, Protocol):
    """A head fed rows of (token, position, hidden row), with a KV cache and a sequence per tree node:
    the MTP head (``backend.MtpContext``; ``n_heads`` chained NextN layers, ``set_head`` picks one) and
    EAGLE-3's decoder (``backend.Eagle3Context``, one head). ``logits(row)`` and ``hidden(row)`` read an
    output row of the last ``decode``; ``hidden`` is the head's own output, fed to the next draft row."""

    n_embd: int
    n_ctx: int
    n_seq: int
    n_heads: int

    def set_head(self, head: int) -> None: ...

    def decode(self, tokens: Sequence[int], positions: Sequence[int], hidden: np.ndarray,
               outputs: Sequence[bool], seqs: Sequence[int] | None = None) -> None: ...

    def copy_seq(self, src: int, dst: int, p0: int = 0, p1: int = -1) -> None: ...

    def remove_seq(self, seq_id: int) -> None: ...

    def logits(self, row: int) -> np.ndarray: ...

    def hidden(self, row: int) -> np.ndarray: ...


class ListeningDrafter(DrafterBase):
    """A drafter that keeps the rows of every target decode (``read(n)``: the last decode's ``n`` rows, each
    ``width`` floats), at most ``max_rows`` of them, until ``close``."""

    name: str
    follows_each_step = False  # a step it had no part in changes nothing here (see Drafter)

    def __init__(self, target: Target, read: Callable[[int], np.ndarray], width: int, max_rows: int) -> None:
        self.target = target
        self._read = read
        self.rows = HiddenRows(width, max_rows)
        target.add_decode_listener(self.observe)

    def observe(self, tokens: Sequence[int], positions: Sequence[int],
                seq_ids: Sequence[Sequence[int]] | None) -> None:
        """Keep the rows of a target decode (called by the target context after each one)."""
        if tokens:
            self.rows.add(tokens, positions, self._read(len(tokens)))

    def accepted(self, history: Sequence[int], n_accepted: int) -> None:
        # Nothing eager: the next propose() reads what was kept from the target's rows.
        pass

    def close(self) -> None:
        self.target.remove_decode_listener(self.observe)


class FedDrafter(ListeningDrafter):
    """A head with a cache built from the target's rows: the catch-up, chains and trees (see the module notes).

    A subclass sets ``lag`` and ``reads_token``, feeds a batch of rows to its head (``_feed``) and, where it
    drafts otherwise than one row per token fed its own hidden output (``_next_logits``) or grows trees
    otherwise than on a sequence per node (``_tree``), says how. ``p_min``: stop drafting when the head's own
    top probability falls below it.
    """

    lag: ClassVar[int] = 0
    reads_token: ClassVar[bool] = True
    head: Any  # a FedHead (MTP, EAGLE-3) or a dflash.BlockHead: a DraftCache either way

    def __init__(self, head: DraftCache, target: Target, read: Callable[[int], np.ndarray], width: int,
                 sampler: Sampler, *, p_min: float, max_row_bytes: int | None) -> None:
        cap = MAX_ROW_BYTES if max_row_bytes is None else max_row_bytes
        super().__init__(target, read, width, max(2, cap // (4 * width)))
        self.head = head
        self.sampler = sampler
        self.p_min = p_min
        # The history prefix the cache's rows were built from, and whether the next history is known to
        # extend the one they were built for (within a generation: see _shared).
        self._built: list[int] = []
        self._trusted = False

    # --- the catch-up ------------------------------------------------------------------------
    def _end(self, history: Sequence[int]) -> int:
        """One past the last row ``history`` needs (the row reading its last token, or its last target row)."""
        return len(history) - 1 + self.lag

    def _shared(self, history: Sequence[int]) -> int:
        """How many leading tokens of ``history`` the cache was built from (``token_ids.held_prefix``: the
        checked tail within a generation; comparing all of it twice a step and copying it cost 330 µs at
        12,000 tokens on a 2-core CPU, 2 ms token by token, beside a GPU step of a few milliseconds)."""
        return held_prefix(self._built, history, trusted=self._trusted, check=SYNC_CHECK)

    def _stale(self, history: Sequence[int], shared: int | None = None) -> int:
        """The first row to (re)build: row p read ``history[:p - lag + 1 + reads_token]``, valid while that is
        what the cache was built from; the row that reads the last token is always rebuilt."""
        built = min(self._shared(history) if shared is None else shared, len(history) - 1)
        return max(0, built + self.lag - self.reads_token)

    def behind(self, history: Sequence[int]) -> int:
        return max(0, self._end(history) - self._stale(history))

    def _catch_up(self, history: Sequence[int]) -> int:
        """Build the rows ``history`` needs; return the batch row holding the last one (with its logits)."""
        shared = self._shared(history)
        row = self._rebuild(history, self._stale(history, shared), self._end(history))
        keep = len(history) - 1 + self.reads_token
        del self._built[min(shared, keep):]
        self._built.extend(as_list(history[len(self._built):keep]))
        self._trusted = True
        self.rows.drop_before(len(history) - 2)  # consumed; the next catch-up needs no earlier row
        return row

    def _rebuild(self, history: Sequence[int], start: int, end: int, *, logits: bool = True) -> int:
        """Feed the head rows ``start`` .. ``end - 1``, a batch at a time, after dropping the rest of its cache;
        return the batch row of the last (its logits asked for when ``logits``)."""
        self.head.rollback_to(start)
        row = 0
        for p0 in range(start, end, self.head.n_batch):
            positions = range(p0, min(end, p0 + self.head.n_batch))
            rows = np.stack([self.rows.row(history, p - self.lag) for p in positions])
            tokens = [history[p - self.lag + 1] for p in positions] if self.reads_token else []
            self._feed(tokens, positions, rows, [logits and p == end - 1 for p in positions])
            row = len(positions) - 1
        return row

    def _feed(self, tokens: Sequence[int], positions: Sequence[int], rows: np.ndarray,
              outputs: Sequence[bool]) -> None:
        """One batch of the catch-up: the head's rows at ``positions`` from the target's ``rows``."""
        raise NotImplementedError

    # --- drafting ----------------------------------------------------------------------------
    def propose(self, history: Sequence[int], draft_len: int) -> Proposal | TreeProposal:
        return self._propose(history, draft_len, 0)

    def propose_tree(self, history: Sequence[int], draft_len: int, nodes: int) -> Proposal | TreeProposal:
        return self._propose(history, draft_len, self._tree_nodes(history, nodes))

    def _longest(self, draft_len: int) -> int:
        """The most tokens one proposal drafts when ``draft_len`` are asked for."""
        return draft_len

    def _tree_nodes(self, history: Sequence[int], nodes: int) -> int:
        """The nodes a tree may have when ``nodes`` are asked for (each decoded node takes a sequence)."""
        return min(nodes, self.head.n_seq) if self.tree_width > 1 else 0

    def _propose(self, history: Sequence[int], draft_len: int, nodes: int) -> Proposal | TreeProposal:
        draft_len = self._longest(draft_len)
        if draft_len <= 0 or self._end(history) <= 0:
            return Proposal(drafter=self.name)
        try:
            return self._draft(history, draft_len, nodes, self._catch_up(history))
        except BaseException:
            self._built = []  # a failed decode leaves the head's cache unknown (llama.cpp cleared it)
            self._trusted = False
            raise

    def _draft(self, history: Sequence[int], draft_len: int, nodes: int, row: int) -> Proposal | TreeProposal:
        """Draft after the catch-up left the last row's logits at batch row ``row``: a tree of ``nodes``
        when more than a chain's worth are asked for, else a chain."""
        if nodes > draft_len:
            return self._tree(history, draft_len, nodes, row)
        return draft_chain(self._next_logits(history, row), self.sampler, self.p_min, history, draft_len, self.name)

    def _next_logits(self, history: Sequence[int], row: int) -> Callable[[int, Sequence[int]], np.ndarray | None]:
        """The chain's logits (``base.draft_chain``): the catch-up's last row, then each drafted token fed one
        position further with the head's own hidden output in place of the target's row."""
        head = self.head
        last = self._end(history) - 1
        at = row

        def logits(depth: int, drafted: Sequence[int]) -> np.ndarray:
            nonlocal at
            if depth > 0:
                own = np.array(head.hidden(at))
                head.decode([drafted[-1]], [last + depth], own[None, :], [True])
                at = 0
            return head.logits(at)

        return logits

    def _tree(self, history: Sequence[int], draft_len: int, nodes: int, row: int) -> Proposal | TreeProposal:
        """A tree grown level by level, each node on a sequence of its own fed its parent's output
        (``grow_fed_tree``); the root's children sit one past the catch-up's last row."""
        return grow_fed_tree(self.head, self.sampler, row, self._end(history), history, max_nodes=nodes,
                             draft_len=draft_len, max_width=self.tree_width, drafter=self.name)

    def reset(self) -> None:
        # The head's cache may keep a prefix the new history shares (its rows came from the target's);
        # the catch-up compares it afresh.
        self._trusted = False


def grow_fed_tree(head: FedHead, sampler: Sampler, row: int, first_pos: int, history: Sequence[int], *, max_nodes: int,
                  draft_len: int, max_width: int, drafter: str) -> TreeProposal:
    """``draft_tree.grow_tree`` for a head fed its parent's hidden row, after a catch-up that left the root's
    logits and hidden row at batch row ``row``. Each node's q is shaped as the target's row after ``history``
    and the node's path (``tree_q``: a grammar masks it so).

    Each level is one batched decode: every waiting node on a sequence of its own (its parent's cells
    shared up to the node's position, ``first_pos`` + depth - 1), fed its parent's hidden output; the
    node sequences are removed afterwards, so the head's cache holds the history again (sequence 0).
    """
    seq_of: dict[tuple[int, ...], int] = {(): 0}
    hidden_of: dict[tuple[int, ...], np.ndarray] = {(): np.array(head.hidden(row))}
    root = tree_q(head.logits(row), sampler, history)

    def q_at(paths: Sequence[tuple[int, ...]]) -> list[np.ndarray]:
        if list(paths) == [()]:
            return [root]
        seqs, positions = [], []
        for path in paths:
            seq = seq_of[path] = len(seq_of)
            position = first_pos + len(path) - 1
            head.copy_seq(seq_of[path[:-1]], seq, 0, position)
            seqs.append(seq)
            positions.append(position)
        fed = np.stack([hidden_of[path[:-1]] for path in paths])
        head.decode([path[-1] for path in paths], positions, fed, [True] * len(paths), seqs)
        out = []
        for i, path in enumerate(paths):
            hidden_of[path] = np.array(head.hidden(i))
            out.append(tree_q(head.logits(i), sampler, history, path))
        return out

    return grow_on_node_sequences(head.remove_seq, seq_of, q_at, sampler, max_nodes=max_nodes,
                                  draft_len=draft_len, max_width=max_width, drafter=drafter)
