"""penalties: llama.cpp's repetition penalties and logit bias, on hand-built rows, and the shaper's
per-row rule (the tokens before a verification row are the history plus the drafted path)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from localspec.errors import InvalidOptionError
from localspec.penalties import Penalties, PenaltyShaper, penalize, penalty_shaper

ROW = np.array([2.0, -1.0, 0.5, 3.0, 0.0, -2.0], dtype=np.float32)


def test_the_defaults_change_nothing_and_need_no_shaper() -> None:
    assert not Penalties().active
    assert penalty_shaper(None) is None and penalty_shaper(Penalties()) is None
    assert penalty_shaper(Penalties(presence=0.5, last_n=0)) is None  # counts no token: off, as in llama.cpp
    assert penalty_shaper(Penalties(logit_bias=((1, 0.0),))) is None
    assert np.array_equal(penalize(ROW, [0, 1, 3], Penalties()), ROW)


def test_presence_and_frequency_subtract_per_occurrence() -> None:
    got = penalize(ROW, [3, 0, 3, 3], Penalties(presence=0.5, frequency=0.25))
    # token 3 seen 3 times: 3 - 3 * 0.25 - 0.5; token 0 once: 2 - 0.25 - 0.5; the rest unchanged
    assert got.tolist() == pytest.approx([1.25, -1.0, 0.5, 1.75, 0.0, -2.0])
    assert got.dtype == ROW.dtype


def test_repeat_divides_positive_and_multiplies_negative_logits_before_the_subtraction() -> None:
    got = penalize(ROW, [0, 1, 4, 1], Penalties(repeat=2.0, frequency=1.0))
    # 0: 2 / 2 - 1;  1 (twice): -1 * 2 - 2;  4: 0 * 2 - 1 (zero counts as non-positive)
    assert got.tolist() == pytest.approx([0.0, -4.0, 0.5, 3.0, -1.0, -2.0])
    # A negative penalty rewards repetition.
    assert penalize(ROW, [2], Penalties(presence=-1.0))[2] == pytest.approx(1.5)


def test_only_the_last_n_tokens_count() -> None:
    before = [3, 3, 0]
    assert penalize(ROW, before, Penalties(presence=1.0, last_n=1)).tolist() == pytest.approx(
        [1.0, -1.0, 0.5, 3.0, 0.0, -2.0])
    assert penalize(ROW, before, Penalties(frequency=1.0, last_n=-1))[3] == pytest.approx(1.0)  # every token


def test_bias_comes_first_so_the_repeat_rule_sees_the_biased_sign() -> None:
    # token 2: 0.5 - 1 = -0.5, then seen once: * 2 (non-positive now) = -1.0
    got = penalize(ROW, [2], Penalties(repeat=2.0, logit_bias=((2, -1.0), (5, 100.0))))
    assert got[2] == pytest.approx(-1.0) and got[5] == pytest.approx(98.0)
    assert int(np.argmax(got)) == 5


def test_the_row_is_never_modified() -> None:
    row = ROW.copy()
    penalize(row, [0, 1, 2, 3], Penalties(presence=1.0, repeat=1.5, logit_bias=((4, 3.0),)))
    assert np.array_equal(row, ROW)


def test_a_verification_row_counts_the_history_and_the_drafted_path_before_it() -> None:
    p = Penalties(frequency=0.5, presence=0.25, repeat=1.3, last_n=4)
    shaper = PenaltyShaper(p)
    history, path = [5, 1, 2, 3, 0], [3, 1]
    # The row after history + path is the row plain decoding reads after those tokens.
    assert np.array_equal(shaper.shape(ROW, history, path), penalize(ROW, history + path, p))
    assert np.array_equal(shaper.shape(ROW, history, ()), penalize(ROW, history, p))
    long_path = [4, 4, 4, 4, 4]  # longer than the window: only its last 4
    assert np.array_equal(shaper.shape(ROW, history, long_path), penalize(ROW, [4, 4, 4, 4], p))
    every = PenaltyShaper(Penalties(frequency=0.5, last_n=-1))
    assert np.array_equal(every.shape(ROW, history, path), penalize(ROW, history + path, every.penalties))


@pytest.mark.parametrize("last_n", [-1, 1, 3, 6, 8, 64])
def test_every_split_into_history_and_path_shapes_the_same_row(last_n: int) -> None:
    """Issue 42: with a history shorter than the window, ``history[len - keep:]`` took its LAST
    ``keep - len`` tokens instead of all of it, so plain decoding (path ``()``) and a verification row
    (the same tokens split otherwise) counted different tokens: greedy speculation under penalties
    differed from plain decoding on any prompt shorter than ``repeat_last_n``."""
    p = Penalties(frequency=0.5, presence=0.25, repeat=1.3, last_n=last_n)
    shaper = PenaltyShaper(p)
    tokens = [5, 1, 2, 3, 0, 3, 1, 4]
    for n in range(len(tokens) + 1):
        seq = tokens[:n]
        want = penalize(ROW, seq if last_n < 0 else seq[-last_n:], p)
        for split in range(n + 1):
            got = shaper.shape(ROW, seq[:split], seq[split:])
            assert np.array_equal(got, want), (n, split)


@pytest.mark.parametrize("penalties, param", [
    (Penalties(presence=2.5), "presence_penalty"),
    (Penalties(frequency=-3.0), "frequency_penalty"),
    (Penalties(frequency=math.nan), "frequency_penalty"),
    (Penalties(repeat=0.0), "repeat_penalty"),
    (Penalties(repeat=11.0), "repeat_penalty"),
    (Penalties(last_n=-2), "repeat_last_n"),
    (Penalties(logit_bias=((1, 101.0),)), "logit_bias"),
    (Penalties(logit_bias=((-1, 1.0),)), "logit_bias"),
    (Penalties(logit_bias=((6, 1.0),)), "logit_bias"),  # outside a 6-token vocabulary
])
def test_bad_values_are_refused_naming_the_parameter(penalties: Penalties, param: str) -> None:
    with pytest.raises(InvalidOptionError) as caught:
        penalty_shaper(penalties, n_vocab=ROW.size)
    assert caught.value.param == param and str(caught.value).startswith(param)
