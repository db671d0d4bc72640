"""The cost model: interpolation, refinement, the cache, and measuring on a real model.

Pure tests use made-up costs and a fake context; the one real measurement is
marked slow and checks only what cannot depend on the machine's speed.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from localspec.policy import costs
from localspec.policy import cost_cache
from localspec.policy import measure as measure_costs
from localspec.policy.costs import CostModel
from localspec.policy.cost_cache import CostKey, load_costs, save_costs
from localspec.policy.measure import fit_per_cell, load_or_measure, measure_verify_costs

# ms for one decode of k tokens: SmolLM2-135M on 2 CPU threads (compute-bound) and a flat GPU-like curve.
CPU = {1: 5.4, 2: 11.3, 4: 16.2, 8: 24.9, 16: 41.1}
GPU = {1: 10.0, 2: 10.1, 4: 10.2, 8: 10.5, 16: 12.0}


# --- interpolation -----------------------------------------------------------
def test_verify_ms_hits_measured_points_and_interpolates_between() -> None:
    model = CostModel(CPU)
    for k, ms in CPU.items():
        assert model.verify_ms(k) == pytest.approx(ms)
    assert model.verify_ms(3) == pytest.approx((11.3 + 16.2) / 2)
    assert model.verify_ms(6) == pytest.approx((16.2 + 24.9) / 2)
    assert model.verify_ms(1.5) == pytest.approx((5.4 + 11.3) / 2)  # an expected (fractional) batch
    assert model.relative(16) == pytest.approx(41.1 / 5.4)
    assert model.relative(1) == 1.0


def test_one_query_and_a_walk_give_the_same_numbers_at_every_kind_of_point() -> None:
    """``_interpolate`` (one query, with its shortcuts) and ``_interpolate_sorted`` (a walk) are one curve:
    the first measured point itself, below it, between points and beyond the last, to the bit."""
    for curve in (CPU, GPU, {2: 7.0, 4: 9.0, 8: 15.0}):
        ks = sorted(curve)
        queries = [0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 7.5, 8.0, 16.0, 24.0]
        assert [costs._interpolate(curve, k, ks) for k in queries] == costs._interpolate_sorted(curve, queries, ks)


def test_verify_ms_extrapolates_linearly_and_never_falls() -> None:
    model = CostModel(CPU)
    slope = (41.1 - 24.9) / 8
    assert model.verify_ms(24) == pytest.approx(41.1 + 8 * slope)
    # A lumpy curve whose last segment falls must not promise cheaper long batches.
    lumpy = CostModel({1: 9.6, 4: 31.3, 8: 37.6, 16: 35.0})
    assert lumpy.verify_ms(32) >= lumpy.verify_ms(16)
    with pytest.raises(ValueError, match="at least one token"):
        model.verify_ms(0)


def test_a_cost_model_needs_a_measurement() -> None:
    with pytest.raises(ValueError, match="at least one"):
        CostModel({})


def test_draft_costs_lookup_default_and_model_drafter() -> None:
    model = CostModel(CPU)
    assert model.draft_ms("ngram", 0) == 0.0  # no draft asked, no drafter called
    assert model.draft_ms("ngram", 8) == pytest.approx(costs.LOOKUP_FIXED_MS + 8 * costs.LOOKUP_PER_TOKEN_MS)
    draft_model = CostModel({1: 2.0, 2: 3.0, 4: 5.0})
    model.set_model_drafter("draft", draft_model)
    # a catch-up of ~2 tokens, then one decode per further token: (V(2) - V(1)) + n V(1)
    assert model.draft_ms("draft", 4) == pytest.approx(1.0 + 4 * 2.0)
    assert model.plain_ms() == pytest.approx(5.4 + model.overhead_ms(0))
    # A longer catch-up (the prefill, or the tokens of steps it sat out) is one batch of the draft's.
    assert model.catch_up_ms("draft", 2) == 0.0 and model.catch_up_ms("ngram", 500) == 0.0
    assert model.catch_up_ms("draft", 4) == pytest.approx(5.0 - 3.0)
    assert model.catch_up_ms("draft", 100) == pytest.approx(draft_model.verify_ms(100) - 3.0)


# --- refinement ----------------------------------------------------------------
def test_drift_seen_at_one_k_moves_every_k() -> None:
    """Throttling makes every decode slower; seen only at k = 1 (speculation off), it still
    moves the estimates for long batches, so relative costs stay right."""
    model = CostModel(CPU)
    for _ in range(150):
        model.observe_verify(1, 2 * 5.4)
    assert model.verify_ms(1) == pytest.approx(2 * 5.4, rel=0.05)
    assert model.verify_ms(8) > 1.6 * 24.9
    assert model.relative(8) == pytest.approx(24.9 / 5.4, rel=0.25)


def test_a_deeper_context_costs_what_each_cell_adds() -> None:
    model = CostModel(CPU, per_cell={1: 0.01, 16: 0.1}, measured_depth=100)
    assert model.verify_ms(1) == pytest.approx(5.4)  # at the depth measured
    model.kv_depth = 1100
    assert model.verify_ms(1) == pytest.approx(5.4 + 1000 * 0.01)
    assert model.verify_ms(16) == pytest.approx(41.1 + 1000 * 0.1)
    assert model.verify_ms(8.5) == pytest.approx(CostModel(CPU).verify_ms(8.5) + 1000 * (0.01 + 0.09 * 7.5 / 15))
    assert model.plain_ms() == pytest.approx(model.verify_ms(1) + model.overhead_ms(0))
    model.kv_depth = 0  # shallower than measured: cheaper, never below half the measured cost
    assert 0.5 * 5.4 <= model.verify_ms(1) < 5.4
    # observing exactly what it predicts at depth leaves the estimates; a machine twice as slow
    # doubles every cost, depth included, and the points keep the measured depth's costs
    model.kv_depth = 1100
    for _ in range(50):
        model.observe_verify(1, 5.4 + 10.0)
    assert model.verify_ms(1) == pytest.approx(15.4) and model.points[1] == pytest.approx(5.4)
    for _ in range(200):
        model.observe_verify(1, 2 * (5.4 + 10.0))
        model.observe_verify(16, 2 * (41.1 + 100.0))
    assert model.verify_ms(1) == pytest.approx(30.8, rel=0.02) and model.verify_ms(16) == pytest.approx(282.2, rel=0.02)
    model.kv_depth = 100  # the point took a little of the drift while the scale caught up: within 10%
    assert model.verify_ms(1) == pytest.approx(10.8, rel=0.1)


def test_a_sliding_window_model_pays_its_global_layers_share_past_the_window() -> None:
    """Up to the window every layer attends to a new cell; past it only the global layers do (Gemma 3: 1/6)."""
    model = CostModel(CPU, per_cell={1: 0.01, 16: 0.1}, measured_depth=0, window=512, past_window=1 / 6)
    assert model.verify_ms(16, kv_depth=256) == pytest.approx(41.1 + 25.6)
    assert model.verify_ms(16, kv_depth=512) == pytest.approx(41.1 + 51.2)
    assert model.verify_ms(16, kv_depth=2048) == pytest.approx(41.1 + 51.2 + 1536 * 0.1 / 6)
    beyond = CostModel(CPU, per_cell={1: 0.01, 16: 0.1}, measured_depth=600, window=512, past_window=0.5)
    assert beyond.verify_ms(1, kv_depth=600 + 1000) == pytest.approx(5.4 + 1000 * 0.01 * 0.5)
    assert beyond.verify_ms(1, kv_depth=400) == pytest.approx(5.4 - 1.12 - 88 * 0.01 * 0.5)
    # without the share, nothing past the window counts (what a model without global layers pays)
    flat = CostModel(CPU, per_cell={1: 0.01, 16: 0.1}, measured_depth=0, window=512)
    assert flat.verify_ms(16, kv_depth=4096) == flat.verify_ms(16, kv_depth=512)
    assert CostModel(CPU, per_cell={1: 0.01}).verify_ms(1, kv_depth=4096) == pytest.approx(5.4 + 40.96)  # no window


@pytest.mark.parametrize("points, per_cell, measured_depth, window", [
    (CPU, None, 0, 0),
    ({4: 16.2, 8: 24.9, 16: 41.1}, {2: 0.002, 8: 0.004, 32: 0.01}, 300, 0),   # k = 1..3 below the first point
    ({1: 26.0, 3: 41.1, 4: 42.6, 6: 71.0, 8: 68.6}, {1: 0.01, 16: 0.1}, 100, 512),  # a lumpy curve, a window
    ({2: 9.0}, {1: 0.01}, 0, 0),  # one point
])
def test_a_plans_table_of_verify_costs_is_verify_ms_exactly(points, per_cell, measured_depth, window) -> None:
    """``verify_ms_at`` walks the points once for a plan's batch sizes; the decisions must not move, so
    every value is exactly ``verify_ms``'s, at whole and fractional (width x k) sizes, any depth."""
    model = CostModel(points, per_cell=per_cell, measured_depth=measured_depth, window=window)
    model.observe_verify(13, 50.0)  # a learned point and a moved scale
    for depth in (0, measured_depth, 250, 2000):
        model.kv_depth = depth
        for ks in (list(range(1, 126)), [1.0 + 1.37 * k for k in range(40)], [1, 1, 2.5, 2.5, 200]):
            assert model.verify_ms_at(ks) == [model.verify_ms(k) for k in ks]
    with pytest.raises(ValueError, match="at least one token"):
        model.verify_ms_at([0.5, 2])


def test_a_larger_batch_never_costs_less_per_cell() -> None:
    """Each row attends to every cell: a measured per-cell cost that falls with k (a load change between
    the shallow and the deep timings; seen: 0.0046 ms at k = 4, 0.0 at k = 16) is raised to the smaller
    batch's, never below 0."""
    model = CostModel(CPU, per_cell={16: 0.0, 1: 0.0007, 4: 0.0046, 2: -1.0}, measured_depth=0)
    assert model.per_cell == {1: 0.0007, 2: 0.0007, 4: 0.0046, 16: 0.0046}
    model.kv_depth = 1000
    assert model.verify_ms(16) == pytest.approx(41.1 + 4.6)
    assert CostModel(CPU, per_cell={1: -0.1}).per_cell == {1: 0.0}


def test_a_draft_model_deep_in_the_context_costs_what_its_cells_add() -> None:
    """A draft model's context holds the target's text: its decodes attend to as many cells, so its
    drafts and catch-ups are priced at the target's depth, and what it is seen to take there teaches
    its line the cost at the depth measured (nothing counted twice)."""
    model = CostModel(CPU, per_cell={1: 0.01, 16: 0.1}, measured_depth=100)
    draft_model = CostModel({1: 2.0, 2: 3.0, 4: 5.0}, per_cell={1: 0.002, 4: 0.008}, measured_depth=100)
    model.set_model_drafter("draft", draft_model)
    assert model.draft_ms("draft", 4) == pytest.approx(1.0 + 4 * 2.0)  # at the depth measured
    model.kv_depth = 1100
    assert draft_model.kv_depth == 1100
    # the 2-token catch-up (0.004 ms a cell) and three one-token decodes (0.002 each) over 1,000 more cells
    assert model.draft_ms("draft", 4) == pytest.approx(1.0 + 4 * 2.0 + 1000 * (0.004 + 3 * 0.002))
    # a catch-up batch attends to the cells before it: 500 tokens after 601 cells, a prefill after none
    assert model.catch_up_ms("draft", 500) == pytest.approx(
        draft_model.verify_ms(500, kv_depth=601) - draft_model.verify_ms(2))
    assert model.catch_up_ms("draft", 1101) == pytest.approx(
        draft_model.verify_ms(1101, kv_depth=0) - draft_model.verify_ms(2))
    assert draft_model.verify_ms(500, kv_depth=601) > draft_model.verify_ms(500, kv_depth=0)
    # observing at depth exactly what is predicted there leaves the line as it was
    for _ in range(100):
        model.observe_draft("draft", 4, model.draft_ms("draft", 4))
        model.observe_draft("draft", 8, model.draft_ms("draft", 8))
    model.kv_depth = 100
    assert model.draft_ms("draft", 4) == pytest.approx(1.0 + 4 * 2.0, rel=0.01)
    # a draft model measured without a second depth (or a lookup) costs the same at any depth
    flat = CostModel(CPU)
    flat.set_model_drafter("draft", CostModel({1: 2.0, 2: 3.0}))
    flat.kv_depth = 5000
    assert flat.draft_ms("draft", 4) == pytest.approx(1.0 + 4 * 2.0) and flat.draft_ms("ngram", 4) > 0


def test_refinement_follows_one_k_and_creates_points() -> None:
    model = CostModel(CPU)
    for _ in range(200):
        model.observe_verify(6, 30.0)
    assert model.verify_ms(6) == pytest.approx(30.0, rel=0.03)
    assert 6 in model.points
    assert model.measured == CPU  # what was measured is kept apart from what was learned


def test_one_outlier_barely_moves_an_estimate() -> None:
    model = CostModel(CPU)
    model.observe_verify(4, 100 * 16.2)  # a preempted decode
    assert model.verify_ms(4) < 1.2 * 16.2
    model.observe_verify(4, float("nan"))
    model.observe_verify(4, -1.0)
    assert math.isfinite(model.verify_ms(4))


def test_draft_and_overhead_lines_are_learned() -> None:
    model = CostModel(CPU)
    for i in range(300):
        n = 1 + i % 6
        model.observe_draft("draft", n, 1.0 + 4.0 * n)
        model.observe_draft("ngram", 3, 2.0)
        model.observe_overhead(n, 0.5)
    assert model.draft_ms("draft", 3) == pytest.approx(13.0, rel=0.05)
    assert model.draft_ms("draft", 6) == pytest.approx(25.0, rel=0.05)
    assert model.draft_ms("ngram", 3) == pytest.approx(2.0, rel=0.1)
    assert model.overhead_ms(2) == pytest.approx(0.5, rel=0.1)
    assert json.dumps(model.to_dict())  # the dashboard can show it


# --- measuring, against a fake context -------------------------------------------
@dataclass
class FakeModel:
    bos: int = 1
    n_swa: int = 0


@dataclass
class FakeContext:
    """Records decodes; mimics Context's token mirror and rollback."""

    n_ctx: int = 64
    n_batch: int = 512
    tokens: list[int] = field(default_factory=lambda: [1, 50, 51, 52])
    model: FakeModel = field(default_factory=FakeModel)
    max_rollback: int | None = None  # an attention-only model: any suffix can be dropped
    cache: list[int] = field(default_factory=list)
    batches: list = field(default_factory=list)
    fills: list[int] = field(default_factory=list)
    depths: bool = False  # record (cells before, size) for every timed batch
    fail_at: int | None = None
    log: list = field(default_factory=list)  # (context, cells before, size) of every timed batch, scratches' too
    scratches: list = field(default_factory=list)
    closed: bool = False

    def __post_init__(self) -> None:
        self.cache = list(self.tokens)

    def scratch(self, n_ctx: int, n_batch: int = 64) -> "FakeContext":
        other = type(self)(n_ctx=n_ctx, n_batch=n_batch, tokens=[], depths=self.depths, log=self.log)
        self.scratches.append(other)
        return other

    def close(self) -> None:
        self.closed = True

    def decode(self, tokens, positions, seq_ids=None, outputs=None) -> None:
        assert list(positions) == list(range(len(self.cache), len(self.cache) + len(tokens)))
        assert outputs is not None and outputs[-1]
        self.cache.extend(tokens)
        if not all(outputs):  # the untimed prefill that fills the context to the second depth
            self.fills.append(len(tokens))
            return
        assert all(outputs)  # verification reads every row
        self.log.append((self, len(self.cache) - len(tokens), len(tokens)))
        self.batches.append((len(self.cache) - len(tokens), len(tokens)) if self.depths else len(tokens))
        if self.fail_at is not None and len(self.batches) == self.fail_at:
            raise RuntimeError("decode failed")

    def rollback_to(self, n: int, seq_id: int = 0) -> None:
        del self.cache[n:]
        del self.tokens[n:]

    def remove_seq(self, seq_id: int, p0: int = 0, p1: int = -1) -> None:
        del self.cache[p0:]


def test_measure_interleaves_restores_and_skips_what_does_not_fit() -> None:
    ctx = FakeContext(n_ctx=16)  # 4 tokens held: batches of 12 and 16 do not fit
    before = list(ctx.tokens)
    result = measure_verify_costs(ctx, max_reps=5, budget_s=10.0)
    assert sorted(result) == [1, 2, 3, 4, 6, 8, 12]
    assert result.rounds == 5 and result.complete
    assert all(ms >= 0 for ms in result.values())
    assert ctx.tokens == before and ctx.cache == before
    fits = sorted(result)
    timed = ctx.batches[1::2]  # each size is decoded twice back to back, the second one timed
    assert ctx.batches[0::2] == timed
    rounds = [timed[i:i + len(fits)] for i in range(0, len(timed), len(fits))]
    assert len(rounds) == 1 + 5  # warm-up, then max_reps rounds
    assert all(sorted(r) == fits for r in rounds)
    assert len({tuple(r) for r in rounds[1:]}) > 1  # the order changes from round to round


def test_measure_times_a_second_depth_side_by_side_in_a_scratch_context() -> None:
    ctx = FakeContext(n_ctx=64, n_batch=16, depths=True)
    before = list(ctx.tokens)
    result = measure_verify_costs(ctx, max_reps=3, budget_s=10.0, depth_cells=40)
    assert ctx.tokens == before and ctx.cache == before
    assert ctx.fills == [] and {n for n, _ in ctx.batches} == {len(before)}  # this context never went deeper
    [deep] = ctx.scratches
    assert deep.closed and deep.n_ctx >= len(before) + 40 + max(measure_costs.DEPTH_KS)
    assert deep.fills == [44] and {n for n, _ in deep.batches} == {len(before) + 40}  # filled once, in its batches
    assert deep.batches[0::2] == deep.batches[1::2]  # each decoded twice back to back, the second one timed
    assert sorted(k for _, k in deep.batches[1::2]) == sorted(list(measure_costs.DEPTH_KS) * (1 + 3))  # warm-up + rounds
    # side by side: every batch timed there is timed here (same k) right before or right after it
    shallow_after = [(c, k) for c, n, k in ctx.log[1::2]][len(result) * (1 + 3):]  # past the shallow rounds
    pairs = [shallow_after[i:i + 2] for i in range(0, len(shallow_after), 2)]
    assert all({id(a[0]), id(b[0])} == {id(ctx), id(deep)} and a[1] == b[1] for a, b in pairs)
    assert len({a[0] is deep for a, _ in pairs}) == 2  # either side goes first
    assert result.depth == len(before) and sorted(result.per_cell) == list(measure_costs.DEPTH_KS)
    # a sliding-window model: timed over its window, which the measurement records
    windowed = FakeContext(n_ctx=64, depths=True)
    windowed.model.n_swa = 24
    result = measure_verify_costs(windowed, max_reps=1, depth_cells=40)
    assert result.window == 24 and {n for n, _ in windowed.scratches[0].batches} == {len(before) + 24}
    # no room to grow that deep here (or a recurrent state): no per-cell costs, no scratch context
    small = FakeContext(n_ctx=40)
    assert measure_verify_costs(small, max_reps=1, depth_cells=40).per_cell == {} and small.scratches == []


def test_per_cell_costs_are_a_line_in_k_that_never_falls() -> None:
    exact = {1: 0.001 + 0.004 * 1, 4: 0.001 + 0.004 * 4, 16: 0.001 + 0.004 * 16}
    assert fit_per_cell(exact) == pytest.approx(exact)
    # one difference swallowed by a load change (this machine's cache held such a record)
    noisy = fit_per_cell({1: 0.0007, 4: 0.0046, 16: 0.0})
    assert noisy[1] <= noisy[4] <= noisy[16] and min(noisy.values()) >= 0
    assert fit_per_cell({1: 0.01, 4: 0.006, 16: 0.002}) == pytest.approx({1: 0.006, 4: 0.006, 16: 0.006})  # flat
    swallowed = fit_per_cell({1: 0.05, 4: 0.0, 16: 0.16})  # the middle one lost, the first doubled
    assert swallowed[1] < 0.02 and 0.13 < swallowed[16] < 0.17
    assert fit_per_cell({1: -0.01, 4: -0.02, 16: -0.05}) == {1: 0.0, 4: 0.0, 16: 0.0}
    assert fit_per_cell({4: 0.02}) == {4: 0.02} and fit_per_cell({}) == {}


def test_a_load_that_comes_and_grows_during_the_measurement_stays_out_of_the_per_cell_costs(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Timed on a fake clock: a decode of k rows after n cells takes (2 + 3k + 0.01kn) ms, plus what a
    background job takes from it, which grows by 2.5 ms a second and jumps by 30 ms at 3 s (each size is
    decoded twice, the second one timed, so the fake clock runs twice as far as the timings add up). Timed in
    phases (shallow, then deep) the load would go into the difference whole: ~2x at k = 1."""
    clock = [0.0]
    true_per_cell = 0.01

    class TimedContext(FakeContext):
        def decode(self, tokens, positions, seq_ids=None, outputs=None) -> None:
            n, k = len(self.cache), len(tokens)
            super().decode(tokens, positions, seq_ids, outputs)
            if all(outputs):
                load = 2.5 * clock[0] + (30 if clock[0] > 3.0 else 0)
                clock[0] += (2 + 3 * k + true_per_cell * k * n + load) / 1e3

    monkeypatch.setattr(measure_costs.time, "perf_counter", lambda: clock[0])
    ctx = TimedContext(n_ctx=1024, depths=True)
    # The batch sizes pinned, so the timeline stays as described: the jump lands among the side-by-side pairs.
    result = measure_verify_costs(ctx, (1, 2, 3, 4, 6, 8, 12, 16), budget_s=2.0, min_reps=3, max_reps=25,
                                  depth_cells=512)
    assert result.complete and len(ctx.scratches) == 1
    for k in measure_costs.DEPTH_KS:
        assert result.per_cell[k] == pytest.approx(true_per_cell * k, rel=0.05)


def test_a_measurement_cut_short_is_marked_incomplete() -> None:
    result = measure_verify_costs(FakeContext(), budget_s=0.0, min_reps=3)
    assert result.rounds == 1 and not result.complete  # one round, however loaded the machine


def test_a_process_kept_its_cpus_when_it_got_the_cpu_time_its_threads_ask_for() -> None:
    kept = measure_costs.kept_its_cpus
    assert kept(0.95, 1.0, 1) and kept(1.9, 1.0, 2) and kept(0.7, 1.0, 1)
    assert not kept(0.5, 1.0, 1)  # another process had half the core
    assert not kept(1.0, 1.0, 2)  # two threads on what amounts to one core
    assert not kept(5.0, 1.0, 0) and not kept(0.0, 0.0, 1)  # a device decoded; nothing was timed


class CpuContext(FakeContext):
    """A context on this CPU whose decodes take ``ms`` on a fake wall clock and ``share`` of that times
    ``cpu_threads`` on a fake CPU clock (the process's CPU time)."""

    offloaded = False
    cpu_threads = 2
    share = 1.0
    clocks = [0.0, 0.0]

    def scratch(self, n_ctx: int, n_batch: int = 64) -> "CpuContext":
        other = super().scratch(n_ctx, n_batch)
        other.clocks, other.share = self.clocks, self.share
        return other

    def decode(self, tokens, positions, seq_ids=None, outputs=None) -> None:
        super().decode(tokens, positions, seq_ids, outputs)
        wall = (5 + len(tokens)) / 1e3
        self.clocks[0] += wall
        self.clocks[1] += wall * self.cpu_threads * self.share


@pytest.mark.parametrize("share, kept", [(0.95, True), (0.5, False)])
def test_a_measurement_cut_short_on_a_cpu_is_kept_when_the_cpus_were_its_own(
        monkeypatch: pytest.MonkeyPatch, share: float, kept: bool) -> None:
    """On the CPU each size is decoded once a sample (no untimed decode before it), and a measurement
    that overran its budget (budget 0: one round) is complete, and cached, when its threads had the CPUs
    (a model slow on this machine); not when something else took half of them (a busy machine)."""
    clocks = [0.0, 0.0]
    monkeypatch.setattr(measure_costs.time, "perf_counter", lambda: clocks[0])
    monkeypatch.setattr(measure_costs.time, "process_time", lambda: clocks[1])
    ctx = CpuContext(n_ctx=1024, depths=True)
    ctx.clocks, ctx.share = clocks, share
    result = measure_verify_costs(ctx, budget_s=0.0, min_reps=3, depth_cells=256)
    assert result.rounds == 1 and result.complete is kept
    assert sorted(result.per_cell) == list(measure_costs.DEPTH_KS)
    shallow = [k for _, k in ctx.batches]
    fits = sorted(result)
    assert shallow[:2 * len(fits)][:len(fits)] == fits  # the warm-up: each size once, in order
    assert sorted(shallow[len(fits):2 * len(fits)]) == fits  # one round: each size once more, and only once
    [deep] = ctx.scratches
    assert sorted(k for _, k in deep.batches) == sorted(list(measure_costs.DEPTH_KS) * 2)  # warm-up + a round
    # on a device (the fake's default) the same overrun is never complete
    assert not measure_verify_costs(FakeContext(), budget_s=0.0, min_reps=3).complete


@pytest.mark.parametrize("share, offloaded, kept", [(0.95, False, True), (0.5, False, False), (0.95, True, False)])
def test_an_mtp_heads_measurement_cut_short_is_kept_as_the_targets_is(
        monkeypatch: pytest.MonkeyPatch, share: float, offloaded: bool, kept: bool) -> None:
    clocks = [0.0, 0.0]
    monkeypatch.setattr(measure_costs.time, "perf_counter", lambda: clocks[0])
    monkeypatch.setattr(measure_costs.time, "process_time", lambda: clocks[1])

    class Head:
        n_past, n_ctx, n_batch, n_embd, cpu_threads = 4, 256, 128, 8, 1

        def __init__(self) -> None:
            self.offloaded = offloaded
            self.rows: list[int] = []

        def set_head(self, i: int) -> None:
            assert i == 0

        def decode(self, tokens, positions, rows, outputs) -> None:
            self.rows.append(len(tokens))
            clocks[0] += 0.01 * len(tokens)
            clocks[1] += 0.01 * len(tokens) * share

        def rollback_to(self, n: int) -> None:
            assert n == 4

    head = Head()
    result = measure_costs.measure_mtp_costs(head, budget_s=0.0, min_reps=3)
    assert result.rounds == 1 and result.complete is kept
    assert sorted(head.rows) == sorted(list(measure_costs.MTP_KS) * 2)  # the warm-up and one round


def test_measure_restores_the_context_when_a_decode_fails() -> None:
    ctx = FakeContext(fail_at=5)
    before = list(ctx.tokens)
    with pytest.raises(RuntimeError):
        measure_verify_costs(ctx)
    assert ctx.tokens == before and ctx.cache == before


def test_measure_refuses_a_full_context() -> None:
    with pytest.raises(ValueError, match="fits"):
        measure_verify_costs(FakeContext(n_ctx=4))


# --- the cache -------------------------------------------------------------------
def key(**changes) -> CostKey:
    base = dict(model="/m/a.gguf", model_size=10, model_mtime_ns=1, system_info="AVX2 = 1", gpu_offload=False,
                n_gpu_layers=-1, n_threads=2, n_ctx=4096, n_seq=33, llama_cpp_version="0.3.36", repack=True)
    base.update(changes)
    return CostKey(**base)


def test_cache_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCALSPEC_CACHE_DIR", str(tmp_path))
    k = key()
    path = cost_cache.cost_path(k)
    assert path.parent == tmp_path / "costs"
    save_costs(path, k, CPU)
    assert load_costs(path, k) == CPU
    # another thread count, another machine, a rebuilt model, weights not repacked: a different file,
    # and never this record
    assert cost_cache.cost_path(key(n_threads=4)) != path
    assert cost_cache.cost_path(key(repack=False)) != path
    assert load_costs(path, key(system_info="CUDA = 1")) is None
    assert load_costs(path, k, max_age_s=-1) is None  # too old
    path.write_text("{ half a file")
    assert load_costs(path, k) is None


def test_a_gpu_run_and_a_cpu_run_never_share_costs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One CUDA build: offloaded to a 4090, to a 3090, kept on the CPU, on a machine without a driver.
    Each gets its own entry; the GPU's free memory (which changes from run to run) is not part of it."""
    from types import SimpleNamespace

    from localspec import backend
    from localspec.models.split import Device, DeviceSplit

    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    ctx = SimpleNamespace(model=SimpleNamespace(path=gguf, repack=True, split=None), n_ctx=4096, n_seq=1)
    monkeypatch.setattr(backend, "system_info", lambda: "CUDA : ARCHS = 890,900 | CPU : AVX2 = 1")
    monkeypatch.setattr(backend, "gpu_offload_supported", lambda: True)
    monkeypatch.setattr(backend, "gpu_devices", lambda: [("NVIDIA GeForce RTX 4090", 20 << 30, 24 << 30)])
    gpu = measure_costs.cost_key(ctx, n_threads=2)
    on_cpu = measure_costs.cost_key(ctx, n_threads=2, n_gpu_layers=0)
    monkeypatch.setattr(backend, "gpu_devices", lambda: [("NVIDIA GeForce RTX 4090", 3 << 30, 24 << 30)])
    assert measure_costs.cost_key(ctx, n_threads=2) == gpu
    monkeypatch.setattr(backend, "gpu_devices", lambda: [("NVIDIA GeForce RTX 3090", 20 << 30, 24 << 30)])
    other_gpu = measure_costs.cost_key(ctx, n_threads=2)
    monkeypatch.setattr(backend, "gpu_offload_supported", lambda: False)
    monkeypatch.setattr(backend, "gpu_devices", lambda: [])
    no_driver = measure_costs.cost_key(ctx, n_threads=2)
    assert gpu.devices.startswith("NVIDIA GeForce RTX 4090") and on_cpu.devices == no_driver.devices == "cpu"
    # Layers on an RPC server (each verification pays a network hop) cost otherwise again.
    server = Device("RPC0", "10.0.0.2:50052", 1 << 30, 1 << 30, remote=True)
    ctx.model.split = DeviceSplit((server,), (1.0,))
    over_rpc = measure_costs.cost_key(ctx, n_threads=2, n_gpu_layers=20)
    assert over_rpc.devices == "layer split over RPC0 (10.0.0.2:50052) 100%"
    assert len({k.digest() for k in (gpu, on_cpu, other_gpu, no_driver, over_rpc)}) == 5


def test_saving_drops_the_records_of_models_that_are_gone_or_rewritten(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCALSPEC_CACHE_DIR", str(tmp_path / "cache"))
    models = {}
    for name in ("kept", "deleted", "rewritten"):
        models[name] = tmp_path / f"{name}.gguf"
        models[name].write_bytes(b"GGUF" + name.encode())

    def real_key(name: str, suffix: str = "") -> CostKey:
        st = models[name].stat()
        return key(model=str(models[name]) + suffix, model_size=st.st_size, model_mtime_ns=st.st_mtime_ns)

    keys = {"kept": real_key("kept"), "kept#mtp": real_key("kept", "#mtp"), "deleted": real_key("deleted"),
            "rewritten": real_key("rewritten")}
    for k in keys.values():
        save_costs(cost_cache.cost_path(k), k, CPU)
    (tmp_path / "cache" / "costs" / "foreign.json").write_text("not ours")
    models["deleted"].unlink()
    models["rewritten"].write_bytes(b"GGUF, longer now")
    fresh = key(model=str(models["kept"]), n_threads=4, model_size=keys["kept"].model_size,
                model_mtime_ns=keys["kept"].model_mtime_ns)
    save_costs(cost_cache.cost_path(fresh), fresh, GPU)
    left = {p.name for p in (tmp_path / "cache" / "costs").glob("*.json")}
    assert left == {cost_cache.cost_path(k).name for k in (keys["kept"], keys["kept#mtp"], fresh)} | {"foreign.json"}


def test_load_or_measure_measures_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCALSPEC_CACHE_DIR", str(tmp_path))
    calls: list[object] = []
    monkeypatch.setattr(measure_costs, "cost_key", lambda ctx, **kw: key())
    monkeypatch.setattr(measure_costs, "measure_verify_costs", lambda ctx, **kw: calls.append(ctx) or dict(GPU))
    first = load_or_measure(object())  # type: ignore[arg-type]
    second = load_or_measure(object())  # type: ignore[arg-type]
    assert len(calls) == 1
    assert first.points == second.points == GPU
    load_or_measure(object(), refresh=True)  # type: ignore[arg-type]
    assert len(calls) == 2


def test_an_incomplete_measurement_is_not_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCALSPEC_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(measure_costs, "cost_key", lambda ctx, **kw: key())
    monkeypatch.setattr(measure_costs, "measure_verify_costs",
                        lambda ctx, **kw: cost_cache.Measurement(CPU, rounds=1, complete=False))
    assert load_or_measure(object()).points == CPU  # type: ignore[arg-type]
    assert not cost_cache.cost_path(key()).exists()


# --- a real model ------------------------------------------------------------------
def test_a_cpu_context_says_it_decodes_here_with_its_threads(smollm2_path: Path) -> None:
    """What the measurement asks of a real context on this CPU build: not offloaded, the threads it
    decodes with; and it times each size with one decode (``decode_calls``: a warm-up and one round)."""
    from localspec.backend import Context, Model, gpu_offload_supported

    if gpu_offload_supported():
        pytest.skip("a GPU build: contexts offload")
    model = Model(smollm2_path)
    ctx = Context(model, n_ctx=256, n_threads=1)
    try:
        assert ctx.offloaded is False and ctx.cpu_threads == 1
        ctx.append(model.tokenize("Hello"))
        calls = ctx.decode_calls
        result = measure_verify_costs(ctx, ks=(1, 2, 4), budget_s=0.0, min_reps=1, max_reps=1, depth_cells=0)
        assert result.rounds == 1 and ctx.decode_calls - calls == 2 * 3
    finally:
        ctx.close()
        model.close()


def test_real_measurement_leaves_the_context_untouched(smollm2_path: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from localspec.backend import Context, Model

    model = Model(smollm2_path)
    prompt = model.tokenize("The quick brown fox jumps over the lazy dog, and then")
    # One thread: with as many threads as cores, a CI box busy with other jobs makes
    # llama.cpp's threads wait on each other for seconds per decode.
    measured_ctx = Context(model, n_ctx=256, n_threads=1)
    fresh_ctx = Context(model, n_ctx=256, n_threads=1)
    try:
        measured_ctx.append(prompt[:-1])
        before = list(measured_ctx.tokens)
        # with a second depth 128 cells further (filled, timed, dropped again)
        result = measure_verify_costs(measured_ctx, budget_s=0.5, depth_cells=128)
        assert measured_ctx.tokens == before
        assert measured_ctx.seq_pos_max(0) == len(before) - 1  # nothing left in the KV cache
        assert sorted(result) == list(measure_costs.DEFAULT_KS)
        assert all(ms > 0 for ms in result.values())
        assert result.depth == len(before) and sorted(result.per_cell) == list(measure_costs.DEPTH_KS)
        assert all(ms >= 0 for ms in result.per_cell.values())
        # increasing-ish, with room for a noisy machine: 16 tokens never cost less than half of one
        assert result[16] > 0.5 * result[1]

        # the next token sees exactly the cache a context that never measured sees
        measured_ctx.append(prompt[-1:])
        fresh_ctx.append(prompt)
        assert np.allclose(measured_ctx.logits(-1), fresh_ctx.logits(-1), atol=1e-4)

        # cached per model and machine: the second load reads the file
        monkeypatch.setenv("LOCALSPEC_CACHE_DIR", str(tmp_path))
        kept = cost_cache.Measurement(result, result.rounds, True, depth=result.depth, per_cell=result.per_cell,
                                         window=300)
        monkeypatch.setattr(measure_costs, "measure_verify_costs", lambda ctx, **kw: kept)
        first = load_or_measure(fresh_ctx, n_threads=1)

        def no_measuring(ctx, **kw):
            raise AssertionError("measured again despite the cache")

        monkeypatch.setattr(measure_costs, "measure_verify_costs", no_measuring)
        again = load_or_measure(fresh_ctx, n_threads=1)
        assert again.points == first.points
        assert again.per_cell == first.per_cell and again.measured_depth == result.depth and again.window == 300
        # what was measured, raised where a larger batch came out cheaper per cell (see CostModel)
        assert sorted(again.per_cell) == sorted(result.per_cell)
        assert all(again.per_cell[k] >= v for k, v in result.per_cell.items())
        assert len(list((tmp_path / "costs").glob("*.json"))) == 1
    finally:
        measured_ctx.close()
        fresh_ctx.close()
        model.close()


# --- a cached cost corrects itself ------------------------------------------------
def _cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, verify: dict[int, float]):
    """A cache entry holding ``verify``, loaded back as load_or_measure would (nothing measured)."""
    monkeypatch.setenv("LOCALSPEC_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(measure_costs, "cost_key", lambda ctx, **kw: key())
    monkeypatch.setattr(measure_costs, "measure_verify_costs",
                        lambda ctx, **kw: pytest.fail("a cached cost must not be measured again"))
    path = cost_cache.cost_path(key())
    save_costs(path, key(), verify)
    model = load_or_measure(object())  # type: ignore[arg-type]
    assert isinstance(model, cost_cache.CachedCostModel) and model.path == path
    return model, path


def test_costs_cached_on_a_loaded_machine_are_dropped_on_a_quiet_one(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # Measured while busy: 3x what the machine now takes. The running model follows the machine, and
    # once the steps settle the cache entry goes, so the next run measures afresh.
    model, path = _cached(tmp_path, monkeypatch, {k: 3 * ms for k, ms in CPU.items()})
    for i in range(cost_cache.DRIFT_MIN_STEPS - 1):
        model.observe_verify(1 if i % 3 else 5, CPU[1] if i % 3 else CPU[4] * 1.25)
        assert path.exists(), "dropped before enough steps were seen"
    model.observe_verify(1, CPU[1])
    assert not path.exists()
    assert model.dropped_ratio is not None and model.dropped_ratio < 1 / cost_cache.DRIFT
    assert model.verify_ms(1) < 1.5 * CPU[1]  # this run already plans with the quiet machine's costs


def test_costs_that_still_hold_are_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model, path = _cached(tmp_path, monkeypatch, CPU)
    for i in range(4 * cost_cache.DRIFT_MIN_STEPS):
        model.observe_verify(1, CPU[1] * (1.1 if i % 2 else 0.92))  # ordinary noise, no drift
    assert path.exists() and model.dropped_ratio is None
    assert 1 / cost_cache.DRIFT < model.drift() < cost_cache.DRIFT


def test_costs_cached_on_a_quiet_machine_are_dropped_on_a_slower_one(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    model, path = _cached(tmp_path, monkeypatch, CPU)
    for _ in range(cost_cache.DRIFT_MIN_STEPS):
        model.observe_verify(2, CPU[2] * 2)
    assert not path.exists() and model.dropped_ratio > cost_cache.DRIFT
    # A fresh measurement has no entry to drop; it only refines.
    fresh = cost_cache.CachedCostModel(CPU)
    for _ in range(cost_cache.DRIFT_MIN_STEPS):
        fresh.observe_verify(1, CPU[1] * 3)
    assert fresh.dropped_ratio is None


def test_the_window_is_the_models_own(gemma_path: Path, smollm2_path: Path) -> None:
    from localspec.backend import Model

    gemma, smollm2 = Model(gemma_path), Model(smollm2_path)
    try:
        assert gemma.n_swa == 512 and smollm2.n_swa == 0  # Gemma 3: 15 of 18 layers over 512 cells
    finally:
        gemma.close()
        smollm2.close()


def test_a_sliding_window_models_costs_count_its_global_layers_past_the_window(
        gemma_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The share is the model's (its header's layer pattern), set on costs measured now and on cached ones."""
    from localspec.backend import Context, Model

    monkeypatch.setenv("LOCALSPEC_CACHE_DIR", str(tmp_path))
    model = Model(gemma_path)
    try:
        # One thread: a test worker has one CPU of its own, where two of ggml's threads wait on each other.
        ctx = Context(model, n_ctx=1024, n_threads=1)
        for _ in range(2):  # measured, then from the cache (measured again if the machine was busy)
            costs = load_or_measure(ctx, n_threads=1, budget_s=0.3)
            assert costs.window == 512 and costs.past_window == pytest.approx(3 / 18)
    finally:
        model.close()
