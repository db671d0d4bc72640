"""What a step costs on this machine: measured once, cached, refined while generating.

Speculative decoding pays only when verifying k+1 tokens in one target decode
costs little more than decoding one. That ratio is a property of the machine,
not of the model alone: on a 2-core CPU a decode is compute-bound and 16 tokens
cost ~8x one token; on a GPU 8 tokens cost about the same as one. So the
controller (``localspec.control``) plans with costs measured here:

* ``measure_verify_costs(ctx)`` times one decode of k tokens for a few k, in
  about a second and a half, and leaves the context exactly as it found it;
* ``load_or_measure(ctx)`` caches that per model file, llama.cpp build, offload
  and thread count in ``cache_dir()/costs/<key>.json``;
* ``CostModel`` interpolates between the measured points and follows the
  machine afterwards (``observe_verify``/``observe_draft``/``observe_overhead``),
  so thermal throttling or another process moves the estimates within a few
  dozen steps.

Importing this module does not load llama.cpp (the controller, which is pure
logic, imports it); only ``measure_verify_costs``, ``cost_key`` and
``load_or_measure`` use a ``Context`` and the backend.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from localspec.paths import atomic_write, cache_dir

if TYPE_CHECKING:
    from localspec.backend import Context

DEFAULT_KS: tuple[int, ...] = (1, 2, 3, 4, 6, 8, 12, 16)
SCHEMA = 1

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

# A model-free drafter's proposal is a Python lookup: a fixed cost, nothing per token.
LOOKUP_FIXED_MS = 0.3
LOOKUP_PER_TOKEN_MS = 0.01
# Per-step Python work around the decode (acceptance rule, history bookkeeping).
OVERHEAD_FIXED_MS = 0.2
OVERHEAD_PER_TOKEN_MS = 0.02


class _Line:
    """``ms(n) = fixed + per_token * n``, refitted with exponential forgetting.

    The prior line enters the fit as two fixed pseudo-observations (n = 0 and
    n = 4), so a drafter always observed at one depth still gets a sensible slope.
    """

    def __init__(self, fixed_ms: float, per_token_ms: float) -> None:
        self.prior = (max(0.0, fixed_ms), max(0.0, per_token_ms))
        self.fixed, self.per_token = self.prior
        # Exponentially weighted sums: weight, n, n^2, y, n*y.
        self._s = [0.0, 0.0, 0.0, 0.0, 0.0]

    def ms(self, n: float) -> float:
        return self.fixed + self.per_token * n

    def observe(self, n: float, ms: float) -> None:
        pred = self.ms(n)
        # Robust to outliers: clip a surprise to 3x the prediction (plus a floor
        # for predictions near zero, where relative clipping means nothing).
        y = min(max(ms, 0.0), 3.0 * pred + 1.0)
        decay = 1.0 - _ALPHA_LINE
        s = self._s
        for i in range(5):
            s[i] *= decay
        s[0] += 1.0
        s[1] += n
        s[2] += n * n
        s[3] += y
        s[4] += n * y
        self._refit()

    def _refit(self) -> None:
        f0, p0 = self.prior
        w, sn, snn, sy, sny = self._s
        for n in (0.0, 4.0):
            y = f0 + p0 * n
            w += _PRIOR_WEIGHT
            sn += _PRIOR_WEIGHT * n
            snn += _PRIOR_WEIGHT * n * n
            sy += _PRIOR_WEIGHT * y
            sny += _PRIOR_WEIGHT * n * y
        det = w * snn - sn * sn
        slope = (w * sny - sn * sy) / det if det > 1e-12 else p0
        slope = max(0.0, slope)
        # Costs are never negative: with the slope fixed, the intercept is the weighted mean residual.
        self.fixed = max(0.0, (sy - slope * sn) / w)
        self.per_token = slope

    def to_dict(self) -> dict[str, float]:
        return {"fixed_ms": self.fixed, "per_token_ms": self.per_token}


def _interpolate(points: Mapping[int, float], k: float) -> float:
    """Piecewise-linear through ``points``; linear beyond the ends (never sloping down past the last)."""
    ks = sorted(points)
    if len(ks) == 1:
        return points[ks[0]]
    if k <= ks[0]:
        # Below the smallest measured batch (k = 1 did not fit): the first segment's
        # slope, but never less than proportional to k (the compute-bound extreme).
        k0, k1 = ks[0], ks[1]
        slope = max(0.0, (points[k1] - points[k0]) / (k1 - k0))
        return max(points[k0] - slope * (k0 - k), points[k0] * k / k0)
    for lo, hi in zip(ks, ks[1:]):
        if k <= hi:
            t = (k - lo) / (hi - lo)
            return points[lo] + t * (points[hi] - points[lo])
    k0, k1 = ks[-2], ks[-1]
    # Beyond the largest measured batch: the last segment's slope. A lumpy curve can
    # make that segment fall; extrapolating a fall would promise ever cheaper batches.
    slope = max(0.0, (points[k1] - points[k0]) / (k1 - k0))
    return points[k1] + slope * (k - k1)


class CostModel:
    """Milliseconds per step component on this machine.

    * ``verify_ms(k)``: one target decode of ``k`` tokens (a plain step is k = 1;
      verifying a draft of d tokens is k = d + 1), interpolated between measured
      points and extrapolated linearly beyond them; ``k`` may be fractional
      (an expected batch size).
    * ``draft_ms(name, n)``: proposing ``n`` tokens with drafter ``name``
      (0 for n = 0: a step without a draft never calls the drafter). A draft
      model costs per token (``set_model_drafter``); a drafter never registered
      is taken to be a model-free lookup: a fixed Python cost.
    * ``overhead_ms(n)``: Python work of a step verifying ``n`` draft tokens.

    Every estimate follows observations (``observe_*``); see the module notes
    for the rates. Not thread-safe: one generation loop owns it.
    """

    def __init__(self, verify: Mapping[int, float], *,
                 overhead: tuple[float, float] = (OVERHEAD_FIXED_MS, OVERHEAD_PER_TOKEN_MS)) -> None:
        points = {int(k): float(ms) for k, ms in verify.items() if int(k) >= 1 and ms > 0}
        if not points:
            raise ValueError("a cost model needs at least one measured verify cost (k >= 1, ms > 0)")
        self.measured: dict[int, float] = dict(points)
        self._points = points
        self._scale = 1.0
        self._draft: dict[str, _Line] = {}
        self._overhead = _Line(*overhead)

    # --- estimates ---------------------------------------------------------
    def verify_ms(self, k: float) -> float:
        """Milliseconds of one target decode of ``k`` >= 1 tokens."""
        if k < 1:
            raise ValueError(f"a decode holds at least one token, not {k}")
        return self._scale * _interpolate(self._points, k)

    def relative(self, k: float) -> float:
        """``verify_ms(k) / verify_ms(1)``: ~1 on a GPU for k <= 8, ~k/2 on a small CPU."""
        return self.verify_ms(k) / self.verify_ms(1)

    def draft_ms(self, name: str, n: float) -> float:
        """Milliseconds for drafter ``name`` to propose ``n`` tokens (0 when n is 0)."""
        if n <= 0:
            return 0.0
        return self._line(name).ms(n)

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

    def set_model_drafter(self, name: str, draft_model: "CostModel") -> None:
        """A draft model drafting n tokens: a catch-up decode (the last target token, or
        the last draft token and the bonus: ~2 tokens) then n - 1 one-token decodes,
        i.e. ``(V(2) - V(1)) + n * V(1)`` with V the draft model's own decode costs."""
        one = draft_model.verify_ms(1)
        self.set_draft_cost(name, max(0.0, draft_model.verify_ms(2) - one), one)

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
        surprise = _clip(math.log(ms / self.verify_ms(k)))
        self._scale *= math.exp(_ALPHA_SCALE * surprise)
        rest = _clip(math.log(ms / self.verify_ms(k)))
        base = self._points.get(k)
        if base is None:
            base = _interpolate(self._points, k)
        self._points[k] = base * math.exp(_ALPHA_POINT * rest)

    def observe_draft(self, name: str, n: int, ms: float) -> None:
        """Learn from drafter ``name`` proposing ``n`` tokens in ``ms``."""
        if ms >= 0 and math.isfinite(ms):
            self._line(name).observe(n, ms)

    def observe_overhead(self, n: int, ms: float) -> None:
        """Learn from a step's Python time (``StepResult.python_s``) with ``n`` draft tokens."""
        if ms >= 0 and math.isfinite(ms):
            self._overhead.observe(n, ms)

    def to_dict(self) -> dict[str, Any]:
        """Current estimates, for the dashboard and for debugging (not the cache format)."""
        return {
            "verify_ms": {str(k): v for k, v in self.points.items()},
            "measured_ms": {str(k): v for k, v in sorted(self.measured.items())},
            "scale": self._scale,
            "overhead": self._overhead.to_dict(),
            "drafters": {name: line.to_dict() for name, line in self._draft.items()},
        }


def _clip(x: float) -> float:
    return max(-_LOG_CLIP, min(_LOG_CLIP, x))


# --- measuring ---------------------------------------------------------------
class Measurement(dict[int, float]):
    """Median ms per batch size, and whether the planned ``min_reps`` rounds all ran.

    An incomplete measurement (the machine was so loaded that the rounds overran
    the time limit) is still the best guess for now, but it is not cached.
    """

    def __init__(self, costs: Mapping[int, float], rounds: int, complete: bool) -> None:
        super().__init__(costs)
        self.rounds = rounds
        self.complete = complete


def measure_verify_costs(ctx: "Context", ks: Sequence[int] = DEFAULT_KS, *, budget_s: float = 1.5,
                         min_reps: int = 3, max_reps: int = 25, seed: int = 0) -> Measurement:
    """Milliseconds of one decode of k tokens, for each k in ``ks`` that fits.

    Each sample decodes k tokens right after what the context holds, with
    logits for every row (as verification asks), then rolls the cache back.
    The tokens are repeats of the last token (any valid id costs the same).
    One untimed warm-up round lets llama.cpp size its buffers; then rounds
    visit every k once, in a shuffled order, until ``budget_s`` (warm-up
    included) is spent: at least ``min_reps`` rounds unless that takes three
    budgets, at least one, at most ``max_reps``. Interleaving makes
    drift (throttling, a background job) hit every k alike instead of
    skewing whichever k ran during it.

    The statistic is the per-k median: noise on a shared machine is one-sided
    (interrupts only add time), so the mean is pulled by outliers and the
    minimum is a best case the generation loop will rarely see; the median is
    the typical cost of a step, which is what the controller plans with.

    Postcondition: ``ctx.tokens`` and the cache hold exactly what they held
    before (also when a decode raises), except with a recurrent state
    (``ctx.max_rollback`` not None), which cannot drop a whole batch: then the
    samples are taken on an empty cache, and it is left empty. Raises ValueError
    when no k fits in the context's free room or batch.
    """
    if ctx.max_rollback is not None:
        ctx.clear()
    n0 = len(ctx.tokens)
    fits = sorted({int(k) for k in ks if 1 <= k <= ctx.n_batch and n0 + k <= ctx.n_ctx})
    if not fits:
        raise ValueError(f"no batch of {sorted(ks)} tokens fits after {n0} tokens in a context of {ctx.n_ctx}")
    token = ctx.tokens[-1] if ctx.tokens else max(ctx.model.bos, 0)
    samples: dict[int, list[float]] = {k: [] for k in fits}
    rng = random.Random(seed)

    def timed(k: int) -> float:
        t0 = time.perf_counter()
        ctx.decode([token] * k, range(n0, n0 + k), None, [True] * k)
        ms = (time.perf_counter() - t0) * 1e3
        # decode() leaves ctx.tokens alone; mirror the batch so rollback_to trims it.
        ctx.tokens.extend([token] * k)
        ctx.rollback_to(n0)
        return ms

    start = time.perf_counter()
    rounds = 0
    try:
        for k in fits:  # warm-up, untimed
            timed(k)
        while rounds < max_reps:
            elapsed = time.perf_counter() - start
            # On a machine so loaded that min_reps rounds overrun the budget threefold,
            # stop anyway: refinement during generation corrects a rough first guess.
            if rounds >= 1 and (elapsed >= 3 * budget_s or (rounds >= min_reps and elapsed >= budget_s)):
                break
            order = list(fits)
            rng.shuffle(order)
            for k in order:
                samples[k].append(timed(k))
            rounds += 1
    finally:
        # A decode that raised may have left its batch in the cache (tokens not yet mirrored).
        ctx.remove_seq(0, n0, -1)
        del ctx.tokens[n0:]
    return Measurement({k: statistics.median(v) for k, v in samples.items()}, rounds, rounds >= min_reps)


# --- the cache ---------------------------------------------------------------
@dataclass(frozen=True)
class CostKey:
    """Everything a measured cost depends on; its hash names the cache file."""

    model: str
    model_size: int
    model_mtime_ns: int
    system_info: str
    gpu_offload: bool
    n_gpu_layers: int
    n_threads: int
    n_ctx: int
    n_seq: int
    llama_cpp_version: str

    def digest(self) -> str:
        raw = json.dumps({"schema": SCHEMA, **self.__dict__}, sort_keys=True).encode()
        return hashlib.sha256(raw).hexdigest()[:20]


def cost_key(ctx: "Context", *, n_threads: int | None = None, n_gpu_layers: int = -1) -> CostKey:
    """The key for ``ctx``'s model on this machine.

    ``Context`` does not keep its thread count or the model's offload, so the
    caller passes what it created them with (None threads: the backend default).
    """
    from importlib.metadata import PackageNotFoundError, version

    from localspec.backend import default_threads, gpu_offload_supported, system_info

    path = Path(ctx.model.path).resolve()
    st = path.stat()
    try:
        llama_version = version("llama-cpp-python")
    except PackageNotFoundError:  # pragma: no cover - a source checkout of the bindings
        llama_version = "unknown"
    return CostKey(
        model=str(path), model_size=st.st_size, model_mtime_ns=st.st_mtime_ns,
        system_info=system_info(), gpu_offload=gpu_offload_supported(), n_gpu_layers=n_gpu_layers,
        n_threads=n_threads or default_threads(), n_ctx=ctx.n_ctx, n_seq=ctx.n_seq,
        llama_cpp_version=llama_version,
    )


def cost_path(key: CostKey) -> Path:
    return cache_dir() / "costs" / f"{key.digest()}.json"


def save_costs(path: Path, key: CostKey, verify: Mapping[int, float]) -> None:
    record = {"schema": SCHEMA, "key": key.__dict__, "measured_at": time.time(),
              "verify_ms": {str(k): float(v) for k, v in sorted(verify.items())}}
    with atomic_write(path) as fh:
        fh.write(json.dumps(record, indent=1).encode())


def load_costs(path: Path, key: CostKey, *, max_age_s: float | None = None) -> dict[int, float] | None:
    """The cached verify costs for ``key``, or None when absent, stale, foreign or unreadable."""
    try:
        record = json.loads(path.read_text())
        if record.get("schema") != SCHEMA or record.get("key") != key.__dict__:
            return None
        if max_age_s is not None and time.time() - float(record["measured_at"]) > max_age_s:
            return None
        verify = {int(k): float(v) for k, v in record["verify_ms"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        # A half-written or hand-edited file is not an error: measuring again fixes it.
        return None
    return verify if verify and all(v > 0 for v in verify.values()) else None


def load_or_measure(ctx: "Context", *, n_threads: int | None = None, n_gpu_layers: int = -1,
                    refresh: bool = False, max_age_s: float | None = 30 * 86400,
                    budget_s: float = 1.5) -> CostModel:
    """The cost model for ``ctx``: from the cache when this machine measured it already
    (and within ``max_age_s``), else measured now (~``budget_s``) and cached.

    The measurement leaves ``ctx`` untouched. It is not cached when it was cut
    short (see ``Measurement``) or the cache cannot be written; the costs are
    returned all the same and the next run measures again.
    """
    key = cost_key(ctx, n_threads=n_threads, n_gpu_layers=n_gpu_layers)
    path = cost_path(key)
    verify = None if refresh else load_costs(path, key, max_age_s=max_age_s)
    if verify is None:
        verify = measure_verify_costs(ctx, budget_s=budget_s)
        # A measurement cut short by an overloaded machine is used now but not kept:
        # cached, it would mislead every later run on a quiet machine.
        if not isinstance(verify, Measurement) or verify.complete:
            try:
                save_costs(path, key, verify)
            except OSError:
                pass  # a read-only cache dir costs a re-measurement next time, nothing else
    return CostModel(verify)
