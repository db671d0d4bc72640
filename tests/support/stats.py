"""The distribution checks the tests share: do sampled outcomes follow the target's exact probabilities?"""

from __future__ import annotations

from collections import Counter
from typing import Callable, Hashable, Mapping

from localspec.speculative import speculative_step


def assert_follows(counts: Mapping[Hashable, int], probs: Mapping[Hashable, float], trials: int, *,
                   min_outcomes: int = 1) -> None:
    """Chi-square at significance 0.001 (critical value by Wilson-Hilferty): every outcome expected at
    least 5 times is its own cell, the rest is pooled into one. ``min_outcomes``: cells of their own
    needed for the test to mean something."""
    big = [k for k, p in sorted(probs.items(), key=lambda kv: -kv[1]) if p * trials >= 5]
    assert len(big) >= min_outcomes, "the distribution is too peaked for a meaningful test"
    expected = [probs[k] * trials for k in big]
    observed = [counts.get(k, 0) for k in big]
    # The pooled rest is a cell of its own when it too is expected 5 times; else it joins the last cell
    # (a cell expected far less than once would make a single rare outcome fail the test).
    rest_e, rest_o = trials - sum(expected), trials - sum(observed)
    if rest_e >= 5 or not expected:
        expected.append(rest_e)
        observed.append(rest_o)
    else:
        expected[-1] += rest_e
        observed[-1] += rest_o
    chi2 = sum((o - e) ** 2 / e for o, e in zip(observed, expected) if e > 0)
    df = len([e for e in expected if e > 0]) - 1
    assert df > 0, "one outcome only: nothing to test"
    z = 3.090
    critical = df * (1 - 2 / (9 * df) + z * (2 / (9 * df)) ** 0.5) ** 3
    assert chi2 < critical, (chi2, critical, df)


def assert_first_two_follow(tctx, prompt: list[int], drafter, sampler, joint: Mapping[Hashable, float],  # noqa: ANN001
                            restart: Callable[[], None], *, trials: int = 1500, draft_len: int = 3,
                            tree_nodes: int = 0) -> None:
    """Speculative steps from ``prompt`` until two tokens are out, ``trials`` times (``restart`` puts the
    target's cache back between trials): both branches of the acceptance rule must run, and the pairs
    must follow the target's own ``joint`` distribution of its next two tokens. ``tree_nodes`` > ``draft_len``:
    the drafter is asked for trees of that many nodes (``Drafter.propose_tree``).

    The rule's arithmetic is tested on hand-built arrays (test_acceptance.py); these trials check its
    wiring through real models (which rows, which q, the second token after an accepted first), where
    an error moves the joint far more than 1,500 trials resolve."""
    counts: Counter[Hashable] = Counter()
    accepted = drafted = 0
    for _ in range(trials):
        history = list(prompt)
        emitted: list[int] = []
        while len(emitted) < 2:
            step = speculative_step(tctx, history, drafter, sampler, draft_len=draft_len, tree_nodes=tree_nodes)
            emitted += step.tokens
            accepted += step.accepted
            drafted += step.drafted
        counts[(emitted[0], emitted[1])] += 1
        restart()
    assert 0 < accepted < drafted  # both branches of the rule ran
    assert set(counts) <= set(joint)  # never a pair the target cannot produce
    assert_follows(counts, joint, trials)


def first_two_joint(tctx, sampler, last: int, shaper=None, history=()) -> dict[tuple[int, int], float]:  # noqa: ANN001
    """The target's own joint distribution of the next two tokens, p1(x1) p2(x2 | x1), after its cache
    and then ``last`` (the prompt's last token, decoded here and taken back): what a step's first two
    emitted tokens must follow. With a ``shaper`` (``sampling.RowShaper``: a grammar, penalties), each
    row is shaped as plain decoding shapes it, after ``history`` (ending with ``last``) and the tokens
    since. The cache is left as it was found."""
    import numpy as np

    def row(path: tuple[int, ...]):  # noqa: ANN202
        logits = tctx.logits(-1)
        return logits if shaper is None else shaper.shape(logits, history, path)

    n0 = len(tctx.tokens)
    tctx.append([last])
    p1 = sampler.distribution(row(())).copy()
    joint: dict[tuple[int, int], float] = {}
    for x1 in np.flatnonzero(p1):
        tctx.append([int(x1)])
        p2 = sampler.distribution(row((int(x1),)))
        for x2 in np.flatnonzero(p2):
            joint[(int(x1), int(x2))] = float(p1[x1] * p2[x2])
        tctx.rollback_to(n0 + 1)
    tctx.rollback_to(n0)
    return joint
