"""localspec.acceptance.accept_siblings: several sampled candidates at one position, exact by statistics."""

from __future__ import annotations

import numpy as np
import pytest

from dataclasses import dataclass, field

from localspec.acceptance import ROOT, accept_sampled_tree, accept_siblings, draw_siblings
from test_acceptance import P0, P1, Q0, Q1, assert_follows, dist

N_TRIALS = 60_000

# p has mass where q has none (token 6), q where p has none (token 7): both residual branches run.
P = P0
Q = Q0


def emitted(k: int, *, replacement: bool, judge_replacement: bool | None = None, seed: int = 0,
            p: np.ndarray = P, q: np.ndarray = Q, trials: int = N_TRIALS) -> tuple[np.ndarray, np.ndarray]:
    """Tokens emitted over ``trials`` rounds of k siblings, and which sibling was accepted (-1: none)."""
    rng = np.random.default_rng(seed)
    judge = replacement if judge_replacement is None else judge_replacement
    tokens = np.empty(trials, dtype=np.int64)
    which = np.empty(trials, dtype=np.int64)
    for t in range(trials):
        siblings = draw_siblings(q, k, rng, replacement=replacement)
        verdict = accept_siblings(siblings, q, p, rng, replacement=judge)
        tokens[t] = verdict.token
        which[t] = -1 if verdict.accepted is None else verdict.accepted
    return tokens, which


@pytest.mark.parametrize("replacement", [False, True])
@pytest.mark.parametrize("k", [1, 3])
def test_the_emitted_token_follows_p(k, replacement):
    tokens, which = emitted(k, replacement=replacement)
    assert_follows(tokens, P)
    assert (which == -1).any() and (which >= 0).any()  # both the accept and the residual branch ran
    if k > 1:
        assert (which >= 1).any()  # later siblings are tried and accepted too


def test_more_siblings_accept_more_often():
    _, one = emitted(1, replacement=False, trials=20_000)
    _, three = emitted(3, replacement=False, trials=20_000)
    assert (three >= 0).mean() > (one >= 0).mean() + 0.05


def test_statistics_would_catch_siblings_judged_with_the_wrong_residual():
    """Drawn without replacement but judged as if drawn with it (q not renormalised): not p any more.

    q is peaked on token 2, which p rules out: the second sibling (never token 2 again) is judged
    against a q that still spends 94% of its mass there, so the residual after it is all but empty
    and p's token 4 is almost never emitted. (On many pairs the two rules agree exactly: where every
    later sibling is accepted or rejected surely; this pair, found by exact enumeration, is 0.69
    apart in total variation.)"""
    p = dist(3, 11, 1, 65, 20)
    q = dist(1, 4, 94, 1, 0)
    tokens, _ = emitted(2, replacement=False, judge_replacement=True, p=p, q=q, trials=20_000)
    with pytest.raises(AssertionError):
        assert_follows(tokens, p)
    right, _ = emitted(2, replacement=False, p=p, q=q, trials=20_000)
    assert_follows(right, p)


def test_draws_without_replacement_are_distinct_and_the_first_follows_q():
    rng = np.random.default_rng(1)
    firsts = []
    for _ in range(30_000):
        s = draw_siblings(Q, 3, rng)
        assert len(set(s)) == 3 and all(Q[x] > 0 for x in s)
        firsts.append(s[0])
    assert_follows(np.array(firsts), Q)


def test_a_q_with_fewer_tokens_than_k_gives_fewer_siblings():
    q = dist(0.5, 0.5, 0, 0)
    assert sorted(draw_siblings(q, 4, np.random.default_rng(0))) == [0, 1]


def test_a_sibling_q_could_not_draw_is_an_error():
    with pytest.raises(ValueError, match="cannot have been drawn"):
        accept_siblings([6], Q, P, np.random.default_rng(0))
    with pytest.raises(ValueError, match="cannot have been drawn"):  # drawn twice without replacement
        accept_siblings([1, 1], dist(0, 1, 1, 0, 0, 0, 0, 0), dist(1, 0, 0, 0, 0, 0, 0, 1), np.random.default_rng(0))


@dataclass
class SampledTree:
    """A hand-built tree of sampled children: each node's parent and token."""

    parents: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.tokens)

    def child(self, node: int, token: int) -> int | None:
        return next((i for i, (p, t) in enumerate(zip(self.parents, self.tokens)) if p == node and t == token), None)


def test_a_tree_of_sampled_children_emits_the_targets_tokens_at_each_depth():
    """Two siblings drawn from Q0 at the root, two drawn from Q1 under each: the first token emitted
    follows the root's p (P0) and the second, where the walk went down a node, that node's p (P1), the
    bonus included. A walk that judged the grandchildren against the root's row would fail the second."""
    rng = np.random.default_rng(7)
    first, second = [], []
    for _ in range(30_000):
        tree = SampledTree()
        for token in draw_siblings(Q0, 2, rng):
            tree.parents.append(ROOT)
            tree.tokens.append(token)
            node = len(tree.tokens) - 1
            for grandchild in draw_siblings(Q1, 2, rng):
                tree.parents.append(node)
                tree.tokens.append(grandchild)
        depth = [0 if parent == ROOT else 1 for parent in tree.parents]
        child_q = {(): Q0, **{(tree.tokens[n],): Q1 for n in range(len(tree)) if depth[n] == 0}}
        rows = [P0] + [P1 if d == 0 else P0 for d in depth]  # row 0: the root's; row n + 1: node n's
        result = accept_sampled_tree(tree, child_q, rows, lambda node: node + 1, rng)
        emitted = [*result.tokens, result.next_token]
        first.append(emitted[0])
        if len(emitted) > 1:
            second.append(emitted[1])
    assert_follows(np.array(first), P0)
    assert len(second) > 5_000  # the walk went down often enough to judge the second position
    assert_follows(np.array(second), P1)
