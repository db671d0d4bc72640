"""The chi-square check the distribution tests share: do sampled outcomes follow exact probabilities?"""

from __future__ import annotations

from typing import Hashable, Mapping


def assert_follows(counts: Mapping[Hashable, int], probs: Mapping[Hashable, float], trials: int, *,
                   min_outcomes: int = 1) -> None:
    """Chi-square at significance 0.001 (critical value by Wilson-Hilferty): every outcome expected at
    least 5 times is its own cell, the rest is pooled into one. ``min_outcomes``: cells of their own
    needed for the test to mean something."""
    big = [k for k, p in sorted(probs.items(), key=lambda kv: -kv[1]) if p * trials >= 5]
    assert len(big) >= min_outcomes, "the distribution is too peaked for a meaningful test"
    expected = [probs[k] * trials for k in big] + [trials * (1 - sum(probs[k] for k in big))]
    observed = [counts.get(k, 0) for k in big] + [trials - sum(counts.get(k, 0) for k in big)]
    chi2 = sum((o - e) ** 2 / e for o, e in zip(observed, expected) if e > 0)
    df = len([e for e in expected if e > 0]) - 1
    z = 3.090
    critical = df * (1 - 2 / (9 * df) + z * (2 / (9 * df)) ** 0.5) ** 3
    assert chi2 < critical, (chi2, critical, df)
