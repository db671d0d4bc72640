"""Turning logits into the distribution a token is drawn from, and drawing it.

Speculative decoding is exact only if the draft and the target tokens are
compared against the very distributions they are sampled from, so this module
is the single definition of "the distribution": :func:`distribution` builds it
(temperature, softmax, top-k, top-p, min-p, in that order) and :func:`sample`
draws from it. Both run in the decode hot path on vocabularies of up to a few
hundred thousand entries, so they avoid full sorts: top-k selects with
``argpartition`` on a prefiltered pool, and top-p finds the nucleus with a histogram and
sorts only the one bucket the boundary falls in (buckets come straight from the bits of the
float64 probabilities, so they are log-scale and cost one integer shift).

Logits are treated as read-only; they may be a view on llama.cpp memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Protocol, Sequence

import numpy as np

from localspec.validation import is_int as _is_int, is_real as _is_real, out_of_range as _out_of_range

# Below this many candidates the nucleus is found with a plain sort; above it, with a
# histogram (see _nucleus).
_SORT_LIMIT = 4096

# _nucleus() buckets a float64 weight w > 0 by the top bits of its IEEE-754 pattern: the
# exponent and the first _SUB_BITS mantissa bits, i.e. 2**_SUB_BITS buckets per power of two.
# For non-negative floats the bit pattern, read as an integer, orders exactly like the value,
# so every bucket is a contiguous range of probabilities.
_SUB_BITS = 3
_BUCKET_SHIFT = 52 - _SUB_BITS

# _top_k(): prefilter through a subsample of every _PREFILTER_STRIDE-th logit when the
# vocabulary has at least _PREFILTER_MIN entries.
_PREFILTER_STRIDE = 64
_PREFILTER_MIN = 16384

# sample(): above this size the CDF is built in blocks of this many entries.
_BLOCK = 1024

_MAX_TEMPERATURE = 5.0


@dataclass(frozen=True)
class SamplingParams:
    """How a token is chosen from the logits.

    ``temperature`` 0 means greedy (argmax); the filters are ignored then.
    ``top_k`` 0, ``top_p`` 1.0 and ``min_p`` 0.0 switch the filters off.
    ``seed`` None draws a fresh seed from the OS.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        """True when decoding takes the argmax instead of sampling."""
        return self.temperature == 0

    def validate(self) -> None:
        """Raise :class:`InvalidOptionError` naming the first bad option.

        Ranges: temperature in [0, 5], top_k >= 0 (integer), top_p in (0, 1],
        min_p in [0, 1), seed None or an integer in [0, 2**63). NaN is rejected
        everywhere (every range test below is written so NaN fails it).
        """
        t = self.temperature
        if not _is_real(t) or not 0.0 <= t <= _MAX_TEMPERATURE:
            raise _out_of_range(
                "temperature", t, "in [0, 5]", "pass 0 for greedy decoding or a value such as 0.8"
            )
        k = self.top_k
        if not _is_int(k) or k < 0:
            raise _out_of_range(
                "top_k", k, "an integer >= 0", "pass 0 to switch it off or a value such as 40"
            )
        p = self.top_p
        if not _is_real(p) or not 0.0 < p <= 1.0:
            raise _out_of_range(
                "top_p", p, "in (0, 1]", "pass 1 to switch it off or a value such as 0.95"
            )
        m = self.min_p
        if not _is_real(m) or not 0.0 <= m < 1.0:
            raise _out_of_range(
                "min_p", m, "in [0, 1)", "pass 0 to switch it off or a value such as 0.05"
            )
        s = self.seed
        if s is not None and (not _is_int(s) or not 0 <= s < 2**63):
            raise _out_of_range(
                "seed",
                s,
                "an integer in [0, 2**63)",
                "pass a value such as 42, or leave it out for a fresh random seed",
            )


def distribution(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The probability vector (float64, same length as logits, sums to 1) a token is drawn from.

    Greedy: one-hot at argmax (lowest index wins ties). Otherwise, in this order: divide by
    temperature, softmax, keep top_k, keep the smallest set whose mass reaches top_p (always at
    least one token), drop tokens with p < min_p * p_max, renormalise.

    Each filter sees the distribution left by the previous one, renormalised: top-p measures
    mass among the top-k survivors (as llama.cpp and Hugging Face do). Ties are broken towards
    the lower token id wherever a filter keeps a fixed number of tokens (top-k, the top-p
    boundary), so the result is a pure function of its inputs.

    ``logits`` (1-D, any float dtype) is never modified. Raises InvalidOptionError for bad
    params and ValueError for logits that are not 1-D, are empty, or contain NaN or +inf
    (-inf entries are fine and get probability 0).
    """
    params.validate()
    return _distribution(_as_logits(logits), params)


_argmax_of = np.ndarray.argmax


def argmax(x: np.ndarray) -> int:
    """``np.argmax(x)``: the index of the largest value, the lowest among equal ones; without the copy numpy
    first makes of an array it may not write (its argmax asks for a writeable one).

    Rows of llama.cpp's logits are handed out read-only (``Context.logits``), and that copy cost 3-4x
    the argmax itself (over a 262k vocabulary 59 us against 13, on the CPU that drives the GPU). So a
    read-only view of a whole writeable vector (its ``base``: how ``Context.logits`` makes its rows) is
    read through that vector; any other read-only ``x`` over writeable memory through a writeable alias
    (whose making cost ~5 us a step in the tiny-model proxy, its caches cold after each decode); nothing
    writes either. One over memory read-only at its source takes numpy's own way, copy and all."""
    if not x.flags.writeable:
        base = x.base  # a read-only view of a whole writeable vector (``Context.logits``): read the vector
        if (type(base) is np.ndarray and x.ndim == 1 and base.shape == x.shape and base.strides == x.strides
                and base.dtype == x.dtype and base.flags.writeable):
            return int(_argmax_of(base))
        alias = x.view()
        try:
            alias.flags.writeable = True
        except ValueError:
            return int(_argmax_of(x))
        x = alias
    return int(_argmax_of(x))


def _as_logits(logits: np.ndarray) -> np.ndarray:
    x = np.asarray(logits)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"logits must be a non-empty 1-D array, got shape {x.shape}")
    return x


# ``_distribution``'s float32 exponentials fall back to float64 below this temperature (1/T would overflow
# float32) and for a maximum logit beyond this size (float64 logits past float32's range: inf - inf).
_FLOAT32_MIN_TEMPERATURE = 1e-37
_FLOAT32_MAX_LOGIT = 1e30


def _distribution(x: np.ndarray, params: SamplingParams, exp_dtype: type = np.float64) -> np.ndarray:
    """``distribution``'s work; ``exp_dtype`` np.float32: the exponentials in float32, the rest in float64
    (``Sampler.draft_distribution``)."""
    n = x.size
    if params.greedy:
        i = argmax(x)  # the first maximum: lowest id wins ties
        if not math.isfinite(x[i]):
            raise ValueError(f"logits must have a finite maximum, got {x[i]}")
        out = np.zeros(n)
        out[i] = 1.0
        return out

    m = x.max()
    if not math.isfinite(m):
        raise ValueError(f"logits must have a finite maximum, got {m}")

    # top-k on the raw logits: dividing by a positive temperature and taking a monotone softmax
    # preserve the order, so the k largest logits are the k most probable tokens.
    k = params.top_k
    idx: np.ndarray | None = None
    if 0 < k < n:
        idx = _top_k(x, k)
        x = x[idx]

    # z = log(p / p_max), computed in float64 after subtracting the max, so w = exp(z) is in
    # [0, 1] with w == 1 exactly at the argmax, and sum(w) >= 1 never overflows. Our own array
    # (everything below works in place on it), cast and shifted in one pass; the temperature and
    # the normalisation multiply by a reciprocal (a float64 division over a 152k vocabulary took
    # 89 us, a multiplication 24; the two differ by a rounding).
    if exp_dtype is not np.float64 and (params.temperature < _FLOAT32_MIN_TEMPERATURE or abs(m) > _FLOAT32_MAX_LOGIT):
        exp_dtype = np.float64
    z = np.subtract(x, m, dtype=exp_dtype)
    if params.temperature != 1.0:
        inverse = 1.0 / params.temperature
        with np.errstate(over="ignore"):  # a tiny temperature sends z to -inf: p = 0, fine
            if math.isfinite(inverse):
                z *= inverse
            else:  # a subnormal temperature: inf * 0 at the maximum would be NaN
                z /= params.temperature

    w = np.exp(z, out=z)
    if exp_dtype is not np.float64:
        w = w.astype(np.float64)
    top_p, min_p = params.top_p, params.min_p
    keep: np.ndarray | None = None
    if top_p < 1.0:
        keep = _top_p_min_p(w, top_p, min_p)
    elif min_p > 0.0:
        keep = w >= min_p  # p_i >= min_p * p_max  <=>  w_i >= min_p, because w = p / p_max
    if keep is not None:
        np.multiply(w, keep, out=w)
    w *= 1.0 / w.sum()

    if idx is None:
        return w
    out = np.zeros(n)
    out[idx] = w
    return out


def _top_k(x: np.ndarray, k: int) -> np.ndarray:
    """Indices (ascending) of the k largest entries of x; ties at the k-th place go to lower ids.

    ``x`` must be NaN-free. For a small k on a large vocabulary, a strided subsample gives a
    threshold that (almost always) has somewhat more than k entries above it, and only those
    are partitioned: this avoids argpartition's vocabulary-sized index array.
    """
    n = x.size
    pool, pool_ids = x, None
    sub = x[::_PREFILTER_STRIDE]
    # The r-th largest subsample entry has about r * stride entries of x above it.
    r = 2 * (k // _PREFILTER_STRIDE) + 16
    if n >= _PREFILTER_MIN and 4 * r <= sub.size:
        thr = np.partition(sub, sub.size - r)[sub.size - r]
        ids = np.flatnonzero(x >= thr)
        if ids.size >= k:  # else (unlucky or adversarial layout): partition everything
            pool, pool_ids = x[ids], ids
    # Every entry >= the k-th largest is in the pool, so ties can be resolved within it.
    sel = np.argpartition(pool, pool.size - k)[pool.size - k :]
    kth = pool[sel].min()
    if np.count_nonzero(pool >= kth) != k:
        # Some entries equal to the k-th value were left out; choose among them by id.
        above = np.flatnonzero(pool > kth)
        tied = np.flatnonzero(pool == kth)[: k - above.size]
        sel = np.concatenate((above, tied))
    idx = sel if pool_ids is None else pool_ids[sel]
    idx.sort()
    return idx


def _top_p_min_p(w: np.ndarray, top_p: float, min_p: float) -> np.ndarray:
    """Boolean mask of the tokens that survive top-p and then min-p.

    ``w`` are unnormalised probabilities with max 1. Order tokens by probability (descending,
    ties by id). The nucleus P is the shortest prefix with mass >= top_p; the min-p set
    M = {w >= min_p} is a prefix as well (all tokens above a threshold). Their intersection is
    therefore the shorter prefix: if M alone has mass >= top_p, P lies inside M and we look for
    it among M's tokens only; otherwise M is the answer.
    """
    target = top_p * w.sum()
    if min_p > 0.0:
        in_m = w >= min_p  # the min-p set, as in _distribution
        if np.sum(w, where=in_m) < target:
            return in_m
        cand = np.flatnonzero(in_m)
        keep = np.zeros(w.size, dtype=bool)
        keep[cand[_nucleus(w[cand], target)]] = True
        return keep
    return _nucleus(w, target)


def _nucleus(w: np.ndarray, target: float) -> np.ndarray:
    """Mask of the shortest prefix (by w descending, ties by position) whose mass reaches target.

    ``w`` is a contiguous float64 array of non-negative weights. ``target`` may exceed the total
    mass by rounding; then everything with weight is kept.
    """
    if w.size <= _SORT_LIMIT:
        return _prefix_of(w, target, 0.0, np.ones(w.size, dtype=bool))

    # Histogram of the mass by bucket (see _BUCKET_SHIFT; higher bucket = larger w). The
    # cumulative mass from the top bucket down says which bucket holds the boundary: the
    # buckets above it are kept whole, and only that one bucket needs sorting.
    b = w.view(np.int64) >> _BUCKET_SHIFT
    mass = np.bincount(b, weights=w)[::-1]
    cum = np.cumsum(mass)
    j = int(np.searchsorted(cum, target, side="left"))
    if j >= cum.size:  # target above the total by rounding: stop at the last bucket with mass
        j = int(np.flatnonzero(mass)[-1])
    bucket = cum.size - 1 - j
    before = float(cum[j - 1]) if j > 0 else 0.0
    return _prefix_of(w, target, before, b == bucket, b > bucket)


def _prefix_of(
    w: np.ndarray,
    target: float,
    before: float,
    among: np.ndarray,
    keep: np.ndarray | None = None,
) -> np.ndarray:
    """Add to ``keep`` the shortest prefix of the tokens ``among`` (by w descending, ties by
    position) that brings the mass ``before`` up to ``target``; at least one token is added."""
    pos = np.flatnonzero(among)
    v = w[pos]
    s = np.sort(v)[::-1]
    c = min(int(np.searchsorted(before + np.cumsum(s), target, side="left")), s.size - 1)
    tau = s[c]  # the token that crosses the target; everything above it is kept
    if keep is None:
        keep = np.zeros(w.size, dtype=bool)
    chosen = v > tau
    need = c + 1 - int(np.count_nonzero(chosen))
    if need > 0:  # the crossing value is tied: take the lowest positions among the ties
        chosen[np.flatnonzero(v == tau)[:need]] = True
    keep[pos[chosen]] = True
    return keep


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    """Draw a token id from ``probs`` by inverse CDF with exactly one ``rng.random()`` draw.

    ``probs`` is a 1-D array of non-negative weights with a positive, finite sum; it need not be
    normalised exactly (the draw is scaled by the sum). A zero-weight entry is never returned.
    """
    w = np.asarray(probs)
    if w.ndim != 1 or w.size == 0:
        raise ValueError(f"probs must be a non-empty 1-D array, got shape {w.shape}")
    u = rng.random()
    if w.size <= _BLOCK:
        return _invert(w, u)
    # Two-level inverse CDF: find the block by block sums, then the token inside the block.
    # It is the same mapping u -> token as one long CDF (up to rounding), in O(n) vectorised
    # work instead of a sequential cumsum over the whole vocabulary.
    n_full = w.size // _BLOCK * _BLOCK
    sums = w[:n_full].reshape(-1, _BLOCK).sum(axis=1)
    if n_full < w.size:
        sums = np.append(sums, w[n_full:].sum())
    cum = np.cumsum(sums)
    total = float(cum[-1])
    if not (total > 0.0 and math.isfinite(total)):
        raise ValueError(f"probs must have a positive finite sum, got {total}")
    target = u * total
    blk = int(np.searchsorted(cum, target, side="right"))
    if blk >= sums.size:  # u * total rounded up to total: take the last block with mass
        blk = int(np.flatnonzero(sums)[-1])
    start = blk * _BLOCK
    residue = target - (float(cum[blk - 1]) if blk > 0 else 0.0)
    part = w[start : start + _BLOCK]
    return start + _invert(part, residue / float(sums[blk]))


def _invert(w: np.ndarray, u: float) -> int:
    """Index i with cdf[i-1] <= u * total < cdf[i]; never a zero-weight entry."""
    cdf = np.cumsum(w)
    total = float(cdf[-1])
    if not (total > 0.0 and math.isfinite(total)):
        raise ValueError(f"probs must have a positive finite sum, got {total}")
    i = int(np.searchsorted(cdf, u * total, side="right"))
    if i >= w.size:  # rounding pushed u * total to the end: the last entry with weight
        i = int(np.flatnonzero(w)[-1])
    return i


class RowShaper(Protocol):
    """What changes a row's logits by the tokens before that row: a grammar's mask, penalties, a bias.

    Exactness under speculation needs every row judged by the distribution plain decoding would have
    used at that position, and plain decoding shapes its one row by everything generated so far. A
    verification batch holds rows after ``history`` plus a drafted ``path``, so a shaper is asked for
    one row at a time with both: ``history`` is the generation's tokens (the prompt and every kept
    token, the unfed last one included), which only grows, and only by kept tokens, while a
    generation runs; ``path`` the drafted tokens between its end and the row (``()`` for the row right
    after ``history``). A shaper may therefore advance its own state along ``history`` for good and
    must treat ``path`` as a guess that the next call may contradict (the speculative states are
    "rolled back" by not keeping them). The draft side asks the same (``Sampler.shaped``) before it
    proposes, so rejection sampling runs between two equally shaped distributions.

    ``shape`` never modifies ``logits`` (it may be a view on llama.cpp's memory): it returns them
    unchanged or a new array of the same length, where ``-inf`` rules a token out.
    """

    def shape(self, logits: np.ndarray, history: Sequence[int], path: Sequence[int]) -> np.ndarray:
        """The logits of the row that follows ``history`` + ``path``, shaped."""
        ...


class ShaperChain:
    """Several shapers applied in order (penalties, then a grammar's mask): itself a ``RowShaper``."""

    __slots__ = ("shapers",)

    def __init__(self, shapers: Iterable[RowShaper]) -> None:
        self.shapers: tuple[RowShaper, ...] = tuple(shapers)

    def shape(self, logits: np.ndarray, history: Sequence[int], path: Sequence[int]) -> np.ndarray:
        for shaper in self.shapers:
            logits = shaper.shape(logits, history, path)
        return logits


def compose(*shapers: RowShaper | None) -> RowShaper | None:
    """One shaper for the given ones, in order, Nones left out; None when none is left (no shaping, the
    unconstrained hot path)."""
    present = [s for s in shapers if s is not None]
    if not present:
        return None
    return present[0] if len(present) == 1 else ShaperChain(present)


class Sampler:
    """params + a np.random.Generator seeded from params.seed (None -> fresh entropy), and the
    ``shaper`` (None: none) every row is shaped by before it is judged or sampled."""

    def __init__(self, params: SamplingParams, shaper: RowShaper | None = None) -> None:
        params.validate()
        self.params: SamplingParams = params
        self.rng: np.random.Generator = np.random.default_rng(params.seed)
        self.shaper: RowShaper | None = shaper

    def shaped(self, logits: np.ndarray, history: Sequence[int], path: Sequence[int] = ()) -> np.ndarray:
        """``logits`` of the row after ``history`` + ``path`` as the shaper shapes them (themselves,
        uncopied, without a shaper)."""
        if self.shaper is None:
            return logits
        return self.shaper.shape(logits, history, path)

    def distribution(self, logits: np.ndarray) -> np.ndarray:
        """:func:`distribution` of ``logits`` under this sampler's params."""
        return _distribution(_as_logits(logits), self.params)

    def draft_distribution(self, logits: np.ndarray) -> np.ndarray:
        """q, the distribution a drafter draws a token from and the acceptance rule judges it by: the same
        filters as :meth:`distribution`, with the exponentials taken in float32 (float64 again after them).

        Rejection sampling keeps the target's distribution exactly for ANY q, as long as the drafted token
        is drawn from the very q it is judged by, so q need not be p's arithmetic twin; it only needs to be
        close to it to be accepted as often. The float32 exponentials differ from float64's by ~1e-7 of
        each probability and cost a fifth to a third less, once per drafted token at T > 0 (the whole q over
        a 49k vocabulary 124 -> 87 us, 152k 383 -> 300 us, 262k 712 -> 582 us, on a 2-core Xeon; with top-k
        the same, its exponentials being few). The target's p stays float64."""
        return _distribution(_as_logits(logits), self.params, np.float32)

    def pick(self, logits: np.ndarray) -> int:
        """The next token: the argmax when greedy, else a draw from :meth:`distribution`."""
        if self.params.greedy:
            return argmax(logits)
        return sample(self.distribution(logits), self.rng)
