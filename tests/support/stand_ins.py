"""Stand-ins for the pure-logic tests of drafters that read the target's hidden rows."""

from __future__ import annotations

import numpy as np


class HiddenRowSource:
    """The target context as a hidden-row drafter sees it: row i of the last decode is ``block[i]``."""

    def __init__(self) -> None:
        self.block = np.zeros((0, 4), dtype=np.float32)

    def hidden_rows(self, n: int) -> np.ndarray:
        return self.block[:n]

    def add_decode_listener(self, listener) -> None:  # noqa: ANN001
        pass

    def remove_decode_listener(self, listener) -> None:  # noqa: ANN001
        pass
