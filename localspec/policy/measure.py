"""Measuring the cost model's verify costs (the cache they are kept in is ``cost_cache``).

* ``measure_verify_costs(ctx)`` times one decode of k tokens for a few k, in
  about a second and a half, then a few k side by side with a scratch context
  ``DEPTH_CELLS`` cells deeper (what each cached cell adds to a decode), and
  leaves the context exactly as it found it;
* ``load_or_measure(ctx)`` caches that per model file, llama.cpp build, offload,
  thread count and weight repacking in ``cache_dir()/costs/<key>.json`` and returns the
  ``localspec.policy.costs.CostModel`` built from it;
* ``measure_mtp_costs(head)`` and ``load_or_measure_mtp(head, ctx)`` do the same
  for a model's MTP head: one decode of k rows (a catch-up batch; k = 1 is a
  draft step), cached next to the target's under its own key.
* a cached cost corrects itself (``cost_cache.CachedCostModel``).

Nothing here imports the backend (llama.cpp) but ``cost_cache.cost_key``, when called.
"""

from __future__ import annotations

import contextlib
import random
import statistics
import time
from typing import TYPE_CHECKING, Callable, ContextManager, Mapping, Sequence

from localspec.policy.costs import CostModel
from localspec.errors import ModelFileError
from localspec.policy.cost_cache import CachedCostModel, Measurement, cost_key, cost_path, load_costs, save_costs

if TYPE_CHECKING:
    from localspec.backend import Context, MtpContext

DEFAULT_KS: tuple[int, ...] = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
# The second depth: this many more cells filled (one prefill), then these batch sizes timed again. The
# difference per cell is what attention over a longer context adds (``CostModel.per_cell``).
DEPTH_CELLS = 512
DEPTH_KS: tuple[int, ...] = (1, 4, 16)


# --- measuring ---------------------------------------------------------------
def measure_verify_costs(ctx: "Context", ks: Sequence[int] = DEFAULT_KS, *, budget_s: float = 1.5,
                         min_reps: int = 3, max_reps: int = 25, seed: int = 0,
                         depth_cells: int = DEPTH_CELLS,
                         turn: Callable[[], ContextManager[object]] = contextlib.nullcontext) -> Measurement:
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

    On a device (``ctx.offloaded``) each sample is the second of two decodes of its size back to back
    (``_timer``); on this CPU it is one decode, as the generation loop runs them.

    A measurement cut short is cached only where it says something about this machine rather than its
    load (``Measurement.complete``): after ``min_reps`` rounds, or, on this CPU, when its decodes had the
    CPUs they asked for (``kept_its_cpus``): the model is then slow here, not the machine busy, and
    waiting for more rounds would only make every run measure again, the ~10 s each of a 135M-270M
    model on one core (a cached cost that turns out wrong is dropped by ``CachedCostModel``).

    Then, where this context has room for ``depth_cells`` more cells and the
    largest of ``DEPTH_KS``, a small second context over the same weights
    (``ctx.scratch``) is filled that much deeper (untimed; over a sliding-window
    model's window only, if that is shorter: see ``CostModel``), and those k
    are timed in pairs, here and there back to back, in shuffled rounds (half
    the budget). The median of each k's differences over the cells is what a
    cached cell adds to its decode; ``per_cell`` is a line in k fitted to them
    (``fit_per_cell``).
    Timed in separate phases instead (shallow, fill, deep), a load that came or
    went in between went into the difference whole: on a shared 2-core machine
    the k = 16 value came out anywhere from 0 to twice what side-by-side timing
    says. No per-cell costs for a recurrent state (its cost does not grow so)
    or when the second context cannot be made (no memory left for it).

    ``turn()``: held around each timed decode (and each pair side by side) and the filling prefill, never
    inside a timing: measuring on a scratch context while a generation runs, the two take turns, so no
    sample is taken while the generation decodes (``Engine``'s background measurement).

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
    rng = random.Random(seed)
    on_device = getattr(ctx, "offloaded", True)
    threads = _cpu_threads(ctx)

    try:
        turns = _Turns(turn)
        shallow = _timed_rounds(fits, turns(_timer(ctx, token, n0, warm=on_device)), rng, budget_s=budget_s,
                                min_reps=min_reps, max_reps=max_reps, clock=turns.clock)
        shallow.complete = shallow.complete or turns.kept_its_cpus(threads)
        shallow.depth = n0
        deep_ks = [k for k in DEPTH_KS if k in shallow]
        # A sliding-window model's growth with depth is the window's (see CostModel.window): timed over it.
        window = int(getattr(ctx.model, "n_swa", 0) or 0)
        cells = min(depth_cells, window) if window else depth_cells
        # Only where this context can grow that deep: a short one never pays much for its depth.
        if cells > 0 and ctx.max_rollback is None and deep_ks and n0 + cells + max(deep_ks) <= ctx.n_ctx:
            measured = _per_cell_side_by_side(ctx, token, deep_ks, cells, rng, budget_s=budget_s / 2,
                                              min_reps=min_reps, max_reps=max_reps, turn=turn,
                                              warm=on_device, threads=threads)
            if measured is not None:
                shallow.per_cell = fit_per_cell({k: v / cells for k, v in measured.items()})
                shallow.window = window
                shallow.complete = shallow.complete and measured.complete
        return shallow
    finally:
        # A decode that raised may have left its batch in the cache (tokens not yet mirrored).
        ctx.remove_seq(0, n0, -1)
        del ctx.tokens[n0:]


def fit_per_cell(points: Mapping[int, float]) -> dict[int, float]:
    """Per-cell costs on the line ``a + b * k`` (a, b >= 0) nearest to the measured ``points``
    (k: the batch size; the value: ms each further cached cell added to its decode), at the same k.

    Each row of a batch attends to every cached cell (b), and the cells are read once per
    decode (a), so the cost per cell is a line in k that never falls. Each point is a
    median of differences of two timings, a small signal on a noisy machine; the line
    through all of them is steadier than any one point (a 0 among them cannot make long
    batches look free at depth).
    """
    ks = sorted(points)
    if not ks:
        return {}
    ys = [points[k] for k in ks]
    n, sk, sy = len(ks), float(sum(ks)), float(sum(ys))
    skk = float(sum(k * k for k in ks))
    sky = float(sum(k * y for k, y in zip(ks, ys)))
    det = n * skk - sk * sk
    a, b = (sy / n, 0.0) if det <= 0 else ((skk * sy - sk * sky) / det, (n * sky - sk * sy) / det)
    if b < 0:  # no rise with k: the mean, flat
        a, b = sy / n, 0.0
    if a < 0:  # through the origin
        a, b = 0.0, max(0.0, sky / skk)
    a = max(0.0, a)
    return {k: a + b * k for k in ks}


# A measurement cut short on this CPU is kept when its process had at least this share of the CPU time its
# threads ask for (``kept_its_cpus``). ggml's threads stay busy through a decode (they spin at its barriers),
# so a process on a quiet machine has ~1.0 of it; two processes sharing its cores, ~0.5 each.
KEPT_CPU_SHARE = 0.7


def kept_its_cpus(cpu_s: float, wall_s: float, threads: int) -> bool:
    """Whether ``wall_s`` seconds of decoding with ``threads`` threads got the CPU time they ask for
    (``cpu_s``, the process's): then a measurement that overran its budget did so because the model is
    slow on this CPU, not because other work took the CPUs. False for no threads (a device decodes)."""
    return threads > 0 and wall_s > 0 and cpu_s >= KEPT_CPU_SHARE * threads * wall_s


def _cpu_threads(ctx: object) -> int:
    """The threads a context decodes with on this CPU; 0 where a device decodes (or it does not say)."""
    return 0 if getattr(ctx, "offloaded", True) else int(getattr(ctx, "cpu_threads", 0))


class _Turns:
    """Samples taken in turns (``turn()`` held around each), and a clock of the time spent in them: the
    budget counts the measurement's own time, not the generation steps it waited for (with the wall
    clock, a measurement taking turns with a reply overran its budget and was never complete). It also
    counts the process's CPU time in them (``kept_its_cpus``)."""

    def __init__(self, turn: Callable[[], ContextManager[object]]) -> None:
        self.turn = turn
        self.spent = 0.0
        self.cpu_spent = 0.0
        self.waits = turn is not contextlib.nullcontext

    def clock(self) -> float:
        return self.spent if self.waits else time.perf_counter()

    def kept_its_cpus(self, threads: int) -> bool:
        return kept_its_cpus(self.cpu_spent, self.spent, threads)

    def __call__(self, timed: Callable[[int], float]) -> Callable[[int], float]:
        def in_turn(k: int) -> float:
            with self.turn():
                t0, c0 = time.perf_counter(), time.process_time()
                try:
                    return timed(k)
                finally:
                    self.spent += time.perf_counter() - t0
                    self.cpu_spent += time.process_time() - c0
        return in_turn


def _timer(ctx: "Context", token: int, n: int, *, warm: bool = True) -> Callable[[int], float]:
    """Times one decode of k copies of ``token`` after the ``n`` tokens ``ctx`` holds, then rolls it back.

    What a decode costs in the generation loop: ``Context.decode`` returns when the device has finished
    (on a GPU, not when the work is queued). ``warm``: the decode timed is the second of two of the same
    shape, back to back. A device that keeps state per batch shape (a CUDA graph is captured anew when
    the shape changes) is then timed as a loop of such decodes runs, not as the first one after
    another shape; the rounds shuffle the sizes, and a lone decode after each change of shape was
    ~1.5x a plain step's own on an H200. On the CPU a decode keeps no such state (a step's decode follows
    one of another shape there too): one decode, half the measurement's time.
    """
    def decode(k: int) -> float:
        t0 = time.perf_counter()
        ctx.decode([token] * k, range(n, n + k), None, [True] * k)
        ms = (time.perf_counter() - t0) * 1e3
        # decode() leaves ctx.tokens alone; mirror the batch so rollback_to trims it.
        ctx.tokens.extend([token] * k)
        ctx.rollback_to(n)
        return ms

    def timed(k: int) -> float:
        if warm:
            decode(k)  # the shape's first decode, untimed
        return decode(k)
    return timed


def _per_cell_side_by_side(ctx: "Context", token: int, ks: Sequence[int], cells: int, rng: random.Random, *,
                           budget_s: float, min_reps: int, max_reps: int,
                           turn: Callable[[], ContextManager[object]] = contextlib.nullcontext,
                           warm: bool = True, threads: int = 0) -> Measurement | None:
    """Median ms that ``cells`` more cached cells add to a decode of k tokens, for each k in ``ks``:
    timed here and in a scratch context ``cells`` deeper, back to back (see ``measure_verify_costs``;
    ``warm`` and ``threads`` as there). None when the scratch context cannot be made."""
    n0 = len(ctx.tokens)
    depth = n0 + cells
    try:
        deep_ctx = ctx.scratch(n_ctx=depth + max(ks))
    except ModelFileError:  # no memory left for a second context (a full GPU): plan without depth costs
        return None
    try:
        for start in range(0, depth, deep_ctx.n_batch):  # the filling prefill, untimed
            n = min(deep_ctx.n_batch, depth - start)
            with turn():
                deep_ctx.decode([token] * n, range(start, start + n), None, [False] * (n - 1) + [True])
        deep_ctx.tokens.extend([token] * depth)
        here, there = _timer(ctx, token, n0, warm=warm), _timer(deep_ctx, token, depth, warm=warm)

        def difference(k: int) -> float:
            if rng.random() < 0.5:  # neither side always runs right after the other
                deep_ms = there(k)
                return deep_ms - here(k)
            shallow_ms = here(k)
            return there(k) - shallow_ms
        turns = _Turns(turn)
        measured = _timed_rounds(ks, turns(difference), rng, budget_s=budget_s, min_reps=min_reps,
                                 max_reps=max_reps, clock=turns.clock)
        measured.complete = measured.complete or turns.kept_its_cpus(threads)
        return measured
    finally:
        deep_ctx.close()


def _timed_rounds(fits: Sequence[int], timed: Callable[[int], float], rng: random.Random, *,
                  budget_s: float, min_reps: int, max_reps: int,
                  clock: Callable[[], float] = time.perf_counter) -> Measurement:
    """One untimed warm-up of each k, then shuffled rounds of ``timed(k)`` until ``budget_s`` by ``clock``;
    per-k medians."""
    samples: dict[int, list[float]] = {k: [] for k in fits}
    start = clock()
    rounds = 0
    for k in fits:  # warm-up, untimed
        timed(k)
    while rounds < max_reps:
        elapsed = clock() - start
        # On a machine so loaded that min_reps rounds overrun the budget threefold,
        # stop anyway: refinement during generation corrects a rough first guess.
        if rounds >= 1 and (elapsed >= 3 * budget_s or (rounds >= min_reps and elapsed >= budget_s)):
            break
        order = list(fits)
        rng.shuffle(order)
        for k in order:
            samples[k].append(timed(k))
        rounds += 1
    return Measurement({k: statistics.median(v) for k, v in samples.items()}, rounds, rounds >= min_reps)


def load_or_measure(ctx: "Context", *, n_threads: int | None = None, n_gpu_layers: int = -1,
                    refresh: bool = False, max_age_s: float | None = 30 * 86400,
                    budget_s: float = 1.5, measure_on: "Context | None" = None,
                    turn: Callable[[], ContextManager[object]] = contextlib.nullcontext) -> CachedCostModel:
    """The cost model for ``ctx``: from the cache when this machine measured it already
    (and within ``max_age_s``), else measured now (~``budget_s``) and cached.

    The measurement leaves ``ctx`` untouched. It is not cached when it was cut
    short by a busy machine (see ``Measurement`` and ``measure_verify_costs``) or the cache cannot be written; the costs are
    returned all the same and the next run measures again. ``measure_on``: a
    context over the same weights to time instead of ``ctx`` (a scratch one, while
    ``ctx`` generates), cached under ``ctx``'s key; ``turn``: see ``measure_verify_costs``.
    """
    cached = None if refresh else load_cached(ctx, n_threads=n_threads, n_gpu_layers=n_gpu_layers,
                                              max_age_s=max_age_s)
    if cached is not None:
        return cached
    key = cost_key(ctx, n_threads=n_threads, n_gpu_layers=n_gpu_layers)
    path = cost_path(key)
    verify = measure_verify_costs(measure_on or ctx, budget_s=budget_s, turn=turn)
    # A measurement cut short by a busy machine is used now but not kept:
    # cached, it would mislead every later run on a quiet machine.
    if not isinstance(verify, Measurement) or verify.complete:
        try:
            save_costs(path, key, verify)
        except OSError:
            pass  # a read-only cache dir costs a re-measurement next time, nothing else
    return _with_window(CachedCostModel(verify), ctx)


def load_cached(ctx: "Context", *, n_threads: int | None = None, n_gpu_layers: int = -1,
                max_age_s: float | None = 30 * 86400) -> CachedCostModel | None:
    """The cost model for ``ctx`` from the cache, or None when this machine has not measured it (no timing)."""
    key = cost_key(ctx, n_threads=n_threads, n_gpu_layers=n_gpu_layers)
    path = cost_path(key)
    verify = load_costs(path, key, max_age_s=max_age_s)
    return None if verify is None else _with_window(CachedCostModel(verify, path), ctx)


def _with_window(costs: CachedCostModel, ctx: "Context") -> CachedCostModel:
    if costs.window:
        # A fact of the model, not of the machine: read from its header, not cached.
        from localspec.models.gguf_info import read_info

        costs.past_window = read_info(ctx.model.path).global_layer_share
    return costs


# --- an MTP head -----------------------------------------------------------------
MTP_KS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)


def measure_mtp_costs(head: "MtpContext", ks: Sequence[int] = MTP_KS, *, budget_s: float = 0.5,
                      min_reps: int = 3, max_reps: int = 25, seed: int = 0) -> Measurement:
    """Milliseconds of one decode of k rows by MTP head 0, for each k in ``ks`` that fits.

    A row is a token and a hidden row (zeros: any value costs the same); only
    the last row asks for logits, as a catch-up does (k = 1: a draft step).
    Rounds as in ``measure_verify_costs``: one untimed warm-up, then shuffled
    rounds until ``budget_s``; the per-k median; cut short, complete where the head
    decodes on this CPU and kept its CPUs. Postcondition: the head's cache
    holds what it held before, and head 0 is selected.
    """
    import numpy as np

    head.set_head(0)
    n0 = head.n_past
    fits = sorted({int(k) for k in ks if 1 <= k <= head.n_batch and n0 + k <= head.n_ctx})
    if not fits:
        raise ValueError(f"no batch of {sorted(ks)} rows fits after {n0} in the MTP context of {head.n_ctx}")
    zeros = np.zeros((max(fits), head.n_embd), dtype=np.float32)
    rng = random.Random(seed)

    def timed(k: int) -> float:
        t0 = time.perf_counter()
        head.decode([0] * k, range(n0, n0 + k), zeros[:k], [False] * (k - 1) + [True])
        ms = (time.perf_counter() - t0) * 1e3
        head.rollback_to(n0)
        return ms

    try:
        turns = _Turns(contextlib.nullcontext)
        measured = _timed_rounds(fits, turns(timed), rng, budget_s=budget_s, min_reps=min_reps, max_reps=max_reps)
        measured.complete = measured.complete or turns.kept_its_cpus(_cpu_threads(head))
        return measured
    finally:
        head.rollback_to(n0)


def load_or_measure_mtp(head: "MtpContext", ctx: "Context", *, n_threads: int | None = None,
                        n_gpu_layers: int = -1, refresh: bool = False,
                        max_age_s: float | None = 30 * 86400) -> CostModel:
    """The MTP head's decode costs (``ctx``: the target context it drafts for), cached like the target's."""
    from dataclasses import replace

    key = cost_key(ctx, n_threads=n_threads, n_gpu_layers=n_gpu_layers)
    key = replace(key, model=key.model + "#mtp")
    path = cost_path(key)
    costs = None if refresh else load_costs(path, key, max_age_s=max_age_s)
    if costs is None:
        costs = measure_mtp_costs(head)
        if not isinstance(costs, Measurement) or costs.complete:
            try:
                save_costs(path, key, costs)
            except OSError:
                pass
    return CostModel(costs)
