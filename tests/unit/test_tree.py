"""Candidate trees: construction against hand-computed tries, and the walk."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localspec.acceptance import ROOT, accept_tree
from localspec.drafting.tree import CandidateTree, build_tree, tree_from_branches

A, B, C, D, E, F = 1, 2, 3, 4, 5, 6
# Continuations a-b-c x3, a-b-d x1, a-e x2, f x2 (total weight 8). Prefix
# probabilities: a 6/8, ab 4/8, abc 3/8, ae 2/8, f 2/8, abd 1/8.
EXAMPLE = [((A, B, C), 3.0), ((A, B, D), 1.0), ((A, E), 2.0), ((F,), 2.0)]


def test_full_tree_by_hand() -> None:
    tree = build_tree(EXAMPLE, max_nodes=10, max_depth=8)
    # Best first; f (depth 1) before ae (depth 2) at equal probability.
    assert tree.tokens == (A, B, C, F, E, D)
    assert tree.parents == (ROOT, 0, 1, ROOT, 0, 1)
    assert tree.depths == (1, 2, 3, 1, 2, 3)
    assert tree.probs == pytest.approx((0.75, 0.5, 0.375, 0.25, 0.25, 0.125))
    assert tree.leaves == (2, 3, 4, 5)
    assert tree.leaf_paths == ((0, 1, 2), (3,), (0, 4), (0, 1, 5))
    assert tree.branches == ((A, B, C), (F,), (A, E), (A, B, D))


def test_probability_is_product_of_conditional_frequencies() -> None:
    tree = build_tree(EXAMPLE, max_nodes=10)
    # abd: P(a) * P(b | a) * P(d | ab) = 6/8 * 4/6 * 1/4
    assert tree.probs[5] == pytest.approx(6 / 8 * 4 / 6 * 1 / 4)


@pytest.mark.parametrize(
    ("kwargs", "tokens", "parents"),
    [
        ({"max_nodes": 4}, (A, B, C, F), (ROOT, 0, 1, ROOT)),
        ({"max_leaves": 1}, (A, B, C), (ROOT, 0, 1)),
        ({"max_leaves": 2}, (A, B, C, F), (ROOT, 0, 1, ROOT)),
        ({"max_depth": 2}, (A, B, F, E), (ROOT, 0, ROOT, 0)),
        ({"min_prob": 0.3}, (A, B, C), (ROOT, 0, 1)),
        ({"max_nodes": 0}, (), ()),
    ],
)
def test_budgets_by_hand(kwargs: dict, tokens: tuple, parents: tuple) -> None:
    tree = build_tree(EXAMPLE, **{"max_nodes": 10, **kwargs})
    assert tree.tokens == tokens
    assert tree.parents == parents


def test_ancestor_mask() -> None:
    tree = build_tree(EXAMPLE, max_nodes=10)
    mask = tree.ancestor_mask()
    assert mask[2].tolist() == [True, True, True, False, False, False]  # abc sees a, b, c
    assert mask[3].tolist() == [False, False, False, True, False, False]  # f sees itself
    assert mask[5].tolist() == [True, True, False, False, False, True]  # abd


def test_invalid_trees_are_refused() -> None:
    with pytest.raises(ValueError):
        CandidateTree((1, 2), (1, ROOT), (2, 1), (1.0, 1.0))  # child before parent
    with pytest.raises(ValueError):
        CandidateTree((1, 1), (ROOT, ROOT), (1, 1), (1.0, 1.0))  # repeated sibling token
    with pytest.raises(ValueError):
        build_tree([((1,), 0.0)])


def test_accept_with_an_array_of_choices() -> None:
    tree = build_tree(EXAMPLE, max_nodes=10)
    # Row 0 = after the history, row i + 1 = after node i.
    choices = np.array([A, B, D, 0, 0, 0, 9])
    result = accept_tree(tree, choices)
    assert result.tokens == (A, B, D)
    assert result.nodes == (0, 1, 5)
    assert result.next_token == 9
    assert accept_tree(tree, np.array([7, 0, 0, 0, 0, 0, 0])).tokens == ()
    with pytest.raises(ValueError):
        accept_tree(tree, [A, B])


def test_accept_samples_only_visited_positions() -> None:
    tree = build_tree(EXAMPLE, max_nodes=10)
    visited: list[int] = []

    def sample(node: int) -> int:
        visited.append(node)
        return {ROOT: A, 0: E}.get(node, 8)

    result = accept_tree(tree, sample)
    assert (result.tokens, result.next_token) == ((A, E), 8)
    assert visited == [ROOT, 0, 4]


def test_empty_tree_returns_the_targets_token() -> None:
    assert accept_tree(CandidateTree(), [5]).next_token == 5


branches = st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=5), min_size=1, max_size=6)


@settings(max_examples=200, deadline=None)
@given(branches=branches, table=st.dictionaries(st.tuples(*[st.integers(0, 3)] * 2), st.integers(0, 3)))
def test_walk_equals_plain_decoding(branches: list[list[int]], table: dict) -> None:
    """With the target a deterministic function of the prefix, the tree walk
    yields exactly what decoding token by token would, and accepts the longest
    prefix of that decoding that is a path in the tree."""
    tree = tree_from_branches(branches)

    def target_after(prefix: tuple[int, ...]) -> int:
        return table.get(prefix[-2:], (len(prefix) * 7 + sum(prefix)) % 4) if len(prefix) >= 2 else len(prefix) % 4

    def tokens_of(node: int) -> tuple[int, ...]:
        return tuple(tree.tokens[i] for i in tree.path(node)) if node != ROOT else ()

    result = accept_tree(tree, lambda node: target_after(tokens_of(node)))
    plain: list[int] = []
    for _ in range(len(result.tokens) + 1):
        plain.append(target_after(tuple(plain)))
    assert list(result.tokens) + [result.next_token] == plain
    paths = {tuple(b[:k]) for b in tree.branches for k in range(len(b) + 1)}
    assert tuple(result.tokens) in paths and tuple(plain) not in paths


@settings(max_examples=200, deadline=None)
@given(branches=branches)
def test_unpruned_tree_holds_exactly_the_maximal_branches(branches: list[list[int]]) -> None:
    tree = tree_from_branches(branches)
    given_ = {tuple(b) for b in branches}
    maximal = {b for b in given_ if not any(len(o) > len(b) and o[: len(b)] == b for o in given_)}
    assert set(tree.branches) == maximal
    assert len(tree) == len({b[:k] for b in given_ for k in range(1, len(b) + 1)})
    for i, parent in enumerate(tree.parents):
        assert parent < i


def test_truncated_keeps_the_shallow_nodes_in_order() -> None:
    tree = build_tree([((1, 2, 3), 3.0), ((1, 4), 1.0), ((5, 6), 1.0)], max_nodes=10, max_depth=4)
    cut = tree.truncated(1)
    assert set(cut.tokens) == {1, 5} and all(d == 1 for d in cut.depths) and all(p == ROOT for p in cut.parents)
    two = tree.truncated(2)
    assert sorted(two.branches) == [(1, 2), (1, 4), (5, 6)]
    assert two.probs == tuple(p for p, d in zip(tree.probs, tree.depths) if d <= 2)
    assert tree.truncated(3) is tree and len(tree.truncated(0)) == 0
