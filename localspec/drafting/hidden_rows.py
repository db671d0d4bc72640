"""The target's hidden rows, kept for a head that drafts from them (``mtp``, Gemma 4's assistant).

After each target decode the drafter hands the decode's rows to ``HiddenRows.add``.
They are keyed by (position, token), so after a tree verification the
accepted path's rows are found too; a key two batch rows share is ambiguous
(which branch the target kept is unknown) and reads as zeros, like a row
never kept. Zeros cost a head acceptance, never correctness: the target
verifies every draft.
"""

from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np


class HiddenRows:
    """At most ``max_rows`` rows of width ``n_embd``, the newest positions kept."""

    def __init__(self, n_embd: int, max_rows: int) -> None:
        self.max_rows = max(1, max_rows)
        self._rows: dict[int, dict[int, np.ndarray | None]] = {}
        self._n = 0
        self._zero = np.zeros(n_embd, dtype=np.float32)

    def add(self, tokens: Sequence[int], positions: Sequence[int], block: np.ndarray) -> None:
        """The rows of one decode (``block[i]`` for ``tokens[i]`` at ``positions[i]``)."""
        if not tokens:
            return
        first, last = min(positions), max(positions)
        # Everything at or after the batch's first position was just overwritten in the target's cache.
        self._drop([p for p in self._rows if p >= first])
        for i, (tok, pos) in enumerate(zip(tokens, positions)):
            if pos <= last - self.max_rows:
                continue  # a long prefill: a row the cap would drop at once is never copied
            at = self._rows.setdefault(int(pos), {})
            if int(tok) in at:
                at[int(tok)] = None  # two branches with this token here: which one the target kept is unknown
            else:
                at[int(tok)] = np.array(block[i])
                self._n += 1
        over = self._n - self.max_rows
        old: list[int] = []
        for pos in sorted(self._rows):  # over the cap (a tree's extra rows): the oldest positions go first
            if over <= 0:
                break
            old.append(pos)
            over -= len(self._rows[pos])
        self._drop(old)

    def row(self, history: Sequence[int], pos: int) -> np.ndarray:
        """The target's hidden state at ``pos`` of ``history`` (zeros before the start or when unknown)."""
        if pos < 0:
            return self._zero
        found = self._rows.get(pos, {}).get(history[pos])
        return self._zero if found is None else found

    def drop_before(self, pos: int) -> None:
        self._drop([p for p in self._rows if p < pos])

    def _drop(self, positions: Sequence[int]) -> None:
        for pos in positions:
            self._n -= len(self._rows.pop(pos))

    def __len__(self) -> int:
        """Rows kept (at most ``max_rows``)."""
        return self._n

    def __contains__(self, pos: object) -> bool:
        return pos in self._rows

    def __iter__(self) -> Iterator[int]:
        """The positions that hold a row."""
        return iter(sorted(self._rows))
