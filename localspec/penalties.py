"""Repetition penalties and logit bias: a row shaped by the tokens before it.

The rule is llama.cpp's (``llama_sampler_penalties`` after ``llama_sampler_logit_bias``, the order
``llama-server`` chains them): first each biased token's logit gets its bias added; then, for every
token that occurs ``c > 0`` times among the last ``last_n`` tokens before the row (the prompt
counts, as in llama-server), a logit ``l`` becomes ``l * repeat`` when ``l <= 0`` and ``l / repeat``
otherwise, then ``- c * frequency - presence``.

Exactness: plain decoding shapes its one row by every token before it. A verification row follows
the history plus the drafted tokens before it, so ``PenaltyShaper`` (a ``sampling.RowShaper``) counts
exactly those: every row is judged by the distribution plain decoding would use there, and the
speculative output keeps the penalised target's distribution.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from localspec.errors import InvalidOptionError

MAX_PENALTY = 2.0  # presence and frequency: OpenAI's range, [-2, 2]
MAX_REPEAT = 10.0  # repeat: (0, 10]; 1 is off
MAX_BIAS = 100.0  # logit bias: OpenAI's range, [-100, 100]
DEFAULT_LAST_N = 64  # llama-server's repeat_last_n


@dataclass(frozen=True)
class Penalties:
    """What shapes each row by the tokens before it. The defaults change nothing.

    ``presence``, ``frequency``: OpenAI's ``presence_penalty`` and ``frequency_penalty`` ([-2, 2]);
    ``repeat``: llama.cpp's ``repeat_penalty`` ((0, 10], 1 off); ``last_n``: how many of the latest
    tokens they count (``-1``: all of them; 0: none, which switches the three off); ``logit_bias``:
    ``(token, bias)`` pairs, bias in [-100, 100], added whatever came before.
    """

    presence: float = 0.0
    frequency: float = 0.0
    repeat: float = 1.0
    last_n: int = DEFAULT_LAST_N
    logit_bias: tuple[tuple[int, float], ...] = ()

    @property
    def penalises(self) -> bool:
        """Whether the repeated tokens are penalised at all (llama.cpp's own early exit)."""
        return self.last_n != 0 and (self.presence != 0.0 or self.frequency != 0.0 or self.repeat != 1.0)

    @property
    def active(self) -> bool:
        """Whether any row changes (False: no shaper is needed; the hot path stays as it is)."""
        return self.penalises or any(bias != 0.0 for _, bias in self.logit_bias)

    def validate(self, n_vocab: int | None = None) -> None:
        """Raise InvalidOptionError naming the first bad value (NaN fails every range);
        with ``n_vocab``, a biased token outside the vocabulary too."""
        for name, value in (("presence_penalty", self.presence), ("frequency_penalty", self.frequency)):
            if not _real(value) or not -MAX_PENALTY <= value <= MAX_PENALTY:
                raise InvalidOptionError(f"{name} {value!r} is out of range: it must be in [-2, 2]; 0 switches it off",
                                         param=name)
        if not _real(self.repeat) or not 0.0 < self.repeat <= MAX_REPEAT:
            raise InvalidOptionError(f"repeat_penalty {self.repeat!r} is out of range: it must be in (0, 10]; "
                                     "1 switches it off", param="repeat_penalty")
        if isinstance(self.last_n, bool) or not isinstance(self.last_n, int) or self.last_n < -1:
            raise InvalidOptionError(f"repeat_last_n {self.last_n!r} is out of range: it must be an integer >= -1 "
                                     "(-1: every token so far; 0: none)", param="repeat_last_n")
        for token, bias in self.logit_bias:
            if isinstance(token, bool) or not isinstance(token, int) or token < 0 or (
                    n_vocab is not None and token >= n_vocab):
                within = f" (this model has ids 0..{n_vocab - 1})" if n_vocab is not None else ""
                raise InvalidOptionError(f"logit_bias names token {token!r}, which is not a token id{within}",
                                         param="logit_bias")
            if not _real(bias) or not -MAX_BIAS <= bias <= MAX_BIAS:
                raise InvalidOptionError(f"logit_bias {bias!r} for token {token} is out of range: it must be in "
                                         "[-100, 100]", param="logit_bias")


def _real(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def penalize(logits: np.ndarray, before: Sequence[int], penalties: Penalties) -> np.ndarray:
    """The row after the tokens ``before`` (oldest first; only the last ``last_n`` count), shaped.

    A new array of ``logits``' length and dtype; ``logits`` is never modified.
    """
    out = np.array(logits, copy=True)
    if penalties.logit_bias:
        ids = np.fromiter((t for t, _ in penalties.logit_bias), dtype=np.int64)
        np.add.at(out, ids, np.fromiter((b for _, b in penalties.logit_bias), dtype=out.dtype))
    if not penalties.penalises or not len(before):
        return out
    window = before if penalties.last_n < 0 else before[-penalties.last_n:]
    ids, counts = np.unique(np.asarray(window, dtype=np.int64), return_counts=True)
    x = out[ids]
    if penalties.repeat != 1.0:
        x = np.where(x <= 0, x * penalties.repeat, x / penalties.repeat).astype(out.dtype)
    x -= (counts * penalties.frequency + penalties.presence).astype(out.dtype)
    out[ids] = x
    return out


class PenaltyShaper:
    """``Penalties`` as a ``sampling.RowShaper``: the row after ``history`` + ``path`` counts the
    tokens of both (the prompt included)."""

    __slots__ = ("penalties",)

    def __init__(self, penalties: Penalties) -> None:
        self.penalties = penalties

    def shape(self, logits: np.ndarray, history: Sequence[int], path: Sequence[int]) -> np.ndarray:
        n = self.penalties.last_n
        if not self.penalties.penalises:
            before: Sequence[int] = ()
        elif n < 0:
            before = [*history, *path]
        else:
            keep = min(len(history), max(0, n - len(path)))  # history[-keep:] would be all of it at keep 0
            before = [*history[len(history) - keep:], *path][-n:]
        return penalize(logits, before, self.penalties)


def penalty_shaper(penalties: Penalties | None, n_vocab: int | None = None) -> PenaltyShaper | None:
    """The shaper for ``penalties`` (checked, against ``n_vocab`` when given); None when they change nothing."""
    if penalties is None:
        return None
    penalties.validate(n_vocab)
    return PenaltyShaper(penalties) if penalties.active else None
