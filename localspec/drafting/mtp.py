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
* ``propose`` first feeds the head the history it has not seen, each token
  ``x_p`` paired with the target's ``h_{p-1}``, ending with the history's
  last token, whose logits give the first draft token; then each further
  draft token is fed with the head's OWN hidden output in place of the
  target's (the target has not computed it yet). Those draft rows are dropped
  before the next catch-up, which rebuilds them from the target's rows.

At temperature > 0 the draft tokens are sampled from the head's distribution
q under the target's sampling settings, and the proposal carries q: the
verifier accepts by exact rejection sampling (min(1, p/q), resampling from
norm(max(p - q, 0))), so the output is distributed exactly as the target's.
llama.cpp's ``draft-mtp`` takes the head's top token and keeps it only on an
exact match. At temperature 0 both are greedy matches.

A model with several NextN layers (Step 3.5) is drafted with its first one
applied recursively, as a single-head model (Qwen3.5, GLM-4.5) is; missing
hidden rows (a row the target never computed on sequence 0) fall back to
zeros, which costs acceptance, never correctness.
"""

from __future__ import annotations

from typing import Protocol, Sequence

import numpy as np

from localspec.drafting.base import DrafterBase, Proposal, draft_token
from localspec.sampling import Sampler


class HiddenSource(Protocol):
    """The target context, as far as the MTP drafter needs it (``backend.Context``)."""

    def hidden_rows(self, n: int) -> np.ndarray: ...

    def add_decode_listener(self, listener) -> None: ...  # noqa: ANN001

    def remove_decode_listener(self, listener) -> None: ...  # noqa: ANN001


class HeadContext(Protocol):
    """The MTP head's own context (``backend.MtpContext``)."""

    n_embd: int
    n_batch: int

    def decode(self, tokens: Sequence[int], positions: Sequence[int], hidden: np.ndarray,
               outputs: Sequence[bool]) -> None: ...

    def logits(self, row: int) -> np.ndarray: ...

    def hidden(self, row: int) -> np.ndarray: ...

    def rollback_to(self, n: int) -> None: ...


class MtpDrafter(DrafterBase):
    """Drafts with the target's MTP head; ``accepted``/``reset`` follow the drafter protocol.

    ``p_min``: stop drafting when the head's own top probability falls below it.
    """

    name = "mtp"

    def __init__(self, head: HeadContext, target: HiddenSource, sampler: Sampler, *, p_min: float = 0.0) -> None:
        self.head = head
        self.target = target
        self.sampler = sampler
        self.p_min = p_min
        # Target hidden rows: position -> {token: row}; a None row marks a key two batch rows shared.
        self._rows: dict[int, dict[int, np.ndarray | None]] = {}
        # Tokens the head's cache holds at positions 0.., each built from the target's hidden row.
        self._tokens: list[int] = []
        self._zero = np.zeros(head.n_embd, dtype=np.float32)
        target.add_decode_listener(self.observe)

    # --- the target's hidden rows ------------------------------------------
    def observe(self, tokens: Sequence[int], positions: Sequence[int],
                seq_ids: Sequence[Sequence[int]] | None) -> None:
        """Keep the hidden rows of a target decode (called by the target context after each one)."""
        if not tokens:
            return
        first = min(positions)
        # Everything at or after the batch's first position was just overwritten in the target's cache.
        for pos in [p for p in self._rows if p >= first]:
            del self._rows[pos]
        block = self.target.hidden_rows(len(tokens))
        for i, (tok, pos) in enumerate(zip(tokens, positions)):
            at = self._rows.setdefault(int(pos), {})
            # Two branches with this token here: which one the target kept is unknown.
            at[int(tok)] = None if int(tok) in at else np.array(block[i])

    def _row(self, history: Sequence[int], pos: int) -> np.ndarray:
        """The target's hidden state at ``pos`` of ``history`` (zeros before the start or when unknown)."""
        if pos < 0:
            return self._zero
        row = self._rows.get(pos, {}).get(history[pos])
        return self._zero if row is None else row

    def _forget_before(self, pos: int) -> None:
        """Drop rows the head has consumed (keeping ``pos`` itself: the next catch-up starts from it)."""
        for p in [p for p in self._rows if p < pos]:
            del self._rows[p]

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

    def _sync(self, history: Sequence[int]) -> int:
        """Feed the head the history up to its last token; return the batch row holding that token's logits."""
        n = self._fed(history)  # the last token is always (re)fed: its logits start the draft
        self.head.rollback_to(n)
        del self._tokens[n:]
        row = 0
        while n < len(history):
            end = min(len(history), n + self.head.n_batch)
            positions = range(n, end)
            hidden = np.stack([self._row(history, p - 1) for p in positions])
            outputs = [p == len(history) - 1 for p in positions]
            try:
                self.head.decode(history[n:end], positions, hidden, outputs)
            except BaseException:
                self._tokens.clear()  # a failed decode leaves the head's cache unknown (it was cleared)
                raise
            row = end - 1 - n
            self._tokens.extend(history[n:end])
            n = end
        self._forget_before(len(history) - 2)
        return row

    def propose(self, history: Sequence[int], draft_len: int) -> Proposal:
        if draft_len <= 0 or not history:
            return Proposal(drafter=self.name)
        row = self._sync(history)
        greedy = self.sampler.params.greedy
        tokens: list[int] = []
        probs: list[np.ndarray] = []
        pos = len(history) - 1
        for i in range(draft_len):
            picked = draft_token(self.head.logits(row), self.sampler, self.p_min)
            if picked is None:
                break
            tok, q = picked
            if q is not None:
                probs.append(q)
            tokens.append(tok)
            if i + 1 < draft_len:
                # The head's own hidden output stands in for the target's, which does not exist yet.
                hidden = np.array(self.head.hidden(row))[None, :]
                pos += 1
                self.head.decode([tok], [pos], hidden, [True])
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

