"""logprobs.token_logprob on hand-built rows: the log-softmax, its alternatives, their order and range."""

from __future__ import annotations

import math

import numpy as np
import pytest

from localspec.errors import InvalidOptionError
from localspec.logprobs import MAX_TOP_LOGPROBS, check_top_logprobs, token_logprob


def test_the_chosen_token_gets_its_log_softmax() -> None:
    row = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    lse = math.log(math.e + math.e**2 + math.e**3)
    got = token_logprob(row, 0)
    assert got.token == 0 and got.logprob == pytest.approx(1.0 - lse, abs=1e-12) and got.top == ()
    # The log-probabilities of a row sum (as probabilities) to one.
    assert sum(math.exp(token_logprob(row, t).logprob) for t in range(3)) == pytest.approx(1.0)


def test_alternatives_are_most_probable_first_ties_by_lower_id() -> None:
    row = np.array([0.5, 2.0, 1.0, 2.0, -1.0])
    got = token_logprob(row, 4, 3)
    assert [t for t, _ in got.top] == [1, 3, 2]
    assert got.top[0][1] == got.top[1][1] > got.top[2][1]
    assert got.logprob < got.top[2][1]  # the chosen token need not be among them
    # A tie at the cut: the lower id is kept.
    assert [t for t, _ in token_logprob(row, 0, 1).top] == [1]
    # More asked than there are tokens: every token, in order.
    assert [t for t, _ in token_logprob(row, 0, 20).top] == [1, 3, 2, 0, 4]


def test_large_logits_do_not_overflow_and_forbidden_tokens_are_minus_inf() -> None:
    row = np.array([1000.0, 999.0, -np.inf])
    got = token_logprob(row, 2, 3)
    assert got.logprob == -math.inf
    assert got.top[0] == (0, pytest.approx(-math.log1p(math.exp(-1.0))))
    assert got.top[2] == (2, -math.inf)
    with pytest.raises(ValueError, match="finite maximum"):
        token_logprob(np.array([-np.inf, -np.inf]), 0)


def test_the_row_is_not_modified() -> None:
    row = np.array([3.0, 1.0, 2.0], dtype=np.float32)
    before = row.copy()
    token_logprob(row, 1, 2)
    assert np.array_equal(row, before)


@pytest.mark.parametrize("bad", [-1, MAX_TOP_LOGPROBS + 1, 2.5, True, "3"])
def test_out_of_range_counts_are_refused_naming_the_parameter(bad: object) -> None:
    with pytest.raises(InvalidOptionError, match=r"logprobs .* must be an integer in \[0, 20\]") as caught:
        check_top_logprobs(bad)
    assert caught.value.param == "logprobs"
    for good in (None, 0, MAX_TOP_LOGPROBS):
        check_top_logprobs(good)
