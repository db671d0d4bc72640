"""Log-probabilities of emitted tokens, as a pure function of one target row.

A token's log-probability is read from the row that produced it: the log-softmax of that row's
logits (after any shaping: penalties, bias, a constraint's mask), before temperature and the
truncation filters. Those filters decide how a token is drawn, not how likely the model finds it:
under greedy decoding they would make every log-probability 0 or -inf. The rows are the same bits
with speculation on or off (docs/exactness.md), so the numbers are too.
"""

from __future__ import annotations

import math

import numpy as np

from localspec.errors import InvalidOptionError
from localspec.events import TokenLogprob

MAX_TOP_LOGPROBS = 20
"""The most alternatives reported per token (OpenAI's limit for ``top_logprobs``)."""


def check_top_logprobs(value: object, param: str = "logprobs") -> None:
    """Raise InvalidOptionError unless ``value`` is None (off) or an integer in [0, MAX_TOP_LOGPROBS]."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TOP_LOGPROBS:
        raise InvalidOptionError(
            f"{param} {value!r} is out of range: it must be an integer in [0, {MAX_TOP_LOGPROBS}] (the alternatives "
            "reported per token; 0 reports only the chosen token's); leave it out for none", param=param)


def token_logprob(logits: np.ndarray, token: int, top_n: int = 0) -> TokenLogprob:
    """The log-softmax of ``logits`` at ``token``, and its ``top_n`` largest entries.

    ``logits``: one row (1-D, any float dtype, never modified; ``-inf`` entries allowed, they get
    ``-inf``). Computed in float64 from the maximum down, so no entry overflows. The alternatives are
    ordered by log-probability, ties by the lower token id, and may include ``token`` itself.
    """
    x = np.asarray(logits)
    m = float(x.max())
    if not math.isfinite(m):
        raise ValueError(f"logits must have a finite maximum, got {m}")
    z = np.subtract(x, m, dtype=np.float64)  # (cast and shifted in one pass)
    lse = math.log(float(np.exp(z).sum()))
    chosen = float(z[token]) - lse
    if top_n <= 0:
        return TokenLogprob(int(token), chosen)
    k = min(top_n, z.size)
    idx = np.argpartition(-z, k - 1)[:k] if k < z.size else np.arange(z.size)
    # The k-th value may be tied with entries argpartition left out: take the lowest ids among the ties.
    kth = z[idx].min()
    above = np.flatnonzero(z > kth)
    tied = np.flatnonzero(z == kth)[: k - above.size]
    idx = np.concatenate((above, tied))
    idx = idx[np.lexsort((idx, -z[idx]))]
    return TokenLogprob(int(token), chosen, tuple((int(i), float(z[i]) - lse) for i in idx))
