"""The token-sequence helpers: ``common_prefix`` against a token-by-token walk."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from localspec.token_ids import as_list, common_prefix


def walked(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


kinds = st.sampled_from([list, tuple, lambda xs: np.array(xs, dtype=np.int32)])


@settings(max_examples=300, deadline=None)
@given(shared=st.integers(0, 700), a_tail=st.lists(st.integers(0, 2), max_size=40),
       b_tail=st.lists(st.integers(0, 2), max_size=40), start=st.integers(-3, 800), kind_a=kinds, kind_b=kinds)
def test_common_prefix_is_the_walk(shared: int, a_tail: list[int], b_tail: list[int], start: int,
                                   kind_a, kind_b) -> None:
    """Sequences sharing ``shared`` tokens (across block boundaries), then tails that may agree further,
    as lists, tuples or numpy ids; ``start`` within the shared part skips it, past it is clipped."""
    base = [(i * 7919) % 1000 for i in range(shared)]
    a, b = base + a_tail, base + b_tail
    expected = walked(a, b)
    assert common_prefix(kind_a(a), kind_b(b)) == expected
    if start <= expected:
        assert common_prefix(kind_a(a), kind_b(b), start) == max(expected, min(start, len(a), len(b)))


def test_a_difference_inside_a_block_is_found_where_it_is() -> None:
    a = list(range(3000))
    for at in (0, 1, 255, 256, 257, 1000, 2999):
        b = a.copy()
        b[at] = -1
        assert common_prefix(a, b) == at
    assert common_prefix(a, a[:1234]) == 1234 and common_prefix(a, a) == 3000


def test_as_list_takes_a_list_as_it_is_and_converts_the_rest() -> None:
    xs = [3, 1, 2]
    assert as_list(xs) is xs
    assert as_list((3, 1, 2)) == xs and as_list(np.array(xs, dtype=np.int32)) == xs
    assert type(as_list(np.array(xs))[0]) is int
