"""What a step costs on this machine: the cost model the controller plans with.

Speculative decoding pays only when verifying k+1 tokens in one target decode
costs little more than decoding one. That ratio is a property of the machine,
not of the model alone: on a 2-core CPU a decode is compute-bound and 16 tokens
cost ~8x one token; on a GPU 8 tokens cost about the same as one. So the
controller (``localspec.policy.controller``) plans with measured costs:
``CostModel`` interpolates between measured points and follows the machine
afterwards (``observe_verify``/``observe_draft``/``observe_overhead``), so
thermal throttling or another process moves the estimates within a few dozen
steps.

Costs grow with the context: every row of a batch attends to every cached
cell. ``per_cell`` (measured at a second KV depth) says by how much, per k, and
``kv_depth`` (set by the controller as the context grows: the cached cells the
next decode attends to) says where the next decode stands; without it the
estimates are those of the KV depth measured (``measured_depth``). "Depth" here
is always that KV depth, never a draft tree's.

Pure arithmetic: measuring a model and caching what was measured is
``localspec.policy.measure``.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from typing import Any, Iterable, Mapping, Sequence

# Refinement. Timings are compared in log space, so "twice as slow" and "half as
# slow" weigh alike, and a single surprise is clipped to a factor of 3: a GC pause
# or a preempted decode moves an estimate by at most ALPHA * log 3.
_LOG_CLIP = math.log(3.0)
# Machine-wide drift (throttling, load) shows at every k alike: a shared scale
# follows it quickly (half-life ~7 observations), also for k values the controller
# is not using right now; the per-k points then slowly (half-life ~23) absorb what is
# specific to one k. The point must be the slower of the two, or it would soak up
# drift seen at k = 1 and leave the long batches at their old cost.
_ALPHA_SCALE = 0.1
_ALPHA_POINT = 0.03
# Draft and Python costs: an exponentially weighted least-squares line, forgetting
# at this rate per observation (half-life ~14 steps).
_ALPHA_LINE = 0.05
# The prior line counts as this many (never forgotten) observations, which keeps
# the fit defined when every observation has the same n.
_PRIOR_WEIGHT = 0.5

# A model-free drafter's proposal is a Python lookup: a fixed cost, little per token
# (an n-gram lookup takes tens of microseconds; the prior must let a cheap drafter be
# asked before planning until its own lookups are measured). Measured on a 2-core CPU over
# the bench replies, ngram's median lookup took 0.035-0.062 ms asked for 8 tokens and
# 0.037-0.084 ms for 31: about 0.001 ms per token at most.
LOOKUP_FIXED_MS = 0.05
LOOKUP_PER_TOKEN_MS = 0.001
# A tree's further node: the Python work of drawing it (a pass over q) and verifying it, before any
# is measured (``CostModel.tree_draft_ms`` learns it).
TREE_NODE_MS = 0.1
# Per-step Python work around the decode (acceptance rule, history bookkeeping).
OVERHEAD_FIXED_MS = 0.2
OVERHEAD_PER_TOKEN_MS = 0.02


class _Line:
    """``ms(n) = fixed + per_token * n``, refitted with exponential forgetting.

    The prior line enters the fit as two fixed pseudo-observations (n = 0 and
    n = 4), so a drafter always observed at one draft length still gets a sensible slope.
    """

    def __init__(self, fixed_ms: float, per_token_ms: float) -> None:
        self.prior = f0, p0 = (max(0.0, fixed_ms), max(0.0, per_token_ms))
        self.fixed, self.per_token = self.prior
        # Exponentially weighted sums: weight, n, n^2, y, n*y.
        self._s = (0.0, 0.0, 0.0, 0.0, 0.0)
        # The prior's two pseudo-observations (n = 0 and n = 4), the same sums, added at every refit.
        ys = [(n, f0 + p0 * n) for n in (0.0, 4.0)]
        self._prior_s = (2 * _PRIOR_WEIGHT, _PRIOR_WEIGHT * sum(n for n, _ in ys),
                         _PRIOR_WEIGHT * sum(n * n for n, _ in ys), _PRIOR_WEIGHT * sum(y for _, y in ys),
                         _PRIOR_WEIGHT * sum(n * y for n, y in ys))

    def ms(self, n: float) -> float:
        return self.fixed + self.per_token * n

    def observe(self, n: float, ms: float) -> None:
        pred = self.fixed + self.per_token * n
        # Robust to outliers: clip a surprise to 3x the prediction (plus a floor
        # for predictions near zero, where relative clipping means nothing).
        y = min(max(ms, 0.0), 3.0 * pred + 1.0)
        decay = 1.0 - _ALPHA_LINE
        w, sn, snn, sy, sny = self._s
        self._s = (w * decay + 1.0, sn * decay + n, snn * decay + n * n, sy * decay + y, sny * decay + n * y)
        self._refit()

    def _refit(self) -> None:
        p0 = self.prior[1]
        w, sn, snn, sy, sny = self._s
        pw, psn, psnn, psy, psny = self._prior_s
        w, sn, snn, sy, sny = w + pw, sn + psn, snn + psnn, sy + psy, sny + psny
        det = w * snn - sn * sn
        slope = (w * sny - sn * sy) / det if det > 1e-12 else p0
        slope = max(0.0, slope)
        # Costs are never negative: with the slope fixed, the intercept is the weighted mean residual.
        self.fixed = max(0.0, (sy - slope * sn) / w)
        self.per_token = slope

    def to_dict(self) -> dict[str, float]:
        return {"fixed_ms": self.fixed, "per_token_ms": self.per_token}


def _interpolate(points: Mapping[int, float], k: float, ks: list[int] | None = None) -> float:
    """Piecewise-linear through ``points`` (``ks``: their keys, sorted); linear beyond the ends (never
    sloping down past the last). The same numbers as ``_interpolate_sorted`` of one query, found by
    bisection (a plan asks for single points many times a step)."""
    if ks is None:
        ks = sorted(points)
    if len(ks) == 1:
        return points[ks[0]]
    first, last = ks[0], ks[-1]
    if k == first:  # a one-token decode, most of all: what the general path below returns there
        return points[first]
    if first < k <= last:
        i = bisect.bisect_left(ks, k)
        lo, hi = ks[i - 1], ks[i]
        p_lo = points[lo]
        return p_lo + (k - lo) / (hi - lo) * (points[hi] - p_lo)
    return _interpolate_sorted(points, (k,), ks)[0]


def _interpolate_sorted(points: Mapping[int, float], queries: Iterable[float], ks: list[int]) -> list[float]:
    """``_interpolate`` at each of ``queries`` (ascending), walking the segments once."""
    if len(ks) == 1:
        return [points[ks[0]] for _ in queries]
    first, last = ks[0], ks[-1]
    out: list[float] = []
    i, lo, hi = 1, ks[0], ks[1]  # the segment [ks[i - 1], ks[i]] holding the query
    p_lo, rise = points[lo], points[hi] - points[lo]
    for k in queries:
        if first < k <= last:
            if k > hi:
                while ks[i] < k:
                    i += 1
                lo, hi = ks[i - 1], ks[i]
                p_lo, rise = points[lo], points[hi] - points[lo]
            out.append(p_lo + (k - lo) / (hi - lo) * rise)
        elif k <= first:
            # Below the smallest measured batch (k = 1 did not fit): the first segment's slope, but never
            # less than proportional to k (the compute-bound extreme).
            slope = max(0.0, (points[ks[1]] - points[first]) / (ks[1] - first))
            out.append(max(points[first] - slope * (first - k), points[first] * k / first))
        else:
            # Beyond the largest measured batch: the last segment's slope. A lumpy curve can make that
            # segment fall; extrapolating a fall would promise ever cheaper batches.
            slope = max(0.0, (points[last] - points[ks[-2]]) / (last - ks[-2]))
            out.append(points[last] + slope * (k - last))
    return out


class CostModel:
    """Milliseconds per step component on this machine.

    * ``verify_ms(k)``: one target decode of ``k`` tokens (a plain step is k = 1;
      verifying a draft of d tokens is k = d + 1), interpolated between measured
      points and extrapolated linearly beyond them; ``k`` may be fractional
      (an expected batch size). At ``kv_depth`` cached cells it adds
      ``(kv_depth - measured_depth) * per_cell(k)`` (``per_cell`` interpolated the
      same way; none given: no change with the KV depth). With a sliding ``window``,
      cells past it count ``past_window`` each (the share of the layers that
      still attend to them).
    * ``draft_ms(name, n)``: proposing ``n`` tokens with drafter ``name``
      (0 for n = 0: a step without a draft never calls the drafter). A draft
      model costs per token (``set_model_drafter``); a drafter never registered
      is taken to be a model-free lookup: a fixed Python cost.
    * ``overhead_ms(n)``: Python work of a step verifying ``n`` draft tokens.

    Every estimate follows observations (``observe_*``); see the module notes
    for the rates. Not thread-safe: one generation loop owns it.
    """

    def __init__(self, verify: Mapping[int, float], *, per_cell: Mapping[int, float] | None = None,
                 measured_depth: int = 0, window: int = 0, past_window: float = 0.0,
                 overhead: tuple[float, float] = (OVERHEAD_FIXED_MS, OVERHEAD_PER_TOKEN_MS)) -> None:
        points = {int(k): float(ms) for k, ms in verify.items() if int(k) >= 1 and ms > 0}
        if not points:
            raise ValueError("a cost model needs at least one measured verify cost (k >= 1, ms > 0)")
        self.measured: dict[int, float] = dict(points)
        self._points = points
        self._ks = sorted(points)
        # ms per cached cell for a decode of k tokens, and the KV depth ``verify`` was measured at
        # Every row of a batch attends to every cached cell, so a batch of more rows never costs less per
        # cell than one of fewer: measured ones that say so (a difference of two timings, taken apart
        # in time, which a load change in between can swallow) are raised to the smaller batch's.
        cells: dict[int, float] = {}
        floor = 0.0
        for k, v in sorted((int(k), float(v)) for k, v in (per_cell or {}).items() if int(k) >= 1):
            floor = cells[k] = max(floor, v)
        self.per_cell = cells
        self._cell_ks = sorted(self.per_cell)
        self.measured_depth = measured_depth
        # A model with sliding-window layers (Gemma 3: five of every six, over 512 cells) pays for depth
        # at the full rate up to its window only: per_cell is measured over the window, where every layer
        # attends to each new cell. Past it only the global layers do, so a cell there costs their share
        # of the rate (``past_window``: 1/6 on Gemma 3, 1/2 on Gemma 2 and gpt-oss; 0 counts nothing
        # past the window). Measured on Gemma 3 270M, a decode of 16 grew 31.3 ms over its first 512
        # cells (0.061 ms a cell) and 28.2 ms over the next 2,560 (0.011 a cell; 1/6 of the rate is 0.010).
        self.window = window
        self.past_window = past_window
        self._scale = 1.0
        self._draft: dict[str, _Line] = {}
        self._tree: dict[str, _Line] = {}  # per further node of a tree (see tree_draft_ms)
        self._draft_models: dict[str, CostModel] = {}
        self._catch_up_passes: dict[str, int] = {}
        self.kv_depth = measured_depth  # cached cells the next decode attends to (``Controller.plan`` sets it)
        self._overhead = _Line(*overhead)

    # --- estimates ---------------------------------------------------------
    @property
    def kv_depth(self) -> int:
        """Cached cells the next decode attends to. A draft model's (and an MTP head's) context holds
        the same text, so setting it sets theirs too."""
        return self._kv_depth

    @kv_depth.setter
    def kv_depth(self, cells: int) -> None:
        self._kv_depth = cells
        for model in self._draft_models.values():
            model.kv_depth = cells

    def verify_ms(self, k: float, *, kv_depth: int | None = None) -> float:
        """Milliseconds of one target decode of ``k`` >= 1 tokens after ``kv_depth`` cached cells (default:
        the model's ``kv_depth``)."""
        if k < 1:
            raise ValueError(f"a decode holds at least one token, not {k}")
        base = _interpolate(self._points, k, self._ks)
        return self._scale * (base + self._kv_depth_ms(k, base, self._kv_depth if kv_depth is None else kv_depth))

    def verify_ms_at(self, ks: Sequence[float]) -> list[float]:
        """``verify_ms(k)`` for each of ``ks`` (ascending, each >= 1) at the current KV depth, in one walk along
        the measured points: a plan prices every batch its options would verify (up to 125 with a 4-leaf
        tree 31 deep), and searching the points for each was most of its time."""
        if ks and ks[0] < 1:
            raise ValueError(f"a decode holds at least one token, not {ks[0]}")
        base = _interpolate_sorted(self._points, ks, self._ks)
        cells = self._cells(self._kv_depth)
        if cells is None:
            return [self._scale * b for b in base]
        per_cell = _interpolate_sorted(self.per_cell, ks, self._cell_ks)
        return [self._scale * (b + max(-0.5 * b, cells * c)) for b, c in zip(base, per_cell)]

    def kv_depth_ms(self, k: float) -> float:
        """What the current ``kv_depth`` adds to a decode of ``k`` tokens (negative: shallower than measured)."""
        return self._scale * self._kv_depth_ms(k, _interpolate(self._points, k, self._ks), self._kv_depth)

    def _kv_depth_ms(self, k: float, base: float, kv_depth: int) -> float:
        """What ``kv_depth`` adds to (or, shallower than measured, takes from) a decode of ``k`` tokens: never
        more than half of ``base`` taken off (a model's weights cost the same at any KV depth)."""
        cells = self._cells(kv_depth)
        if cells is None:
            return 0.0
        return max(-0.5 * base, cells * _interpolate(self.per_cell, k, self._cell_ks))

    def _cells(self, kv_depth: int) -> float | None:
        """The cached cells a decode at ``kv_depth`` pays for beyond (or, negative, short of) the measured
        KV depth, a cell past a sliding window counting ``past_window``; None when the KV depth changes nothing
        (no per-cell costs, or the measured KV depth itself)."""
        if not self.per_cell or kv_depth == self.measured_depth:
            return None
        if not self.window:
            return kv_depth - self.measured_depth
        w, at = self.window, self.measured_depth
        return (min(kv_depth, w) - min(at, w)) + self.past_window * (max(kv_depth, w) - max(at, w))

    def relative(self, k: float) -> float:
        """``verify_ms(k) / verify_ms(1)``: ~1 on a GPU for k <= 8, ~k/2 on a small CPU."""
        return self.verify_ms(k) / self.verify_ms(1)

    def draft_ms(self, name: str, draft_len: float) -> float:
        """Milliseconds for drafter ``name`` to propose ``draft_len`` tokens (0 when draft_len is 0)."""
        if draft_len <= 0:
            return 0.0
        return self._line(name).ms(draft_len) + self._draft_kv_depth_ms(name, draft_len)

    def tree_draft_ms(self, name: str, draft_len: int, nodes: float) -> float:
        """Milliseconds for drafter ``name`` to grow a tree of ``nodes`` tokens ``draft_len`` deep.

        A draft model (``set_model_drafter``) decodes the tree level by level
        (``draft_tree.grow_tree`` asks for every waiting node at once): as many
        decodes as its chain of draft_len tokens, the ``nodes - draft_len`` further nodes as extra
        rows in them. A node at the last tree depth is never decoded, and with draft_len = 1
        none is. Any other drafter drafts a tree from what its chain costs
        already (a DFlash block is one pass whatever grows from it).
        Besides, each further node costs Python work (drawing it from q over the
        vocabulary, the verification's bookkeeping): a line in the further nodes,
        learned from every tree observed (``observe_tree_draft``).
        """
        extra = nodes - draft_len
        chain = self.draft_ms(name, draft_len)
        if extra <= 0:
            return chain
        return chain + self._tree_rows_ms(name, draft_len, extra) + self._tree_line(name).ms(extra)

    def tree_draft_ms_at(self, name: str, draft_len: int, extras: Sequence[int]) -> list[float]:
        """``tree_draft_ms(name, draft_len, draft_len + m)`` for each m of ``extras`` (ascending), the draft
        model's decodes read in one walk along its measured points."""
        chain = self.draft_ms(name, draft_len)
        line = self._tree_line(name)
        model = self._draft_models.get(name)
        rows = [0.0] * len(extras)
        if model is not None and draft_len > 1:
            levels = draft_len - 1
            for r, count in Counter(self._level_rows(name, draft_len)).items():
                one = model.verify_ms(r)
                at = model.verify_ms_at([r * (1 + m / levels) for m in extras])
                rows = [total + count * max(0.0, v - one) for total, v in zip(rows, at)]
        return [chain + r + line.ms(m) if m > 0 else chain for m, r in zip(extras, rows)]

    def _tree_rows_ms(self, name: str, draft_len: int, extra: float) -> float:
        """What ``extra`` further nodes add to a draft model's decodes of a ``draft_len``-deep tree."""
        model = self._draft_models.get(name)
        if model is None or draft_len <= 1:
            return 0.0
        # The decodes after the catch-up's, each of 1 + extra / levels nodes on average.
        grow = 1 + extra / (draft_len - 1)
        return sum(max(0.0, model.verify_ms(r * grow) - model.verify_ms(r))
                   for r in self._level_rows(name, draft_len))

    def _level_rows(self, name: str, draft_len: int) -> list[int]:
        """The rows a node takes in each of the draft_len - 1 decodes of a ``draft_len``-deep tree after the
        catch-up's: one, but for chained MTP heads (``set_model_drafter``'s ``passes``) a node at tree depth d < passes
        rebuilds its draft region, d + 1 rows (``drafting/mtp_tree.py``)."""
        heads = self._catch_up_passes.get(name, 1)
        return [d + 1 if d < heads else 1 for d in range(1, draft_len)]

    def _tree_line(self, name: str) -> _Line:
        line = self._tree.get(name)
        if line is None:
            line = self._tree[name] = _Line(0.0, TREE_NODE_MS)
        return line

    def observe_tree_draft(self, name: str, draft_len: int, nodes: int, ms: float) -> None:
        """Learn from drafter ``name`` growing a tree of ``nodes`` tokens ``draft_len`` deep in ``ms``: what it
        took beyond its chain's estimate and the draft model's extra rows teaches the per-node line."""
        extra = nodes - draft_len
        if extra > 0 and ms >= 0 and math.isfinite(ms):
            own = ms - self.draft_ms(name, draft_len) - self._tree_rows_ms(name, draft_len, extra)
            self._tree_line(name).observe(extra, max(0.0, own))

    def _draft_kv_depth_ms(self, name: str, draft_len: float) -> float:
        """What the KV depth adds to a draft model's ``draft_len``-token draft: its catch-up decodes of ~2
        tokens (one per pass) and draft_len - 1 one-token decodes, each attending to the whole context (see
        set_model_drafter). The line itself holds the draft's cost at the model's measured KV depth."""
        model = self._draft_models.get(name)
        if model is None:
            return 0.0
        return (self._catch_up_passes[name] * model.kv_depth_ms(2)
                + max(0.0, draft_len - 1) * model.kv_depth_ms(1))

    def overhead_ms(self, n: float = 0) -> float:
        """Python time of one step verifying ``n`` draft tokens (plain decoding: n = 0)."""
        return self._overhead.ms(n)

    def plain_ms(self) -> float:
        """One step of plain decoding: a one-token decode and the step's Python work."""
        return self.verify_ms(1) + self.overhead_ms(0)

    @property
    def points(self) -> dict[int, float]:
        """The current verify estimates at every k that was measured or observed."""
        return {k: self._scale * v for k, v in sorted(self._points.items())}

    # --- drafters ----------------------------------------------------------
    def set_draft_cost(self, name: str, fixed_ms: float, per_token_ms: float) -> None:
        """Declare drafter ``name``'s cost line (replaces what was learned about it)."""
        self._draft[name] = _Line(fixed_ms, per_token_ms)

    def restart_draft(self, name: str) -> None:
        """Drop what was learned about drafter ``name``'s cost: its line starts again from its prior."""
        line = self._draft.get(name)
        if line is not None:
            self._draft[name] = _Line(*line.prior)

    def set_model_drafter(self, name: str, draft_model: "CostModel", *, passes: int = 1) -> None:
        """A draft model drafting n tokens: a catch-up decode (the last target token, or
        the last draft token and the bonus: ~2 tokens) then n - 1 one-token decodes,
        i.e. ``(V(2) - V(1)) + n * V(1)`` with V the draft model's own decode costs.
        A longer catch-up (its prefill, or the tokens of steps it sat out) is
        ``catch_up_ms``.

        An MTP head is such a drafter, V its own decode costs (one NextN block
        and the output matrix); ``passes``: the catch-up decodes the history
        once per chained head (each head is its own layer), ``passes * V(2) - V(1)``
        fixed; a tree's node at tree depth d < passes decodes d + 1 rows (``_level_rows``).

        The line holds V at the KV depth ``draft_model`` was measured at; from then on
        the draft model follows this model's ``kv_depth`` (its context holds the same
        text), and ``draft_ms`` adds what that KV depth costs its decodes."""
        at = draft_model.measured_depth
        one = draft_model.verify_ms(1, kv_depth=at)
        self.set_draft_cost(name, max(0.0, passes * draft_model.verify_ms(2, kv_depth=at) - one), one)
        self._draft_models[name] = draft_model
        self._catch_up_passes[name] = max(1, passes)
        draft_model.kv_depth = self._kv_depth

    def catch_up_ms(self, name: str, behind: int) -> float:
        """What drafter ``name`` pays beyond ``draft_ms`` to decode the ``behind`` tokens it lacks.

        ``draft_ms`` already holds a 2-token catch-up; past that, a draft model
        decodes the rest in one batch: ``V(behind) - V(2)`` (times the passes of
        ``set_model_drafter``), the batch attending to the cells before it (a
        first prefill to none). Lookups never lag.
        """
        model = self._draft_models.get(name)
        if model is None or behind <= 2:
            return 0.0
        passes = self._catch_up_passes.get(name, 1)
        batch = model.verify_ms(behind, kv_depth=max(0, self._kv_depth + 1 - behind))
        return passes * max(0.0, batch - model.verify_ms(2))

    def _line(self, name: str) -> _Line:
        line = self._draft.get(name)
        if line is None:
            line = self._draft[name] = _Line(LOOKUP_FIXED_MS, LOOKUP_PER_TOKEN_MS)
        return line

    # --- refinement --------------------------------------------------------
    def observe_verify(self, k: int, ms: float) -> None:
        """Learn from a measured decode of ``k`` tokens that took ``ms``.

        First the shared scale moves (drift shows at every k), then the point at
        ``k`` absorbs the rest (created from the curve if k was never seen).
        """
        if k < 1 or not ms > 0 or not math.isfinite(ms):
            return
        # log(ms / verify_ms(k)) before the scale moves; after it, the same less the move (verify_ms is
        # linear in the scale), so the estimate is read once.
        surprise = math.log(ms / self.verify_ms(k))
        moved = _ALPHA_SCALE * _clip(surprise)
        self._scale *= math.exp(moved)
        rest = _clip(surprise - moved)
        base = self._points.get(k)
        if base is None:
            base = _interpolate(self._points, k)
            self._ks = sorted([*self._ks, k])
        # The point holds the cost at the measured KV depth and moves by the same share; the per-cell
        # costs were measured and the scale follows the machine, KV depth included.
        self._points[k] = base * math.exp(_ALPHA_POINT * rest)

    def observe_draft(self, name: str, draft_len: int, ms: float) -> None:
        """Learn from drafter ``name`` proposing ``draft_len`` tokens in ``ms`` (at the current ``kv_depth``)."""
        if ms >= 0 and math.isfinite(ms):
            self._line(name).observe(draft_len, max(0.0, ms - self._draft_kv_depth_ms(name, draft_len)))

    def observe_overhead(self, n: int, ms: float) -> None:
        """Learn from a step's Python time (``StepEvent.python_ms``) with ``n`` draft tokens."""
        if ms >= 0 and math.isfinite(ms):
            self._overhead.observe(n, ms)

    def to_dict(self) -> dict[str, Any]:
        """Current estimates, for the dashboard and for debugging (not the cache format)."""
        return {
            "verify_ms": {str(k): v for k, v in self.points.items()},
            "measured_ms": {str(k): v for k, v in sorted(self.measured.items())},
            "per_cell_ms": {str(k): v for k, v in sorted(self.per_cell.items())},
            "depth": self.kv_depth, "measured_depth": self.measured_depth, "window": self.window,
            "past_window": self.past_window,
            "scale": self._scale,
            "overhead": self._overhead.to_dict(),
            "drafters": {name: line.to_dict() for name, line in self._draft.items()},
        }


def _clip(x: float) -> float:
    return max(-_LOG_CLIP, min(_LOG_CLIP, x))
