"""localspec.sampling: the distribution a token is drawn from, the draw, the params."""

from __future__ import annotations

import math
from typing import Any, cast
from unittest import mock

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from localspec import sampling
from localspec.errors import InvalidOptionError
from localspec.sampling import Sampler, SamplingParams, distribution, sample

# Chi-square critical values at significance 0.001, by degrees of freedom (upper 0.1% point
# of the chi-square distribution; standard tables).
CHI2_CRIT_001 = {1: 10.828, 2: 13.816, 3: 16.266, 4: 18.467, 5: 20.515, 6: 22.458, 7: 24.322}


def frozen(values: object, dtype: type = np.float32) -> np.ndarray:
    """A read-only array: any attempt to modify the logits in place raises."""
    a = np.array(values, dtype=dtype)
    a.flags.writeable = False
    return a


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(np.asarray(x, dtype=np.float64) - np.max(x))
    return e / e.sum()


def support(d: np.ndarray) -> set[int]:
    return set(np.flatnonzero(d).tolist())


def reference(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """A deliberately naive implementation of the documented pipeline (full sort, step by step)."""
    x = np.asarray(logits, dtype=np.float64)
    n = x.size
    if params.temperature == 0:
        out = np.zeros(n)
        out[np.argmax(x)] = 1.0
        return out
    p = softmax(x / params.temperature)
    order = np.lexsort((np.arange(n), -x))  # most probable first, ties by lower id
    keep = np.zeros(n, dtype=bool)
    k = params.top_k if 0 < params.top_k < n else n
    keep[order[:k]] = True
    p = np.where(keep, p, 0.0)
    p /= p.sum()
    if params.top_p < 1.0:
        cum = np.cumsum(p[order])
        last = min(int(np.searchsorted(cum, params.top_p, side="left")), n - 1)
        nucleus = np.zeros(n, dtype=bool)
        nucleus[order[: last + 1]] = True
        p = np.where(nucleus, p, 0.0)
    p = np.where(p >= params.min_p * p.max(), p, 0.0)
    return p / p.sum()


# --- greedy ---------------------------------------------------------------------------------


def test_greedy_is_one_hot_at_argmax() -> None:
    d = distribution(frozen([0.5, 3.0, -1.0, 2.9]), SamplingParams())
    assert d.dtype == np.float64
    assert d.tolist() == [0.0, 1.0, 0.0, 0.0]


def test_greedy_tie_goes_to_lowest_index() -> None:
    d = distribution(frozen([1.0, 7.0, 3.0, 7.0, 7.0]), SamplingParams(temperature=0.0))
    assert d.tolist() == [0.0, 1.0, 0.0, 0.0, 0.0]
    assert Sampler(SamplingParams()).pick(frozen([1.0, 7.0, 3.0, 7.0])) == 1


def read_only_view(values: np.ndarray) -> np.ndarray:
    """What ``Context.logits`` hands out: a read-only view of memory someone else may write."""
    view = values.view()
    view.flags.writeable = False
    return view


@pytest.mark.parametrize("make", [
    frozen,
    # read through its base (a view of the whole vector, as Context.logits makes them), or else an alias
    lambda v: read_only_view(np.array(v, dtype=np.float32)),
    lambda v: read_only_view(np.array([9.0, *v, 9.0], dtype=np.float32))[1:-1],
    lambda v: read_only_view(np.array(v[::-1], dtype=np.float32))[::-1],
    lambda v: read_only_view(np.array(v, dtype=np.float32)).view(np.int32).view(np.float32),
    lambda v: read_only_view(np.array([v, v[::-1]], dtype=np.float32))[0],
], ids=["frozen", "whole", "part", "reversed", "retyped", "a row"])
def test_argmax_is_numpys_on_read_only_rows(make) -> None:  # noqa: ANN001
    for values in ([1.0, 7.0, 3.0, 7.0, 7.0], [-math.inf, -1.0, -1.0], [2.0, math.nan, 5.0], [0.0]):
        row = make(values)
        assert sampling.argmax(row) == int(np.argmax(row))
        assert not row.flags.writeable
        np.testing.assert_array_equal(row, np.array(values, dtype=np.float32))


def test_argmax_of_a_read_only_view_copies_nothing() -> None:
    """numpy's argmax copies an array it may not write; over a 262k vocabulary that copy cost 3-4x the
    argmax, once per row read on the GPU's host. The view is read through a writeable alias instead."""
    import tracemalloc

    row = read_only_view(np.random.default_rng(0).standard_normal(262_144).astype(np.float32))
    tracemalloc.start()
    try:
        np.argmax(row)
        _, numpy_peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        sampling.argmax(row)
        _, ours_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert numpy_peak >= row.nbytes  # (what the test guards against: numpy still copies)
    assert ours_peak < row.nbytes // 100


def test_greedy_ignores_filters() -> None:
    params = SamplingParams(temperature=0.0, top_k=1, top_p=0.1, min_p=0.5)
    assert distribution(frozen([0.0, 2.0, 1.0]), params).tolist() == [0.0, 1.0, 0.0]


# --- temperature and softmax ----------------------------------------------------------------


def test_temperature_one_is_plain_softmax() -> None:
    x = [1.0, 2.0, 3.0]
    e = [math.exp(1.0), math.exp(2.0), math.exp(3.0)]
    expected = [v / sum(e) for v in e]
    d = distribution(frozen(x, np.float64), SamplingParams(temperature=1.0))
    np.testing.assert_allclose(d, expected, rtol=1e-12)


@pytest.mark.parametrize("temperature", [0.5, 0.8, 2.0, 5.0])
def test_temperature_divides_logits_before_softmax(temperature: float) -> None:
    x = [0.0, 1.0, 2.5, -3.0]
    e = [math.exp(v / temperature) for v in x]
    expected = [v / sum(e) for v in e]
    d = distribution(frozen(x, np.float64), SamplingParams(temperature=temperature))
    np.testing.assert_allclose(d, expected, rtol=1e-12)


def test_low_temperature_approaches_greedy() -> None:
    d = distribution(frozen([1.0, 3.0, 2.0]), SamplingParams(temperature=0.01))
    assert d[1] > 1 - 1e-12


@pytest.mark.parametrize("temperature", [1e-300, 1e-310, 5e-324])
def test_a_vanishing_temperature_is_one_hot_at_the_argmax(temperature: float) -> None:
    """Down to the smallest subnormal temperature (whose reciprocal overflows to inf)."""
    d = distribution(frozen([1.0, 3.0, 2.0, 3.0]), SamplingParams(temperature=temperature))
    assert d.tolist() == [0.0, 0.5, 0.0, 0.5]  # the two maxima tie


def test_large_logits_do_not_overflow() -> None:
    x = frozen([1e30, 1e30 - 1e24, -1e30], np.float64)
    d = distribution(x, SamplingParams(temperature=1.0))
    assert np.isfinite(d).all() and d.sum() == pytest.approx(1.0)
    assert d[2] == 0.0


def test_minus_infinity_logits_get_zero_probability() -> None:
    d = distribution(frozen([0.0, -np.inf, 0.0]), SamplingParams(temperature=1.0))
    np.testing.assert_allclose(d, [0.5, 0.0, 0.5])


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_maximum_is_rejected(bad: float) -> None:
    for params in (SamplingParams(), SamplingParams(temperature=1.0)):
        with pytest.raises(ValueError, match="finite"):
            distribution(frozen([0.0, bad, 1.0]), params)


@pytest.mark.parametrize("shape", [(0,), (2, 3)])
def test_logits_must_be_non_empty_1d(shape: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match="1-D"):
        distribution(np.zeros(shape, dtype=np.float32), SamplingParams(temperature=1.0))


# --- top-k ----------------------------------------------------------------------------------


def test_top_k_keeps_the_k_most_likely_and_renormalises() -> None:
    x = [0.0, 3.0, 1.0, 2.0, -1.0]
    d = distribution(frozen(x, np.float64), SamplingParams(temperature=1.0, top_k=2))
    expected = np.zeros(5)
    expected[[1, 3]] = softmax(np.array([3.0, 2.0]))
    np.testing.assert_allclose(d, expected, rtol=1e-12)


@pytest.mark.parametrize("k", [5, 6, 1000])
def test_top_k_at_or_above_vocab_size_keeps_everything(k: int) -> None:
    x = frozen([0.0, 3.0, 1.0, 2.0, -1.0], np.float64)
    d = distribution(x, SamplingParams(temperature=1.0, top_k=k))
    np.testing.assert_allclose(d, softmax(x), rtol=1e-12)


def test_top_k_tie_at_the_cut_goes_to_lowest_ids() -> None:
    x = frozen([1.0, 5.0, 2.0, 2.0, 0.0, 2.0])
    d = distribution(x, SamplingParams(temperature=1.0, top_k=3))
    assert support(d) == {1, 2, 3}


def test_top_k_one_is_greedy_when_sampling() -> None:
    d = distribution(frozen([0.1, 0.4, 0.3]), SamplingParams(temperature=1.3, top_k=1))
    assert d.tolist() == [0.0, 1.0, 0.0]


# --- top-p ----------------------------------------------------------------------------------


def test_top_p_keeps_the_token_that_crosses_the_threshold() -> None:
    # probabilities 0.5, 0.3, 0.2 (ids 2, 0, 1)
    x = frozen(np.log([0.3, 0.2, 0.5]), np.float64)
    params = SamplingParams(temperature=1.0)
    assert support(distribution(x, params)) == {0, 1, 2}
    cases = [(0.4, {2}), (0.5001, {0, 2}), (0.6, {0, 2}), (0.79, {0, 2}), (0.81, {0, 1, 2})]
    for top_p, kept in cases:
        d = distribution(x, SamplingParams(temperature=1.0, top_p=top_p))
        assert support(d) == kept, top_p
    d = distribution(x, SamplingParams(temperature=1.0, top_p=0.6))
    np.testing.assert_allclose(d, [0.3 / 0.8, 0.0, 0.5 / 0.8], rtol=1e-9)


def test_top_p_reaching_the_mass_exactly_is_enough() -> None:
    # four equal tokens: two of them carry exactly half of the mass
    d = distribution(frozen([0.0, 0.0, 0.0, 0.0]), SamplingParams(temperature=1.0, top_p=0.5))
    assert d.tolist() == [0.5, 0.5, 0.0, 0.0]  # ties broken towards the lower ids


def test_tiny_top_p_keeps_exactly_the_argmax() -> None:
    x = frozen([0.0, 1.0, 1.0 - 1e-3, 0.5])
    d = distribution(x, SamplingParams(temperature=1.0, top_p=1e-9))
    assert d.tolist() == [0.0, 1.0, 0.0, 0.0]


# --- min-p ----------------------------------------------------------------------------------


def test_min_p_drops_tokens_below_a_fraction_of_the_max() -> None:
    # p proportional to 1, 0.5, 0.2, 0.05
    x = frozen(np.log([0.5, 1.0, 0.05, 0.2]), np.float64)
    d = distribution(x, SamplingParams(temperature=1.0, min_p=0.1))
    np.testing.assert_allclose(d, np.array([0.5, 1.0, 0.0, 0.2]) / 1.7, rtol=1e-9)
    assert support(distribution(x, SamplingParams(temperature=1.0, min_p=0.6))) == {1}
    assert support(distribution(x, SamplingParams(temperature=1.0, min_p=0.19))) == {0, 1, 3}


# --- composition ----------------------------------------------------------------------------


def test_temperature_applies_before_min_p() -> None:
    # p ratio e^-1 = 0.37 at T=1, e^-0.5 = 0.61 at T=2: min_p 0.5 keeps token 1 only at T=2.
    x = frozen([1.0, 0.0], np.float64)
    assert support(distribution(x, SamplingParams(temperature=1.0, min_p=0.5))) == {0}
    assert support(distribution(x, SamplingParams(temperature=2.0, min_p=0.5))) == {0, 1}


def test_top_p_measures_mass_after_top_k() -> None:
    p = np.array([0.40, 0.30] + [0.01] * 30)
    x = frozen(np.log(p), np.float64)
    # Over the whole vocabulary the top token has 0.4 < 0.55 of the mass, so top_p 0.55 keeps
    # two; after top_k=2 it has 0.4 / 0.7 = 0.571 >= 0.55 of the renormalised mass: one.
    d = distribution(x, SamplingParams(temperature=1.0, top_k=2, top_p=0.55))
    assert support(d) == {0}
    d = distribution(x, SamplingParams(temperature=1.0, top_p=0.55))
    assert support(d) == {0, 1}


def test_min_p_after_top_p_is_relative_to_the_max() -> None:
    p = np.array([0.5, 0.3, 0.1, 0.1])
    x = frozen(np.log(p), np.float64)
    d = distribution(x, SamplingParams(temperature=1.0, top_p=0.95, min_p=0.5))
    np.testing.assert_allclose(d, [0.625, 0.375, 0.0, 0.0], rtol=1e-9)
    d = distribution(x, SamplingParams(temperature=1.0, top_p=0.7, min_p=0.1))
    np.testing.assert_allclose(d, [0.625, 0.375, 0.0, 0.0], rtol=1e-9)


def test_all_filters_together_match_the_reference() -> None:
    rng = np.random.default_rng(3)
    x = frozen(rng.normal(size=500) * 2)
    params = SamplingParams(temperature=0.7, top_k=60, top_p=0.8, min_p=0.02)
    np.testing.assert_allclose(distribution(x, params), reference(x, params), rtol=1e-9, atol=1e-15)


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_k=60, top_p=0.8, min_p=0.02),
    SamplingParams(temperature=1.3, top_p=0.5), SamplingParams(temperature=0.4, min_p=0.1),
], ids=["plain", "all filters", "top-p", "min-p"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_drafts_q_is_the_targets_distribution_with_float32_exponentials(params: SamplingParams, dtype: type) -> None:
    """q (``Sampler.draft_distribution``): the same filters, the exponentials in float32: a float64 vector
    summing to 1 within rounding, each probability within float32's precision of ``distribution``'s."""
    x = frozen(np.random.default_rng(5).normal(size=4000) * 3, dtype)
    q, p = Sampler(params).draft_distribution(x), distribution(x, params)
    assert q.dtype == np.float64 and q.shape == p.shape
    assert abs(q.sum() - 1.0) < 1e-12
    np.testing.assert_allclose(q, p, rtol=1e-5, atol=1e-12)
    assert np.array_equal(q > 0, p > 0)  # (no filter boundary falls within a rounding here)


@pytest.mark.parametrize("logits, temperature, expected", [
    ([1.0, 3.0, 2.0, 3.0], 1e-300, [0.0, 0.5, 0.0, 0.5]),  # 1/T overflows float32: float64 again
    ([1.0, 3.0, 2.0, 3.0], 5e-324, [0.0, 0.5, 0.0, 0.5]),
    ([1e300, 1e300, -1e300], 1.0, [0.5, 0.5, 0.0]),  # past float32's range: float64 again, no inf - inf
])
def test_a_drafts_q_takes_float64_where_float32_cannot_hold_it(logits, temperature, expected) -> None:  # noqa: ANN001
    q = Sampler(SamplingParams(temperature=temperature)).draft_distribution(frozen(logits, np.float64))
    assert q.tolist() == expected


def test_a_drafted_token_carries_the_q_it_was_drawn_from() -> None:
    """Rejection sampling is exact for any q, provided the token is judged by the q it was drawn from."""
    from localspec.drafting.base import draft_token
    from localspec.drafting.draft_tree import tree_q

    x = frozen(np.random.default_rng(6).normal(size=300) * 2)
    sampler = Sampler(SamplingParams(temperature=0.8, top_p=0.9, seed=1))
    token, q = draft_token(x, sampler, 0.0)
    assert q is not None and np.array_equal(q, sampler.draft_distribution(x)) and q[token] > 0
    assert np.array_equal(tree_q(x, sampler), sampler.draft_distribution(x))


# --- output hygiene -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(),
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.8, top_k=3),
        SamplingParams(temperature=0.8, top_p=0.5),
        SamplingParams(temperature=0.8, min_p=0.2),
        SamplingParams(temperature=0.8, top_k=4, top_p=0.9, min_p=0.05),
    ],
)
def test_output_is_a_fresh_float64_distribution_and_input_untouched(params: SamplingParams) -> None:
    x = frozen([0.3, -1.0, 2.0, 2.0, 0.7, -5.0])
    before = x.copy()
    d = distribution(x, params)
    assert d.dtype == np.float64 and d.shape == x.shape
    assert d.sum() == pytest.approx(1.0, abs=1e-12)
    assert (d >= 0).all()
    np.testing.assert_array_equal(x, before)
    assert not np.shares_memory(d, x)
    d[:] = 0  # the result is the caller's to keep or scribble on
    np.testing.assert_array_equal(x, before)


def test_float16_and_integer_logits_are_accepted() -> None:
    for dtype in (np.float16, np.int32):
        d = distribution(frozen([1, 2, 3], dtype), SamplingParams(temperature=1.0))
        np.testing.assert_allclose(d, softmax(np.array([1.0, 2.0, 3.0])), rtol=1e-12)


# --- large vocabularies (the histogram nucleus and the top-k prefilter) ---------------------


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.8, top_k=40),
        SamplingParams(temperature=0.8, top_k=5000),
        SamplingParams(temperature=0.8, top_p=0.95),
        SamplingParams(temperature=1.3, top_p=0.3),
        SamplingParams(temperature=0.8, top_p=0.95, min_p=0.05),
        SamplingParams(temperature=0.8, top_p=0.5, min_p=1e-4),
        SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),
        SamplingParams(temperature=0.8, min_p=0.05),
    ],
)
@pytest.mark.parametrize("kind", ["normal", "ties", "peaked"])
def test_large_vocab_matches_reference(params: SamplingParams, kind: str) -> None:
    rng = np.random.default_rng(11)
    n = 70_000
    if kind == "normal":
        x = rng.normal(size=n)
    elif kind == "ties":  # few distinct values: ties at every cut
        x = rng.integers(0, 12, size=n) / 2.0
    else:  # LLM-like: a few dominant tokens over a wide tail
        x = rng.normal(size=n) * 3
        x[rng.choice(n, 20, replace=False)] += 20
    x = frozen(x)
    got, want = distribution(x, params), reference(x, params)
    assert support(got) == support(want)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-18)


def test_top_k_prefilter_falls_back_when_the_subsample_misleads() -> None:
    # Only the entries the strided subsample looks at are large, so the subsample's threshold
    # has fewer than k entries above it and _top_k must partition everything.
    n = 65_536
    x = np.zeros(n, dtype=np.float32)
    x[:: sampling._PREFILTER_STRIDE] = np.arange(n // sampling._PREFILTER_STRIDE)
    x[5] = 1024.0  # the largest, off the subsample grid
    d = distribution(frozen(x), SamplingParams(temperature=1.0, top_k=40))
    expected = {5} | set(range(n - 39 * sampling._PREFILTER_STRIDE, n, sampling._PREFILTER_STRIDE))
    assert support(d) == expected


# --- property tests -------------------------------------------------------------------------

# Logits on a grid of quarters: plenty of exact ties, and distinct values stay distinct after
# temperature and exp, so the naive reference and the implementation order tokens identically.
logit_lists = st.lists(st.integers(-80, 80).map(lambda v: v / 4.0), min_size=1, max_size=300)
param_sets = st.builds(
    SamplingParams,
    temperature=st.sampled_from([0.0, 0.1, 0.5, 0.8, 1.0, 2.0, 5.0]),
    top_k=st.integers(0, 40),
    top_p=st.floats(0.01, 1.0),
    min_p=st.one_of(st.just(0.0), st.floats(0.0, 0.99)),
)


def check_against_reference(values: list[float], params: SamplingParams) -> None:
    x = frozen(values)
    d = distribution(x, params)
    n = x.size
    assert d.shape == (n,) and d.dtype == np.float64
    assert (d >= 0).all() and d.sum() == pytest.approx(1.0, abs=1e-9)
    np.testing.assert_array_equal(x, frozen(values))
    s = support(d)
    assert int(np.argmax(x)) in s  # the first argmax survives every filter
    if params.top_k:
        assert len(s) <= params.top_k
    if not params.greedy:
        # anything strictly more likely than a kept token is kept too
        lowest_kept = min(x[i] for i in s)
        assert all(x[i] < lowest_kept or i in s for i in range(n) if x[i] > lowest_kept)
        assert (d[list(s)] >= params.min_p * d.max() * (1 - 1e-9)).all()
    # The filters' boundaries are decided by rounding when top_p or min_p sits exactly on a
    # cumulative mass or probability ratio; accept any reading within 1e-9 of the option.
    wiggle = (1 - 1e-9, 1.0, 1 + 1e-9)
    readings = [
        reference(x, SamplingParams(params.temperature, params.top_k, min(1.0, params.top_p * a),
                                    min(0.999, params.min_p * b)))
        for a in wiggle for b in wiggle
    ]
    # And a token whose probability is below the rounding of the sums (1e-16 against a mass near 1) may
    # land on either side of a top-p cut that sits within those roundings of 1 (values of 1 - 1e-16
    # found so): the supports may differ by tokens of negligible probability only.
    exact = [r for r in readings if support(r) == s]
    matching = exact or [r for r in readings if all(max(r[i], d[i]) < 1e-12 for i in support(r) ^ s)]
    assert matching, (s, [support(r) for r in readings])
    np.testing.assert_allclose(d, matching[0], rtol=1e-9, atol=1e-15 if exact else 1e-12)


@settings(max_examples=300, deadline=None)
@given(logit_lists, param_sets)
@example([0.0, 0.0, 17.75], SamplingParams(temperature=0.5, top_p=0.9999999999999999))  # a cut within rounding of 1
@example([0.0, 14.0], SamplingParams(temperature=0.5))
def test_property_matches_reference(values: list[float], params: SamplingParams) -> None:
    check_against_reference(values, params)


@settings(max_examples=150, deadline=None)
@given(logit_lists, param_sets)
def test_property_matches_reference_on_the_large_vocab_paths(
    values: list[float], params: SamplingParams
) -> None:
    # Force the histogram nucleus and the top-k prefilter onto small inputs.
    with mock.patch.object(sampling, "_SORT_LIMIT", 0), mock.patch.object(
        sampling, "_PREFILTER_MIN", 0
    ), mock.patch.object(sampling, "_PREFILTER_STRIDE", 2):
        check_against_reference(values, params)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(-1e4, 1e4, allow_nan=False), min_size=1, max_size=200),
    param_sets,
)
def test_property_any_finite_logits_give_a_distribution(
    values: list[float], params: SamplingParams
) -> None:
    x = frozen(values, np.float64)
    d = distribution(x, params)
    assert np.isfinite(d).all() and (d >= 0).all()
    assert d.sum() == pytest.approx(1.0, abs=1e-9)
    # The most probable token survives. (Not necessarily the argmax of the logits: logits that
    # differ by less than float64 resolves after exp have equal probability, and then the
    # lower id is the one kept.)
    w = np.exp((x - x.max()) / (params.temperature or 1.0))
    assert (d[w == 1.0] > 0).any()
    if params.top_k:
        assert np.count_nonzero(d) <= params.top_k


# --- sample ---------------------------------------------------------------------------------


class FixedRandom:
    """Stands in for a Generator whose next random() is known."""

    def __init__(self, u: float) -> None:
        self.u = u

    def random(self) -> float:
        return self.u


def fixed(u: float) -> np.random.Generator:
    return cast(np.random.Generator, FixedRandom(u))


def chi_square(counts: np.ndarray, probs: np.ndarray) -> tuple[float, int]:
    """Pearson's statistic over the categories with positive probability, and its df."""
    n = counts.sum()
    pos = probs > 0
    assert counts[~pos].sum() == 0, "a zero-probability category was drawn"
    expected = n * probs[pos]
    return float(((counts[pos] - expected) ** 2 / expected).sum()), int(pos.sum()) - 1


def test_sample_follows_the_distribution() -> None:
    probs = np.array([0.1, 0.0, 0.25, 0.05, 0.4, 0.2])
    rng = np.random.default_rng(5)
    n = 40_000
    counts = np.bincount([sample(probs, rng) for _ in range(n)], minlength=probs.size)
    stat, df = chi_square(counts, probs)
    assert stat < CHI2_CRIT_001[df]


def test_sample_blocked_path_follows_the_distribution() -> None:
    # Larger than one block, support at block edges and in the short last block.
    n_vocab = 3 * sampling._BLOCK + 17
    ids = [0, sampling._BLOCK - 1, sampling._BLOCK, 2 * sampling._BLOCK + 5, n_vocab - 1]
    probs = np.zeros(n_vocab)
    probs[ids] = [0.3, 0.1, 0.2, 0.15, 0.25]
    rng = np.random.default_rng(6)
    drawn = np.array([sample(probs, rng) for _ in range(30_000)])
    assert set(drawn.tolist()) <= set(ids)
    counts = np.array([(drawn == i).sum() for i in ids])
    stat, df = chi_square(counts, probs[ids])
    assert stat < CHI2_CRIT_001[df]


@pytest.mark.parametrize("n_vocab", [7, 5000])
def test_sample_ends_of_the_unit_interval_pick_first_and_last_token_with_mass(n_vocab: int) -> None:
    probs = np.zeros(n_vocab)
    probs[[2, n_vocab - 3]] = [0.5, 0.5]
    assert sample(probs, fixed(0.0)) == 2
    assert sample(probs, fixed(1 - 2**-53)) == n_vocab - 3
    assert sample(probs, fixed(0.5)) == n_vocab - 3
    assert sample(probs, fixed(0.4999)) == 2


def test_sample_uses_exactly_one_draw_and_accepts_unnormalised_weights() -> None:
    a, b = np.random.default_rng(9), np.random.default_rng(9)
    weights = np.array([2.0, 0.0, 6.0])
    for _ in range(20):
        i = sample(weights, a)
        u = b.random()
        assert i == (0 if u < 0.25 else 2)


def test_sample_rejects_bad_input() -> None:
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError):
        sample(np.zeros(4), rng)
    with pytest.raises(ValueError):
        sample(np.zeros(5000), rng)
    with pytest.raises(ValueError):
        sample(np.ones((2, 2)), rng)


# --- Sampler --------------------------------------------------------------------------------


def test_seeded_sampler_is_reproducible_and_seeds_differ() -> None:
    x = frozen(np.zeros(1000))
    picks = {}
    for seed in (1, 1, 2):
        s = Sampler(SamplingParams(temperature=1.0, seed=seed))
        picks.setdefault(seed, []).append([s.pick(x) for _ in range(30)])
    assert picks[1][0] == picks[1][1]
    assert picks[1][0] != picks[2][0]


def test_sampler_pick_and_distribution_agree_with_the_functions() -> None:
    params = SamplingParams(temperature=0.9, top_k=5, seed=4)
    x = frozen(np.random.default_rng(0).normal(size=50))
    s = Sampler(params)
    np.testing.assert_array_equal(s.distribution(x), distribution(x, params))
    rng = np.random.default_rng(4)
    expected = [sample(distribution(x, params), rng) for _ in range(10)]
    assert [s.pick(x) for _ in range(10)] == expected


def test_unseeded_samplers_get_fresh_entropy() -> None:
    x = frozen(np.zeros(1000))
    runs = [[Sampler(SamplingParams(temperature=1.0)).pick(x) for _ in range(1)] for _ in range(20)]
    assert len({r[0] for r in runs}) > 1


def test_sampler_validates_params() -> None:
    with pytest.raises(InvalidOptionError):
        Sampler(SamplingParams(top_p=0.0))


# --- validate -------------------------------------------------------------------------------


def test_defaults_and_typical_params_are_valid() -> None:
    SamplingParams().validate()
    SamplingParams(temperature=5.0, top_k=0, top_p=1.0, min_p=0.0, seed=0).validate()
    SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=2**63 - 1).validate()
    SamplingParams(temperature=np.float32(0.7), top_k=np.int64(3)).validate()
    assert SamplingParams().greedy and not SamplingParams(temperature=0.1).greedy


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", -0.1),
        ("temperature", 5.01),
        ("temperature", float("nan")),
        ("temperature", float("inf")),
        ("temperature", "hot"),
        ("top_k", -1),
        ("top_k", 2.5),
        ("top_k", True),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("top_p", float("nan")),
        ("min_p", -0.01),
        ("min_p", 1.0),
        ("min_p", float("nan")),
        ("seed", -1),
        ("seed", 2**63),
        ("seed", 1.5),
    ],
)
def test_validate_names_the_option_the_value_and_the_range(field: str, value: object) -> None:
    kwargs: dict[str, Any] = {field: value}
    params = SamplingParams(**kwargs)
    with pytest.raises(InvalidOptionError) as info:
        params.validate()
    message = str(info.value)
    assert "\n" not in message
    shown = repr(value) if isinstance(value, str) else value  # a string quoted: 'hot', '4' (not 4)
    assert message.startswith(f"{field} {shown} ")
    assert "must be" in message and "; pass" in message
    assert info.value.param == field  # the core names its parameter; the CLI renames it (--temp, --top-k)


def test_validate_message_format() -> None:
    with pytest.raises(InvalidOptionError) as info:
        SamplingParams(top_p=1.5).validate()
    assert str(info.value) == (
        "top_p 1.5 is out of range: top_p must be in (0, 1]; "
        "pass 1 to switch it off or a value such as 0.95"
    )


# --- row shapers: the hook a grammar or a penalty shapes each row through ---------------------------

class _Ban:
    """A hand-made shaper: rules out ``token`` after any prefix whose last token is ``after``."""

    def __init__(self, after: int, token: int) -> None:
        self.after, self.token, self.calls = after, token, []

    def shape(self, logits, history, path):
        self.calls.append((tuple(history), tuple(path)))
        prefix = (*history, *path)
        if not prefix or prefix[-1] != self.after:
            return logits
        out = np.array(logits, dtype=np.float32)
        out[self.token] = -np.inf
        return out


class _Add:
    def __init__(self, delta: np.ndarray) -> None:
        self.delta = delta

    def shape(self, logits, history, path):
        return np.asarray(logits) + self.delta


def test_a_sampler_without_shaper_hands_back_the_very_logits():
    logits = frozen([1.0, 2.0, 3.0])
    assert Sampler(SamplingParams()).shaped(logits, [1, 2], (3,)) is logits


def test_compose_drops_nones_and_applies_shapers_in_order():
    assert sampling.compose(None, None) is None
    ban = _Ban(after=7, token=2)
    assert sampling.compose(None, ban) is ban
    chain = sampling.compose(_Add(np.array([0.0, 0.0, 5.0])), ban)
    logits = frozen([1.0, 2.0, 3.0])
    # the bias raises token 2 to the top, then the ban rules it out after a 7
    assert int(np.argmax(chain.shape(logits, [7], ()))) == 1
    assert int(np.argmax(chain.shape(logits, [1], ()))) == 2
    assert int(np.argmax(chain.shape(logits, [1], (7,)))) == 1  # the drafted path counts as the prefix
    assert list(logits) == [1.0, 2.0, 3.0]  # never modified


def test_a_shaped_distribution_gives_a_ruled_out_token_no_mass():
    sampler = Sampler(SamplingParams(temperature=1.0, seed=3), _Ban(after=0, token=2))
    p = sampler.distribution(sampler.shaped(frozen([1.0, 2.0, 3.0]), [0]))
    assert p[2] == 0.0 and math.isclose(p.sum(), 1.0)


def test_draft_token_shapes_the_draft_as_the_target_row_after_history_and_path():
    from localspec.drafting.base import draft_token

    ban = _Ban(after=5, token=2)
    greedy = Sampler(SamplingParams(), ban)
    logits = frozen([1.0, 2.0, 3.0])
    assert draft_token(logits, greedy, 0.0, [1], [5]) == (1, None)
    assert ban.calls[-1] == ((1,), (5,))
    assert draft_token(logits, greedy, 0.0, [1], [4]) == (2, None)
    sampled = Sampler(SamplingParams(temperature=1.0, seed=0), ban)
    tok, q = draft_token(logits, sampled, 0.0, [5])
    assert tok != 2 and q[2] == 0.0  # q is the shaped distribution rejection sampling will use
    everything = Sampler(SamplingParams(), _Add(np.full(3, -np.inf)))
    assert draft_token(logits, everything, 0.0, [1]) is None  # nothing allowed: no draft
